"""Gemma3ForCausalLM (text) <-> hf_tfm, exact both ways: Gemma 2's sandwich norms, (1 + weight) RMSNorm, scaled
embeddings and query_pre_attn_scalar, plus a per-head (1 + weight) RMSNorm on queries and keys and RoPE with its own
theta for local (sliding) and global layers; a window shorter than the test sequence (generation runs past it,
dynamic and static caches), with and without soft-capping, eager and sdpa."""

from functools import partial

import pytest
import torch
from conftest import tiny_config
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    assert_converts_exactly,
    assert_decoding_matches,
    assert_option_matters,
    assert_refused_by_name,
    assert_round_trip,
    padded_batch,
)
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

LOCAL_GLOBAL = ["sliding_attention", "full_attention", "sliding_attention"]


def gemma3(**overrides):
    return tiny_reference("gemma3_text", **overrides)


VARIANTS = [
    pytest.param({}, id="local-global"),
    pytest.param(dict(tie_word_embeddings=False, attention_bias=True), id="untied-bias"),
    pytest.param(
        dict(
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0},
            }
        ),
        id="scaled-global-rope",
    ),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gemma3_parity(overrides):
    """Logits (eager and sdpa, unpadded, right- and left-padded), greedy and beam tokens, and the state dict back."""
    ref = gemma3(**overrides)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="gemma3_text"), caches=("dynamic", "static"))
    assert ours.config.qk_norm == "per_head" and ours.config.layer_types == LOCAL_GLOBAL
    assert set(ours.config.rope_parameters) == {"sliding_attention", "full_attention"}


def test_gemma3_final_soft_capping_converts_and_the_attention_cap_is_unread():
    """Gemma 3 caps its logits with final_logit_softcapping; its attention never reads attn_logit_softcapping (a
    key its config keeps from Gemma 2): converted as no cap, where hf_tfm would cap."""
    ref = gemma3(final_logit_softcapping=2.0)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="gemma3_text"))
    assert ours.config.final_logit_softcapping == 2.0
    assert_option_matters(ref, gemma3().eval())
    capped = gemma3(attn_logit_softcapping=1.0)
    assert_option_matters(capped, gemma3(attn_logit_softcapping=1.0, final_logit_softcapping=2.0).eval())
    assert to_tfm(capped).config.attn_logit_softcapping is None
    assert_converts_exactly(capped, to_tfm, partial(from_tfm, name="gemma3_text"))
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        config_from_tfm(tiny_config(**GEMMA3_SHAPED, attn_logit_softcapping=50.0), "gemma3_text")


@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_gemma3_decoding_past_the_window(cache_implementation):
    ref = gemma3()
    assert_decoding_matches(ref, to_tfm(ref), cache_implementation)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(
            dict(
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                }
            ),
            id="local-theta",
        ),
        pytest.param(dict(layer_types=["full_attention"] * 3), id="window"),
        pytest.param(dict(query_pre_attn_scalar=16), id="scalar"),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """Each Gemma 3 option changes the reference logits well beyond the tolerance at the test shape, so the parity
    above proves hf_tfm applies it (the local RoPE theta too: Gemma 3 checkpoints use 10k local, 1M global)."""
    ref, other = gemma3(), gemma3(**overrides)
    other.load_state_dict(ref.state_dict())
    assert_option_matters(ref, other)


def test_the_query_key_norms_count():
    """Zeroing the query norm's weight (a (1 + weight) norm: scale 1) changes the logits: it is read, not dropped."""
    ref = gemma3()
    ours = to_tfm(ref)
    input_ids = padded_batch()[0]
    with torch.no_grad():
        before = ours(input_ids).logits
        ours.model.layers[0].self_attn.q_norm.weight.zero_()
        assert (ours(input_ids).logits - before).abs().max() > 1e-2


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gemma3_round_trip(overrides):
    assert_round_trip(gemma3(**overrides), to_tfm, partial(from_tfm, name="gemma3_text"))


def test_converted_gemma3_saves_and_loads(tmp_path):
    """The per-layer-type RoPE tables and the QK norms survive save_pretrained -> from_pretrained."""
    ours = to_tfm(gemma3())
    ours.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    input_ids = padded_batch()[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, ours(input_ids).logits, atol=0, rtol=0)


GEMMA3_SHAPED = dict(
    LLAMA_SHAPED,
    rmsnorm_unit_offset=True,
    norm_position="sandwich",
    hidden_act="gelu_pytorch_tanh",
    scale_embeddings=True,
    round_embedding_scale=True,
    qk_norm="per_head",
)


def test_gemma3_shaped_tfm_config_converts():
    """One RoPE dict means it for both layer types; without query_pre_attn_scalar hf_tfm scales by head_dim ** -0.5."""
    config = config_from_tfm(tiny_config(**GEMMA3_SHAPED), "gemma3_text")
    assert config.query_pre_attn_scalar == 8
    assert config.rope_parameters["sliding_attention"] == config.rope_parameters["full_attention"]


def gemma3_shaped(**overrides):
    from conftest import tiny_model

    return tiny_model(**{**GEMMA3_SHAPED, **overrides})


INEXPRESSIBLE = [
    (lambda: gemma3_shaped(qk_norm="projection"), "qk_norm"),
    (lambda: gemma3_shaped(norm_position="pre"), "norm_position"),
    (lambda: gemma3_shaped(rmsnorm_unit_offset=False), "rmsnorm_unit_offset"),
    (lambda: gemma3_shaped(mlp_bias=True), "mlp_bias"),
    (lambda: gemma3_shaped(attention_multiplier=0.5), "attention_multiplier"),
    (lambda: gemma3_shaped(scale_embeddings=False), "scale_embeddings"),
    (lambda: gemma3_shaped(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_gemma3_cannot_express_is_refused(make_source, field):
    assert_refused_by_name(
        partial(from_tfm, name="gemma3_text"), make_source(), field, [name for _, name in INEXPRESSIBLE]
    )


def test_a_partial_rotary_factor_is_refused():
    """Gemma 3's default RoPE reads only rope_theta: hf_tfm would rotate a part of each head."""
    rope = {kind: {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5} for kind in LOCAL_GLOBAL}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        config_from_tfm(tiny_config(**GEMMA3_SHAPED, rope_parameters=rope), "gemma3_text")


def test_gemma3_config_hf_tfm_cannot_express_is_refused():
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        config_to_tfm(gemma3(use_bidirectional_attention=True).config)


# Gemma 3 1B's text config.json as released (5 local layers to 1 global, local theta 10k, global 1M)
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "vocab_size": 262144,
}


def test_released_gemma3_config_converts():
    config = config_to_tfm(Gemma3TextConfig.from_dict(GEMMA3_1B))
    assert config.layer_types.count("full_attention") == 4 and config.sliding_window == 512
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10000
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1000000
    back = config_from_tfm(config, "gemma3_text")
    assert back.layer_types == Gemma3TextConfig.from_dict(GEMMA3_1B).layer_types
