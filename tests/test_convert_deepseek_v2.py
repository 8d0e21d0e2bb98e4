"""DeepseekV2ForCausalLM <-> hf_tfm, exact both ways: DeepSeek-V3's latent attention and MoE layout (dense first
layers, fine-grained routed experts beside gated shared experts) with DeepSeek-V2's routing: softmax scores in
float32, greedy or group-limited top-k (a group scored by its best expert: `expert_group_score="max"`), weights not
renormalised and scaled by routed_scaling_factor; and its rotary pairs rotated as complex numbers (`rope_as_complex`).
The registry-wide files prove the rest (round trips, bf16 with its controls, presets)."""

import copy
from functools import partial

import pytest
import torch
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    assert_converts_exactly,
    assert_gradients_match,
    assert_option_matters,
    assert_refused_by_name,
    assert_round_trip,
    assert_router_outputs_match,
    padded_batch,
)
from transformers import DeepseekV2Config

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "rope_theta": 10000.0,
}


def deepseek_v2(**overrides):
    return tiny_reference("deepseek_v2", **overrides)


VARIANTS = [
    pytest.param({}, id="group_limited-q_lora-mlp_bias"),
    pytest.param(dict(topk_method="greedy", n_group=None, topk_group=None), id="greedy"),
    pytest.param(dict(q_lora_rank=None, mlp_bias=False), id="direct_query"),
    pytest.param(dict(rope_parameters=YARN, attention_bias=True, tie_word_embeddings=True), id="yarn-bias-tied"),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_deepseek_v2_parity(overrides):
    """Logits (eager and sdpa; unpadded, right- and left-padded), greedy and beam tokens with dynamic and static
    caches, and the logits of the model converted back."""
    ours = assert_converts_exactly(
        deepseek_v2(**overrides),
        to_tfm,
        partial(from_tfm, name="deepseek_v2"),
        caches=("dynamic", "static"),
        max_new_tokens=6,
    )
    assert ours.config.expert_group_score == "max" and not ours.config.norm_topk_prob
    assert "rope_as_complex" in ours.config.numerics


@pytest.mark.parametrize("overrides", VARIANTS)
def test_deepseek_v2_round_trip(overrides):
    assert_round_trip(deepseek_v2(**overrides), to_tfm, partial(from_tfm, name="deepseek_v2"))


def test_greedy_routing_reads_no_groups():
    """A greedy config's group fields are never read: converted, it routes ungrouped, and its way back writes them
    unset (None), as transformers' default."""
    config = config_to_tfm(deepseek_v2(topk_method="greedy").config)
    assert (config.num_expert_groups, config.topk_expert_groups) == (1, 1)
    back = config_from_tfm(config, "deepseek_v2")
    assert (back.topk_method, back.n_group, back.topk_group) == ("greedy", None, None)


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
def test_deepseek_v2_router_logits_match(experts):
    """DeepSeek-V2's model adds no aux loss: router_aux_loss_coef is 0 on hf_tfm's side."""
    ref = deepseek_v2()
    assert_router_outputs_match(ref, to_tfm(ref), experts, routed_layers=2, aux_loss=False)


def test_training_loss_and_gradients_match():
    reference = deepseek_v2()
    ours = to_tfm(reference)
    input_ids, attention_mask, position_ids = padded_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
    reference.train(), ours.train()
    expected, actual = reference(**inputs), ours(**inputs)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "deepseek_v2")


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(topk_method="greedy"), id="group-limit"),
        pytest.param(dict(n_group=2), id="n_group"),
        pytest.param(dict(routed_scaling_factor=1.0), id="scaling"),
        pytest.param(dict(rope_parameters=YARN), id="yarn-mscale"),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """Each DeepSeek-V2 option moves the reference logits well beyond the tolerance at the test shape, so the parity
    above proves hf_tfm applies it."""
    ref, other = deepseek_v2(), deepseek_v2(**overrides)
    other.load_state_dict(ref.state_dict())
    assert_option_matters(ref, other)


def test_a_group_is_scored_by_its_best_expert():
    """The control for `expert_group_score`: the same weights scoring each group by its two best experts (DeepSeek-V3's
    rule) route otherwise and give other logits than the reference's."""
    reference = deepseek_v2()
    ours = to_tfm(reference)
    input_ids = padded_batch()[0]
    with torch.no_grad():
        expected = reference(input_ids).logits
        torch.testing.assert_close(ours(input_ids).logits, expected, atol=0, rtol=0)
        for layer in ours.model.layers[1:]:
            layer.mlp.router.group_score = "top2_sum"
        assert (ours(input_ids).logits - expected).abs().max() > 1e-3


def test_the_rotation_as_complex_numbers_is_exact():
    """The control for `rope_as_complex`: with it the float32 logits equal the reference's bit for bit; rotating the
    same pairs by `cos` and `sin` tables (DeepSeek-V3's way, the same function) they differ in the last bits."""
    reference = deepseek_v2()
    ours = to_tfm(reference)
    config = copy.deepcopy(ours.config)
    config.numerics = [entry for entry in config.numerics if entry != "rope_as_complex"]
    without = type(ours)(config).eval()
    without.load_state_dict(ours.state_dict())
    input_ids = padded_batch()[0]
    with torch.no_grad():
        expected = reference(input_ids).logits
        torch.testing.assert_close(ours(input_ids).logits, expected, atol=0, rtol=0)
        difference = (without(input_ids).logits - expected).abs().max()
    assert 0 < difference < 1e-5


def deepseek_v2_shaped(**overrides):
    """An hf_tfm model that is a DeepSeek-V2 except for `overrides`."""
    config = config_to_tfm(deepseek_v2().config)
    fields = {key: value for key, value in config.to_diff_dict().items() if key in type(config).__dataclass_fields__}
    return tiny_model(**{**LLAMA_SHAPED, **fields, **overrides})


INEXPRESSIBLE = [
    (lambda: deepseek_v2_shaped(scoring_func="sigmoid"), "scoring_func"),
    (lambda: deepseek_v2_shaped(norm_topk_prob=True), "norm_topk_prob"),
    (lambda: deepseek_v2_shaped(router_choice_bias=True), "router_choice_bias"),
    (lambda: deepseek_v2_shaped(expert_group_score="top2_sum"), "expert_group_score"),
    (lambda: deepseek_v2_shaped(rope_interleave=False, numerics=["router_in_float32"]), "rope_interleave"),
    (lambda: deepseek_v2_shaped(router_aux_loss_coef=0.01), "router_aux_loss_coef"),
    (lambda: deepseek_v2_shaped(shared_expert_intermediate_size=12), "shared_expert_intermediate_size"),
    (lambda: deepseek_v2_shaped(mlp_only_layers=[1]), "mlp_only_layers"),
]


@pytest.mark.parametrize(
    "make_source, field", INEXPRESSIBLE, ids=[f"{case[1]}-{i}" for i, case in enumerate(INEXPRESSIBLE)]
)
def test_tfm_config_deepseek_v2_cannot_express_is_refused(make_source, field):
    assert isinstance(config_from_tfm(deepseek_v2_shaped().config, "deepseek_v2"), DeepseekV2Config)  # the baseline
    others = [name for _, name in INEXPRESSIBLE]
    assert_refused_by_name(partial(from_tfm, name="deepseek_v2"), make_source(), field, others)


def test_complex_rotation_needs_interleaved_pairs():
    config = config_to_tfm(deepseek_v2().config)
    with pytest.raises(ValueError, match="rope_as_complex"):
        type(config)(**{**config.to_dict(), "rope_interleave": False})


# DeepSeek-V2-Lite's config.json (its auto_map and the keys of its remote code's own left out, listed below)
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "v_head_dim": 128,
    "vocab_size": 102400,
}


def test_released_deepseek_v2_lite_config_converts():
    config = config_to_tfm(DeepseekV2Config.from_dict(DEEPSEEK_V2_LITE))
    assert (config.kv_lora_rank, config.q_lora_rank, config.head_dim, config.v_head_dim) == (512, None, 64, 128)
    assert (config.num_experts, config.num_experts_per_tok, config.num_expert_groups) == (64, 6, 1)
    assert config.mlp_only_layers == [0] and config.shared_expert_intermediate_size == 2816
    back = config_from_tfm(config, "deepseek_v2")
    assert (back.first_k_dense_replace, back.n_shared_experts, back.topk_method) == (1, 2, "greedy")
