"""Olmo2ForCausalLM <-> hf_tfm, exact both ways: norms on the sublayer outputs (norm_position="output"), an RMSNorm
over the whole query and key projections (qk_norm="projection"), GQA, q/k/v/o biases, and a head_dim that is not
hidden / heads (an extra config key OLMo2's modeling code reads)."""

import pytest
import torch
from conftest import VOCAB, perturb, tiny_config
from parity_harness import ATOL, assert_generate_matches, assert_logits_match, assert_round_trip, padded_batch
from transformers import Olmo2Config, Olmo2ForCausalLM

from hf_tfm.convert_olmo2 import olmo2_config_to_tfm, olmo2_to_tfm, tfm_config_to_olmo2, tfm_to_olmo2


def olmo2_config(**overrides) -> Olmo2Config:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Olmo2Config(**{**fields, **overrides})


def olmo2(**overrides) -> Olmo2ForCausalLM:
    torch.manual_seed(0)
    return perturb(Olmo2ForCausalLM(olmo2_config(**overrides)))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="default"),
        pytest.param(dict(attention_bias=True, tie_word_embeddings=True), id="bias-tied"),
        pytest.param(dict(head_dim=16), id="head-dim"),
    ],
)
def test_olmo2_parity(overrides):
    ref = olmo2(**overrides)
    ours = olmo2_to_tfm(ref)
    assert ours.config.norm_position == "output" and ours.config.qk_norm == "projection"
    for attn in ("eager", "sdpa"):
        assert_logits_match(ref, ours, attn=attn)
    assert_generate_matches(ref, ours, num_beams=1)
    assert_generate_matches(ref, ours, num_beams=3)
    assert_logits_match(ref, tfm_to_olmo2(ours), attn="sdpa")


@pytest.mark.parametrize("overrides", [{}, pytest.param(dict(attention_bias=True, head_dim=16), id="bias-head-dim")])
def test_olmo2_round_trip(overrides):
    assert_round_trip(olmo2(**overrides), olmo2_to_tfm, tfm_to_olmo2)


def test_qk_norm_changes_the_reference():
    """Without its (perturbed) q/k norms OLMo2's logits move well beyond the tolerance, so the parity above proves
    hf_tfm applies them."""
    ref, without = olmo2(), olmo2()
    with torch.no_grad():
        for layer in without.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
        input_ids = padded_batch()[0][:1]
        assert (ref(input_ids).logits - without(input_ids).logits).abs().max() > 100 * ATOL


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
        olmo2_config_to_tfm(olmo2_config(**overrides))


OLMO2_SHAPED = dict(
    position_embedding_type="rope",
    norm_type="rmsnorm",
    norm_position="output",
    qk_norm="projection",
    ffn_type="glu",
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
)


def test_olmo2_shaped_tfm_config_converts():
    config = tfm_config_to_olmo2(tiny_config(**OLMO2_SHAPED, head_dim=16))
    assert config.head_dim == 16 and not config.attention_bias
    assert "head_dim" not in tfm_config_to_olmo2(tiny_config(**OLMO2_SHAPED)).to_dict()  # derived: not written


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
        tfm_config_to_olmo2(tiny_config(**{**OLMO2_SHAPED, **overrides}))
