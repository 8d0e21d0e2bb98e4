"""Exact conversion between transformers' `GPTNeoXForCausalLM` and `TfmDecoderForCausalLM`, both directions.

GPT-NeoX fuses q, k and v into one `query_key_value` projection whose output rows are interleaved per head
(`[heads, 3, head_dim]`: head 0's q, k, v, then head 1's...); hf_tfm keeps separate `q_proj`/`k_proj`/`v_proj`, so
the fused weight and bias are split on the way in and interleaved again on the way back. Its other options are
config data: `rotary_pct` is RoPE's `partial_rotary_factor`, `use_parallel_residual` is `parallel_residual`.
"""

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import converted_config, field_names, inverted, load_exact, renamed_fields
from .modeling_tfm import TfmDecoderForCausalLM

# GPTNeoXConfig field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = field_names(
    "intermediate_size", "hidden_act", "layer_norm_eps", "attention_bias", use_parallel_residual="parallel_residual"
)
# what GPT-NeoX always is, in TfmConfig terms: LayerNorm (with bias) before each sublayer, a plain biased MLP, RoPE
_GPT_NEOX_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="layernorm",
    norm_position="pre",
    ffn_type="mlp",
    mlp_bias=True,
)
_IRRELEVANT = {"classifier_dropout": "read only by GPTNeoXForTokenClassification, never by the causal LM"}

# per-layer names whose tensors are copied as they are (all but the fused query_key_value)
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "attention.dense": "self_attn.o_proj",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
}
_STACK_NAMES = {
    "gpt_neox.embed_in.weight": "model.embed_tokens.weight",
    "gpt_neox.final_layer_norm.weight": "model.norm.weight",
    "gpt_neox.final_layer_norm.bias": "model.norm.bias",
    "lm_head.weight": "lm_head.weight",
}


def _rope_to_tfm(rope: dict) -> dict:
    # GPTNeoXConfig fills in partial_rotary_factor=0.25 when it is absent; hf_tfm's absent means 1.0 (all rotated)
    rope = dict(rope)
    if rope.get("partial_rotary_factor") == 1.0:
        del rope["partial_rotary_factor"]
    return rope


def _rope_to_gpt_neox(rope: dict) -> dict:
    return {**rope, "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0)}


def _to_tfm(config: GPTNeoXConfig) -> TfmDecoderConfig:
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_GPT_NEOX_ARCHITECTURE,
        attention_out_bias=config.attention_bias,  # one flag for query_key_value and dense
        attention_dropout=float(config.attention_dropout),
        hidden_dropout=float(config.hidden_dropout),  # after each sublayer and on the embeddings
        embedding_dropout=float(config.hidden_dropout),
        rope_parameters=_rope_to_tfm(config.rope_parameters),
    )


def _to_gpt_neox(config: TfmDecoderConfig) -> GPTNeoXConfig:
    return GPTNeoXConfig(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        attention_dropout=config.attention_dropout,
        hidden_dropout=config.hidden_dropout,
        rope_parameters=_rope_to_gpt_neox(config.rope_parameters or {}),
    )


def gpt_neox_config_to_tfm(config: GPTNeoXConfig) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_gpt_neox, irrelevant=_IRRELEVANT)


def tfm_config_to_gpt_neox(config: TfmDecoderConfig) -> GPTNeoXConfig:
    return converted_config(config, _to_gpt_neox, _to_tfm)


def _split_qkv(fused: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`query_key_value` rows `[heads, 3, head_dim]` (weight, with a trailing input dim, or bias) -> q, k, v rows
    `[heads * head_dim]` each."""
    per_head = fused.reshape(heads, 3, -1, *fused.shape[1:])
    return tuple(per_head[:, i].reshape(-1, *fused.shape[1:]) for i in range(3))


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of `_split_qkv`."""
    per_head = [t.reshape(heads, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.stack(per_head, dim=1).reshape(-1, *q.shape[1:])


def _parameter_names(source: dict, prefix: str) -> list[str]:
    return [name for name in ("weight", "bias") if f"{prefix}.{name}" in source]


def gpt_neox_to_tfm(model: GPTNeoXForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `GPTNeoXForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    config = gpt_neox_config_to_tfm(model.config)
    source, heads = model.state_dict(), config.num_attention_heads
    state = {ours: source[theirs] for theirs, ours in _STACK_NAMES.items() if theirs in source}
    for i in range(config.num_hidden_layers):
        src, dst = f"gpt_neox.layers.{i}.", f"model.layers.{i}."
        for name in _parameter_names(source, src + "attention.query_key_value"):
            fused = source[f"{src}attention.query_key_value.{name}"]
            for projection, part in zip(("q_proj", "k_proj", "v_proj"), _split_qkv(fused, heads)):
                state[f"{dst}self_attn.{projection}.{name}"] = part
        for theirs, ours in _LAYER_NAMES.items():
            for name in _parameter_names(source, src + theirs):
                state[f"{dst}{ours}.{name}"] = source[f"{src}{theirs}.{name}"]
    return load_exact(TfmDecoderForCausalLM(config), state, generation_config=model.generation_config)


def tfm_to_gpt_neox(model: TfmDecoderForCausalLM) -> GPTNeoXForCausalLM:
    """Convert a GPT-NeoX-shaped `TfmDecoderForCausalLM` back into a `GPTNeoXForCausalLM` with identical outputs."""
    config = tfm_config_to_gpt_neox(model.config)
    source, heads = model.state_dict(), config.num_attention_heads
    state = {theirs: source[ours] for theirs, ours in _STACK_NAMES.items() if ours in source}
    for i in range(config.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"gpt_neox.layers.{i}."
        for name in _parameter_names(source, src + "self_attn.q_proj"):
            parts = [source[f"{src}self_attn.{projection}.{name}"] for projection in ("q_proj", "k_proj", "v_proj")]
            state[f"{dst}attention.query_key_value.{name}"] = _fuse_qkv(*parts, heads)
        for theirs, ours in _LAYER_NAMES.items():
            for name in _parameter_names(source, src + ours):
                state[f"{dst}{theirs}.{name}"] = source[f"{src}{ours}.{name}"]
    return load_exact(GPTNeoXForCausalLM(config), state, generation_config=model.generation_config)
