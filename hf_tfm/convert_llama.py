"""Exact conversion between transformers' `LlamaForCausalLM` and `TfmDecoderForCausalLM`, both directions.

The layouts agree except for the two per-layer norm names, so conversion is a rename plus a config mapping.
"""

from transformers import LlamaConfig, LlamaForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import LLAMA_FAMILY_STACK, load_exact, renamed_fields, renamed_keys, require_compatible
from .modeling_tfm import TfmDecoderForCausalLM

LLAMA_RENAMES = {".input_layernorm.": ".attn_norm.", ".post_attention_layernorm.": ".ffn_norm."}


# LlamaConfig field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = {
    name: name
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "hidden_act",
        "mlp_bias",
        "attention_bias",
        "max_position_embeddings",
        "tie_word_embeddings",
        "initializer_range",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
} | {"rms_norm_eps": "layer_norm_eps"}
# what Llama always is, in TfmConfig terms
LLAMA_ARCHITECTURE = dict(position_embedding_type="rope", norm_type="rmsnorm", norm_position="pre", ffn_type="glu")


def llama_config_to_tfm(config: LlamaConfig) -> TfmDecoderConfig:
    require_compatible(config, "TfmDecoderConfig", {}, unsupported={"pretraining_tp": config.pretraining_tp not in (None, 1)})
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **LLAMA_ARCHITECTURE,
        rope_parameters=dict(config.rope_parameters),
        attention_dropout=float(config.attention_dropout),  # Llama allows an int 0
    )


def tfm_config_to_llama(config: TfmDecoderConfig) -> LlamaConfig:
    require_compatible(
        config,
        "LlamaConfig",
        {
            **LLAMA_ARCHITECTURE,
            **LLAMA_FAMILY_STACK,
        },
        unsupported={"mlp_bias": config.mlp_bias != config.attention_bias},  # Llama may set them apart; one flag each
    )
    names = {ours: theirs for theirs, ours in _CONFIG_NAMES.items()}
    return LlamaConfig(
        **renamed_fields(config, names),
        rope_parameters=dict(config.rope_parameters),
        attention_dropout=config.attention_dropout,
    )


def llama_to_tfm(model: LlamaForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `LlamaForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    target = TfmDecoderForCausalLM(llama_config_to_tfm(model.config))
    return load_exact(target, renamed_keys(model.state_dict(), LLAMA_RENAMES))


def tfm_to_llama(model: TfmDecoderForCausalLM) -> LlamaForCausalLM:
    """Convert a Llama-shaped `TfmDecoderForCausalLM` back into a `LlamaForCausalLM` with identical outputs."""
    target = LlamaForCausalLM(tfm_config_to_llama(model.config))
    return load_exact(target, renamed_keys(model.state_dict(), {new: old for old, new in LLAMA_RENAMES.items()}))
