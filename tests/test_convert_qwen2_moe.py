"""Qwen2MoeForCausalLM <-> hf_tfm, exact both ways: Qwen2's attention (q, k, v biases) with softmax top-k experts
renormalised or not (`norm_topk_prob`) plus the sigmoid-gated shared expert, MoE layers picked by
`decoder_sparse_step` and `mlp_only_layers` (dense GLU elsewhere), Qwen2's window on the layers `layer_types` marks
(dynamic and static caches), and the same router logits, aux loss and loss with labels as the reference."""

from functools import partial

import pytest
import torch
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    ATOL,
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_refused_by_name,
    assert_round_trip,
    assert_router_outputs_match,
    moe_layers,
    padded_batch,
)
from transformers import Qwen2MoeConfig

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

E, K = 4, 2


def qwen2_moe(**overrides):
    return tiny_reference("qwen2_moe", **overrides)


VARIANTS = [
    pytest.param({}, [True, True], id="normed"),
    pytest.param(dict(norm_topk_prob=False, decoder_sparse_step=2), [False, True], id="unnormed-step2"),
    pytest.param(
        dict(mlp_only_layers=[1], use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2, qkv_bias=False),
        [True, False],
        id="mlp_only-window-no_bias",
    ),
    pytest.param(dict(head_dim=16, tie_word_embeddings=True), [True, True], id="head_dim-tied"),
]


@pytest.mark.parametrize("overrides, moe", VARIANTS)
def test_qwen2_moe_parity(overrides, moe):
    ref = qwen2_moe(**overrides)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="qwen2_moe"), caches=("dynamic", "static"))
    assert moe_layers(ours) == moe
    assert ours.config.layer_types == ref.config.layer_types
    assert ours.config.shared_expert_intermediate_size == 24 and ours.config.shared_expert_gate


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
@pytest.mark.parametrize("overrides, moe", VARIANTS[:2])
def test_qwen2_moe_router_logits_aux_loss_and_loss_match(overrides, moe, experts):
    ref = qwen2_moe(**overrides)
    assert_router_outputs_match(ref, to_tfm(ref), experts, sum(moe))


def test_the_shared_expert_and_its_gate_count():
    """Zeroing the shared expert's gate input changes the logits: the converted gate is read, not dropped."""
    ref = qwen2_moe()
    ours = to_tfm(ref)
    input_ids = padded_batch()[0]
    with torch.no_grad():
        before = ours(input_ids).logits
        ours.model.layers[0].mlp.shared_expert_gate.weight.zero_()
        assert (ours(input_ids).logits - before).abs().max() > 100 * ATOL


@pytest.mark.parametrize("overrides, moe", VARIANTS)
def test_qwen2_moe_round_trip(overrides, moe):
    assert_round_trip(qwen2_moe(**overrides), to_tfm, partial(from_tfm, name="qwen2_moe"))


def qwen2_moe_shaped(**overrides):
    """An hf_tfm model that is a Qwen2-MoE except for `overrides`."""
    fields = dict(
        LLAMA_SHAPED,
        attention_bias=True,
        attention_out_bias=False,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        num_experts=E,
        num_experts_per_tok=K,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        shared_expert_gate=True,
        router_weights_in_model_dtype=True,
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: qwen2_moe_shaped(scoring_func="sigmoid"), "scoring_func"),
    (lambda: qwen2_moe_shaped(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
    (lambda: qwen2_moe_shaped(shared_expert_gate=False), "shared_expert_gate"),
    (lambda: qwen2_moe_shaped(router_z_loss_coef=0.01), "router_z_loss_coef"),
    (lambda: qwen2_moe_shaped(capacity_factor=1.25), "capacity_factor"),
    (lambda: qwen2_moe_shaped(qk_norm="per_head"), "qk_norm"),
    (lambda: qwen2_moe_shaped(attention_out_bias=True), "attention_out_bias"),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_qwen2_moe_cannot_express_raises(make_source, field):
    assert isinstance(config_from_tfm(qwen2_moe_shaped().config, "qwen2_moe"), Qwen2MoeConfig)  # the baseline
    assert_refused_by_name(
        partial(from_tfm, name="qwen2_moe"), make_source(), field, [name for _, name in INEXPRESSIBLE]
    )


# Qwen1.5-MoE-A2.7B's config.json (rope_theta and the window keys as released)
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "max_window_layers": 21,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_released_qwen2_moe_config_converts():
    config = config_to_tfm(Qwen2MoeConfig.from_dict(QWEN15_MOE_A27B))
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (60, 4, False)
    assert (config.shared_expert_intermediate_size, config.shared_expert_gate, config.sliding_window) == (
        5632,
        True,
        None,
    )
    assert config.attention_bias and not config.attention_out_bias
    back = config_from_tfm(config, "qwen2_moe")
    assert (back.num_experts, back.shared_expert_intermediate_size, back.qkv_bias) == (60, 5632, True)
