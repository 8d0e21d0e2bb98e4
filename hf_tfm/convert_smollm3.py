"""Exact conversion between transformers' `SmolLM3ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

SmolLM3 is Llama with NoPE layers: `no_rope_layers[i] == 0` means layer i gets no position encoding, which is
hf_tfm's `nope_layers`. Its optional sliding window is `layer_types` and `sliding_window` as transformers has them
(by default the NoPE layers slide when `use_sliding_window` is set). The weights are Llama's.
"""

import copy

from transformers import SmolLM3Config, SmolLM3ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import (
    converted_config,
    head_dim_kwargs,
    implicit_head_dim,
    inverted,
    renamed_fields,
    renamed_model,
)
from .convert_llama import LLAMA_ARCHITECTURE, LLAMA_RENAMES, llama_family_names, llama_family_rope
from .modeling_tfm import TfmDecoderForCausalLM

# SmolLM3Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = llama_family_names("intermediate_size", "attention_bias", "mlp_bias", without=("head_dim",))


def _has_sliding_layers(config) -> bool:
    return "sliding_attention" in config.layer_types


def _one_rope(config) -> dict:
    """The RoPE dict of either side as SmolLM3 reads it: one for every layer. SmolLM3Config takes a dict nested per
    layer type (it has layer_types), but its model cannot be built from one."""
    rope = llama_family_rope(config)
    if rope and set(rope) <= {"full_attention", "sliding_attention"}:
        raise ValueError(
            f"Cannot convert {type(config).__name__} exactly: rope_parameters is nested per layer type "
            f"({sorted(rope)}), and SmolLM3 reads one RoPE dict for every layer"
        )
    return rope


def _to_tfm(config: SmolLM3Config) -> TfmDecoderConfig:
    layers = range(config.num_hidden_layers)
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **LLAMA_ARCHITECTURE,  # what SmolLM3 always is, in TfmConfig terms
        head_dim=implicit_head_dim(config),
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
        attention_dropout=float(config.attention_dropout),  # SmolLM3 allows an int 0
        rope_parameters=_one_rope(config),
        nope_layers=[i for i in layers if not config.no_rope_layers[i]] or None,
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window,
    )


def _to_smollm3(config: TfmDecoderConfig) -> SmolLM3Config:
    nope = set(config.nope_layers or ())
    return SmolLM3Config(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        **head_dim_kwargs(config),
        attention_dropout=config.attention_dropout,
        rope_parameters=_one_rope(config),
        no_rope_layers=[int(i not in nope) for i in range(config.num_hidden_layers)],
        layer_types=list(config.layer_types),
        # the attention reads the window only where use_sliding_window is set (flash attention; the masks of the
        # other backends slide on every sliding layer whatever it says)
        use_sliding_window=_has_sliding_layers(config),
        sliding_window=config.sliding_window,
    )


def smollm3_config_to_tfm(config: SmolLM3Config) -> TfmDecoderConfig:
    irrelevant = {"no_rope_layer_interval": "only fills no_rope_layers when that is not given; the model reads that"}
    if not _has_sliding_layers(config):
        irrelevant["use_sliding_window"] = "read only on sliding_attention layers, and layer_types has none"
    if len(config.no_rope_layers) > config.num_hidden_layers:  # entries past the last layer are never read
        config = copy.deepcopy(config)
        config.no_rope_layers = config.no_rope_layers[: config.num_hidden_layers]
    return converted_config(config, _to_tfm, _to_smollm3, irrelevant=irrelevant)


def tfm_config_to_smollm3(config: TfmDecoderConfig) -> SmolLM3Config:
    if config.nope_layers is not None:  # the same layers in the one form that comes back: sorted, [] as None
        config = copy.deepcopy(config)
        config.nope_layers = sorted(set(config.nope_layers)) or None
    return converted_config(config, _to_smollm3, _to_tfm)


def smollm3_to_tfm(model: SmolLM3ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert a `SmolLM3ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    return renamed_model(model, TfmDecoderForCausalLM(smollm3_config_to_tfm(model.config)), LLAMA_RENAMES)


def tfm_to_smollm3(model: TfmDecoderForCausalLM) -> SmolLM3ForCausalLM:
    """Convert a SmolLM3-shaped `TfmDecoderForCausalLM` back into a `SmolLM3ForCausalLM` with identical outputs."""
    return renamed_model(model, SmolLM3ForCausalLM(tfm_config_to_smollm3(model.config)), inverted(LLAMA_RENAMES))
