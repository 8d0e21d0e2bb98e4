"""Exact conversion between transformers' `MixtralForCausalLM` and an MoE `TfmDecoderForCausalLM`, both directions.

Mixtral is Llama with every feed-forward replaced by a softmax top-k router over fused GLU experts, stored in the
layout hf_tfm uses too; conversion is a rename plus a config mapping.
"""

import copy

from transformers import MixtralConfig, MixtralForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, head_dim_kwargs, implicit_head_dim, inverted, renamed_model
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    LLAMA_RENAMES,
    llama_family_config_to_tfm,
    llama_family_names,
    tfm_config_to_llama_family,
)
from .modeling_tfm import TfmDecoderForCausalLM

# Llama's names, and the router: the same `[experts, hidden]` weight under another name (Qwen3-MoE's too)
MIXTRAL_RENAMES = {**LLAMA_RENAMES, ".mlp.gate.weight": ".mlp.router.weight"}
# MixtralConfig field -> TfmDecoderConfig field, for every field with a direct counterpart (head_dim is mapped apart)
_CONFIG_NAMES = llama_family_names(
    "num_experts_per_tok",
    "router_aux_loss_coef",
    "router_jitter_noise",
    "output_router_logits",
    without=("head_dim",),
    num_local_experts="num_experts",
    intermediate_size="moe_intermediate_size",
)
# what Mixtral always is, in TfmConfig terms: every layer routes each token to its top-k of softmax scores
_MIXTRAL_ARCHITECTURE = dict(
    **LLAMA_ARCHITECTURE,
    attention_bias=False,
    mlp_bias=False,
    scoring_func="softmax",
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    moe_layers=None,
    shared_expert_intermediate_size=0,
    router_z_loss_coef=0.0,
    router_bias_update_rate=0.0,
    capacity_factor=None,
)


def _to_tfm(config: MixtralConfig) -> TfmDecoderConfig:
    # no dense layer reads intermediate_size; giving it the expert width keeps a fresh config's defaults sensible
    return llama_family_config_to_tfm(
        config,
        _CONFIG_NAMES,
        _MIXTRAL_ARCHITECTURE,
        head_dim=implicit_head_dim(config),
        intermediate_size=config.intermediate_size,
    )


def _to_mixtral(config: TfmDecoderConfig) -> MixtralConfig:
    if config.num_experts == 0:  # MixtralConfig takes num_local_experts=0, but builds no working model from it
        raise ValueError(
            f"Cannot convert {type(config).__name__} to MixtralConfig exactly: num_experts=0 is a dense model, and "
            "every Mixtral layer routes over experts"
        )
    # MixtralConfig keeps head_dim=None (its default) for the width its modeling code derives
    return tfm_config_to_llama_family(config, MixtralConfig, _CONFIG_NAMES, **head_dim_kwargs(config))


def mixtral_config_to_tfm(config: MixtralConfig) -> TfmDecoderConfig:
    if config.head_dim == config.hidden_size // config.num_attention_heads:  # compare it as Mixtral writes it back
        config = copy.deepcopy(config)
        config.head_dim = None
    return converted_config(config, _to_tfm, _to_mixtral)


def tfm_config_to_mixtral(config: TfmDecoderConfig) -> MixtralConfig:
    return converted_config(config, _to_mixtral, _to_tfm)


def mixtral_to_tfm(model: MixtralForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `MixtralForCausalLM` into an MoE `TfmDecoderForCausalLM` with identical outputs and aux loss."""
    return renamed_model(model, TfmDecoderForCausalLM(mixtral_config_to_tfm(model.config)), MIXTRAL_RENAMES)


def tfm_to_mixtral(model: TfmDecoderForCausalLM) -> MixtralForCausalLM:
    """Convert a Mixtral-shaped MoE `TfmDecoderForCausalLM` back into a `MixtralForCausalLM`."""
    return renamed_model(model, MixtralForCausalLM(tfm_config_to_mixtral(model.config)), inverted(MIXTRAL_RENAMES))
