"""Exact conversion between transformers' `BartForConditionalGeneration` and hf_tfm's encoder-decoder, both ways.

BART in hf_tfm terms: learned positions looked up at `position + 2`, post-norm LayerNorm (eps 1e-5) with a norm after
the embeddings and none at the end, biases everywhere, a GELU MLP, and the LM head bias `final_logits_bias` ([1, V],
a buffer) as `lm_head.bias`. Weights are renamed only. BART's training-only regularizers without a counterpart
(`activation_dropout`, layerdrop) are not carried over; inference is exact.
"""

from transformers import BartConfig, BartForConditionalGeneration

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

# BartConfig field -> TfmEncoderDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "encoder_layers": "num_hidden_layers",
    "decoder_layers": "decoder_layers",
    "encoder_attention_heads": "num_attention_heads",
    "encoder_ffn_dim": "intermediate_size",
    "activation_function": "hidden_act",
    "max_position_embeddings": "max_position_embeddings",
    "scale_embedding": "scale_embeddings",
    "init_std": "initializer_range",
    "tie_word_embeddings": "tie_word_embeddings",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "decoder_start_token_id": "decoder_start_token_id",
}
# what BART always is, in TfmConfig terms
_BART_ARCHITECTURE = dict(
    position_embedding_type="learned",
    position_offset=2,
    norm_type="layernorm",
    norm_position="post",
    layer_norm_eps=1e-5,
    norm_bias=True,
    embedding_norm=True,
    final_norm=False,
    ffn_type="mlp",
    attention_bias=True,
    mlp_bias=True,
    lm_head_bias=True,
    scale_lm_head_input=False,
)
# per-layer module renames (BART -> hf_tfm); each carries a weight and a bias
_LAYER_NAMES = {
    **{f"self_attn.{p}_proj": f"self_attn.{p}_proj" for p in "qkv"},
    "self_attn.out_proj": "self_attn.o_proj",
    "self_attn_layer_norm": "attn_norm",
    "fc1": "mlp.up_proj",
    "fc2": "mlp.down_proj",
    "final_layer_norm": "ffn_norm",
}
_CROSS_NAMES = {
    **{f"encoder_attn.{p}_proj": f"cross_attn.{p}_proj" for p in "qkv"},
    "encoder_attn.out_proj": "cross_attn.o_proj",
    "encoder_attn_layer_norm": "cross_attn_norm",
}
_TOKEN_TABLE_COPIES = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]


# BartConfig fields a converted BartForConditionalGeneration computes the same outputs without
_IRRELEVANT = {
    **dict.fromkeys(
        ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop"),
        "a training-only regularizer hf_tfm has no counterpart for; inference is exact",
    ),
    "classifier_dropout": "read only by BART's classification head",
    **dict.fromkeys(
        ("add_bias_logits", "add_final_layer_norm", "classif_dropout", "normalize_before", "normalize_embedding"),
        "a transformers 4.x BartConfig key that transformers 5's BART never reads",
    ),
    "forced_eos_token_id": "a generation default, carried over by the model's generation_config",
}


def _to_tfm(config: BartConfig) -> TfmEncoderDecoderConfig:
    return TfmEncoderDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_BART_ARCHITECTURE,
        hidden_dropout=float(config.dropout),
        embedding_dropout=float(config.dropout),
        attention_dropout=float(config.attention_dropout),
    )


def _to_bart(config: TfmEncoderDecoderConfig) -> BartConfig:
    require_paradigm(config, TfmEncoderDecoderConfig, "BartConfig")
    return BartConfig(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        decoder_attention_heads=config.num_attention_heads,
        decoder_ffn_dim=config.intermediate_size,
        dropout=config.hidden_dropout,
        attention_dropout=config.attention_dropout,
        forced_eos_token_id=None,  # a generation default: carried by generation_config, not by TfmConfig
    )


def bart_config_to_tfm(config: BartConfig) -> TfmEncoderDecoderConfig:
    return converted_config(config, _to_tfm, _to_bart, irrelevant=_IRRELEVANT)


def tfm_config_to_bart(config: TfmEncoderDecoderConfig) -> BartConfig:
    return converted_config(config, _to_bart, _to_tfm)


def _key_pairs(encoder_layers: int, decoder_layers: int) -> list[tuple[str, str]]:
    """(BART key, hf_tfm key) for every tensor but the token-table copies and the LM head bias."""
    pairs = [("model.shared.weight", "model.shared.weight"), ("lm_head.weight", "lm_head.weight")]
    for stack, depth in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        stack = f"model.{stack}."
        pairs.append((f"{stack}embed_positions.weight", f"{stack}embed_positions.weight"))
        pairs += [(f"{stack}layernorm_embedding.{t}", f"{stack}embed_norm.{t}") for t in ("weight", "bias")]
        names = {**_LAYER_NAMES, **_CROSS_NAMES} if stack == "model.decoder." else _LAYER_NAMES
        for i in range(depth):
            layer = f"{stack}layers.{i}."
            pairs += [(f"{layer}{t}.{w}", f"{layer}{o}.{w}") for t, o in names.items() for w in ("weight", "bias")]
    return pairs


def bart_to_tfm(model: BartForConditionalGeneration) -> TfmEncoderDecoderForConditionalGeneration:
    """Convert a `BartForConditionalGeneration` into an hf_tfm encoder-decoder with identical outputs."""
    source = model.state_dict()
    require_one_token_table(source, "model.shared.weight", _TOKEN_TABLE_COPIES)
    config = bart_config_to_tfm(model.config)
    pairs = _key_pairs(config.num_hidden_layers, config.decoder_layers)
    state = {ours: source[theirs] for theirs, ours in pairs}
    state["lm_head.bias"] = source["final_logits_bias"][0]
    target = TfmEncoderDecoderForConditionalGeneration(config)
    return load_exact(target, state, generation_config=model.generation_config)


def tfm_to_bart(model: TfmEncoderDecoderForConditionalGeneration) -> BartForConditionalGeneration:
    """Convert a BART-shaped hf_tfm encoder-decoder back into a `BartForConditionalGeneration`, identical outputs."""
    config = tfm_config_to_bart(model.config)
    source = model.state_dict()
    pairs = _key_pairs(config.encoder_layers, config.decoder_layers)
    state = {theirs: source[ours] for theirs, ours in pairs}
    state.update(dict.fromkeys(_TOKEN_TABLE_COPIES, source["model.shared.weight"]))
    state["final_logits_bias"] = source["lm_head.bias"][None]
    return load_exact(BartForConditionalGeneration(config), state, generation_config=model.generation_config)
