"""Exact conversion between transformers' `Gemma2ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

Gemma 2 is a Llama-shaped decoder whose differences are all config data in hf_tfm: sandwich norms
(`norm_position="sandwich"`: a norm before and after each sublayer), RMSNorm scaling by `1 + weight`
(`rmsnorm_unit_offset`), token embeddings scaled by `sqrt(hidden_size)` (`scale_embeddings`), the attention scale
`query_pre_attn_scalar ** -0.5`, tanh soft-capping of the attention scores and of the final logits, and
alternating sliding-window / full attention layers (`layer_types`, `sliding_window`). The weights differ only in
the four per-layer norm names.
"""

import copy

from transformers import Gemma2Config, Gemma2ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, inverted, renamed_model
from .convert_llama import llama_family_config_to_tfm, llama_family_names, tfm_config_to_llama_family
from .modeling_tfm import TfmDecoderForCausalLM

_RENAMES = {
    ".input_layernorm.": ".attn_norm.",
    ".post_attention_layernorm.": ".post_attn_norm.",
    ".pre_feedforward_layernorm.": ".ffn_norm.",
    ".post_feedforward_layernorm.": ".post_ffn_norm.",
}

# Gemma2Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names(
    "intermediate_size",
    "attention_bias",
    "sliding_window",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    without=("hidden_act",),
    hidden_activation="hidden_act",
)
# what Gemma 2 always is, in TfmConfig terms
_GEMMA2_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="rmsnorm",
    rmsnorm_unit_offset=True,
    norm_position="sandwich",
    ffn_type="glu",
    mlp_bias=False,
    scale_embeddings=True,
)


def _to_tfm(config: Gemma2Config) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(
        config,
        _CONFIG_NAMES,
        _GEMMA2_ARCHITECTURE,
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
        query_pre_attn_scalar=float(config.query_pre_attn_scalar),
        layer_types=list(config.layer_types),
    )


def _to_gemma2(config: TfmDecoderConfig) -> Gemma2Config:
    scalar = config.query_pre_attn_scalar if config.query_pre_attn_scalar is not None else config.head_dim
    return tfm_config_to_llama_family(
        config,
        Gemma2Config,
        _CONFIG_NAMES,
        # an int in Gemma2Config: a fractional value (or a scale set by attention_multiplier) comes back changed and
        # is refused by name
        query_pre_attn_scalar=int(scalar),
        layer_types=list(config.layer_types),
    )


def gemma2_config_to_tfm(config: Gemma2Config) -> TfmDecoderConfig:
    # use_bidirectional_attention None and False both mean causal attention, the only kind hf_tfm's decoder has
    irrelevant = {} if config.use_bidirectional_attention else {"use_bidirectional_attention": "causal either way"}
    return converted_config(config, _to_tfm, _to_gemma2, irrelevant=irrelevant)


def tfm_config_to_gemma2(config: TfmDecoderConfig) -> Gemma2Config:
    if config.query_pre_attn_scalar is None and config.attention_multiplier is None:
        # hf_tfm's default scale head_dim ** -0.5 is Gemma 2's query_pre_attn_scalar = head_dim
        config = copy.deepcopy(config)
        config.query_pre_attn_scalar = float(config.head_dim)
    return converted_config(config, _to_gemma2, _to_tfm)


def gemma2_to_tfm(model: Gemma2ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `Gemma2ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(gemma2_config_to_tfm(model.config)), _RENAMES)


def tfm_to_gemma2(model: TfmDecoderForCausalLM) -> Gemma2ForCausalLM:
    """Convert a Gemma-2-shaped `TfmDecoderForCausalLM` back into a `Gemma2ForCausalLM` with identical outputs."""
    target = Gemma2ForCausalLM(tfm_config_to_gemma2(model.config))
    if target.config.attn_logit_softcapping is not None:
        target.set_attn_implementation("eager")  # transformers 5.17 defaults Gemma 2 to sdpa, which drops the cap
    return renamed_model(model, target, inverted(_RENAMES))
