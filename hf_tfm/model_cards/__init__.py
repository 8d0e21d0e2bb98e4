"""Model card templates (Jinja2, rendered by `hf_tfm.hub.card`); shipped inside the package as `hf_tfm.model_cards`."""
