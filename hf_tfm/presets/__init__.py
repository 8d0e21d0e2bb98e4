"""Model presets, one folder with a config.json each, named by parameter count in millions (tied weights counted
once): hf_tfm/presets/<name>/config.json, package data of `hf_tfm.presets`, so they load by name from any working
directory:

    import hf_tfm
    config = hf_tfm.preset_config("llama-1.3m")               # or hf_tfm.preset_path("llama-1.3m"): the folder
"""

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
# earlier names, which said nothing true about size (llama-tiny was 15 times llama-mini) -> the preset now
RENAMED = {
    "llama-mini": "llama-1.3m",
    "llama-tiny": "llama-19m",
    "bert-mini": "bert-1.4m",
    "t5-mini": "t5-1.9m",
    "mixtral-mini": "mixtral-1.8m",
}


def preset_names() -> list[str]:
    return sorted(entry.name for entry in FOLDER.iterdir() if (entry / "config.json").is_file())


def preset_path(name: str) -> Path:
    """The folder holding preset `name`'s config.json; a ValueError naming the presets if there is none."""
    if name in preset_names():
        return FOLDER / name
    if name in RENAMED:
        raise ValueError(f"preset {name!r} is now named {RENAMED[name]!r} (presets are named by parameter count)")
    raise ValueError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")


def preset_config(name: str, **fields):
    """Preset `name`'s config, `fields` overriding its values (`preset_config("llama-1.3m", num_experts=8)`), validated
    as one new config."""
    from transformers import AutoConfig

    values = json.loads((preset_path(name) / "config.json").read_text())
    return AutoConfig.for_model(**{**values, **fields})
