"""Exact conversion between transformers' `Qwen3MoeForCausalLM` and an MoE `TfmDecoderForCausalLM`, both directions.

Qwen3-MoE is Qwen3's attention (per-head QK-norm, one `attention_bias` flag) with Mixtral's softmax top-k router over
fused GLU experts, renormalised only with `norm_topk_prob`, on the layers `decoder_sparse_step` and `mlp_only_layers`
pick (a dense GLU of `intermediate_size` on the others). Its window, when `use_sliding_window`, covers every layer,
as Mistral's does; it has no `layer_types` and, like Qwen2, no `head_dim` field. Its aux loss is Mixtral's.
"""

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    converted_config,
    head_dim_kwargs,
    implicit_head_dim,
    inverted,
    renamed_model,
    without_derived_head_dim,
)
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    llama_family_config_to_tfm,
    llama_family_names,
    tfm_config_to_llama_family,
)
from .convert_mixtral import MIXTRAL_RENAMES
from .convert_qwen2 import QWEN_UNREAD
from .modeling_tfm import TfmDecoderForCausalLM

# Qwen3MoeConfig field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names(
    "intermediate_size",
    "attention_bias",
    "sliding_window",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "norm_topk_prob",
    "router_aux_loss_coef",
    "output_router_logits",
    without=("head_dim",),
)
# what Qwen3-MoE always is, in TfmConfig terms
_QWEN3_MOE_ARCHITECTURE = dict(
    **LLAMA_ARCHITECTURE,
    qk_norm="per_head",
    mlp_bias=False,
    scoring_func="softmax",
    moe_layers=None,
    shared_expert_intermediate_size=0,
    router_jitter_noise=0.0,
    router_z_loss_coef=0.0,
    router_bias_update_rate=0.0,
    capacity_factor=None,
)


def _to_tfm(config: Qwen3MoeConfig) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(
        config,
        _CONFIG_NAMES,
        _QWEN3_MOE_ARCHITECTURE,
        head_dim=implicit_head_dim(config),
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
        mlp_only_layers=list(config.mlp_only_layers),
    )


def _to_qwen3_moe(config: TfmDecoderConfig) -> Qwen3MoeConfig:
    return tfm_config_to_llama_family(
        config,
        Qwen3MoeConfig,
        _CONFIG_NAMES,
        **head_dim_kwargs(config),
        use_sliding_window=config.sliding_window is not None,
        mlp_only_layers=list(config.mlp_only_layers),
    )


def qwen3_moe_config_to_tfm(config: Qwen3MoeConfig) -> TfmDecoderConfig:
    return converted_config(without_derived_head_dim(config), _to_tfm, _to_qwen3_moe, irrelevant=QWEN_UNREAD)


def tfm_config_to_qwen3_moe(config: TfmDecoderConfig) -> Qwen3MoeConfig:
    return converted_config(config, _to_qwen3_moe, _to_tfm)


def qwen3_moe_to_tfm(model: Qwen3MoeForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `Qwen3MoeForCausalLM` into an MoE `TfmDecoderForCausalLM` with identical outputs and aux loss."""
    return renamed_model(model, TfmDecoderForCausalLM(qwen3_moe_config_to_tfm(model.config)), MIXTRAL_RENAMES)


def tfm_to_qwen3_moe(model: TfmDecoderForCausalLM) -> Qwen3MoeForCausalLM:
    """Convert a Qwen3-MoE-shaped `TfmDecoderForCausalLM` back into a `Qwen3MoeForCausalLM` with identical outputs."""
    return renamed_model(model, Qwen3MoeForCausalLM(tfm_config_to_qwen3_moe(model.config)), inverted(MIXTRAL_RENAMES))
