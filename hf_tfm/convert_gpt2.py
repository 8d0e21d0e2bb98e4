"""Exact conversion between transformers' `GPT2LMHeadModel` and `TfmDecoderForCausalLM`, both directions.

GPT-2 stores linear layers as `Conv1D` (weight `[in, out]`) and fuses q, k, v into `c_attn`; we store `nn.Linear`
(weight `[out, in]`) with separate projections, so weights are split and transposed on the way in and back.
"""

import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, inverted, load_exact, renamed_fields
from .modeling_tfm import TfmDecoderForCausalLM

# per-layer renames whose tensors need only a transpose (Conv1D -> Linear) or nothing (norms)
_LAYER_NAMES = {
    "ln_1": "attn_norm",
    "ln_2": "ffn_norm",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
}


# GPT2Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = {
    "vocab_size": "vocab_size",
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
    "activation_function": "hidden_act",
    "layer_norm_epsilon": "layer_norm_eps",
    "embd_pdrop": "embedding_dropout",
    "resid_pdrop": "hidden_dropout",
    "attn_pdrop": "attention_dropout",
    "tie_word_embeddings": "tie_word_embeddings",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# what GPT-2 always is, in TfmConfig terms
_GPT2_ARCHITECTURE = dict(
    position_embedding_type="learned",
    norm_type="layernorm",
    norm_position="pre",
    ffn_type="mlp",
    attention_bias=True,
    mlp_bias=True,
)
# GPT2Config fields GPT2LMHeadModel never reads in a way that changes what it computes
_IRRELEVANT = {
    **dict.fromkeys(
        ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout"),
        "read only by GPT2DoubleHeadsModel's multiple-choice head",
    ),
    "reorder_and_upcast_attn": "the same attention, computed in float32 (a half-precision eager training option)",
    "n_ctx": "an old GPT2Config key transformers 5 keeps but never reads; n_positions sizes the position table",
}


def _to_tfm(config: GPT2Config) -> TfmDecoderConfig:
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_GPT2_ARCHITECTURE,
        intermediate_size=config.n_inner or 4 * config.n_embd,
    )


def _to_gpt2(config: TfmDecoderConfig) -> GPT2Config:
    # n_inner=None is GPT-2's way of writing the default width 4 * n_embd
    n_inner = None if config.intermediate_size == 4 * config.hidden_size else config.intermediate_size
    return GPT2Config(**renamed_fields(config, inverted(_CONFIG_NAMES)), n_inner=n_inner)


def gpt2_config_to_tfm(config: GPT2Config) -> TfmDecoderConfig:
    if config.n_inner == 4 * config.n_embd:  # the default width written out: compare it as GPT-2 writes it back
        config = copy.deepcopy(config)
        config.n_inner = None
    return converted_config(config, _to_tfm, _to_gpt2, irrelevant=_IRRELEVANT)


def tfm_config_to_gpt2(config: TfmDecoderConfig) -> GPT2Config:
    return converted_config(config, _to_gpt2, _to_tfm)


def gpt2_to_tfm(model: GPT2LMHeadModel) -> TfmDecoderForCausalLM:
    """Convert a `GPT2LMHeadModel` into a `TfmDecoderForCausalLM` with identical outputs."""
    source = model.state_dict()
    hidden = model.config.n_embd
    state = {
        "model.embed_tokens.weight": source["transformer.wte.weight"],
        "model.embed_positions.weight": source["transformer.wpe.weight"],
        "model.norm.weight": source["transformer.ln_f.weight"],
        "model.norm.bias": source["transformer.ln_f.bias"],
        "lm_head.weight": source["lm_head.weight"],
    }
    for i in range(model.config.n_layer):
        src, dst = f"transformer.h.{i}.", f"model.layers.{i}."
        for name, weight, bias in zip(
            ("q_proj", "k_proj", "v_proj"),
            source[src + "attn.c_attn.weight"].split(hidden, dim=1),
            source[src + "attn.c_attn.bias"].split(hidden),
        ):
            state[f"{dst}self_attn.{name}.weight"] = weight.t()
            state[f"{dst}self_attn.{name}.bias"] = bias
        for theirs, ours in _LAYER_NAMES.items():
            weight = source[f"{src}{theirs}.weight"]
            state[f"{dst}{ours}.weight"] = weight if theirs.startswith("ln_") else weight.t()
            state[f"{dst}{ours}.bias"] = source[f"{src}{theirs}.bias"]
    return load_exact(TfmDecoderForCausalLM(gpt2_config_to_tfm(model.config)), state)


def tfm_to_gpt2(model: TfmDecoderForCausalLM) -> GPT2LMHeadModel:
    """Convert a GPT-2-shaped `TfmDecoderForCausalLM` back into a `GPT2LMHeadModel` with identical outputs."""
    config = tfm_config_to_gpt2(model.config)
    source = model.state_dict()
    state = {
        "transformer.wte.weight": source["model.embed_tokens.weight"],
        "transformer.wpe.weight": source["model.embed_positions.weight"],
        "transformer.ln_f.weight": source["model.norm.weight"],
        "transformer.ln_f.bias": source["model.norm.bias"],
        "lm_head.weight": source["lm_head.weight"],
    }
    for i in range(config.n_layer):
        src, dst = f"model.layers.{i}.", f"transformer.h.{i}."
        projections = [f"{src}self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj")]
        state[dst + "attn.c_attn.weight"] = torch.cat([source[p + ".weight"].t() for p in projections], dim=1)
        state[dst + "attn.c_attn.bias"] = torch.cat([source[p + ".bias"] for p in projections])
        for theirs, ours in _LAYER_NAMES.items():
            weight = source[f"{src}{ours}.weight"]
            state[f"{dst}{theirs}.weight"] = weight if theirs.startswith("ln_") else weight.t()
            state[f"{dst}{theirs}.bias"] = source[f"{src}{ours}.bias"]
    return load_exact(GPT2LMHeadModel(config), state)
