"""Model card templates (Jinja2, rendered by `hf_tfm.card`); shipped inside the package as `hf_tfm.model_cards`."""
