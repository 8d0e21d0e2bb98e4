"""MistralForCausalLM <-> hf_tfm, exact both ways: a sliding window shorter than the test sequence (generation runs
past it with a dynamic and a static cache), no window, and tied embeddings."""

from functools import partial

import pytest
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_decoding_matches,
    assert_generate_matches,
    assert_refused_by_name,
    assert_round_trip,
)
from transformers import MistralConfig

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm


def mistral(**overrides):
    return tiny_reference("mistral", **overrides)


VARIANTS = [
    pytest.param({}, id="window"),
    pytest.param(dict(sliding_window=None, tie_word_embeddings=True), id="full-tied"),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_mistral_parity(overrides):
    ref = mistral(**overrides)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="mistral"))
    assert ours.config.sliding_window == ref.config.sliding_window
    expected_type = "full_attention" if ref.config.sliding_window is None else "sliding_attention"
    assert ours.config.layer_types == [expected_type] * 2


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_mistral_generates_past_the_window(cache):
    """Decoding 6 tokens after a 9-token prompt with a window of 4: every step's logits are Mistral's (sliding cache
    layers drop what the window no longer sees), and greedy and beam tokens are too."""
    ref = mistral()
    ours = to_tfm(ref)
    assert_decoding_matches(ref, ours, cache)
    for model in (ref, ours):
        model.generation_config.cache_implementation = cache
    assert_generate_matches(ref, ours, num_beams=3)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_mistral_round_trip(overrides):
    assert_round_trip(mistral(**overrides), to_tfm, partial(from_tfm, name="mistral"))


def mistral_shaped(**overrides):
    """An hf_tfm model that is a Mistral except for `overrides`."""
    fields = dict(LLAMA_SHAPED, num_key_value_heads=2, tie_word_embeddings=False, sliding_window=WINDOW)
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    # Mistral applies its window to every layer: per-layer kinds are Ministral's
    (lambda: mistral_shaped(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (lambda: mistral_shaped(attention_bias=True), "attention_bias"),
    (lambda: mistral_shaped(qk_norm="per_head"), "qk_norm"),
    (lambda: mistral_shaped(num_experts=4, moe_intermediate_size=16), "num_experts"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_mistral_cannot_express_raises(make_source, field):
    assert isinstance(config_from_tfm(mistral_shaped().config, "mistral"), MistralConfig)  # the baseline converts
    others = ["sliding_window", *(name for _, name in INEXPRESSIBLE)]
    assert_refused_by_name(
        partial(from_tfm, name="mistral"), make_source(), field, others
    )  # the field is named, not every field


def test_mistral_config_key_it_does_not_read_raises():
    """Every Mistral field has an hf_tfm counterpart; a key MistralConfig does not declare is refused by name:
    Mistral warns about `layer_types` and windows every layer anyway, while its cache would follow them."""
    config = mistral().config
    config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="layer_types"):
        config_to_tfm(config)
