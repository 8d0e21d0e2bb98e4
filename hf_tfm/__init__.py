"""hf_tfm: Transformer models (encoder-only, decoder-only, encoder-decoder) native to the Hugging Face ecosystem.

Importing the package registers every model type with the transformers Auto classes, and marks the classes for
`register_for_auto_class` so that `save_pretrained` writes `auto_map` and copies the model bundle; the bundle names
each head class in transformers' table of its task (where Trainer and model cards look a task up by class name); it
changes nothing else of transformers.

Where things live: `model/` is the model bundle, what ships next to every checkpoint as remote code (the config and its
rules, the layers, the stack, the heads, what each backend can run, what each release needs). Not remote code:
`model_hooks.py` (what the models hand over to the package: staged saves, checks around a load, pushes), `saving.py`
(staged saves, manifests, `hf-tfm verify`), `quantization.py` (torchao on the MoE experts), `hub/` (cards, pushes),
`convert/` (families, both ways), `export/` (ONNX, GGUF), `training/`, `presets.py` (the configs/ folder),
`commands.py` (the `hf-tfm` commands), `compat.py` (the one table of release decisions).
"""

# first: transformers' model code, imported without optional packages' import-time noise
from . import quiet_import  # noqa: F401, I001
import transformers

from . import model_hooks  # noqa: F401  (loaded: the models hand their saving, loading and publishing to it)
from .model import capabilities, modeling_tfm
from .model.configuration_tfm import (
    PARADIGM_CONFIGS,
    TfmConfig,
    TfmDecoderConfig,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
)
from .model.modeling_tfm import *  # noqa: F403  (the model classes, listed once: modeling_tfm.__all__)
from .model.modeling_tfm_loading import AUTO_CLASSES
from .presets import preset_config, preset_names, preset_path

__version__ = "0.1.0"


def _register() -> None:
    for model_type, config_class in PARADIGM_CONFIGS.items():
        transformers.AutoConfig.register(model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_name, model_name in AUTO_CLASSES[model_type].items():
            model_class = getattr(modeling_tfm, model_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_name)


_register()

__all__ = [
    "TfmConfig",
    "TfmDecoderConfig",
    "TfmEncoderConfig",
    "TfmEncoderDecoderConfig",
    *modeling_tfm.__all__,
    "preset_config",
    "preset_path",
    "preset_names",
    "capabilities",
]
