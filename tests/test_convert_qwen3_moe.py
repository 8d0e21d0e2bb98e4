"""Qwen3MoeForCausalLM <-> hf_tfm, exact both ways: per-head QK-norm with softmax top-k experts renormalised or not
(`norm_topk_prob`), MoE layers picked by `decoder_sparse_step` and `mlp_only_layers` (dense GLU elsewhere), a window
on every layer (dynamic and static caches), and the same router logits, aux loss and loss with labels as the
reference."""

from functools import partial

import pytest
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    LLAMA_SHAPED,
    WINDOW,
    assert_converts_exactly,
    assert_refused_by_name,
    assert_round_trip,
    assert_router_outputs_match,
    moe_layers,
)
from transformers import Qwen3MoeConfig

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

E, K = 4, 2


def qwen3_moe(**overrides):
    return tiny_reference("qwen3_moe", **overrides)


VARIANTS = [
    pytest.param({}, [True, True], id="normed"),
    pytest.param(dict(norm_topk_prob=False, decoder_sparse_step=2), [False, True], id="unnormed-step2"),
    pytest.param(
        dict(mlp_only_layers=[1], use_sliding_window=True, sliding_window=WINDOW, attention_bias=True),
        [True, False],
        id="mlp_only-window-bias",
    ),
    pytest.param(dict(head_dim=16, tie_word_embeddings=True), [True, True], id="head_dim-tied"),
    pytest.param(dict(head_dim=8), [True, True], id="head_dim-derived"),  # the key, with the value it derives
]


@pytest.mark.parametrize("overrides, moe", VARIANTS)
def test_qwen3_moe_parity(overrides, moe):
    ref = qwen3_moe(**overrides)
    ours = assert_converts_exactly(ref, to_tfm, partial(from_tfm, name="qwen3_moe"), caches=("dynamic", "static"))
    assert moe_layers(ours) == moe
    assert ours.config.layer_types == ["sliding_attention" if ref.config.sliding_window else "full_attention"] * 2


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
@pytest.mark.parametrize("overrides, moe", VARIANTS[:2])
def test_qwen3_moe_router_logits_aux_loss_and_loss_match(overrides, moe, experts):
    ref = qwen3_moe(**overrides)
    assert_router_outputs_match(ref, to_tfm(ref), experts, sum(moe))


@pytest.mark.parametrize("overrides, moe", VARIANTS)
def test_qwen3_moe_round_trip(overrides, moe):
    assert_round_trip(qwen3_moe(**overrides), to_tfm, partial(from_tfm, name="qwen3_moe"))


def qwen3_moe_shaped(**overrides):
    """An hf_tfm model that is a Qwen3-MoE except for `overrides`."""
    fields = dict(
        LLAMA_SHAPED,
        qk_norm="per_head",
        num_key_value_heads=2,
        tie_word_embeddings=False,
        num_experts=E,
        num_experts_per_tok=K,
        moe_intermediate_size=16,
        router_weights_in_model_dtype=True,
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: qwen3_moe_shaped(scoring_func="sigmoid"), "scoring_func"),
    (lambda: qwen3_moe_shaped(shared_expert_intermediate_size=16), "shared_expert_intermediate_size"),
    (lambda: qwen3_moe_shaped(router_z_loss_coef=0.01), "router_z_loss_coef"),
    (lambda: qwen3_moe_shaped(capacity_factor=1.25), "capacity_factor"),
    (lambda: qwen3_moe_shaped(moe_layers=[1]), "moe_layers"),
    # Qwen3-MoE windows every layer or none
    (
        lambda: qwen3_moe_shaped(sliding_window=WINDOW, layer_types=["full_attention", "sliding_attention"]),
        "layer_types",
    ),
]


@pytest.mark.parametrize("make_source, field", INEXPRESSIBLE, ids=[case[1] for case in INEXPRESSIBLE])
def test_tfm_config_qwen3_moe_cannot_express_raises(make_source, field):
    assert isinstance(config_from_tfm(qwen3_moe_shaped().config, "qwen3_moe"), Qwen3MoeConfig)  # the baseline converts
    assert_refused_by_name(
        partial(from_tfm, name="qwen3_moe"), make_source(), field, [name for _, name in INEXPRESSIBLE]
    )


def test_qwen3_moe_config_key_it_does_not_read_raises():
    """Every Qwen3-MoE field has an hf_tfm counterpart; a key it does not declare is refused by name: Qwen3-MoE
    windows every layer whatever `layer_types` say, while its cache would follow them."""
    config = qwen3_moe(use_sliding_window=True, sliding_window=WINDOW).config
    config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="layer_types"):
        config_to_tfm(config)


# Qwen3-30B-A3B's config.json: a head_dim twice hidden_size // heads, and a max_window_layers Qwen3-MoE never reads
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_released_qwen3_moe_config_converts():
    config = config_to_tfm(Qwen3MoeConfig.from_dict(QWEN3_30B_A3B))
    assert (config.head_dim, config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (
        128,
        128,
        8,
        True,
    )
    assert (config.moe_intermediate_size, config.intermediate_size, config.sliding_window) == (768, 6144, None)
    back = config_from_tfm(config, "qwen3_moe")
    assert (back.head_dim, back.num_experts, back.mlp_only_layers) == (128, 128, [])
