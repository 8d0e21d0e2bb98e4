"""Tensor, expert and pipeline parallelism through transformers' own engine, proved with two CPU processes (gloo).

hf_tfm declares transformers' plans, computed from the config when the base model is built (`tensor_parallel_plan`,
`expert_parallel_plan`, `pipeline_parallel_plan`) plus the heads' `_tp_plan`; `from_pretrained(path, tp_plan="auto")`
under `torchrun --nproc_per_node 2` shards a model with them. One launch of tests/support/tp_worker.py runs every check
against the same model in one process and writes what it measured (float32, largest differences); the tests here read
it. The cases cover every paradigm and each block option whose sharding differs: GQA, gated and plain feed-forwards,
MoE experts with a gated shared expert, per-head and whole-projection QK-norms, ALiBi and T5's relative bias (attention
gathered), parallel residual, sandwich, output and post norms, soft-capping, sliding and NoPE layers, partial and
nested RoPE, padding-aware positions, cross-attention, tied and untied heads with biases. The training step also proves
the LM heads' fallback: a tensor-parallel head computes its loss from gathered logits (the reference uses the chunked
loss), with the same value and gradients. The tests without processes check the plans' rules and the layouts refused by
config field."""

import json
import os
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
from support.families import tiny_reference
from support.processes import run_process_group
from transformers.distributed import DistributedConfig
from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from hf_tfm.compat import TOKEN_DISPATCH
from hf_tfm.convert import to_tfm
from hf_tfm.model.capabilities import (
    check_parallel_layout,
    expert_parallel_plan,
    pipeline_parallel_plan,
    tensor_parallel_plan,
)
from hf_tfm.model.modeling_tfm import (
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderDecoderModel,
    TfmEncoderForMaskedLM,
    TfmEncoderForSequenceClassification,
    TfmEncoderModel,
)

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.xdist_group("tensor_parallel")]

WORKER = Path(__file__).resolve().parent / "support" / "tp_worker.py"
ATOL = 1e-5  # float32: the sharded sums differ from one process's only in summation order

SMALL = dict(
    vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip

# name -> (model class, config class, fields)
CASES = {
    # Llama/Gemma 2-like: sharded attention with GQA, per-head QK-norm, nested and partial RoPE, sliding and NoPE
    # layers, sandwich (1 + weight) norms, both soft-cappings, q/k/v biases without an output bias, tied head
    "decoder_gqa": (
        TfmDecoderForCausalLM,
        TfmDecoderConfig,
        dict(
            num_hidden_layers=3,
            num_key_value_heads=2,
            ffn_type="glu",
            hidden_act="silu",
            mlp_bias=False,
            norm_type="rmsnorm",
            rmsnorm_unit_offset=True,
            norm_position="sandwich",
            position_embedding_type="rope",
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
            },
            qk_norm="per_head",
            attention_bias=True,
            attention_out_bias=False,
            query_pre_attn_scalar=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=4,
            nope_layers=[1],
            attn_logit_softcapping=30.0,
            final_logit_softcapping=20.0,
        ),
    ),
    # Qwen-MoE/GPT-NeoX-like: a dense first layer, routed experts with a capacity and sigmoid scores, a gated shared
    # expert, a parallel residual, no first attention norm, an untied head with a bias, router losses in the loss
    "decoder_moe": (
        TfmDecoderForCausalLM,
        TfmDecoderConfig,
        dict(
            num_key_value_heads=2,
            position_embedding_type="rope",
            parallel_residual=True,
            first_layer_attn_norm=False,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_only_layers=[0],
            scoring_func="sigmoid",
            capacity_factor=2.0,
            shared_expert_intermediate_size=32,
            shared_expert_gate=True,
            tie_word_embeddings=False,
            lm_head_bias=True,
            router_aux_loss_coef=0.1,
            router_z_loss_coef=0.01,
        ),
    ),
    # OLMo2-like QK-norm over the whole projection with output norms, and ALiBi: attention gathered, MLP sharded
    "decoder_alibi": (
        TfmDecoderForCausalLM,
        TfmDecoderConfig,
        dict(
            num_key_value_heads=2,
            position_embedding_type="alibi",
            qk_norm="projection",
            norm_type="rmsnorm",
            norm_position="output",
        ),
    ),
    # GPT-2/Phi-3-like: q, k and v as one matrix (attention gathered, as Phi-3's plan), GQA, gated feed-forward
    "decoder_fused": (
        TfmDecoderForCausalLM,
        TfmDecoderConfig,
        dict(
            num_key_value_heads=2,
            position_embedding_type="rope",
            fused_qkv_proj=True,
            attention_bias=True,
            ffn_type="glu",
            hidden_act="silu",
        ),
    ),
    # BERT/RoBERTa-like: post-norm, token types, padding-aware learned positions, embedding norm, tied MLM head
    "encoder": (
        TfmEncoderForMaskedLM,
        TfmEncoderConfig,
        dict(
            norm_position="post",
            embedding_norm=True,
            final_norm=False,
            position_ids_from_padding=True,
            position_offset=1,
        ),
    ),
    # T5-like: relative position bias (self-attention gathered, cross-attention sharded), gated feed-forward
    "t5_like": (
        TfmEncoderDecoderForConditionalGeneration,
        TfmEncoderDecoderConfig,
        dict(
            position_embedding_type="relative_bias",
            norm_type="rmsnorm",
            ffn_type="glu",
            hidden_act="gelu_new",
            attention_bias=False,
            mlp_bias=False,
            attention_multiplier=1.0,
            scale_lm_head_input=True,
            decoder_start_token_id=0,
            decoder_layers=3,
        ),
    ),
    # BART-like: learned positions at an offset, post-norm, scaled embeddings, GQA in both attentions, head bias
    "bart_like": (
        TfmEncoderDecoderForConditionalGeneration,
        TfmEncoderDecoderConfig,
        dict(
            num_key_value_heads=2,
            position_offset=2,
            norm_position="post",
            embedding_norm=True,
            final_norm=False,
            scale_embeddings=True,
            lm_head_bias=True,
            decoder_start_token_id=2,
        ),
    ),
}
PARADIGM = {
    TfmDecoderForCausalLM: ("AutoModelForCausalLM", "decoder"),
    TfmEncoderForMaskedLM: ("AutoModelForMaskedLM", "encoder"),
    TfmEncoderDecoderForConditionalGeneration: ("AutoModelForSeq2SeqLM", "encoder_decoder"),
}

# transformers >= 5.21 runs the experts of a tensor-parallel model expert-parallel with `ep_size`; 5.17-5.20 with
# `enable_expert_parallel`, which puts the expert plan in place of the tensor one
EXPERT_LAYOUT = {"tp_size": 2, "ep_size": 2} if TOKEN_DISPATCH else {"tp_size": 2, "enable_expert_parallel": True}
# a negative control: the per-head QK-norms without their gradient all-reduce (transformers >= 5.21 names the
# no-op style "replicate"); a check that could not see this error would prove nothing
PARTIAL_NORM_GRADIENTS = {
    "tp_size": 2,
    "tp_plan": dict.fromkeys(["model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"], "replicate"),
}
# run name -> (case, how it is distributed, the checks besides the logits)
RUNS = {
    "decoder_gqa": ("decoder_gqa", {"tp_plan": "auto"}, ["generate", "train"]),
    "decoder_moe": ("decoder_moe", {"tp_plan": "auto"}, ["generate", "train", "save"]),
    "decoder_alibi": ("decoder_alibi", {"tp_plan": "auto"}, ["generate", "train"]),
    "decoder_fused": ("decoder_fused", {"tp_plan": "auto"}, ["generate", "train"]),
    "encoder": ("encoder", {"tp_plan": "auto"}, ["train"]),
    "t5_like": ("t5_like", {"tp_plan": "auto"}, ["generate", "train", "save"]),
    "bart_like": ("bart_like", {"tp_size": 2}, ["generate", "train"]),  # the DistributedConfig spelling
    "expert_parallel": ("decoder_moe", EXPERT_LAYOUT, ["generate", "train"]),
    # the forward pass only: transformers' pipeline returns logits without a loss, and in generate() a later stage
    # would read the cached length from layer 0's cache, which only the first stage fills
    "pipeline": ("decoder_gqa", {"pp_size": 2}, []),
}
if "replicate" in ALL_PARALLEL_STYLES:
    RUNS["control_partial_norm_gradients"] = ("decoder_gqa", PARTIAL_NORM_GRADIENTS, ["train"])
TENSOR_PARALLEL = ["decoder_gqa", "decoder_moe", "decoder_alibi", "decoder_fused", "encoder", "t5_like", "bart_like"]

# what each run must hold in slices (wildcard name -> its placement): proof that the plan was applied as meant
SHARDED = {
    "decoder_gqa": {
        "model.embed_tokens.weight": "Shard(dim=0)",  # the vocabulary, tied to lm_head
        "model.layers.*.self_attn.q_proj.weight": "Shard(dim=0)",
        "model.layers.*.self_attn.k_proj.bias": "Shard(dim=0)",
        "model.layers.*.self_attn.o_proj.weight": "Shard(dim=1)",
        "model.layers.*.mlp.gate_proj.weight": "Shard(dim=0)",
        "model.layers.*.mlp.down_proj.weight": "Shard(dim=1)",
    },
    "decoder_moe": {
        "lm_head.weight": "Shard(dim=0)",
        "lm_head.bias": "Shard(dim=0)",
        "model.layers.*.mlp.experts.gate_up_proj": "_StridedShard(dim=1",  # gate and up halves split alike
        "model.layers.*.mlp.experts.down_proj": "Shard(dim=2)",
        "model.layers.*.mlp.shared_expert.gate_proj.weight": "Shard(dim=0)",
        "model.layers.*.mlp.up_proj.weight": "Shard(dim=0)",  # the dense first layer
    },
    "decoder_alibi": {"model.layers.*.self_attn.q_proj.weight": "Shard(dim=0)"},  # sharded, output gathered
    "decoder_fused": {
        "model.layers.*.self_attn.qkv_proj.weight": "Shard(dim=0)",  # sharded, output gathered
        "model.layers.*.self_attn.qkv_proj.bias": "Shard(dim=0)",
        "model.layers.*.self_attn.o_proj.weight": "Shard(dim=1)",
    },
    "encoder": {"lm_head.decoder.bias": "Shard(dim=0)", "model.layers.*.mlp.up_proj.weight": "Shard(dim=0)"},
    "t5_like": {
        "model.shared.weight": "Shard(dim=0)",
        "model.encoder.layers.*.self_attn.v_proj.weight": "Shard(dim=0)",
        "model.decoder.layers.*.cross_attn.k_proj.weight": "Shard(dim=0)",
        "model.decoder.layers.*.mlp.gate_proj.weight": "Shard(dim=0)",
    },
    "bart_like": {
        "lm_head.bias": "Shard(dim=0)",
        "model.decoder.layers.*.cross_attn.o_proj.weight": "Shard(dim=1)",
        "model.encoder.layers.*.self_attn.o_proj.weight": "Shard(dim=1)",
    },
    "expert_parallel": {  # whole experts per rank (dim 0 of [E, 2I, H]), attention still tensor-parallel
        "model.layers.*.mlp.experts.gate_up_proj": "Shard(dim=0)",
        "model.layers.*.mlp.experts.down_proj": "Shard(dim=0)",
    },
}
if TOKEN_DISPATCH:
    SHARDED["expert_parallel"]["model.layers.*.self_attn.q_proj.weight"] = "Shard(dim=0)"


def perturbed(model):
    """Noise on every weight, so that norms and biases (initialised at 1 and 0) take part in the comparison."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.1)
    return model


def write_runs(directory: Path) -> None:
    for name, (model_class, config_class, fields) in CASES.items():
        torch.manual_seed(0)
        perturbed(model_class(config_class(**SMALL | fields))).save_pretrained(directory / name)
    runs = {}
    for name, (case, distributed, checks) in RUNS.items():
        auto_class, paradigm = PARADIGM[CASES[case][0]]
        runs[name] = dict(
            folder=case, auto_class=auto_class, paradigm=paradigm, distributed=distributed, checks=checks
        )
    (directory / "runs.json").write_text(json.dumps(runs, indent=1))


def died_in_native_code(launcher_output: str) -> bool:
    """Whether torchrun reports a rank killed by SIGABRT, SIGSEGV or SIGBUS (a Python error exits with 1)."""
    return re.search(r"Signal (6|7|11) \(SIG(ABRT|BUS|SEGV)\) received", launcher_output) is not None


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    """Both ranks' results: {run name: {what was measured}}."""
    directory = tmp_path_factory.mktemp("tensor-parallel")
    write_runs(directory)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for attempt in range(2):
        result = run_process_group([*command, str(WORKER), str(directory)], env=env, timeout=300)
        if result.returncode == 0 or not died_in_native_code(result.stderr) or attempt == 1:
            break
        # once in CI (2026-11-27) rank 0 aborted in the t5_like run with glibc's "malloc(): unaligned fastbin chunk
        # detected", and 25 launches under a busy loop here did not repeat it; a crash twice in a row still fails
        warnings.warn(f"a rank died in native code; launching once more:\n{result.stderr[-1500:]}", stacklevel=1)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads((directory / f"rank{rank}.json").read_text())["runs"] for rank in range(2)]
    for runs in ranks:
        failed = {name: run["error"] for name, run in runs.items() if "error" in run}
        assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())
    return ranks


@pytest.mark.parametrize("run", sorted(SHARDED))
@pytest.mark.slow
def test_the_plans_shard_what_they_name(measured, run):
    for results in measured:
        sharded = results[run]["sharded"]
        for name, placement in SHARDED[run].items():
            assert placement in sharded.get(name, "not sharded"), (name, sharded.get(name))
        assert results[run]["tp_size"] == 2


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.slow
def test_logits_equal_one_process(measured, run):
    for results in measured:
        assert results[run]["logits"] <= ATOL


@pytest.mark.parametrize("run", sorted(name for name, (_, _, checks) in RUNS.items() if "generate" in checks))
@pytest.mark.slow
def test_greedy_generation_gives_the_same_tokens(measured, run):
    for results in measured:
        assert results[run]["same_tokens"], results[run]["tokens"]
    assert measured[0][run]["tokens"] == measured[1][run]["tokens"]


@pytest.mark.parametrize("run", [*TENSOR_PARALLEL, "expert_parallel"])
@pytest.mark.slow
def test_one_training_step_gives_the_same_loss_gradients_and_parameters(measured, run):
    for results in measured:
        for measure in ("loss", "gradients", "parameters"):
            assert results[run][measure] <= ATOL, (measure, results[run][measure])


@pytest.mark.parametrize("run", sorted(name for name, (_, _, checks) in RUNS.items() if "save" in checks))
@pytest.mark.slow
def test_save_pretrained_writes_the_whole_trained_model(measured, run):
    for results in measured:
        assert results[run]["saved"] == 0.0


@pytest.mark.slow
def test_the_checks_see_a_missing_gradient_all_reduce(measured):
    """The negative control: without the rule that sums the per-head norms' partial gradients over the ranks, the
    forward pass is still right, but the gradients and the stepped parameters are not."""
    if "control_partial_norm_gradients" not in RUNS:
        pytest.skip("this transformers has no no-op `replicate` style to drop a rule with")
    for results in measured:
        control = results["control_partial_norm_gradients"]
        assert control["logits"] <= ATOL and control["loss"] <= ATOL
        assert control["gradients"] > 1e3 * ATOL and control["parameters"] > 1e3 * ATOL


@pytest.mark.slow
def test_pipeline_stages_split_the_layers(measured):
    """Each rank holds part of the blocks (the others are transformers' placeholders) and the logits still match."""
    first, last = (results["pipeline"]["placeholders"] for results in measured)
    assert first > 0 and last > 0 and measured[0]["pipeline"]["sharded"] == {}


# ------------------------------------------------------------------------------------- the plans, no processes


def rules(config) -> dict[str, str]:
    return tensor_parallel_plan(config)


def test_attention_is_sharded_by_heads_unless_a_step_needs_them_all():
    plain = rules(TfmDecoderConfig(**SMALL))
    assert plain["layers.*.self_attn.q_proj"] == "colwise" and plain["layers.*.self_attn.o_proj"] == "rowwise"
    per_head = rules(TfmDecoderConfig(**SMALL, qk_norm="per_head"))
    assert per_head["layers.*.self_attn.k_norm"] == "replicated_with_grad_allreduce"
    for fields in (dict(qk_norm="projection"), dict(position_embedding_type="alibi", qk_norm="per_head")):
        gathered = rules(TfmDecoderConfig(**SMALL, **fields))
        assert gathered["layers.*.self_attn.q_proj"] == "colwise_gather_output", fields
        assert gathered["layers.*.self_attn.o_proj"] == "rowwise_split_input", fields
        assert "layers.*.self_attn.q_norm" not in gathered, fields  # every rank's norm sees every head
    t5 = rules(TfmEncoderDecoderConfig(**SMALL, position_embedding_type="relative_bias"))
    assert (
        t5["encoder.layers.*.self_attn.k_proj"] == t5["decoder.layers.*.self_attn.k_proj"] == "colwise_gather_output"
    )
    assert t5["decoder.layers.*.cross_attn.k_proj"] == "colwise"  # no position bias in cross-attention
    assert t5["shared"] == "embedding_rowwise"  # the body's table; the stacks borrow it


def test_feed_forward_and_expert_rules_follow_the_layers():
    mlp = rules(TfmDecoderConfig(**SMALL))
    assert "layers.*.mlp.gate_proj" not in mlp and mlp["layers.*.mlp.down_proj"] == "rowwise"
    assert not any("experts" in name for name in mlp) and expert_parallel_plan(TfmDecoderConfig(**SMALL)) is None
    moe = rules(TfmDecoderConfig(**SMALL, num_experts=4, shared_expert_intermediate_size=16))
    assert "layers.*.mlp.up_proj" not in moe  # every layer is MoE
    assert moe["layers.*.mlp.experts.gate_up_proj"] == "packed_colwise"
    assert moe["layers.*.mlp.shared_expert.gate_proj"] == "colwise"  # gated, whatever ffn_type says
    seq2seq = TfmEncoderDecoderConfig(**SMALL, num_experts=4, decoder_sparse_step=2, decoder_layers=3)
    assert {"encoder.layers.*.mlp.experts", "decoder.layers.*.mlp.experts", "decoder.layers.*.mlp.up_proj"} <= set(
        rules(seq2seq)
    )
    assert {name.split(".")[0] for name in expert_parallel_plan(seq2seq)} == {"encoder", "decoder"}


MODELS = [
    (
        TfmDecoderForCausalLM,
        TfmDecoderConfig,
        dict(num_experts=4, mlp_only_layers=[0], shared_expert_intermediate_size=16),
    ),
    (TfmDecoderForCausalLM, TfmDecoderConfig, dict(qk_norm="per_head", ffn_type="glu", tie_word_embeddings=False)),
    (TfmDecoderForSequenceClassification, TfmDecoderConfig, dict(position_embedding_type="alibi")),
    (TfmEncoderForMaskedLM, TfmEncoderConfig, dict(qk_norm="projection")),
    (TfmEncoderForSequenceClassification, TfmEncoderConfig, {}),
    (TfmEncoderDecoderForConditionalGeneration, TfmEncoderDecoderConfig, dict(num_experts=2, decoder_layers=3)),
]


@pytest.mark.parametrize(("model_class", "config_class", "fields"), MODELS)
def test_every_rule_names_a_module_of_the_model(model_class, config_class, fields):
    """The plans transformers merges (the config's under the body's name, the head's own) name only what exists: a
    rule naming nothing would be a layer left whole without a word."""
    model = model_class(config_class(**SMALL | fields))
    named = [name for name, _ in [*model.named_modules(), *model.named_parameters()]]
    names = {".".join("*" if part.isdigit() else part for part in name.split(".")) for name in named}
    for plan in (model.tp_plan, model._ep_plan, model.pp_plan):
        assert set(plan) <= names, sorted(set(plan) - names)
    assert model.tp_plan.get("lm_head", model.tp_plan.get("lm_head.decoder")) in (None, "colwise_gather_output")
    if config_class is TfmEncoderDecoderConfig:  # the stacks' rules are the body's, prefixed once
        assert model.model.encoder.tp_plan == {} and "model.decoder.layers.*.cross_attn.q_proj" in model.tp_plan


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_causal_lms_fsdp_plan_is_llamas(tied):
    """transformers' FSDP2 (`DistributedConfig(fsdp_size=N)`) shards by the model's `fsdp_plan`: a Llama-converted
    model's is Llama's, the final norm and the LM head (or the tied token table) kept gathered for the backward,
    where the head would otherwise be held by the root unit, gathered through the whole step."""
    reference = tiny_reference("llama", tie_word_embeddings=tied)
    assert to_tfm(reference).fsdp_plan == reference.fsdp_plan


def test_a_models_plans_follow_its_configs_fields_and_keep_assigned_rules():
    """The base model computes its plans from the config as it is built (a field changed before then counts); a rule
    assigned to the config, as transformers' own configs carry theirs, stays on top; none is written to
    config.json."""
    config = TfmEncoderDecoderConfig(**SMALL)
    config.qk_norm = "projection"
    config.base_model_tp_plan = {"shared": "replicate"}
    model = TfmEncoderDecoderForConditionalGeneration(config)
    assert model.tp_plan["model.decoder.layers.*.cross_attn.q_proj"] == "colwise_gather_output"
    assert model.tp_plan["model.shared"] == "replicate"
    assert "base_model_tp_plan" not in config.to_dict()
    decoder = TfmDecoderForCausalLM(TfmDecoderConfig(**SMALL, position_embedding_type="rope"))
    assert decoder.pp_plan["model.layers"] and decoder.model.pp_plan == pipeline_parallel_plan(decoder.config)


@pytest.mark.parametrize(
    "config_class, fields",
    [
        (TfmDecoderConfig, dict(position_embedding_type="rope", num_experts=4, num_experts_per_tok=2)),
        (TfmEncoderConfig, {}),
        (TfmEncoderDecoderConfig, {}),
    ],
    ids=["moe-decoder", "encoder", "encoder-decoder"],
)
def test_the_plans_are_the_configs(config_class, fields):
    """transformers and its tooling read a model's plans from its config (`base_model_tp_plan`, `base_model_ep_plan`,
    `base_model_pp_plan`, as its own configs declare them): hf_tfm's config computes them from its fields, and the
    base model applies exactly those."""
    config = config_class(**SMALL | fields)
    body = {TfmDecoderConfig: TfmDecoderModel, TfmEncoderConfig: TfmEncoderModel}.get(
        config_class, TfmEncoderDecoderModel
    )(config)
    assert config.base_model_tp_plan and body.tp_plan == config.base_model_tp_plan
    assert body._ep_plan == config.base_model_ep_plan and bool(config.base_model_ep_plan) == config.has_moe_layers()
    assert body.pp_plan == config.base_model_pp_plan and bool(config.base_model_pp_plan) == config.is_decoder
    assert body.supports_tp_plan


def distributed(**sizes) -> DistributedConfig:
    if "ep_size" in sizes and not TOKEN_DISPATCH:  # 5.17-5.20: expert parallelism over the tensor-parallel ranks
        sizes = {"tp_size": sizes.pop("ep_size"), "enable_expert_parallel": True}
    return DistributedConfig(**sizes)


REFUSED = [
    (TfmDecoderConfig, dict(num_key_value_heads=1), dict(tp_size=2), "num_key_value_heads"),  # MQA
    (
        TfmDecoderConfig,
        dict(num_attention_heads=6, num_key_value_heads=3, head_dim=8),
        dict(tp_size=2),
        "num_key_value_heads",
    ),
    (TfmEncoderConfig, dict(num_attention_heads=2, head_dim=16), dict(tp_size=4), "num_attention_heads"),
    (TfmDecoderConfig, dict(intermediate_size=66), dict(tp_size=4), "intermediate_size"),
    (TfmDecoderConfig, dict(num_experts=4, moe_intermediate_size=33), dict(tp_size=2), "moe_intermediate_size"),
    (TfmDecoderConfig, dict(num_experts=2, shared_expert_intermediate_size=9), dict(tp_size=2), "shared_expert"),
    (TfmDecoderConfig, dict(num_experts=6), dict(tp_size=4, ep_size=4), "num_experts"),
    (TfmDecoderConfig, dict(position_embedding_type="learned"), dict(pp_size=2), "position_embedding_type"),
    (TfmDecoderConfig, dict(position_embedding_type="rope", scale_embeddings=True), dict(pp_size=2), "scale_embed"),
    (TfmEncoderConfig, {}, dict(pp_size=2), "model_type"),
    (TfmEncoderDecoderConfig, dict(num_key_value_heads=1), dict(tp_size=2), "num_key_value_heads"),  # cross-attn
]


@pytest.mark.parametrize(("config_class", "fields", "sizes", "field"), REFUSED)
def test_layouts_the_plans_would_shard_wrongly_are_refused_by_field(config_class, fields, sizes, field):
    config = config_class(**SMALL | fields)
    model_class = {TfmDecoderConfig: TfmDecoderForCausalLM, TfmEncoderConfig: TfmEncoderForMaskedLM}.get(
        config_class, TfmEncoderDecoderForConditionalGeneration
    )
    with pytest.raises(ValueError, match=field):
        # the hook from_pretrained calls before transformers shards anything (its mesh is not needed to refuse)
        model_class.maybe_distribute_model(model_class(config), distributed(**sizes), None)


ALLOWED = [
    (TfmDecoderConfig, dict(num_key_value_heads=1, position_embedding_type="alibi"), dict(tp_size=2)),  # gathered
    (TfmDecoderConfig, dict(num_experts=4, moe_intermediate_size=33), dict(tp_size=2, ep_size=2)),  # whole
    (TfmDecoderConfig, dict(position_embedding_type="rope"), dict(pp_size=2)),
]


@pytest.mark.parametrize(("config_class", "fields", "sizes"), ALLOWED)
def test_layouts_the_plans_shard_exactly_are_not_refused(config_class, fields, sizes):
    check_parallel_layout(config_class(**SMALL | fields), distributed(**sizes))


def test_only_a_rank_killed_by_a_signal_is_launched_again():
    crashed = "  traceback : Signal 6 (SIGABRT) received by PID 2564\n"  # torchrun's report, as CI printed it
    raised = "  exitcode  : 1 (pid: 2564)\n  traceback : To enable traceback see: ...\n"
    assert died_in_native_code(crashed) and not died_in_native_code(raised)
