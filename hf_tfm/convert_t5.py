"""Exact conversion between transformers' `T5ForConditionalGeneration` and hf_tfm's encoder-decoder, both ways.

T5 in hf_tfm terms: T5's relative position bias (kept by T5 in block 0's self-attention of each stack, by us on the
stack), pre-norm RMSNorm with a final norm, no biases, unscaled attention scores (`attention_multiplier=1.0`),
`head_dim = d_kv`, a ReLU MLP (T5 v1.0) or a gated GELU (v1.1, `wi_0` = gate, `wi_1` = up).

Ties and scaling are two facts in transformers 5.23: `T5Config` always says `tie_word_embeddings=True`, keeps the
saved flag as `scale_decoder_outputs` (v1.0 rescales the LM head input, v1.1 does not), and a v1.1 checkpoint is
untied only because its `lm_head` differs from `shared` when loaded. So tying is read from the model's tensors and
scaling from `scale_decoder_outputs`. Every linear layer matches, so weights are renamed only; training-only dropout
placement differs slightly (T5 also drops inside the FFN and after the final norm).
"""

import copy

import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from .configuration_tfm import TfmEncoderDecoderConfig
from .convert_common import (
    converted_config,
    inverted,
    load_exact,
    renamed_fields,
    require_one_token_table,
    require_paradigm,
)
from .modeling_tfm import TfmEncoderDecoderForConditionalGeneration

# T5Config field -> TfmEncoderDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_kv": "head_dim",
    "d_ff": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_decoder_layers": "decoder_layers",
    "num_heads": "num_attention_heads",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "layer_norm_epsilon": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "eos_token_id": "eos_token_id",
}
# what T5 always is, in TfmConfig terms
_T5_ARCHITECTURE = dict(
    position_embedding_type="relative_bias",
    norm_type="rmsnorm",
    norm_position="pre",
    final_norm=True,
    embedding_norm=False,
    scale_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    attention_multiplier=1.0,
    lm_head_bias=False,
)


# fields of one side the other cannot hold and a converted T5ForConditionalGeneration never needs
_T5_IRRELEVANT = {
    "initializer_factor": "read only to initialise weights; converted weights are given",
    "classifier_dropout": "read only by T5's classification heads",
    "n_positions": "a transformers 4.x T5Config key that transformers 5's T5 never reads (no position table)",
}
_TFM_IRRELEVANT = {"initializer_range": "read only to initialise weights; converted weights are given"}


def _to_tfm(config: T5Config, tie_word_embeddings: bool | None = None) -> TfmEncoderDecoderConfig:
    return TfmEncoderDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_T5_ARCHITECTURE,
        ffn_type="glu" if config.is_gated_act else "mlp",
        hidden_act=config.dense_act_fn,
        scale_lm_head_input=config.scale_decoder_outputs,
        **dict.fromkeys(("hidden_dropout", "attention_dropout", "embedding_dropout"), float(config.dropout_rate)),
        tie_word_embeddings=config.scale_decoder_outputs if tie_word_embeddings is None else tie_word_embeddings,
        bos_token_id=getattr(config, "bos_token_id", None),
        decoder_start_token_id=getattr(config, "decoder_start_token_id", None),
    )


def _to_t5(config: TfmEncoderDecoderConfig) -> T5Config:
    require_paradigm(config, TfmEncoderDecoderConfig, "T5Config")
    gated = config.ffn_type == "glu"
    # T5 spells the GELU-tanh gate "gated-gelu"; every other activation by its own name (a GELU gate comes back as
    # GELU-tanh and is refused by name)
    activation = "gelu" if gated and config.hidden_act == "gelu_new" else config.hidden_act
    return T5Config(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        bos_token_id=config.bos_token_id,
        feed_forward_proj=f"gated-{activation}" if gated else activation,
        dropout_rate=config.hidden_dropout,
        tie_word_embeddings=config.scale_lm_head_input,  # T5Config stores it as scale_decoder_outputs
        decoder_start_token_id=config.decoder_start_token_id,
    )


def t5_config_to_tfm(config: T5Config, tie_word_embeddings: bool | None = None) -> TfmEncoderDecoderConfig:
    """`tie_word_embeddings` defaults to the saved flag (`scale_decoder_outputs`): tied v1.0, untied v1.1."""
    if getattr(config, "decoder_start_token_id", None) is None:  # T5 starts decoding with pad
        config = copy.deepcopy(config)
        config.decoder_start_token_id = config.pad_token_id
    return converted_config(config, lambda t5: _to_tfm(t5, tie_word_embeddings), _to_t5, irrelevant=_T5_IRRELEVANT)


def tfm_config_to_t5(config: TfmEncoderDecoderConfig) -> T5Config:
    # T5Config cannot hold the tie (see the module docstring): the converted model's tensors carry it
    return converted_config(
        config, _to_t5, lambda t5: _to_tfm(t5, config.tie_word_embeddings), irrelevant=_TFM_IRRELEVANT
    )


def _key_pairs(num_layers: int, num_decoder_layers: int, gated: bool) -> list[tuple[str, str]]:
    """(T5 key, hf_tfm key) for every tensor but the token-table copies, in both directions."""
    pairs = [("shared.weight", "model.shared.weight"), ("lm_head.weight", "lm_head.weight")]
    mlp = (
        {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"} if gated else {"wi": "up_proj", "wo": "down_proj"}
    )
    for stack, depth in (("encoder", num_layers), ("decoder", num_decoder_layers)):
        bias = "relative_attention_bias.weight"
        pairs += [
            (f"{stack}.block.0.layer.0.SelfAttention.{bias}", f"model.{stack}.position_bias.{bias}"),
            (f"{stack}.final_layer_norm.weight", f"model.{stack}.norm.weight"),
        ]
        sublayers = [("SelfAttention", "self_attn", "attn_norm")]
        if stack == "decoder":
            sublayers.append(("EncDecAttention", "cross_attn", "cross_attn_norm"))
        for i in range(depth):
            src, dst = f"{stack}.block.{i}.layer.", f"model.{stack}.layers.{i}."
            for j, (theirs, ours, norm) in enumerate(sublayers):
                pairs += [(f"{src}{j}.{theirs}.{p}.weight", f"{dst}{ours}.{p}_proj.weight") for p in "qkvo"]
                pairs.append((f"{src}{j}.layer_norm.weight", f"{dst}{norm}.weight"))
            ff = len(sublayers)
            pairs += [(f"{src}{ff}.DenseReluDense.{t}.weight", f"{dst}mlp.{o}.weight") for t, o in mlp.items()]
            pairs.append((f"{src}{ff}.layer_norm.weight", f"{dst}ffn_norm.weight"))
    return pairs


def t5_to_tfm(model: T5ForConditionalGeneration) -> TfmEncoderDecoderForConditionalGeneration:
    """Convert a `T5ForConditionalGeneration` into an hf_tfm encoder-decoder with identical outputs."""
    source = model.state_dict()
    require_one_token_table(source, "shared.weight", ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"])
    config = t5_config_to_tfm(model.config, tie_word_embeddings=model.lm_head.weight is model.shared.weight)
    pairs = _key_pairs(config.num_hidden_layers, config.decoder_layers, config.ffn_type == "glu")
    state = {ours: source[theirs] for theirs, ours in pairs}
    target = TfmEncoderDecoderForConditionalGeneration(config)
    return load_exact(target, state, generation_config=model.generation_config)


def tfm_to_t5(model: TfmEncoderDecoderForConditionalGeneration) -> T5ForConditionalGeneration:
    """Convert a T5-shaped hf_tfm encoder-decoder back into a `T5ForConditionalGeneration` with identical outputs."""
    config = tfm_config_to_t5(model.config)
    source = model.state_dict()
    pairs = _key_pairs(config.num_layers, config.num_decoder_layers, config.is_gated_act)
    state = {theirs: source[ours] for theirs, ours in pairs}
    state["encoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] = source["model.shared.weight"]
    target = T5ForConditionalGeneration(config)  # ties lm_head to shared, whatever the config says
    if not model.config.tie_word_embeddings:  # untie, as from_pretrained does for a checkpoint with its own lm_head
        target.lm_head.weight = nn.Parameter(torch.empty_like(target.lm_head.weight))
        target.all_tied_weights_keys.pop("lm_head.weight", None)
    return load_exact(target, state, tie=False, generation_config=model.generation_config)
