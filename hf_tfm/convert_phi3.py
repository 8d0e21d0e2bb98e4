"""Exact conversion between transformers' `Phi3ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

Phi-3 is Llama with fused projections: `qkv_proj` holds the q, k and v rows one after the other and `gate_up_proj`
the gate rows, then the up rows. hf_tfm keeps the projections separate (one layout for every family), so they are
split on the way in and concatenated again on the way back. Its options are config data: a partial rotary factor
and LongRoPE live in `rope_parameters` as transformers keeps them, a sliding window covers every layer (Mistral's
convention, hf_tfm's default for `sliding_window`), and `resid_pdrop` is the dropout on each sublayer's output
(`hidden_dropout`).
"""

import copy

import torch
from transformers import Phi3Config, Phi3ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    converted_config,
    head_dim_kwargs,
    implicit_head_dim,
    inverted,
    load_exact,
    renamed_fields,
    renamed_keys,
)
from .convert_llama import LLAMA_ARCHITECTURE, LLAMA_RENAMES, llama_family_names
from .modeling_tfm import TfmDecoderForCausalLM

# Phi3Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", "sliding_window", without=("head_dim",))
# what Phi-3 always is, in TfmConfig terms (no biases anywhere)
_PHI3_ARCHITECTURE = {
    **{field: value for field, value in LLAMA_ARCHITECTURE.items() if field != "hidden_dropout"},  # resid_pdrop
    "attention_bias": False,
    "mlp_bias": False,
}
_IRRELEVANT = {"embd_pdrop": "Phi3Model never applies it (no dropout on the embeddings)"}
_LONGROPE_ONLY = {"original_max_position_embeddings": "read only by LongRoPE; the other RoPE types never read it"}


def _rope_to_tfm(rope: dict) -> dict:
    # Phi3Config fills in partial_rotary_factor=1.0; hf_tfm's absent means the same (every feature rotated)
    return {key: value for key, value in rope.items() if (key, value) != ("partial_rotary_factor", 1.0)}


def _to_tfm(config: Phi3Config) -> TfmDecoderConfig:
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_PHI3_ARCHITECTURE,
        hidden_dropout=float(config.resid_pdrop),  # on each sublayer's output, before the residual sum
        head_dim=implicit_head_dim(config),
        attention_dropout=float(config.attention_dropout),  # Phi-3 allows an int 0
        rope_parameters=_rope_to_tfm(config.rope_parameters),
    )


def _to_phi3(config: TfmDecoderConfig) -> Phi3Config:
    rope = dict(config.rope_parameters or {})
    # Phi3Config keeps LongRoPE's pretraining length at the top level too, and lets that one win over the dict's
    pretraining_length = {}
    if rope.get("rope_type") == "longrope" and "original_max_position_embeddings" in rope:
        pretraining_length["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return Phi3Config(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        **head_dim_kwargs(config),
        **pretraining_length,
        attention_dropout=config.attention_dropout,
        resid_pdrop=config.hidden_dropout,
        rope_parameters=rope,
    )


def phi3_config_to_tfm(config: Phi3Config) -> TfmDecoderConfig:
    longrope = config.rope_parameters.get("rope_type") == "longrope"
    return converted_config(config, _to_tfm, _to_phi3, irrelevant=_IRRELEVANT | ({} if longrope else _LONGROPE_ONLY))


def tfm_config_to_phi3(config: TfmDecoderConfig) -> Phi3Config:
    if (config.rope_parameters or {}).get("partial_rotary_factor") == 1.0:  # the form that comes back: absent
        config = copy.deepcopy(config)
        config.rope_parameters = _rope_to_tfm(config.rope_parameters)
    return converted_config(config, _to_phi3, _to_tfm)


# Phi-3's fused projections and the hf_tfm projections they hold, in row order
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _rows(config: Phi3Config) -> dict[str, list[int]]:
    """Output rows of each part inside each fused weight."""
    head_dim = implicit_head_dim(config)
    kv_rows = config.num_key_value_heads * head_dim
    return {
        "self_attn.qkv_proj": [config.num_attention_heads * head_dim, kv_rows, kv_rows],
        "mlp.gate_up_proj": [config.intermediate_size] * 2,
    }


def phi3_to_tfm(model: Phi3ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `Phi3ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    config, rows = model.config, _rows(model.config)
    target = TfmDecoderForCausalLM(phi3_config_to_tfm(config))
    state = renamed_keys(model.state_dict(), LLAMA_RENAMES)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in _FUSED.items():
            weights = state.pop(f"{prefix}{fused}.weight").split(rows[fused])
            state |= {f"{prefix}{part}.weight": weight for part, weight in zip(parts, weights)}
    return load_exact(target, state, generation_config=model.generation_config)


def tfm_to_phi3(model: TfmDecoderForCausalLM) -> Phi3ForCausalLM:
    """Convert a Phi-3-shaped `TfmDecoderForCausalLM` back into a `Phi3ForCausalLM` with identical outputs."""
    config = tfm_config_to_phi3(model.config)
    state = renamed_keys(model.state_dict(), inverted(LLAMA_RENAMES))
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for fused, parts in _FUSED.items():
            state[f"{prefix}{fused}.weight"] = torch.cat([state.pop(f"{prefix}{part}.weight") for part in parts])
    return load_exact(Phi3ForCausalLM(config), state, generation_config=model.generation_config)
