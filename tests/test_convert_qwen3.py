"""Qwen3ForCausalLM <-> hf_tfm, exact both ways: per-head QK-norm, a head_dim apart from hidden_size // heads, one
attention_bias flag for all four projections, and sliding layers (a window shorter than the test sequence)."""

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
from transformers import Qwen3Config

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

FULL, SLIDING = "full_attention", "sliding_attention"


def qwen3(**overrides):
    return tiny_reference("qwen3", **overrides)


VARIANTS = [
    pytest.param({}, [FULL, FULL], id="full"),
    pytest.param(dict(attention_bias=True, tie_word_embeddings=True), [FULL, FULL], id="bias-tied"),
    pytest.param(
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1), [FULL, SLIDING], id="window"
    ),
]


@pytest.mark.parametrize("overrides, layer_types", VARIANTS)
def test_qwen3_parity(overrides, layer_types):
    ours = assert_converts_exactly(
        qwen3(**overrides), to_tfm, partial(from_tfm, name="qwen3"), caches=("dynamic", "static")
    )
    assert ours.config.layer_types == layer_types
    assert ours.config.qk_norm == "per_head" and ours.model.layers[0].self_attn.q_norm.weight.shape == (16,)


@pytest.mark.parametrize("overrides, layer_types", VARIANTS)
def test_qwen3_round_trip(overrides, layer_types):
    assert_round_trip(qwen3(**overrides), to_tfm, partial(from_tfm, name="qwen3"))


def qwen3_shaped(**overrides):
    """An hf_tfm model that is a Qwen3 except for `overrides`."""
    fields = dict(LLAMA_SHAPED, qk_norm="per_head", num_key_value_heads=2, tie_word_embeddings=False)
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: qwen3_shaped(attention_bias=True, attention_out_bias=False), "attention_out_bias"),
    (lambda: qwen3_shaped(qk_norm="projection"), "qk_norm"),
    (lambda: qwen3_shaped(nope_layers=[1]), "nope_layers"),
    (lambda: qwen3_shaped(norm_position="sandwich"), "norm_position"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_qwen3_cannot_express_raises(make_source, field):
    assert isinstance(config_from_tfm(qwen3_shaped().config, "qwen3"), Qwen3Config)  # the baseline converts
    assert_refused_by_name(partial(from_tfm, name="qwen3"), make_source(), field, [name for _, name in INEXPRESSIBLE])


def test_qwen3_sliding_layers_without_window_raise():
    """Every Qwen3 field has an hf_tfm counterpart. Sliding layer_types without use_sliding_window leave Qwen3 no
    window (its forward then fails on None); the converter names the field instead."""
    with pytest.raises(ValueError, match="sliding_window"):
        config_to_tfm(Qwen3Config(num_hidden_layers=2, layer_types=[SLIDING, FULL]))


def test_qwen3_config_key_it_does_not_read_raises():
    """A key Qwen3Config does not declare and Qwen3 never reads is refused by name: here Llama's `mlp_bias`, which
    would leave a Qwen3 MLP without the biases it asks for."""
    config = qwen3().config
    config.mlp_bias = True
    with pytest.raises(ValueError, match="mlp_bias"):
        config_to_tfm(config)
