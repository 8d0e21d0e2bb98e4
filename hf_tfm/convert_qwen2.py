"""Exact conversion between transformers' `Qwen2ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

Qwen2 is Mistral with biases on the query, key and value projections but none on the output projection
(`attention_bias=True, attention_out_bias=False`), and its window on the layers `layer_types` marks sliding
(`use_sliding_window` switches the window on; `max_window_layers` only fills `layer_types` when a config has none).
It has no `head_dim` field: its attention reads `head_dim` if a config carries one, else `hidden_size // heads`.
The weights have Llama's names. The window mapping serves `convert_qwen3` too.
"""

from transformers import Qwen2Config, Qwen2ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    converted_config,
    head_dim_kwargs,
    implicit_head_dim,
    inverted,
    renamed_model,
    without_derived_head_dim,
)
from .convert_llama import (
    LLAMA_ARCHITECTURE,
    LLAMA_RENAMES,
    llama_family_config_to_tfm,
    llama_family_names,
    tfm_config_to_llama_family,
)
from .modeling_tfm import TfmDecoderForCausalLM

# Qwen2Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", without=("head_dim",))
# what Qwen2 always is, in TfmConfig terms
_QWEN2_ARCHITECTURE = dict(**LLAMA_ARCHITECTURE, attention_bias=True, attention_out_bias=False, mlp_bias=False)
# keys of released Qwen config.json files that no Qwen text model reads once its config exists
QWEN_UNREAD = {
    "max_window_layers": "Qwen2 and Qwen3 read it only to fill layer_types when a config has none (the converted "
    "layer_types carry it); Qwen3-MoE never reads it, though its released configs carry it",
    "use_mrope": "Qwen2-VL's multimodal RoPE switch, which released Qwen2.5 configs carry as false",
}


def window_to_tfm(config) -> dict:
    """hf_tfm's window fields from a Qwen2-style config (`sliding_window` is None unless `use_sliding_window`)."""
    return dict(sliding_window=config.sliding_window, layer_types=list(config.layer_types))


def window_from_tfm(config: TfmDecoderConfig) -> dict:
    """Qwen2's window fields from hf_tfm's. `max_window_layers` is written as the first sliding layer (Qwen2's
    pattern: full layers, then sliding ones) for readers of config.json; `layer_types` decides."""
    types = config.layer_types
    return dict(
        use_sliding_window=config.sliding_window is not None,
        sliding_window=config.sliding_window,
        max_window_layers=types.index("sliding_attention") if "sliding_attention" in types else len(types),
        layer_types=list(types),
    )


def _to_tfm(config: Qwen2Config) -> TfmDecoderConfig:
    return llama_family_config_to_tfm(
        config, _CONFIG_NAMES, _QWEN2_ARCHITECTURE, head_dim=implicit_head_dim(config), **window_to_tfm(config)
    )


def _to_qwen2(config: TfmDecoderConfig) -> Qwen2Config:
    return tfm_config_to_llama_family(
        config, Qwen2Config, _CONFIG_NAMES, **head_dim_kwargs(config), **window_from_tfm(config)
    )


def qwen2_config_to_tfm(config: Qwen2Config) -> TfmDecoderConfig:
    return converted_config(without_derived_head_dim(config), _to_tfm, _to_qwen2, irrelevant=QWEN_UNREAD)


def tfm_config_to_qwen2(config: TfmDecoderConfig) -> Qwen2Config:
    return converted_config(config, _to_qwen2, _to_tfm)


def qwen2_to_tfm(model: Qwen2ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `Qwen2ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(qwen2_config_to_tfm(model.config)), LLAMA_RENAMES)


def tfm_to_qwen2(model: TfmDecoderForCausalLM) -> Qwen2ForCausalLM:
    """Convert a Qwen2-shaped `TfmDecoderForCausalLM` back into a `Qwen2ForCausalLM` with identical outputs."""
    return renamed_model(model, Qwen2ForCausalLM(tfm_config_to_qwen2(model.config)), inverted(LLAMA_RENAMES))
