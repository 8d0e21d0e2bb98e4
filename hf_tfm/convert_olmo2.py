"""Exact conversion between transformers' `Olmo2ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

OLMo2 is a Llama-shaped decoder with two differences, both config data in hf_tfm: its norms sit on the sublayer
outputs, `x + norm(f(x))` (`norm_position="output"`: no input norms), and an RMSNorm over the whole query and the
whole key projection before the split into heads (`qk_norm="projection"`). The weights differ only in the two
per-layer norm names. In half precision OLMo2 rounds in two places where hf_tfm (as Llama) does not: its RMSNorm
multiplies by the weight before casting back to the input dtype, and it applies RoPE in float32 with float32
cos/sin before casting back. The same numbers in float32; in bfloat16 the logits differ by rounding.
"""

from transformers import Olmo2Config, Olmo2ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    LLAMA_FAMILY_STACK,
    converted_config,
    head_dim_kwargs,
    implicit_head_dim,
    inverted,
    renamed_model,
)
from .convert_llama import llama_family_config_to_tfm, llama_family_names, tfm_config_to_llama_family
from .modeling_tfm import TfmDecoderForCausalLM

_RENAMES = {".post_attention_layernorm.": ".post_attn_norm.", ".post_feedforward_layernorm.": ".post_ffn_norm."}

# Olmo2Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", "attention_bias", without=("head_dim",))
# what OLMo2 always is, in TfmConfig terms
_OLMO2_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="rmsnorm",
    norm_position="output",
    qk_norm="projection",
    ffn_type="glu",
    mlp_bias=False,
    **LLAMA_FAMILY_STACK,
)


def _to_tfm(config: Olmo2Config) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(
        config,
        _CONFIG_NAMES,
        _OLMO2_ARCHITECTURE,
        head_dim=implicit_head_dim(config),
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
    )


def _to_olmo2(config: TfmDecoderConfig) -> Olmo2Config:
    return tfm_config_to_llama_family(config, Olmo2Config, _CONFIG_NAMES, **head_dim_kwargs(config))


def olmo2_config_to_tfm(config: Olmo2Config) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_olmo2)


def tfm_config_to_olmo2(config: TfmDecoderConfig) -> Olmo2Config:
    return converted_config(config, _to_olmo2, _to_tfm)


def olmo2_to_tfm(model: Olmo2ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert an `Olmo2ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(olmo2_config_to_tfm(model.config)), _RENAMES)


def tfm_to_olmo2(model: TfmDecoderForCausalLM) -> Olmo2ForCausalLM:
    """Convert an OLMo2-shaped `TfmDecoderForCausalLM` back into an `Olmo2ForCausalLM` with identical outputs."""
    return renamed_model(model, Olmo2ForCausalLM(tfm_config_to_olmo2(model.config)), inverted(_RENAMES))
