"""Exact conversion between transformers' `GPT2LMHeadModel` and `TfmDecoderForCausalLM`, both directions.

GPT-2 stores linear layers as `Conv1D` (weight `[in, out]`) and fuses q, k, v into `c_attn`; we store `nn.Linear`
(weight `[out, in]`) with separate projections, so weights are split and transposed on the way in and back.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from .configuration_tfm import TfmDecoderConfig
from .convert_common import load_exact, require_compatible
from .modeling_tfm import TfmDecoderForCausalLM

# per-layer renames whose tensors need only a transpose (Conv1D -> Linear) or nothing (norms)
_LAYER_NAMES = {
    "ln_1": "attn_norm",
    "ln_2": "ffn_norm",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
}


def gpt2_config_to_tfm(config: GPT2Config) -> TfmDecoderConfig:
    require_compatible(
        "GPT2Config",
        "TfmDecoderConfig",
        {
            "scale_attn_weights": not config.scale_attn_weights,
            "scale_attn_by_inverse_layer_idx": config.scale_attn_by_inverse_layer_idx,
            "add_cross_attention": config.add_cross_attention,
        },
    )
    return TfmDecoderConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        intermediate_size=config.n_inner or 4 * config.n_embd,
        hidden_act=config.activation_function,
        ffn_type="mlp",
        mlp_bias=True,
        attention_bias=True,
        position_embedding_type="learned",
        max_position_embeddings=config.n_positions,
        norm_type="layernorm",
        norm_position="pre",
        layer_norm_eps=config.layer_norm_epsilon,
        embedding_dropout=config.embd_pdrop,
        hidden_dropout=config.resid_pdrop,
        attention_dropout=config.attn_pdrop,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def tfm_config_to_gpt2(config: TfmDecoderConfig) -> GPT2Config:
    require_compatible(
        "TfmDecoderConfig",
        "GPT2Config",
        {
            "position_embedding_type": config.position_embedding_type != "learned" and config.position_embedding_type,
            "norm_type": config.norm_type != "layernorm" and config.norm_type,
            "norm_position": config.norm_position != "pre" and config.norm_position,
            "ffn_type": config.ffn_type != "mlp" and config.ffn_type,
            "num_key_value_heads": config.num_key_value_heads != config.num_attention_heads and config.num_key_value_heads,
            "head_dim": config.head_dim * config.num_attention_heads != config.hidden_size and config.head_dim,
            "attention_bias": not config.attention_bias,
            "mlp_bias": not config.mlp_bias,
            "norm_bias": not config.norm_bias,
            "final_norm": not config.final_norm,
            "embedding_norm": config.embedding_norm,
            "scale_embeddings": config.scale_embeddings,
            "type_vocab_size": config.type_vocab_size,
        },
    )
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.max_position_embeddings,
        n_embd=config.hidden_size,
        n_layer=config.num_hidden_layers,
        n_head=config.num_attention_heads,
        n_inner=config.intermediate_size,
        activation_function=config.hidden_act,
        resid_pdrop=config.hidden_dropout,
        embd_pdrop=config.embedding_dropout,
        attn_pdrop=config.attention_dropout,
        layer_norm_epsilon=config.layer_norm_eps,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


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
    return load_exact(TfmDecoderForCausalLM(gpt2_config_to_tfm(model.config)), _contiguous(state))


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
    return load_exact(GPT2LMHeadModel(config), _contiguous(state))


def _contiguous(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.contiguous() for key, value in state.items()}
