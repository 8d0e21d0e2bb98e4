"""hf_tfm: Transformer models (encoder-only, decoder-only, encoder-decoder) native to the Hugging Face ecosystem.

Importing the package registers every model type with the transformers Auto classes, and marks the classes for
`register_for_auto_class` so that `save_pretrained` writes `auto_map` and copies the flat modeling code.
"""

import transformers

from .configuration_tfm import TfmConfig, TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from . import modeling_tfm
from .modeling_tfm import (
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderDecoderModel,
    TfmEncoderForMaskedLM,
    TfmEncoderForQuestionAnswering,
    TfmEncoderForSequenceClassification,
    TfmEncoderForTokenClassification,
    TfmEncoderModel,
    TfmPreTrainedModel,
)

__version__ = "0.1.0"


def _register() -> None:
    for config_class in (TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig):
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_name, model_name in config_class.auto_classes.items():
            model_class = getattr(modeling_tfm, model_name)
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_name)


_register()

__all__ = [
    "TfmConfig",
    "TfmDecoderConfig",
    "TfmEncoderConfig",
    "TfmEncoderDecoderConfig",
    "TfmPreTrainedModel",
    "TfmDecoderModel",
    "TfmDecoderForCausalLM",
    "TfmDecoderForSequenceClassification",
    "TfmEncoderModel",
    "TfmEncoderForMaskedLM",
    "TfmEncoderForSequenceClassification",
    "TfmEncoderForTokenClassification",
    "TfmEncoderForQuestionAnswering",
    "TfmEncoderDecoderModel",
    "TfmEncoderDecoderForConditionalGeneration",
]
