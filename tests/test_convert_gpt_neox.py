"""GPTNeoXForCausalLM <-> hf_tfm, exact both ways: fused per-head query_key_value, partial rotary (rotary_pct),
parallel and sequential residuals, biases everywhere, an untied LM head."""

from functools import partial

import pytest
import torch
from conftest import tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import assert_generate_matches, assert_logits_match, assert_round_trip, padded_batch
from transformers import AutoModelForCausalLM

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm


def gpt_neox_config(**overrides):
    return tiny_reference_config("gpt_neox", **overrides)


def gpt_neox(**overrides):
    return tiny_reference("gpt_neox", **overrides)


VARIANTS = [
    pytest.param(dict(use_parallel_residual=True), id="parallel"),
    pytest.param(dict(use_parallel_residual=False, attention_bias=False, rotary_pct=0.5), id="sequential-nobias"),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gpt_neox_parity(overrides):
    ref = gpt_neox(**overrides)
    ours = to_tfm(ref)
    config = ours.config
    assert config.parallel_residual == ref.config.use_parallel_residual
    assert config.rope_parameters["partial_rotary_factor"] == ref.config.rope_parameters["partial_rotary_factor"] < 1
    for attn in ("eager", "sdpa"):
        assert_logits_match(ref, ours, attn=attn)
    assert_generate_matches(ref, ours, num_beams=1)
    assert_generate_matches(ref, ours, num_beams=3)
    back = from_tfm(ours, "gpt_neox")
    assert_logits_match(ref, back)


@pytest.mark.parametrize("overrides", [*VARIANTS, pytest.param(dict(tie_word_embeddings=True), id="tied")])
def test_gpt_neox_round_trip(overrides):
    assert_round_trip(gpt_neox(**overrides), to_tfm, partial(from_tfm, name="gpt_neox"))


def test_converted_gpt_neox_saves_and_loads(tmp_path):
    """Partial RoPE's inv_freq is rebuilt right after from_pretrained (built on the meta device)."""
    ours = to_tfm(gpt_neox())
    ours.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    input_ids = padded_batch()[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, ours(input_ids).logits, atol=0, rtol=0)


def test_fused_qkv_is_split_per_head():
    """query_key_value's output rows are [heads, 3, head_dim]: head h's query is rows [3h*d, 3h*d + d). hf_tfm keeps
    one matrix too (`fused_qkv_proj`, one matmul a layer) with the rows stacked [3, heads, head_dim]: q, then k, then
    v."""
    ref = gpt_neox()
    ours = to_tfm(ref)
    fused = ref.gpt_neox.layers[0].attention.query_key_value.weight
    heads = ref.config.num_attention_heads
    d = ref.config.hidden_size // heads
    stacked = ours.model.layers[0].self_attn.qkv_proj.weight
    assert ours.config.fused_qkv_proj and stacked.shape == fused.shape
    for part in range(3):  # q, k, v
        for head in range(heads):
            ours_rows = slice((part * heads + head) * d, (part * heads + head + 1) * d)
            assert torch.equal(stacked[ours_rows], fused[(3 * head + part) * d : (3 * head + part + 1) * d])


def test_full_rotary_round_trips_configs():
    """rotary_pct=1.0 is hf_tfm's plain RoPE and comes back as 1.0 (GPTNeoXConfig would otherwise default to 0.25)."""
    config = gpt_neox_config(rotary_pct=1.0)
    ours = config_to_tfm(config)
    assert ours.rope_parameters.get("partial_rotary_factor", 1.0) == 1.0
    assert config_from_tfm(ours, "gpt_neox").rope_parameters["partial_rotary_factor"] == 1.0


def test_gpt_neox_config_hf_tfm_cannot_express_is_refused():
    """12 * 0.25 = 3 rotary features: GPT-NeoX then rotates 4 with frequencies of a 3-wide band; hf_tfm refuses."""
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        config_to_tfm(gpt_neox_config(hidden_size=24, rotary_pct=0.25))


GPT_NEOX_SHAPED = dict(position_embedding_type="rope", parallel_residual=True, tie_word_embeddings=False)


def test_gpt_neox_shaped_tfm_config_converts():
    config = config_from_tfm(tiny_config(**GPT_NEOX_SHAPED), "gpt_neox")
    assert config.use_parallel_residual and config.rope_parameters["partial_rotary_factor"] == 1.0


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_key_value_heads=2), "num_key_value_heads"),
        (dict(qk_norm="per_head"), "qk_norm"),
        (dict(norm_type="rmsnorm"), "norm_type"),
        (dict(attention_out_bias=False), "attention_out_bias"),
        (dict(embedding_dropout=0.1), "embedding_dropout"),
    ],
)
def test_tfm_config_gpt_neox_cannot_express_is_refused(overrides, field):
    config = tiny_config(**{**GPT_NEOX_SHAPED, **overrides})
    with pytest.raises(ValueError, match=field):
        config_from_tfm(config, "gpt_neox")
