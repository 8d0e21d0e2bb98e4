"""The family presets: a small member of each converted family whose record has one (`Family.preset`), made by the
conversion engine from transformers' own config class (so each is what that family is, in hf_tfm's terms). All share
llama-1.3m's size where the family allows it (`hf_tfm.convert.record.PRESET_SIZE`).

    python -m hf_tfm.convert.family_presets      # rewrites configs/<family>-<size>/config.json (a source checkout)

tests/test_packaging.py checks that the committed files are what this produces.
"""

import json

from ..presets import configs_folder


def preset_families() -> dict:
    """The registry's families with a small member (`Family.preset`, sized by `hf_tfm.convert.record.PRESET_SIZE`)."""
    from hf_tfm.convert.families import FAMILIES

    return {name: record for name, record in FAMILIES.items() if record.preset is not None}


def family_config(family: str):
    """The family's small member as an hf_tfm config, through the conversion engine."""
    import transformers

    from hf_tfm.convert import config_to_tfm
    from hf_tfm.convert.families import FAMILIES

    record = FAMILIES[family]
    return config_to_tfm(getattr(transformers, record.config_class)(**record.preset))


def preset_json(config) -> str:
    values = {key: value for key, value in config.to_dict().items() if key not in ("transformers_version", "dtype")}
    return json.dumps(values, indent=2, sort_keys=True) + "\n"


def preset_name(family: str, config) -> str:
    import transformers

    from hf_tfm.convert.record import PARADIGMS

    model = getattr(transformers, PARADIGMS[config.model_type].auto_class).from_config(config)
    count = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return f"{family.replace('_', '-')}-{count / 1e6:.1f}m"


def main() -> None:
    for family in preset_families():
        config = family_config(family)
        folder = configs_folder() / preset_name(family, config)
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(preset_json(config))
        print(folder.name)


if __name__ == "__main__":
    main()
