"""Model presets: `configs/<name>/config.json`, shipped inside the package as `hf_tfm.presets`."""
