"""Qwen2ForCausalLM <-> hf_tfm, exact both ways: q/k/v biases without an output bias, sliding layers picked by
`max_window_layers` or by `layer_types` (a window shorter than the test sequence; dynamic and static caches), a
`head_dim` key the config class does not declare, and tied embeddings."""

from functools import partial

import pytest
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_refused_by_name,
    assert_round_trip,
)
from transformers import Qwen2Config

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

FULL, SLIDING = "full_attention", "sliding_attention"


def qwen2(**overrides):
    return tiny_reference("qwen2", **overrides)


WINDOWED = dict(use_sliding_window=True, sliding_window=WINDOW)
VARIANTS = [
    pytest.param({}, [FULL, FULL], id="full"),
    pytest.param(dict(**WINDOWED, max_window_layers=1), [FULL, SLIDING], id="max_window_layers"),
    pytest.param(dict(**WINDOWED, layer_types=[SLIDING, FULL], tie_word_embeddings=True), [SLIDING, FULL], id="tied"),
    pytest.param(dict(head_dim=16), [FULL, FULL], id="head_dim"),
    pytest.param(dict(head_dim=8), [FULL, FULL], id="head_dim-derived"),  # the key, with the value it derives
]


@pytest.mark.parametrize("overrides, layer_types", VARIANTS)
def test_qwen2_parity(overrides, layer_types):
    ours = assert_converts_exactly(
        qwen2(**overrides), to_tfm, partial(from_tfm, name="qwen2"), caches=("dynamic", "static")
    )
    assert ours.config.layer_types == layer_types
    assert (
        ours.model.layers[0].self_attn.q_proj.bias is not None and ours.model.layers[0].self_attn.o_proj.bias is None
    )


@pytest.mark.parametrize("overrides, layer_types", VARIANTS)
def test_qwen2_round_trip(overrides, layer_types):
    assert_round_trip(qwen2(**overrides), to_tfm, partial(from_tfm, name="qwen2"))


def test_qwen2_config_round_trip_writes_max_window_layers():
    """hf_tfm has no max_window_layers; the way back writes Qwen2's pattern (full layers, then sliding) from
    layer_types, and any other pattern still converts exactly because layer_types decide."""
    config = qwen2(**WINDOWED, max_window_layers=1).config
    back = config_from_tfm(config_to_tfm(config), "qwen2")
    assert (back.max_window_layers, back.layer_types, back.sliding_window) == (1, [FULL, SLIDING], WINDOW)
    assert config_from_tfm(qwen2_shaped(layer_types=[SLIDING, FULL]).config, "qwen2").layer_types == [SLIDING, FULL]


def qwen2_shaped(**overrides):
    """An hf_tfm model that is a Qwen2 except for `overrides`."""
    fields = dict(
        LLAMA_SHAPED,
        attention_bias=True,
        attention_out_bias=False,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        sliding_window=WINDOW,
        layer_types=[FULL, SLIDING],
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: qwen2_shaped(attention_out_bias=True), "attention_out_bias"),
    (lambda: qwen2_shaped(attention_bias=False), "attention_bias"),
    (lambda: qwen2_shaped(mlp_bias=True), "mlp_bias"),
    (lambda: qwen2_shaped(qk_norm="per_head"), "qk_norm"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_qwen2_cannot_express_raises(make_source, field):
    assert isinstance(config_from_tfm(qwen2_shaped().config, "qwen2"), Qwen2Config)  # the baseline converts
    assert_refused_by_name(partial(from_tfm, name="qwen2"), make_source(), field, [name for _, name in INEXPRESSIBLE])


def test_qwen2_sliding_layers_without_window_raise():
    """Every Qwen2 field has an hf_tfm counterpart. Sliding layer_types without use_sliding_window leave Qwen2 no
    window (its forward then fails on None); the converter names the field instead."""
    config = Qwen2Config(num_hidden_layers=2, layer_types=[SLIDING, FULL])
    assert config.sliding_window is None
    with pytest.raises(ValueError, match="sliding_window"):
        config_to_tfm(config)


def test_qwen2_config_key_it_does_not_read_raises():
    """Qwen2's biases are fixed (q/k/v on, output off): an `attention_bias` key it would ignore is refused by name,
    not taken to mean what it says."""
    config = qwen2().config
    config.attention_bias = False
    with pytest.raises(ValueError, match="attention_bias"):
        config_to_tfm(config)


# Qwen2.5-0.5B's config.json (written by transformers 4.40): keys 5.x no longer declares, a window switched off
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_released_qwen2_5_config_converts():
    """`use_mrope` (no Qwen text model reads it) and `max_window_layers` do not block a released config."""
    config = config_to_tfm(Qwen2Config.from_dict(QWEN2_5_0_5B))
    assert (config.head_dim, config.sliding_window, config.rope_parameters["rope_theta"]) == (64, None, 1e6)
    assert config.layer_types == [FULL] * 24 and config.tie_word_embeddings
    back = config_from_tfm(config, "qwen2")
    assert (back.max_window_layers, back.use_sliding_window) == (24, False)
