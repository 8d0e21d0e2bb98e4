"""Olmo2ForCausalLM <-> hf_tfm, exact both ways: norms on the sublayer outputs (norm_position="output"), an RMSNorm
over the whole query and key projections (qk_norm="projection"), GQA, q/k/v/o biases, and a head_dim that is not
hidden / heads (an extra config key OLMo2's modeling code reads)."""

from functools import partial

import pytest
import torch
from conftest import tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import (
    LLAMA_SHAPED,
    assert_converts_exactly,
    assert_option_matters,
    assert_round_trip,
)

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm


def olmo2_config(**overrides):
    return tiny_reference_config("olmo2", **overrides)


def olmo2(**overrides):
    return tiny_reference("olmo2", **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="default"),
        pytest.param(dict(attention_bias=True, tie_word_embeddings=True), id="bias-tied"),
        pytest.param(dict(head_dim=16), id="head-dim"),
    ],
)
def test_olmo2_parity(overrides):
    ours = assert_converts_exactly(olmo2(**overrides), to_tfm, partial(from_tfm, name="olmo2"), back_attn="sdpa")
    assert ours.config.norm_position == "output" and ours.config.qk_norm == "projection"


@pytest.mark.parametrize("overrides", [{}, pytest.param(dict(attention_bias=True, head_dim=16), id="bias-head-dim")])
def test_olmo2_round_trip(overrides):
    assert_round_trip(olmo2(**overrides), to_tfm, partial(from_tfm, name="olmo2"))


def test_qk_norm_changes_the_reference():
    """Without its (perturbed) q/k norms OLMo2's logits move well beyond the tolerance, so the parity above proves
    hf_tfm applies them."""
    ref, without = olmo2(), olmo2()
    with torch.no_grad():
        for layer in without.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
    assert_option_matters(ref, without)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)), "rope"),
        (dict(clip_qkv=8.0), "clip_qkv"),  # OLMo 1's option: an Olmo2Config may carry it, OLMo2 never reads it
    ],
)
def test_olmo2_config_hf_tfm_cannot_express_is_refused(overrides, field):
    """OLMo2 rotates every feature whatever partial_rotary_factor says, and a key the converter does not know is
    refused by name rather than dropped."""
    with pytest.raises(ValueError, match=field):
        config_to_tfm(olmo2_config(**overrides))


OLMO2_SHAPED = dict(
    LLAMA_SHAPED,
    norm_position="output",
    qk_norm="projection",
    hidden_act="silu",
    rmsnorm_scale_in_float32=True,
    rope_tables_in_float32=True,
)


def test_olmo2_shaped_tfm_config_converts():
    config = config_from_tfm(tiny_config(**OLMO2_SHAPED, head_dim=16), "olmo2")
    assert config.head_dim == 16 and not config.attention_bias
    assert "head_dim" not in config_from_tfm(tiny_config(**OLMO2_SHAPED), "olmo2").to_dict()  # derived: not written


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(norm_position="pre"), "norm_position"),
        (dict(qk_norm="per_head"), "qk_norm"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(attention_bias=True, attention_out_bias=False), "attention_out_bias"),
        (dict(sliding_window=4), "sliding_window"),
        (dict(nope_layers=[1]), "nope_layers"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)), "rope"),
        (dict(rmsnorm_unit_offset=True), "rmsnorm_unit_offset"),
    ],
)
def test_tfm_config_olmo2_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(**{**OLMO2_SHAPED, **overrides}), "olmo2")
