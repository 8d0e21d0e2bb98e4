"""Exact conversion between transformers' `Qwen3ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

Qwen3 is Qwen2 with an RMSNorm of width `head_dim` on every query and key head before RoPE (`qk_norm="per_head"`,
weights `self_attn.q_norm` / `k_norm` under the same names in both), one `attention_bias` flag for all four
attention projections, and a `head_dim` field (128 by default, not `hidden_size // heads`). Its window fields are
Qwen2's.
"""

from transformers import Qwen3Config, Qwen3ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, inverted, renamed_model
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    LLAMA_RENAMES,
    llama_family_config_to_tfm,
    llama_family_names,
    tfm_config_to_llama_family,
)
from .convert_qwen2 import QWEN_UNREAD, window_from_tfm, window_to_tfm
from .modeling_tfm import TfmDecoderForCausalLM

# Qwen3Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", "attention_bias")
# what Qwen3 always is, in TfmConfig terms
_QWEN3_ARCHITECTURE = dict(**LLAMA_ARCHITECTURE, qk_norm="per_head", mlp_bias=False)


def _to_tfm(config: Qwen3Config) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(
        config,
        _CONFIG_NAMES,
        _QWEN3_ARCHITECTURE,
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
        **window_to_tfm(config),
    )


def _to_qwen3(config: TfmDecoderConfig) -> Qwen3Config:
    return tfm_config_to_llama_family(config, Qwen3Config, _CONFIG_NAMES, **window_from_tfm(config))


def qwen3_config_to_tfm(config: Qwen3Config) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_qwen3, irrelevant=QWEN_UNREAD)


def tfm_config_to_qwen3(config: TfmDecoderConfig) -> Qwen3Config:
    return converted_config(config, _to_qwen3, _to_tfm)


def qwen3_to_tfm(model: Qwen3ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `Qwen3ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(qwen3_config_to_tfm(model.config)), LLAMA_RENAMES)


def tfm_to_qwen3(model: TfmDecoderForCausalLM) -> Qwen3ForCausalLM:
    """Convert a Qwen3-shaped `TfmDecoderForCausalLM` back into a `Qwen3ForCausalLM` with identical outputs."""
    return renamed_model(model, Qwen3ForCausalLM(tfm_config_to_qwen3(model.config)), inverted(LLAMA_RENAMES))
