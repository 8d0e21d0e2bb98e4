"""Beyond parity, compiled end to end: both models compiled by the same backend (inductor on the CPU), a training
step (forward with labels and backward, no optimizer) and batch-1 greedy decoding through generate() with a static
cache, whose decode step generate() compiles (`compile_config`). Ratios are ours / reference in seconds.

The evidence says that both sides were compiled as they should be: the graphs each one made and its graph breaks
(none for hf_tfm), the two compiled losses' difference on identical weights (dropout 0, so that it is exact), and
whether greedy decoding gave the same tokens.
"""

import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import CompileConfig

from benchmarks.measure import alternating_medians, generate_work, train_step_work, training_batch
from benchmarks.pairs import KINDS, SMOKE_DECODER, build_pair
from benchmarks.pairs import PROFILES as PAIR_PROFILES

CPU = torch.device("cpu")
SMOKE_PAIRS = PAIR_PROFILES["smoke"]["pairs"]

_CPU_DECODER = dict(
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=688,
    vocab_size=8192,
    max_position_embeddings=512,
)

# dropout off, so that both compiled losses are computed from the same numbers (Llama and Mixtral have none)
GPT2_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

PROFILES = {
    # 2 cores, fp32, inductor: speed.py's CPU shapes at 2 layers (inductor compiles every layer: each one costs
    # compile time), about 4 minutes in all, most of it compiling. Each further pair (Mixtral, BERT, T5) would cost
    # about 1.5 minutes of compiles more; the smoke profile runs their code paths
    "cpu": {
        "pairs": {
            "gpt2": dict(
                config=dict(n_embd=256, n_layer=2, n_head=4, vocab_size=8192, n_positions=512, **GPT2_NO_DROPOUT),
                batch=8,
                length=128,
            ),
            "llama": dict(config=_CPU_DECODER, batch=8, length=128),
        },
        "backend": "inductor",
        "warmup": 2,
        "repeats": 10,
        "prompt_length": 16,
        "new_tokens": 32,
        "generate_warmup": 1,
        "generate_repeats": 5,
    },
    # for tests: every code path at a toy shape, in seconds (dynamo's "eager" backend: captured, not compiled)
    "smoke": {
        "pairs": {
            "gpt2": dict(
                config=dict(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=64, **GPT2_NO_DROPOUT),
                batch=2,
                length=8,
            ),
            "llama": dict(config=SMOKE_DECODER, batch=2, length=8),
            "mixtral": dict(config=dict(SMOKE_DECODER, num_local_experts=4, num_experts_per_tok=2), batch=2, length=8),
            "bert": dict(
                config=dict(SMOKE_PAIRS["bert"]["config"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                batch=2,
                length=8,
            ),
            "t5": dict(config=dict(SMOKE_PAIRS["t5"]["config"], dropout_rate=0.0), batch=2, length=8, target_length=4),
        },
        "backend": "eager",
        "warmup": 1,
        "repeats": 2,
        "prompt_length": 4,
        "new_tokens": 3,
        "generate_warmup": 1,
        "generate_repeats": 1,
    },
}


def compiled_run(call) -> tuple[object, dict]:
    """`call()`'s result, and the graphs dynamo made and the graph breaks it met while running it."""
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    result = call()
    return result, {
        "graphs": counters["stats"]["unique_graphs"] - graphs,
        "graph_breaks": sum(counters["graph_break"].values()) - breaks,
    }


def time_row(name: str, measure: str, backend: str, timed: dict, per: int = 1) -> dict:
    """A row of seconds per call (per `per` tokens when given, shown in ms)."""
    return {
        "technique": "compiled",
        "pair": name,
        "variant": f"{backend}, both compiled",
        "measure": measure,
        "unit": "ms" if per == 1 else "ms/token",
        "reference": timed["reference"]["median_s"] / per * 1e3,
        "ours": timed["ours"]["median_s"] / per * 1e3,
        "time_ratio": timed["ours"]["median_s"] / timed["reference"]["median_s"],
        "seconds": {"reference": timed["reference"], "ours": timed["ours"]},
    }


def train_row(name: str, spec: dict, profile: dict) -> tuple[dict, dict]:
    """One training step (forward with labels, backward) of both models, each `torch.compile`d whole."""
    # every compiled module shares nn.Module's call code, whose compiled versions dynamo caps at a few: a fresh start
    torch._dynamo.reset()
    reference, ours = build_pair(name, spec["config"])
    models = {"reference": reference.train(), "ours": ours.train()}
    task = KINDS[name].task
    inputs = training_batch(
        task, reference.config.vocab_size, spec["batch"], spec["length"], spec.get("target_length"), CPU
    )
    compiled = {key: torch.compile(model, backend=profile["backend"]) for key, model in models.items()}
    work = {key: train_step_work(model, inputs, None, None) for key, model in compiled.items()}
    # as train_step_work calls them: MoE models with their load-balancing loss (Mixtral's only when asked)
    loss_inputs = {**inputs, "output_router_logits": True} if name == "mixtral" else inputs
    evidence, losses = {}, {}
    for key, model in compiled.items():  # the first call compiles (forward and backward): its graphs, and its loss
        losses[key], evidence[key] = compiled_run(lambda model=model: model(**loss_inputs).loss.item())
    evidence["loss_difference"] = abs(losses["ours"] - losses["reference"])
    timed = alternating_medians(work, profile["warmup"], profile["repeats"], CPU)
    return evidence, time_row(name, "train step", profile["backend"], timed)


def decode_row(name: str, spec: dict, profile: dict) -> tuple[dict, dict]:
    """Batch-1 greedy decoding of `new_tokens` through generate() with a static cache, the decode step compiled by
    generate() itself (`compile_config`; on the CPU only when `_compile_all_devices` says so)."""
    torch._dynamo.reset()  # as in train_row
    reference, ours = build_pair(name, spec["config"])
    models = {"reference": reference, "ours": ours}
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, reference.config.vocab_size, (1, profile["prompt_length"]), generator=generator)
    outputs = {key: [] for key in models}
    work = {}
    evidence = {}
    for key, model in models.items():
        compile_config = CompileConfig(fullgraph=True, dynamic=False, backend=profile["backend"], mode="default")
        compile_config._compile_all_devices = True
        model.generation_config.compile_config = compile_config
        work[key] = generate_work(model, prompt, profile["new_tokens"], "static", outputs[key])
        evidence[key] = compiled_run(work[key])[1]
    evidence["same_tokens"] = torch.equal(outputs["ours"][-1], outputs["reference"][-1])
    timed = alternating_medians(work, profile["generate_warmup"], profile["generate_repeats"], CPU)
    return evidence, time_row(name, "batch-1 decode", profile["backend"], timed, per=profile["new_tokens"])


def measure(profile_name: str) -> tuple[dict, list[dict]]:
    """Every pair of the profile: ({pair: evidence}, rows)."""
    profile = PROFILES[profile_name]
    counters.clear()
    evidence, rows = {}, []
    for name, spec in profile["pairs"].items():
        evidence[name] = {"reference": KINDS[name].reference, "shape": spec}
        evidence[name]["train step"], row = train_row(name, spec, profile)
        rows.append(row)
        if KINDS[name].task != "masked":  # a masked LM does not generate
            evidence[name]["batch-1 decode"], row = decode_row(name, spec, profile)
            rows.append(row)
    return evidence, rows
