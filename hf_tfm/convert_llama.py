"""Exact conversion between transformers' `LlamaForCausalLM` and `TfmDecoderForCausalLM`, both directions.

The layouts agree except for the two per-layer norm names, so conversion is a rename plus a config mapping. The
Llama-family pieces (names, architecture, the two config mappings) serve `convert_mixtral` too.
"""

from transformers import LlamaConfig, LlamaForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    LLAMA_FAMILY_STACK,
    converted_config,
    field_names,
    inverted,
    renamed_fields,
    renamed_model,
)
from .modeling_tfm import TfmDecoderForCausalLM

LLAMA_RENAMES = {".input_layernorm.": ".attn_norm.", ".post_attention_layernorm.": ".ffn_norm."}

# Llama-family config field -> TfmDecoderConfig field, for the fields every Llama-shaped decoder has
LLAMA_FAMILY_NAMES = field_names("num_key_value_heads", "head_dim", "hidden_act", rms_norm_eps="layer_norm_eps")
# Llama's attention_bias covers q, k, v and o: hf_tfm's attention_out_bias defaults to it
_CONFIG_NAMES = LLAMA_FAMILY_NAMES | {name: name for name in ("intermediate_size", "mlp_bias", "attention_bias")}
# what Llama always is, in TfmConfig terms
LLAMA_ARCHITECTURE = dict(
    position_embedding_type="rope", norm_type="rmsnorm", norm_position="pre", ffn_type="glu", **LLAMA_FAMILY_STACK
)
_IRRELEVANT = {"pretraining_tp": "transformers 5's Llama never reads it (a 4.x way of computing the same layers)"}


def llama_family_names(*same: str, without: tuple[str, ...] = (), **renamed: str) -> dict[str, str]:
    """A Llama-family converter's field table: `LLAMA_FAMILY_NAMES` less the fields in `without`, plus `same` (one
    name on both sides) and `renamed` (`source_name="target_name"`)."""
    kept = {theirs: ours for theirs, ours in LLAMA_FAMILY_NAMES.items() if theirs not in without}
    return kept | {name: name for name in same} | renamed


def llama_family_rope(config) -> dict:
    """The RoPE dict of either side as a Llama-family model reads it: every feature of a head is rotated, so a
    `partial_rotary_factor` is left behind (and the round trip names `rope_parameters`)."""
    return {key: value for key, value in (config.rope_parameters or {}).items() if key != "partial_rotary_factor"}


def llama_family_config_to_tfm(config, names: dict[str, str], architecture: dict, **fields) -> TfmDecoderConfig:
    """A Llama-family config (`names` its field table, `architecture` what it always is) as a `TfmDecoderConfig`."""
    return TfmDecoderConfig(
        **renamed_fields(config, names),
        **architecture,
        **fields,
        rope_parameters=llama_family_rope(config),
        attention_dropout=float(config.attention_dropout),  # Llama allows an int 0
    )


def tfm_config_to_llama_family(config: TfmDecoderConfig, config_class, names: dict[str, str], **fields):
    """The inverse mapping of `llama_family_config_to_tfm`, to `config_class`."""
    return config_class(
        **renamed_fields(config, inverted(names)),
        **fields,
        rope_parameters=llama_family_rope(config),
        attention_dropout=config.attention_dropout,
    )


def _to_tfm(config: LlamaConfig) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(config, _CONFIG_NAMES, LLAMA_ARCHITECTURE)


def _to_llama(config: TfmDecoderConfig) -> LlamaConfig:
    return tfm_config_to_llama_family(config, LlamaConfig, _CONFIG_NAMES)


def llama_config_to_tfm(config: LlamaConfig) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_llama, irrelevant=_IRRELEVANT)


def tfm_config_to_llama(config: TfmDecoderConfig) -> LlamaConfig:
    return converted_config(config, _to_llama, _to_tfm)


def llama_to_tfm(model: LlamaForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `LlamaForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(llama_config_to_tfm(model.config)), LLAMA_RENAMES)


def tfm_to_llama(model: TfmDecoderForCausalLM) -> LlamaForCausalLM:
    """Convert a Llama-shaped `TfmDecoderForCausalLM` back into a `LlamaForCausalLM` with identical outputs."""
    return renamed_model(model, LlamaForCausalLM(tfm_config_to_llama(model.config)), inverted(LLAMA_RENAMES))
