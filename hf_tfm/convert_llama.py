"""Exact conversion between transformers' `LlamaForCausalLM` and `TfmDecoderForCausalLM`, both directions.

The layouts agree except for the two per-layer norm names, so conversion is a rename plus a config mapping.
"""

from transformers import LlamaConfig, LlamaForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import load_exact, require_compatible
from .modeling_tfm import TfmDecoderForCausalLM

_RENAMES = {".input_layernorm.": ".attn_norm.", ".post_attention_layernorm.": ".ffn_norm."}


def llama_config_to_tfm(config: LlamaConfig) -> TfmDecoderConfig:
    require_compatible("LlamaConfig", "TfmDecoderConfig", {"pretraining_tp": config.pretraining_tp not in (None, 1)})
    return TfmDecoderConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        ffn_type="glu",
        mlp_bias=config.mlp_bias,
        attention_bias=config.attention_bias,
        position_embedding_type="rope",
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=dict(config.rope_parameters),
        norm_type="rmsnorm",
        norm_position="pre",
        layer_norm_eps=config.rms_norm_eps,
        attention_dropout=float(config.attention_dropout),
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def tfm_config_to_llama(config: TfmDecoderConfig) -> LlamaConfig:
    require_compatible(
        "TfmDecoderConfig",
        "LlamaConfig",
        {
            "position_embedding_type": config.position_embedding_type != "rope" and config.position_embedding_type,
            "norm_type": config.norm_type != "rmsnorm" and config.norm_type,
            "norm_position": config.norm_position != "pre" and config.norm_position,
            "ffn_type": config.ffn_type != "glu" and config.ffn_type,
            "attention_bias/mlp_bias": config.attention_bias != config.mlp_bias and "differ",
            "final_norm": not config.final_norm,
            "embedding_norm": config.embedding_norm,
            "scale_embeddings": config.scale_embeddings,
            "type_vocab_size": config.type_vocab_size,
            "embedding_dropout": config.embedding_dropout,
            "hidden_dropout": config.hidden_dropout,
        },
    )
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        mlp_bias=config.mlp_bias,
        attention_bias=config.attention_bias,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=dict(config.rope_parameters),
        rms_norm_eps=config.layer_norm_eps,
        attention_dropout=config.attention_dropout,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def _rename(state, renames):
    renamed = {}
    for key, value in state.items():
        for old, new in renames.items():
            key = key.replace(old, new)
        renamed[key] = value
    return renamed


def llama_to_tfm(model: LlamaForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `LlamaForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    target = TfmDecoderForCausalLM(llama_config_to_tfm(model.config))
    return load_exact(target, _rename(model.state_dict(), _RENAMES))


def tfm_to_llama(model: TfmDecoderForCausalLM) -> LlamaForCausalLM:
    """Convert a Llama-shaped `TfmDecoderForCausalLM` back into a `LlamaForCausalLM` with identical outputs."""
    target = LlamaForCausalLM(tfm_config_to_llama(model.config))
    return load_exact(target, _rename(model.state_dict(), {new: old for old, new in _RENAMES.items()}))
