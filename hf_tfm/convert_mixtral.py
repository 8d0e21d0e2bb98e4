"""Exact conversion between transformers' `MixtralForCausalLM` and an MoE `TfmDecoderForCausalLM`, both directions.

Mixtral is Llama with every feed-forward replaced by a softmax top-k router over fused GLU experts, stored in the
layout hf_tfm uses too; conversion is a rename plus a config mapping.
"""

from transformers import MixtralConfig, MixtralForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import LLAMA_FAMILY_STACK, inverted, renamed_model, require_compatible
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    LLAMA_FAMILY_NAMES,
    LLAMA_RENAMES,
    llama_family_config_to_tfm,
    tfm_config_to_llama_family,
)
from .modeling_tfm import TfmDecoderForCausalLM

_RENAMES = {**LLAMA_RENAMES, ".mlp.gate.weight": ".mlp.router.weight"}
# MixtralConfig field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = (
    LLAMA_FAMILY_NAMES
    | {name: name for name in ("num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise")}
    | {"output_router_logits": "output_router_logits"}
    | {"num_local_experts": "num_experts", "intermediate_size": "moe_intermediate_size"}
)
# what Mixtral always is, in TfmConfig terms
_MIXTRAL_ARCHITECTURE = dict(
    **LLAMA_ARCHITECTURE,
    attention_bias=False,
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


def mixtral_config_to_tfm(config: MixtralConfig) -> TfmDecoderConfig:
    require_compatible(config, "TfmDecoderConfig", {"sliding_window": None})
    return llama_family_config_to_tfm(
        config, _CONFIG_NAMES, _MIXTRAL_ARCHITECTURE, mlp_bias=False, intermediate_size=config.intermediate_size
    )


def tfm_config_to_mixtral(config: TfmDecoderConfig) -> MixtralConfig:
    require_compatible(
        config,
        "MixtralConfig",
        {**_MIXTRAL_ARCHITECTURE, **LLAMA_FAMILY_STACK},
        unsupported={"num_experts": config.num_experts == 0},
    )
    return tfm_config_to_llama_family(config, MixtralConfig, _CONFIG_NAMES)


def mixtral_to_tfm(model: MixtralForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `MixtralForCausalLM` into an MoE `TfmDecoderForCausalLM` with identical outputs and aux loss."""
    return renamed_model(model, TfmDecoderForCausalLM(mixtral_config_to_tfm(model.config)), _RENAMES)


def tfm_to_mixtral(model: TfmDecoderForCausalLM) -> MixtralForCausalLM:
    """Convert a Mixtral-shaped MoE `TfmDecoderForCausalLM` back into a `MixtralForCausalLM`."""
    return renamed_model(model, MixtralForCausalLM(tfm_config_to_mixtral(model.config)), inverted(_RENAMES))
