"""GptOssForCausalLM <-> hf_tfm, exact both ways: a learned sink logit per head in every attention softmax, biases
on q, k, v and o, alternating sliding (a window shorter than the test sequence, dynamic and static caches) and full
layers, YaRN, and every feed-forward a biased router over experts with biases and the clamped SwiGLU (stored
[in, out] with alternating gate/up columns by GPT-OSS); the same router logits, aux loss and loss as the reference
under each experts backend. GPT-OSS attends eagerly: sdpa has no sinks."""

from functools import partial

import pytest
import torch
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_decoding_matches,
    assert_option_matters,
    assert_refused_by_name,
    assert_round_trip,
    assert_router_outputs_match,
)
from transformers import DistributedConfig, GptOssConfig

from hf_tfm import TfmDecoderForCausalLM, capabilities
from hf_tfm.compat import gpt_oss_declares_swiglu
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm
from hf_tfm.convert.common import config_with
from hf_tfm.model.capabilities import check_parallel_layout

E, K = 4, 2


def gpt_oss(**overrides):
    return tiny_reference("gpt_oss", **overrides)


VARIANTS = [
    pytest.param({}, id="sinks-biases-clamped"),
    pytest.param(dict(attention_bias=False, tie_word_embeddings=True), id="no_attention_bias-tied"),
    pytest.param(dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}), id="plain-rope"),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gpt_oss_parity(overrides):
    """Logits (unpadded, right- and left-padded), greedy and beam tokens with dynamic and static caches, the logits
    of the model converted back."""
    ref = gpt_oss(**overrides)
    ours = assert_converts_exactly(
        ref, to_tfm, partial(from_tfm, name="gpt_oss"), caches=("dynamic", "static"), attns=("eager",)
    )
    assert ours.config.attention_sinks and ours.config.router_bias and ours.config.expert_mlp_bias
    assert ours.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_gpt_oss_decoding_past_the_window(cache_implementation):
    ref = gpt_oss()
    assert_decoding_matches(ref, to_tfm(ref), cache_implementation)


@pytest.mark.parametrize("experts", ["eager", "batched_mm", "grouped_mm"])
def test_gpt_oss_router_logits_aux_loss_and_loss_match(experts):
    """Under each experts backend (transformers' batched and grouped kernels add the experts' biases and call
    hf_tfm's clamped gate)."""
    ref = gpt_oss()
    assert_router_outputs_match(ref, to_tfm(ref), experts, routed_layers=3)


def _zeroed(model, *names):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(name.endswith(suffix) for suffix in names):
                parameter.zero_()
    return model


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param(("self_attn.sinks",), id="sinks"),
        pytest.param(("mlp.router.bias",), id="router-bias"),
        pytest.param(("experts.gate_up_proj_bias", "experts.down_proj_bias"), id="expert-biases"),
    ],
)
def test_each_part_changes_the_reference(parts):
    """Each GPT-OSS part moves the reference logits well beyond the tolerance at the test shape, so the parity above
    proves hf_tfm applies it (and converts it to the right place)."""
    assert_option_matters(gpt_oss(), _zeroed(gpt_oss(), *parts))


@pytest.mark.skipif(not gpt_oss_declares_swiglu(), reason="this transformers' GptOssConfig fixes the SwiGLU limit")
def test_the_swiglu_clamp_changes_the_reference():
    ref, unclamped = gpt_oss(), gpt_oss(swiglu_limit=1e4)
    unclamped.load_state_dict(ref.state_dict())
    assert_option_matters(ref, unclamped)
    assert to_tfm(ref).config.swiglu_limit == 0.5


@pytest.mark.parametrize("overrides", VARIANTS)
def test_gpt_oss_round_trip(overrides):
    assert_round_trip(gpt_oss(**overrides), to_tfm, partial(from_tfm, name="gpt_oss"))


def test_sinks_refuse_sdpa_and_the_unsharded_parts_refuse_tensor_parallelism():
    config = config_to_tfm(gpt_oss().config)
    model = TfmDecoderForCausalLM(config)
    assert model.config._attn_implementation == "eager"  # the default falls back from sdpa
    with pytest.raises(ValueError, match="attention_sinks"):
        model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="attention_sinks"):
        check_parallel_layout(config, DistributedConfig(tp_size=2))
    # vLLM's attention takes the sinks (tests/support/vllm_serving.py); its fused experts have no router bias
    assert capabilities.backend_refusal(config_with(config, num_experts=0), "vllm") is None
    assert "router_bias" in capabilities.backend_refusal(config, "vllm")


def gpt_oss_shaped(**overrides):
    """An hf_tfm model that is a GPT-OSS except for `overrides`."""
    fields = dict(
        LLAMA_SHAPED,
        num_key_value_heads=2,
        attention_bias=True,
        tie_word_embeddings=False,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        num_experts=E,
        num_experts_per_tok=K,
        moe_intermediate_size=16,
        attention_sinks=True,
        router_bias=True,
        expert_mlp_bias=True,
        swiglu_limit=7.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        rmsnorm_scale_in_float32=True,
        scoring_func="top_k_softmax",
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: gpt_oss_shaped(attention_sinks=False), "attention_sinks"),
    (lambda: gpt_oss_shaped(router_bias=False), "router_bias"),
    (lambda: gpt_oss_shaped(expert_mlp_bias=False), "expert_mlp_bias"),
    (lambda: gpt_oss_shaped(swiglu_limit=None), "swiglu_limit"),
    (lambda: gpt_oss_shaped(scoring_func="softmax"), "scoring_func"),
    (lambda: gpt_oss_shaped(shared_expert_intermediate_size=16), "shared_expert_intermediate_size"),
    (lambda: gpt_oss_shaped(qk_norm="per_head"), "qk_norm"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_gpt_oss_cannot_express_is_refused(make_source, field):
    assert isinstance(config_from_tfm(gpt_oss_shaped().config, "gpt_oss"), GptOssConfig)  # the baseline converts
    assert_refused_by_name(
        partial(from_tfm, name="gpt_oss"), make_source(), field, [name for _, name in INEXPRESSIBLE]
    )


# gpt-oss-20b's config.json as released (quantization_config left out: its MXFP4 experts load dequantised)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}


def test_released_gpt_oss_config_converts():
    config = config_to_tfm(GptOssConfig.from_dict(GPT_OSS_20B))
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (32, 4, 2880)
    assert config.rope_parameters["rope_type"] == "yarn" and config.sliding_window == 128
    assert config.swiglu_limit == 7.0 and config.attention_sinks
    back = config_from_tfm(config, "gpt_oss")
    assert (back.num_local_experts, back.layer_types) == (32, GPT_OSS_20B["layer_types"])
