"""DeepseekV3ForCausalLM <-> hf_tfm, exact both ways: multi-head latent attention (a normed query bottleneck or a
direct query, keys and values expanded from a normed latent, a rotary key part shared by every head, interleaved or
half-split rotary pairs, YaRN's mscale in the score scale, values narrower than keys), the cache holding the latent
and the rotary key as transformers' DeepSeek-V3 does (dynamic and static), dense first layers, and MoE layers with
sigmoid scores, a choice-only bias (e_score_correction_bias), group-limited top-k, routed_scaling_factor and ungated
shared experts; the same router logits and loss as the reference."""

from functools import partial

import pytest
import torch
from conftest import tiny_model
from support.families import tiny_reference
from support.parity_harness import (
    ATOL,
    LLAMA_SHAPED,
    assert_converts_exactly,
    assert_option_matters,
    assert_refused_by_name,
    assert_round_trip,
    assert_router_outputs_match,
    padded_batch,
)
from transformers import DeepseekV3Config, DistributedConfig

from hf_tfm import TfmDecoderConfig, capabilities
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm
from hf_tfm.model.capabilities import check_parallel_layout

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}


def deepseek_v3(**overrides):
    return tiny_reference("deepseek_v3", **overrides)


VARIANTS = [
    pytest.param({}, id="q_lora-interleaved"),
    pytest.param(dict(q_lora_rank=None, rope_interleave=False), id="direct_query-halves"),
    pytest.param(dict(rope_parameters=YARN, attention_bias=True, tie_word_embeddings=True), id="yarn-bias-tied"),
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_deepseek_v3_parity(overrides):
    """Logits (eager and sdpa; unpadded, right- and left-padded), greedy and beam tokens with dynamic and static
    caches, and the logits of the model converted back."""
    ref = deepseek_v3(**overrides)
    ours = assert_converts_exactly(
        ref, to_tfm, partial(from_tfm, name="deepseek_v3"), caches=("dynamic", "static"), max_new_tokens=6
    )
    assert ours.config.kv_lora_rank == 16 and ours.config.mlp_only_layers == [0]
    assert ours.config.shared_expert_intermediate_size == 16 and ours.config.router_choice_bias


def test_the_cache_holds_what_transformers_holds():
    """Per layer, the normed latent [batch, 1, tokens, kv_lora_rank] and the rotary key [batch, 1, tokens, rope],
    equal to the reference's."""
    ref = deepseek_v3()
    ours = to_tfm(ref)
    input_ids = padded_batch()[0]
    with torch.no_grad():
        theirs, mine = ref(input_ids, use_cache=True), ours(input_ids, use_cache=True)
    cache_field = next(name for name in ("cache", "past_key_values") if mine.get(name) is not None)
    for theirs_layer, mine_layer in zip(theirs[cache_field].layers, mine[cache_field].layers, strict=True):
        assert mine_layer.keys.shape == (2, 1, 9, 16) and mine_layer.values.shape == (2, 1, 9, 4)
        torch.testing.assert_close(mine_layer.keys, theirs_layer.keys, atol=ATOL, rtol=0)
        torch.testing.assert_close(mine_layer.values, theirs_layer.values, atol=ATOL, rtol=0)


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
def test_deepseek_v3_router_logits_and_loss_match(experts):
    """DeepSeek-V3 adds no aux loss: router_aux_loss_coef is 0 on hf_tfm's side."""
    ref = deepseek_v3()
    assert_router_outputs_match(ref, to_tfm(ref), experts, routed_layers=2, aux_loss=False)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(topk_group=4), id="group-limit"),
        pytest.param(dict(routed_scaling_factor=1.0), id="scaling"),
        pytest.param(dict(rope_interleave=False), id="interleave"),
        pytest.param(dict(rope_parameters=YARN), id="yarn-mscale"),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """Each DeepSeek-V3 option moves the reference logits well beyond the tolerance at the test shape, so the parity
    above proves hf_tfm applies it (the choice bias: below)."""
    ref, other = deepseek_v3(), deepseek_v3(**overrides)
    other.load_state_dict(ref.state_dict())
    assert_option_matters(ref, other)


def test_the_choice_bias_changes_the_reference():
    ref, unbiased = deepseek_v3(), deepseek_v3()
    with torch.no_grad():
        for name, buffer in unbiased.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()
    assert_option_matters(ref, unbiased)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_deepseek_v3_round_trip(overrides):
    assert_round_trip(deepseek_v3(**overrides), to_tfm, partial(from_tfm, name="deepseek_v3"))


def deepseek_shaped(**overrides):
    """An hf_tfm model that is a DeepSeek-V3 except for `overrides`."""
    fields = dict(
        LLAMA_SHAPED,
        tie_word_embeddings=False,
        head_dim=4,
        kv_lora_rank=16,
        q_lora_rank=12,
        qk_nope_head_dim=6,
        v_head_dim=5,
        rope_interleave=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        num_expert_groups=4,
        topk_expert_groups=2,
        routed_scaling_factor=2.5,
        scoring_func="sigmoid",
        router_choice_bias=True,
        router_in_float32=True,
        router_aux_loss_coef=0.0,
        shared_expert_intermediate_size=16,
        mlp_only_layers=[0],
    )
    return tiny_model(**{**fields, **overrides})


INEXPRESSIBLE = [
    (lambda: deepseek_shaped(scoring_func="softmax"), "scoring_func"),
    (lambda: deepseek_shaped(router_choice_bias=False), "router_choice_bias"),
    (lambda: deepseek_shaped(router_aux_loss_coef=0.01), "router_aux_loss_coef"),
    (lambda: deepseek_shaped(shared_expert_intermediate_size=12), "shared_expert_intermediate_size"),
    (lambda: deepseek_shaped(shared_expert_intermediate_size=0), "shared_expert_intermediate_size"),
    (lambda: deepseek_shaped(mlp_only_layers=[1]), "mlp_only_layers"),
    (lambda: deepseek_shaped(shared_expert_gate=True), "shared_expert_gate"),
    (lambda: deepseek_shaped(router_in_float32=False), "router_in_float32"),
]


@pytest.mark.parametrize(
    "make_source, field", INEXPRESSIBLE, ids=[f"{case[1]}-{i}" for i, case in enumerate(INEXPRESSIBLE)]
)
def test_tfm_config_deepseek_v3_cannot_express_is_refused(make_source, field):
    assert isinstance(config_from_tfm(deepseek_shaped().config, "deepseek_v3"), DeepseekV3Config)  # the baseline
    others = [name for _, name in INEXPRESSIBLE]
    assert_refused_by_name(partial(from_tfm, name="deepseek_v3"), make_source(), field, others)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(position_embedding_type="learned"), "position_embedding_type"),
        (dict(qk_norm="per_head"), "qk_norm"),
        (dict(sliding_window=4), "layer_types"),
        (dict(num_expert_groups=3), "num_expert_groups"),
        (dict(topk_expert_groups=5), "topk_expert_groups"),
    ],
)
def test_latent_attention_and_group_routing_refuse_what_they_cannot_run(overrides, field):
    fields = dict(LLAMA_SHAPED, head_dim=4, kv_lora_rank=16, num_experts=8, num_experts_per_tok=2)
    fields |= dict(num_expert_groups=4, topk_expert_groups=2)
    with pytest.raises(ValueError, match=field):
        TfmDecoderConfig(**{**fields, **overrides})


def test_latent_attention_refuses_tensor_parallelism():
    config = config_to_tfm(deepseek_v3().config)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        check_parallel_layout(config, DistributedConfig(tp_size=2))
    assert "kv_lora_rank" in capabilities.backend_refusal(config, "vllm")


# DeepSeek-V3's config.json as released (quantization_config left out: its FP8 weights load dequantised)
DEEPSEEK_V3_671B = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "v_head_dim": 128,
    "vocab_size": 129280,
}


def test_released_deepseek_v3_config_converts():
    config = config_to_tfm(DeepseekV3Config.from_dict(DEEPSEEK_V3_671B))
    assert (config.kv_lora_rank, config.q_lora_rank, config.head_dim, config.v_head_dim) == (512, 1536, 64, 128)
    assert (config.num_experts, config.num_expert_groups, config.topk_expert_groups) == (256, 8, 4)
    assert config.mlp_only_layers == [0, 1, 2] and config.shared_expert_intermediate_size == 2048
    back = config_from_tfm(config, "deepseek_v3")
    assert (back.first_k_dense_replace, back.n_shared_experts, back.n_group) == (3, 1, 8)


def test_a_bf16_deepseek_v3_routes_as_the_reference():
    """DeepSeek-V3's router scores in float32 whatever the model's dtype: in bf16 the converted model gives the
    reference's router logits and logits exactly; scoring in bf16 (the control) it would not."""
    reference = deepseek_v3()
    ours = to_tfm(reference).to(torch.bfloat16)
    reference = reference.to(torch.bfloat16)
    ids = torch.randint(3, reference.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids, output_router_logits=True)
        actual = ours(ids, output_router_logits=True)
        assert actual.router_logits[0].dtype == torch.float32
        for mine, theirs in zip(actual.router_logits, getattr(expected, "router_logits", None) or ()):  # 5.19 on
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
        torch.testing.assert_close(actual.logits, expected.logits, rtol=0, atol=0)
        for module in ours.modules():
            if hasattr(module, "in_float32"):
                module.in_float32 = False
        assert (ours(ids).logits - expected.logits).abs().max() > 0
