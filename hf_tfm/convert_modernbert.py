"""Exact conversion between transformers' `ModernBertModel` / `ModernBertForMaskedLM` and `TfmEncoderModel` /
`TfmEncoderForMaskedLM`, both directions.

ModernBERT is a pre-norm encoder with a LayerNorm after the token embeddings (no positions or token types there),
none before the first layer's attention (`first_layer_attn_norm=False`), a final norm, GeGLU feed-forwards and
RoPE with one theta for the global layers and another for the local ones (`rope_parameters` nested per layer type).
Its local layers see the keys at most `local_attention // 2` tokens away: `config.sliding_window`, which hf_tfm's
bidirectional `sliding_window` means too (both build the mask with `create_bidirectional_sliding_window_mask`).

Two weights are fused: `attn.Wqkv` holds q, k and v stacked (split on the way in, concatenated on the way back) and
`mlp.Wi` holds the activated half first and the multiplying half second (ModernBERT calls the second one the gate;
in hf_tfm they are `gate_proj`, which is activated, and `up_proj`).

The MLM head is dense, activation, norm and the tied decoder, as hf_tfm's. hf_tfm's head dense always has a bias and
applies `hidden_act`; ModernBERT's has a bias only with `classifier_bias` (off in the published checkpoints) and
applies `classifier_activation`. A missing dense bias is converted as a zero one (same logits), and a zero one goes
back as `classifier_bias=False`, so the round trip is exact; a `classifier_activation` other than
`hidden_activation` is refused.

Dropout sits elsewhere than in hf_tfm (ModernBERT drops the attention output with `attention_dropout` and the GLU
product with `mlp_dropout`; hf_tfm drops every sublayer output with `hidden_dropout`): only zero survives, other
values are refused by name. Not carried over: `padding_idx` of the token embeddings (it only zeroes that row's
gradient).
"""

import copy
import dataclasses

import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM, ModernBertModel

from .configuration_tfm import TfmEncoderConfig
from .convert_common import converted_config, field_names, inverted, load_exact, renamed_fields, renamed_modules
from .modeling_tfm import TfmEncoderForMaskedLM, TfmEncoderModel

# ModernBertConfig field -> TfmEncoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = field_names(
    "intermediate_size",
    "norm_bias",
    "mlp_bias",
    "attention_bias",
    hidden_activation="hidden_act",
    norm_eps="layer_norm_eps",
)
# what ModernBERT always is, in TfmConfig terms
_MODERNBERT_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="layernorm",
    norm_position="pre",
    first_layer_attn_norm=False,
    embedding_norm=True,
    final_norm=True,
    ffn_type="glu",
    type_vocab_size=0,
    use_pooler=False,
)
# fields no ModernBertModel or ModernBertForMaskedLM reads, with the reason
_IRRELEVANT = {
    "classifier_pooling": "read only by ModernBertForSequenceClassification",
    "classifier_dropout": "read only by the classification, token-classification and QA heads",
    "deterministic_flash_attn": "picks flash attention's deterministic kernel; the values are the same",
    "cls_token_id": "a tokenizer id; no ModernBERT class reads it (it goes back as bos_token_id, its default)",
    "classifier_bias": "a missing dense bias of the MLM head is converted as zeros, which give the same logits",
}
_MODERNBERT_FIELDS = {field.name for field in dataclasses.fields(ModernBertConfig)} | {"model_type"}


def _require_full_rotary(rope: dict, config) -> None:
    """ModernBERT's default RoPE ignores `partial_rotary_factor` (and its other types fail on it): hf_tfm would
    rotate fewer features."""
    factors = [kind.get("partial_rotary_factor", 1.0) for kind in rope.values()]
    if any(factor != 1.0 for factor in factors):
        raise ValueError(
            f"Cannot convert {type(config).__name__} exactly: rope_parameters has partial_rotary_factor "
            f"{factors}, but ModernBERT rotates every feature of a head"
        )


def _rope_to_tfm(rope: dict) -> dict:
    """ModernBERT's per-layer-type RoPE dicts; one flat dict when they agree (what a flat hf_tfm config means)."""
    kinds = list(rope.values())
    return copy.deepcopy(kinds[0] if all(kind == kinds[0] for kind in kinds) else rope)


def _to_tfm(config: ModernBertConfig) -> TfmEncoderConfig:
    _require_full_rotary(config.rope_parameters, config)
    sliding = "sliding_attention" in config.layer_types
    # attention_dropout and mlp_dropout have no counterpart (see above): they come back as 0, so only 0 converts
    return TfmEncoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_MODERNBERT_ARCHITECTURE,
        attention_out_bias=config.attention_bias,  # one flag for Wqkv and Wo
        embedding_dropout=float(config.embedding_dropout),
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window if sliding else None,  # local_attention // 2
        rope_parameters=_rope_to_tfm(config.rope_parameters),
        sep_token_id=config.sep_token_id,  # not a TfmConfig field, but a PreTrainedConfig key it keeps
    )


def _to_modernbert(config: TfmEncoderConfig) -> ModernBertConfig:
    rope = copy.deepcopy(config.rope_parameters or {})
    if not config.nested_rope():  # one dict for every layer type
        rope = {kind: dict(rope) for kind in ("full_attention", "sliding_attention")}
    _require_full_rotary(rope, config)
    window = {} if config.sliding_window is None else {"local_attention": 2 * config.sliding_window}
    return ModernBertConfig(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        **window,
        embedding_dropout=config.embedding_dropout,
        layer_types=list(config.layer_types),
        rope_parameters=rope,
        classifier_activation=config.hidden_act,  # hf_tfm's MLM head applies hidden_act
        classifier_bias=True,  # hf_tfm's MLM head dense has a bias (tfm_to_modernbert drops a zero one)
        cls_token_id=config.bos_token_id,
        sep_token_id=getattr(config, "sep_token_id", None),
    )


def modernbert_config_to_tfm(config: ModernBertConfig) -> TfmEncoderConfig:
    irrelevant = dict(_IRRELEVANT)
    if "sliding_attention" not in config.layer_types:
        irrelevant["local_attention"] = "read only by sliding_attention layers, and there are none"
    if not config.sparse_prediction:
        irrelevant["sparse_pred_ignore_index"] = "read only with sparse_prediction=True"
    # keys a config.json carries that are no ModernBertConfig field (global_attn_every_n_layers, which filled
    # layer_types; position_embedding_type and others the Hub's files hold): nothing else reads them
    for key in config.to_dict().keys() - _MODERNBERT_FIELDS:
        irrelevant.setdefault(key, "not a ModernBertConfig field: no ModernBERT class reads it")
    return converted_config(config, _to_tfm, _to_modernbert, irrelevant)


def tfm_config_to_modernbert(config: TfmEncoderConfig) -> ModernBertConfig:
    return converted_config(config, _to_modernbert, _to_tfm)


def _layer_names(i: int) -> dict[str, str]:
    """ModernBERT module -> our module, in layer i (the fused Wqkv and Wi are split separately)."""
    names = {"attn.Wo": "self_attn.o_proj", "mlp_norm": "ffn_norm", "mlp.Wo": "mlp.down_proj"}
    if i > 0:  # layer 0 has no attention norm (the embeddings are normed)
        names["attn_norm"] = "attn_norm"
    return {f"layers.{i}.{theirs}": f"layers.{i}.{ours}" for theirs, ours in names.items()}


# fused ModernBERT module -> our modules, in the order their rows are stacked
_FUSED = {
    "attn.Wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.Wi": ("mlp.gate_proj", "mlp.up_proj"),
}
_HEAD_NAMES = {"head.dense": "lm_head.dense", "head.norm": "lm_head.norm", "decoder": "lm_head.decoder"}


def _module_names(num_layers: int, mlm: bool) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Every ModernBERT module holding weights -> our module (and each fused one -> our modules), with each side's
    prefix for the model class."""
    theirs, ours = ("model.", "model.") if mlm else ("", "")
    names = {"embeddings.tok_embeddings": "embed_tokens", "embeddings.norm": "embed_norm", "final_norm": "norm"}
    fused = {}
    for i in range(num_layers):
        names.update(_layer_names(i))
        fused.update({f"layers.{i}.{f}": tuple(f"layers.{i}.{part}" for part in parts) for f, parts in _FUSED.items()})
    names = {theirs + source: ours + target for source, target in names.items()}
    fused = {theirs + source: tuple(ours + part for part in parts) for source, parts in fused.items()}
    if mlm:
        names.update(_HEAD_NAMES)
    return names, fused


def _split(source: dict, fused: dict[str, tuple[str, ...]]) -> dict:
    """Each fused weight (and bias) cut into its parts, row blocks of equal size in the order `fused` lists them."""
    state = {}
    for whole, parts in fused.items():
        for suffix in (".weight", ".bias"):
            if whole + suffix in source:
                chunks = source[whole + suffix].chunk(len(parts), dim=0)
                state.update({part + suffix: chunk for part, chunk in zip(parts, chunks, strict=True)})
    return state


def _fused(source: dict, fused: dict[str, tuple[str, ...]]) -> dict:
    """The inverse of `_split`: the parts concatenated back into each fused weight (and bias)."""
    state = {}
    for whole, parts in fused.items():
        for suffix in (".weight", ".bias"):
            if parts[0] + suffix in source:
                state[whole + suffix] = torch.cat([source[part + suffix] for part in parts], dim=0)
    return state


def modernbert_to_tfm(model: ModernBertModel | ModernBertForMaskedLM) -> TfmEncoderModel | TfmEncoderForMaskedLM:
    """Convert a `ModernBertModel` (-> `TfmEncoderModel`) or `ModernBertForMaskedLM` (-> `TfmEncoderForMaskedLM`)
    with identical outputs."""
    mlm = isinstance(model, ModernBertForMaskedLM)
    if not mlm and not isinstance(model, ModernBertModel):
        raise TypeError(
            f"modernbert_to_tfm converts ModernBertModel or ModernBertForMaskedLM, got {type(model).__name__}"
        )
    config = modernbert_config_to_tfm(model.config)
    names, fused = _module_names(config.num_hidden_layers, mlm)
    source = model.state_dict()
    state = renamed_modules(source, names) | _split(source, fused)
    if mlm and not model.config.classifier_bias:  # hf_tfm's head dense has a bias: zero computes the same
        state["lm_head.dense.bias"] = torch.zeros_like(model.head.norm.weight)
    target = TfmEncoderForMaskedLM(config) if mlm else TfmEncoderModel(config)
    return load_exact(target, state)


def tfm_to_modernbert(model: TfmEncoderModel | TfmEncoderForMaskedLM) -> ModernBertModel | ModernBertForMaskedLM:
    """Convert a ModernBERT-shaped `TfmEncoderModel` (-> `ModernBertModel`) or `TfmEncoderForMaskedLM`
    (-> `ModernBertForMaskedLM`) back, with identical outputs."""
    mlm = isinstance(model, TfmEncoderForMaskedLM)
    if not mlm and not isinstance(model, TfmEncoderModel):
        raise TypeError(
            f"tfm_to_modernbert converts TfmEncoderModel or TfmEncoderForMaskedLM, got {type(model).__name__}"
        )
    source = model.state_dict()
    tfm_config = model.config
    if mlm or model.pooler is None:  # use_pooler says nothing about a model without a pooler (MLM heads build none)
        tfm_config = copy.deepcopy(tfm_config)
        tfm_config.use_pooler = False
    config = tfm_config_to_modernbert(tfm_config)
    names, fused = _module_names(config.num_hidden_layers, mlm)
    state = renamed_modules(source, inverted(names)) | _fused(source, fused)
    if mlm and not source["lm_head.dense.bias"].any():  # ModernBERT's own layout: no dense bias
        config.classifier_bias = False
        del state["head.dense.bias"]
    target = ModernBertForMaskedLM(config) if mlm else ModernBertModel(config)
    return load_exact(target, state)
