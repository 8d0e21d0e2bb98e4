"""Exact conversion between transformers' `MistralForCausalLM` and `TfmDecoderForCausalLM`, both directions.

Mistral is Llama without biases plus a sliding window on every layer when `sliding_window` is set (hf_tfm's default
`layer_types` for a config with a window). Its weights have Llama's names, and its config maps with the
Llama-family helpers of `convert_llama`.
"""

from transformers import MistralConfig, MistralForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, inverted, renamed_model
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    LLAMA_RENAMES,
    llama_family_config_to_tfm,
    llama_family_names,
    tfm_config_to_llama_family,
)
from .modeling_tfm import TfmDecoderForCausalLM

# MistralConfig field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", "sliding_window")
# what Mistral always is, in TfmConfig terms (its layer_types follow from sliding_window: all sliding or all full)
_MISTRAL_ARCHITECTURE = {**LLAMA_ARCHITECTURE, "attention_bias": False, "mlp_bias": False}


def _to_tfm(config: MistralConfig) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(config, _CONFIG_NAMES, _MISTRAL_ARCHITECTURE)


def _to_mistral(config: TfmDecoderConfig) -> MistralConfig:
    return tfm_config_to_llama_family(config, MistralConfig, _CONFIG_NAMES)


def mistral_config_to_tfm(config: MistralConfig) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_mistral)


def tfm_config_to_mistral(config: TfmDecoderConfig) -> MistralConfig:
    return converted_config(config, _to_mistral, _to_tfm)


def mistral_to_tfm(model: MistralForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `MistralForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(mistral_config_to_tfm(model.config)), LLAMA_RENAMES)


def tfm_to_mistral(model: TfmDecoderForCausalLM) -> MistralForCausalLM:
    """Convert a Mistral-shaped `TfmDecoderForCausalLM` back into a `MistralForCausalLM` with identical outputs."""
    return renamed_model(model, MistralForCausalLM(tfm_config_to_mistral(model.config)), inverted(LLAMA_RENAMES))
