"""hf_tfm: Transformer models (encoder-only, decoder-only, encoder-decoder) native to the Hugging Face ecosystem.

Importing the package registers every model type with the transformers Auto classes, and marks the classes for
`register_for_auto_class` so that `save_pretrained` writes `auto_map` and copies the flat modeling code; it changes
nothing else of transformers.

Where things live: the model is the flat remote-code files here (`modeling_tfm.py` heads -> `modeling_tfm_stack.py`
stack and block -> `modeling_tfm_layers.py` attention, feed-forward, MoE; `modeling_tfm_loss.py`;
`configuration_tfm.py`; `capabilities.py` what each backend and engine can run; `compat.py` what each release needs).
Not remote code: `convert/` (families, both ways), `export/` (ONNX, GGUF), `training/`, `hub/`, `presets/`,
`model_cards/`, `commands.py` (the `hf-tfm` commands).
"""

import transformers

from . import modeling_tfm
from .configuration_tfm import PARADIGM_CONFIGS, TfmConfig, TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from .hub import card  # noqa: F401  (loaded: the models' save_pretrained and push_to_hub write its card)
from .modeling_tfm import *  # noqa: F403  (the model classes, listed once: modeling_tfm.__all__)

__version__ = "0.1.0"


def _register() -> None:
    for config_class in PARADIGM_CONFIGS.values():
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_name, model_name in config_class.auto_classes.items():
            model_class = getattr(modeling_tfm, model_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_name)


_register()

PRESET_FUNCTIONS = ("preset_config", "preset_path", "preset_names")


def __getattr__(name: str):
    # hf_tfm.preset_config(...) etc. live in hf_tfm.presets (hf_tfm/presets/<name>/config.json);
    # imported on first use, so that `import hf_tfm` also works from a source tree on sys.path without an install.
    if name in PRESET_FUNCTIONS:
        from . import presets

        return getattr(presets, name)
    raise AttributeError(f"module 'hf_tfm' has no attribute {name!r}")


__all__ = [
    "TfmConfig",
    "TfmDecoderConfig",
    "TfmEncoderConfig",
    "TfmEncoderDecoderConfig",
    *modeling_tfm.__all__,
    *PRESET_FUNCTIONS,
]
