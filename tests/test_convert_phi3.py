"""Phi3ForCausalLM <-> hf_tfm, exact both ways: fused qkv_proj and gate_up_proj split on the way in and fused on
the way back, GQA, partial rotary, a sliding window (every layer) shorter than the test sequence with generation
past it, and LongRoPE with its short and its long factors."""

from functools import partial

import pytest
import torch
from conftest import tiny_config
from peft import LoraConfig, get_peft_model
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import (
    LLAMA_SHAPED,
    PAD,
    WINDOW,
    assert_converts_exactly,
    assert_decoding_matches,
    assert_option_matters,
    assert_round_trip,
    padded_batch,
)

from hf_tfm.compat import phi3_recomputes_longrope_cache
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

PARTIAL = dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))


def longrope(original_max_position_embeddings: int, partial_rotary_factor: float = 1.0) -> dict:
    """LongRoPE over 8 * factor rotated features: 4 * factor short and long factors. The test batch has 9
    tokens, so an original length of 8 runs the long factors and one of 16 the short ones."""
    pairs = int(4 * partial_rotary_factor)
    rope = dict(
        rope_type="longrope",
        rope_theta=10000.0,
        partial_rotary_factor=partial_rotary_factor,
        short_factor=[1.0 + i / 2 for i in range(pairs)],
        long_factor=[4.0 * 2**i for i in range(pairs)],
    )
    return dict(rope_parameters=rope, original_max_position_embeddings=original_max_position_embeddings)


def phi3_config(**overrides):
    return tiny_reference_config("phi3", **overrides)


def phi3(**overrides):
    return tiny_reference("phi3", **overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="default"),
        pytest.param(dict(PARTIAL, sliding_window=WINDOW, tie_word_embeddings=True), id="partial-sliding-tied"),
        pytest.param(longrope(8), id="longrope-long"),
        pytest.param(longrope(16, partial_rotary_factor=0.5), id="longrope-short-partial"),
    ],
)
def test_phi3_parity(overrides):
    assert_converts_exactly(
        phi3(**overrides), to_tfm, partial(from_tfm, name="phi3"), max_new_tokens=6, back_attn="sdpa"
    )


def test_phi3_keeps_q_k_v_as_one_matrix_that_lora_targets_by_phi3s_name():
    """Phi-3's qkv_proj converts into hf_tfm's qkv_proj as it is (one matmul a layer, as the reference runs), so a
    LoRA configuration written for Phi-3 (target_modules naming qkv_proj and o_proj) adapts the converted model's
    same layers."""
    reference = phi3()
    ours = to_tfm(reference)
    assert ours.config.fused_qkv_proj and ours.model.layers[0].self_attn.q_proj is None
    assert torch.equal(
        ours.model.layers[0].self_attn.qkv_proj.weight, reference.model.layers[0].self_attn.qkv_proj.weight
    )
    targets = LoraConfig(target_modules=["qkv_proj", "o_proj"], r=4)
    adapted = {name: get_peft_model(model, targets) for name, model in (("reference", reference), ("ours", ours))}
    names = {
        side: sorted(n.split(".layers.")[1] for n, _ in m.named_parameters() if "lora_A" in n)
        for side, m in adapted.items()
    }
    assert names["ours"] == names["reference"] and names["ours"]


def test_phi3_static_cache_generation_past_the_window():
    ref = phi3(sliding_window=WINDOW)
    ours = to_tfm(ref)
    assert ours.config.layer_types == ["sliding_attention"] * 2
    assert_decoding_matches(ref, ours, "static")


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_longrope_generation_across_the_original_length(cache_implementation):
    """The step on which the sequence first outgrows original_max_position_embeddings drops the keys cached with the
    short factors and computes every position again with the long ones, as Phi-3's `prepare_inputs_for_generation`
    does: hf_tfm's tokens and scores are those of generating without a cache (each step computes every position with
    the factors of its length), and Phi-3's where the installed release recomputes that step whole (5.20+; 5.17-5.19
    feed it the new token alone: `phi3_recomputes_longrope_cache`)."""
    ref = phi3(**longrope(10))
    ours = to_tfm(ref)
    input_ids, attention_mask, _ = padded_batch(9)  # 9 tokens, 6 new: the third new one crosses 10
    kwargs = dict(
        input_ids=input_ids, attention_mask=attention_mask, pad_token_id=PAD, do_sample=False, max_new_tokens=6,
        min_new_tokens=6, output_scores=True, return_dict_in_generate=True, cache_implementation=cache_implementation,
    )  # fmt: skip
    cached = ours.generate(**kwargs)
    uncached = ours.generate(**{**kwargs, "use_cache": False, "cache_implementation": None})
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.scores, uncached.scores)  # two matmul shapes: within float32 rounding
    if phi3_recomputes_longrope_cache():
        expected = ref.generate(**kwargs)
        assert torch.equal(cached.sequences, expected.sequences)
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(cached.scores, expected.scores, strict=True))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(PARTIAL, id="partial"),
        pytest.param(dict(sliding_window=WINDOW), id="window"),
        pytest.param(longrope(8), id="longrope"),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """Each option changes the reference logits well beyond the tolerance at the test shape, so the parity above
    proves hf_tfm applies it."""
    ref, other = phi3(), phi3(**overrides)
    other.load_state_dict(ref.state_dict())
    assert_option_matters(ref, other)


@pytest.mark.parametrize(
    "overrides", [{}, pytest.param(dict(longrope(8), tie_word_embeddings=True, num_key_value_heads=1), id="mqa")]
)
def test_phi3_round_trip(overrides):
    assert_round_trip(phi3(**overrides), to_tfm, partial(from_tfm, name="phi3"))


def test_phi3_fields():
    """resid_pdrop is the dropout on each sublayer's output; embd_pdrop is never applied by Phi3Model, and
    original_max_position_embeddings is read only by LongRoPE."""
    config = config_to_tfm(phi3_config(resid_pdrop=0.1, embd_pdrop=0.2, original_max_position_embeddings=32))
    assert config.hidden_dropout == 0.1 and config.embedding_dropout == 0.0
    assert config_from_tfm(config, "phi3").resid_pdrop == 0.1
    config = config_to_tfm(phi3_config(**longrope(8)))
    assert config.rope_parameters["original_max_position_embeddings"] == 8
    assert config_from_tfm(config, "phi3").original_max_position_embeddings == 8


PHI3_SHAPED = dict(LLAMA_SHAPED, hidden_act="silu")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(attention_bias=True), "attention_bias"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(embedding_dropout=0.1), "embedding_dropout"),
        (dict(sliding_window=WINDOW, layer_types=["full_attention", "sliding_attention"]), "layer_types"),
        (dict(nope_layers=[0]), "nope_layers"),
        (dict(qk_norm="projection"), "qk_norm"),
        (dict(norm_position="output"), "norm_position"),
    ],
)
def test_tfm_config_phi3_cannot_express_is_refused(overrides, field):
    assert config_from_tfm(tiny_config(**PHI3_SHAPED), "phi3")  # the shape itself converts
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(**{**PHI3_SHAPED, **overrides}), "phi3")


def test_phi3_config_hf_tfm_cannot_express_is_refused():
    with pytest.raises(ValueError, match="clip_qkv"):  # a key the converter does not know is refused, not dropped
        config_to_tfm(phi3_config(clip_qkv=8.0))
