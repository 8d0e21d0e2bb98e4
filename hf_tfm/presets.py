"""Model presets, one folder with a config.json each under the top-level `configs/` folder (shipped inside the wheel as
`hf_tfm/configs/`), named by parameter count in millions (tied weights counted once), so they load by name from any
working directory:

    import hf_tfm
    config = hf_tfm.preset_config("llama-1.3m")               # or hf_tfm.preset_path("llama-1.3m"): the folder

`configs/accelerate/` beside them holds the launch files (`accelerate launch --config_file ...`).
"""

import json
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# earlier names, which said nothing true about size (llama-tiny was 15 times llama-mini) -> the preset now
RENAMED = {
    "llama-mini": "llama-1.3m",
    "llama-tiny": "llama-19m",
    "bert-mini": "bert-1.4m",
    "t5-mini": "t5-1.9m",
    "mixtral-mini": "mixtral-1.8m",
}


def shipped_folder(name: str) -> Path:
    """A top-level folder of the repository that the wheel ships inside the package (`configs`, `model_cards`): in an
    installed wheel under the package, in a source checkout (an editable install) beside it."""
    for folder in (_PACKAGE / name, _PACKAGE.parent / name):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"hf_tfm's {name}/ folder is missing (looked in {_PACKAGE} and {_PACKAGE.parent})")


def configs_folder() -> Path:
    return shipped_folder("configs")


def preset_names() -> list[str]:
    """The presets' names, sorted (`configs/<name>/config.json`; the table is in docs/models.md)."""
    return sorted(entry.name for entry in configs_folder().iterdir() if (entry / "config.json").is_file())


def preset_path(name: str) -> Path:
    """The folder holding preset `name`'s config.json; a ValueError naming the presets if there is none."""
    if name in preset_names():
        return configs_folder() / name
    if name in RENAMED:
        raise ValueError(f"preset {name!r} is now named {RENAMED[name]!r} (presets are named by parameter count)")
    raise ValueError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")


def preset_config(name: str, **fields):
    """Preset `name`'s config, `fields` overriding its values (`preset_config("llama-1.3m", num_experts=8)`), validated
    as one new config."""
    from transformers import AutoConfig

    values = json.loads((preset_path(name) / "config.json").read_text())
    return AutoConfig.for_model(**{**values, **fields})
