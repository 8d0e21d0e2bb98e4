"""Gemma2ForCausalLM <-> hf_tfm, exact both ways: sandwich norms, (1 + weight) RMSNorm, scaled embeddings, GeGLU,
query_pre_attn_scalar, attention and final logit soft-capping, head_dim != hidden / heads, and alternating sliding /
full layers whose window is shorter than the test sequence (generation runs past it, dynamic and static caches).
Gemma 2 attends eagerly: sdpa cannot soft-cap the scores."""

from functools import partial

import pytest
import torch
from conftest import tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import (
    LLAMA_SHAPED,
    assert_decoding_matches,
    assert_generate_matches,
    assert_logits_match,
    assert_option_matters,
    assert_round_trip,
    padded_batch,
)
from transformers import AutoModelForCausalLM

from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm


def gemma2_config(**overrides):
    return tiny_reference_config("gemma2", **overrides)


def gemma2(**overrides):
    return tiny_reference("gemma2", **overrides)


def test_gemma2_parity():
    ref = gemma2()
    ours = to_tfm(ref)
    assert ours.config._attn_implementation == "eager"
    assert ours.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert_logits_match(ref, ours, attn="eager")
    assert_generate_matches(ref, ours, num_beams=1, max_new_tokens=6)
    assert_generate_matches(ref, ours, num_beams=3, max_new_tokens=6)
    back = from_tfm(ours, "gemma2")
    assert back.config._attn_implementation == "eager"  # not transformers 5.17's default sdpa, which drops the cap
    assert_logits_match(ref, back, attn="eager")


def test_converted_gemma2_saves_and_loads(tmp_path):
    """The (1 + weight) norms and the window survive save_pretrained -> from_pretrained (built on the meta device)."""
    ours = to_tfm(gemma2())
    ours.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    input_ids = padded_batch()[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, ours(input_ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_gemma2_decoding_past_the_window(cache_implementation):
    """Every step's logits, not only the tokens, match while the cache's sliding layers run past the window (a
    window that is off by two changes them by > 1 at this shape while the greedy tokens still agree)."""
    ref = gemma2()
    assert_decoding_matches(ref, to_tfm(ref), cache_implementation)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(attn_logit_softcapping=None), id="attention-cap"),
        pytest.param(dict(final_logit_softcapping=None), id="final-cap"),
        pytest.param(dict(layer_types=["full_attention"] * 3), id="window"),
        pytest.param(dict(query_pre_attn_scalar=16), id="scalar"),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """Each Gemma 2 option changes the reference logits well beyond the tolerance at the test shape, so the parity
    above proves hf_tfm applies it."""
    ref, without = gemma2(), gemma2(**overrides)
    without.load_state_dict(ref.state_dict())
    assert_option_matters(ref, without)


@pytest.mark.parametrize("overrides", [{}, pytest.param(dict(tie_word_embeddings=False), id="untied")])
def test_gemma2_round_trip(overrides):
    assert_round_trip(gemma2(**overrides), to_tfm, partial(from_tfm, name="gemma2"))


def test_softcapping_refuses_sdpa():
    """sdpa cannot cap attention scores: hf_tfm attends eagerly by default and refuses sdpa, naming the field."""
    config = config_to_tfm(gemma2_config())
    model = TfmDecoderForCausalLM(config)
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        TfmDecoderForCausalLM._from_config(config, attn_implementation="sdpa")


def test_gemma2_config_hf_tfm_cannot_express_is_refused():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        config_to_tfm(gemma2_config(use_bidirectional_attention=True))
    assert config_to_tfm(gemma2_config(use_bidirectional_attention=False))  # False is causal, as None


GEMMA2_SHAPED = dict(
    LLAMA_SHAPED,
    rmsnorm_unit_offset=True,
    norm_position="sandwich",
    hidden_act="gelu_pytorch_tanh",
    scale_embeddings=True,
    round_embedding_scale=True,
)


def test_gemma2_shaped_tfm_config_converts():
    """Without query_pre_attn_scalar hf_tfm scales by head_dim ** -0.5: Gemma 2's query_pre_attn_scalar=head_dim."""
    config = config_from_tfm(tiny_config(**GEMMA2_SHAPED), "gemma2")
    assert config.query_pre_attn_scalar == 8 and config.final_logit_softcapping is None


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(norm_position="pre"), "norm_position"),
        (dict(rmsnorm_unit_offset=False), "rmsnorm_unit_offset"),
        (dict(qk_norm="per_head"), "qk_norm"),
        (dict(attention_out_bias=True), "attention_out_bias"),
        (dict(query_pre_attn_scalar=10.5), "query_pre_attn_scalar"),
        (dict(attention_multiplier=0.5), "attention_multiplier"),
        # Gemma 2 rotates every feature of a head
        (dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}), "rope_parameters"),
    ],
)
def test_tfm_config_gemma2_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(**{**GEMMA2_SHAPED, **overrides}), "gemma2")
