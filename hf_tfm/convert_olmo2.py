"""Exact conversion between transformers' `Olmo2ForCausalLM` and `TfmDecoderForCausalLM`, both directions.

OLMo2 is a Llama-shaped decoder with two differences, both config data in hf_tfm: its norms sit on the sublayer
outputs, `x + norm(f(x))` (`norm_position="output"`: no input norms), and an RMSNorm over the whole query and the
whole key projection before the split into heads (`qk_norm="projection"`). The weights differ only in the two
per-layer norm names. In half precision OLMo2 rounds in two places where hf_tfm (as Llama) does not: its RMSNorm
multiplies by the weight before casting back to the input dtype, and it applies RoPE in float32 with float32
cos/sin before casting back. The same numbers in float32; in bfloat16 the logits differ by rounding.
"""

from transformers import Olmo2Config, Olmo2ForCausalLM

from .configuration_tfm import TfmDecoderConfig
from .convert_common import LLAMA_FAMILY_STACK, converted_config, inverted, load_exact, renamed_fields, renamed_keys
from .convert_llama import llama_family_rope
from .modeling_tfm import TfmDecoderForCausalLM

_RENAMES = {".post_attention_layernorm.": ".post_attn_norm.", ".post_feedforward_layernorm.": ".post_ffn_norm."}

# Olmo2Config field -> TfmDecoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = {
    name: name
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_act",
        "max_position_embeddings",
        "initializer_range",
        "tie_word_embeddings",
        "attention_bias",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
} | {"rms_norm_eps": "layer_norm_eps"}
# what OLMo2 always is, in TfmConfig terms
_OLMO2_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="rmsnorm",
    norm_position="output",
    qk_norm="projection",
    ffn_type="glu",
    mlp_bias=False,
    **LLAMA_FAMILY_STACK,
)


def implicit_head_dim(config) -> int:
    """The head width of a reference config without a `head_dim` field (OLMo2, SmolLM3, Phi-3): its modeling code
    reads `getattr(config, "head_dim", hidden_size // num_attention_heads)`, so an extra `head_dim` key counts."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def head_dim_kwargs(config: TfmDecoderConfig) -> dict:
    """`head_dim` for such a reference config: passed only when it is not the one derived from the widths, so a
    config.json written back has no key the original did not have."""
    derived = config.hidden_size // config.num_attention_heads
    return {} if config.head_dim == derived else {"head_dim": config.head_dim}


def _to_tfm(config: Olmo2Config) -> TfmDecoderConfig:
    return TfmDecoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_OLMO2_ARCHITECTURE,
        head_dim=implicit_head_dim(config),
        attention_out_bias=config.attention_bias,  # one flag for q, k, v and o
        attention_dropout=float(config.attention_dropout),  # OLMo2 allows an int 0
        rope_parameters=llama_family_rope(config),
    )


def _to_olmo2(config: TfmDecoderConfig) -> Olmo2Config:
    return Olmo2Config(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        **head_dim_kwargs(config),
        attention_dropout=config.attention_dropout,
        rope_parameters=llama_family_rope(config),
    )


def olmo2_config_to_tfm(config: Olmo2Config) -> TfmDecoderConfig:
    return converted_config(config, _to_tfm, _to_olmo2)


def tfm_config_to_olmo2(config: TfmDecoderConfig) -> Olmo2Config:
    return converted_config(config, _to_olmo2, _to_tfm)


def olmo2_to_tfm(model: Olmo2ForCausalLM) -> TfmDecoderForCausalLM:
    """Convert an `Olmo2ForCausalLM` into a `TfmDecoderForCausalLM` with identical outputs."""
    target = TfmDecoderForCausalLM(olmo2_config_to_tfm(model.config))
    return load_exact(target, renamed_keys(model.state_dict(), _RENAMES), generation_config=model.generation_config)


def tfm_to_olmo2(model: TfmDecoderForCausalLM) -> Olmo2ForCausalLM:
    """Convert an OLMo2-shaped `TfmDecoderForCausalLM` back into an `Olmo2ForCausalLM` with identical outputs."""
    target = Olmo2ForCausalLM(tfm_config_to_olmo2(model.config))
    state = renamed_keys(model.state_dict(), inverted(_RENAMES))
    return load_exact(target, state, generation_config=model.generation_config)
