"""SmolLM3ForCausalLM <-> hf_tfm, exact both ways: NoPE layers (no_rope_layers -> nope_layers), and sliding NoPE
layers (SmolLM3's use_sliding_window) whose window is shorter than the test sequence, generation running past it
with dynamic and static caches."""

from functools import partial

import pytest
from conftest import tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import (
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_decoding_matches,
    assert_option_matters,
    assert_round_trip,
)

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

SLIDING = dict(use_sliding_window=True, sliding_window=WINDOW)


def smollm3_config(**overrides):
    return tiny_reference_config("smollm3", **overrides)


def smollm3(**overrides):
    return tiny_reference("smollm3", **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="nope"),
        pytest.param(dict(SLIDING, attention_bias=True, mlp_bias=True, tie_word_embeddings=False), id="sliding-bias"),
    ],
)
def test_smollm3_parity(overrides):
    ref = smollm3(**overrides)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="smollm3"), max_new_tokens=6, back_attn="sdpa")
    assert ours.config.nope_layers == [1, 3]


def test_smollm3_sliding_layers():
    ours = to_tfm(smollm3(**SLIDING))
    assert ours.config.layer_types == ["full_attention", "sliding_attention"] * 2
    assert ours.config.sliding_window == WINDOW


def test_smollm3_static_cache_generation():
    """Sliding layers in a static cache give the reference's tokens past the window."""
    ref = smollm3(**SLIDING)
    assert_decoding_matches(ref, to_tfm(ref), "static")


@pytest.mark.parametrize(
    "overrides",
    [pytest.param(dict(no_rope_layers=[1] * 4), id="nope"), pytest.param(SLIDING, id="window")],
)
def test_each_option_changes_the_reference(overrides):
    """NoPE layers and the window each change the reference logits well beyond the tolerance at the test shape, so
    the parity above proves hf_tfm applies them."""
    ref, other = smollm3(), smollm3(**overrides)
    other.load_state_dict(ref.state_dict())
    assert_option_matters(ref, other)


@pytest.mark.parametrize("overrides", [{}, pytest.param(dict(SLIDING, tie_word_embeddings=False), id="untied")])
def test_smollm3_round_trip(overrides):
    assert_round_trip(smollm3(**overrides), to_tfm, partial(from_tfm, name="smollm3"))


def test_fields_smollm3_never_reads_convert():
    """no_rope_layer_interval only fills no_rope_layers, entries past the last layer are never read, and without
    sliding layers use_sliding_window is not read either."""
    config = config_to_tfm(smollm3_config(no_rope_layers=[1, 0, 1, 1, 0, 0], no_rope_layer_interval=3))
    assert config.nope_layers == [1] and config.layer_types == ["full_attention"] * 4
    assert config_to_tfm(smollm3_config(use_sliding_window=True)).sliding_window is None  # no window


@pytest.mark.parametrize(
    "overrides, field",
    [
        # sliding layers whose window flash attention would not apply: the reference's backends disagree
        (dict(layer_types=["sliding_attention"] * 4, sliding_window=WINDOW), "use_sliding_window"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)), "rope"),
    ],
)
def test_smollm3_config_hf_tfm_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_to_tfm(smollm3_config(**overrides))


SMOLLM3_SHAPED = dict(LLAMA_SHAPED, hidden_act="silu", num_hidden_layers=4)


def test_smollm3_shaped_tfm_config_converts():
    """Any NoPE layers and any mix of sliding and full layers: no_rope_layers and layer_types carry them."""
    tfm = tiny_config(
        **SMOLLM3_SHAPED,
        nope_layers=[2, 0, 2],  # unsorted, repeated: the same layers
        layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
        sliding_window=3,
    )
    config = config_from_tfm(tfm, "smollm3")
    assert config.no_rope_layers == [0, 1, 0, 1] and config.use_sliding_window and config.sliding_window == 3
    assert config.layer_types == tfm.layer_types
    assert config_from_tfm(tiny_config(**SMOLLM3_SHAPED, nope_layers=[]), "smollm3").no_rope_layers == [1] * 4


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(norm_position="sandwich"), "norm_position"),
        (dict(qk_norm="per_head"), "qk_norm"),
        (dict(attention_bias=True, attention_out_bias=False), "attention_out_bias"),
        (dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)), "rope"),
        (dict(scale_embeddings=True), "scale_embeddings"),
    ],
)
def test_tfm_config_smollm3_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(**{**SMOLLM3_SHAPED, **overrides}), "smollm3")


def test_rope_per_layer_type_is_refused():
    """SmolLM3Config would take a RoPE dict nested per layer type (it has layer_types); its model reads one dict."""
    config = tiny_config(**SMOLLM3_SHAPED)
    config.rope_parameters = {"full_attention": dict(rope_type="default", rope_theta=1e4)}
    with pytest.raises(ValueError, match="rope_parameters is nested"):
        config_from_tfm(config, "smollm3")
