"""A compiled training step, predicted on the CPU: what torch.compile's kernels read and write, by inductor's own
count, for hf_tfm and the reference class.

    python -m benchmarks.compiled --profile gpu      # writes benchmarks/results/compiled-gpu-<date>.json
    python -m benchmarks.compiled --profile smoke    # toy shapes, in seconds

`benchmarks.trace` counts an eager step (every aten operator a kernel); a compiled step runs what inductor generated
from the whole graph instead, and a formulation that costs nothing in eager can cost a compiled step a pass over a
large buffer (a float32 gradient buffer between two fusable passes, for example). So each pair of the profile is
built at its configuration (depth, widths, vocabulary) and the GPU profile's dtype policy, and one training step
(forward with labels, then backward) is compiled by inductor on the CPU, for batches of `--batches` (default 2 and 4)
sequences of `--length` (default 256) tokens, which a CPU compiles and runs in about a minute. For every graph it
compiles, inductor's scheduler counts the bytes its kernels read and write (`GraphLowering.count_bytes`, the figure
of its `inductor_metrics` log: fused kernels and the matmuls they call) and the kernels it generated; the sums over
the step's graphs are recorded, with the graphs and graph breaks. The bytes grow by about the same amount with each
sequence (a fixed part is the passes over the weights and their gradients), so the two batches also give the bytes
at the profile's own token count, where the fixed part weighs far less. Two limits of that line:
- hf_tfm's chunked loss passes once over the float32 weight gradient per chunk, and 2 and 4 sequences take one chunk
  on every pair, so the line leaves out the passes of the profile's further chunks (GPT-2 takes six at 16 x 1024:
  five passes of about 0.46 GB, about 2.3% of its step's bytes there). Batches that take different chunk counts
  make it worse: through 4 and 8 sequences (one chunk, then two) GPT-2's line reads 1.14x at the profile's tokens
  (`results/compiled-gpu-2026-11-27-2.json`).
- The reference's BART moves 0.28 GB a sequence from 2 to 4 sequences and 0.59 GB from 4 to 8 (hf_tfm's 0.55 and
  0.55), so through 2 and 4 its line puts hf_tfm at 1.53x at the profile's tokens, through 4 and 8 at 0.94x. The
  ratio at the measured batch (0.93x at 4 and at 8) is the one to read there.

Fusion is decided by inductor's scheduler for CPU and GPU code alike, though each backend may refuse some fusions:
the ratio is a prediction for a GPU, as the eager trace is. As there, an attention a GPU fuses runs without its
dropout (`benchmarks.trace.FusedAttention`): the CPU's math path for attention dropout would count scores that the
GPU's fused kernel never writes.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

import torch
import torch._inductor.metrics as inductor_metrics
from torch._dynamo.utils import counters
from torch._inductor.compile_fx import inductor_metrics_log

from benchmarks.measure import training_batch
from benchmarks.pairs import KINDS, PROFILES, build_pair, training_dtypes
from benchmarks.record import RESULTS, header, write
from benchmarks.trace import FusedAttention, autocast_policy


def count_inductor_bytes() -> None:
    """Make inductor count the bytes of every graph it compiles (it does when its metrics log is on), without
    printing that log."""
    inductor_metrics_log.setLevel(logging.INFO)
    inductor_metrics_log.propagate = False
    if not inductor_metrics_log.handlers:
        inductor_metrics_log.addHandler(logging.NullHandler())


def inductor_counts(step) -> dict:
    """Run `step` (a callable that compiles and runs) from a fresh compiler state: inductor's bytes and kernels over
    every graph it compiled, the graphs and the graph breaks. Inductor's caches are off for the step: a graph that a
    process without the metrics log compiled earlier (a timed run at the same shape) would come back from the cache
    with no bytes counted."""
    torch._dynamo.reset()
    inductor_metrics.reset()
    counters.clear()
    start = time.perf_counter()
    with torch._inductor.config.patch(force_disable_caches=True):
        step()
    return {
        "gb": inductor_metrics.num_bytes_accessed / 1e9,
        "kernels": inductor_metrics.generated_kernel_count,
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "seconds": round(time.perf_counter() - start, 1),
    }


def compiled_step(model: torch.nn.Module, inputs: dict, autocast_dtype: torch.dtype | None) -> dict:
    """One training step of `model` (forward with labels, backward), compiled: `inductor_counts` and the loss."""
    model.train()
    compiled = torch.compile(model)
    losses = []

    def step():
        with autocast_policy(autocast_dtype), FusedAttention():  # attention dropout as a GPU's fused kernel runs it
            loss = compiled(**inputs).loss
        loss.backward()
        losses.append(loss.item())

    counts = inductor_counts(step)
    model.zero_grad(set_to_none=True)
    return {**counts, "loss": losses[0]}


def counts_by_batch(model, batch_of, batches: tuple[int, int], profile_batch: float, autocast_dtype) -> dict:
    """`model`'s compiled step at both batch sizes (`batch_of(size)` makes the inputs): the larger batch's counts,
    the bytes of each, and the bytes on the line through them at `profile_batch` sequences."""
    by_batch = {batch: compiled_step(model, batch_of(batch), autocast_dtype) for batch in batches}
    (small, at_small), (large, at_large) = by_batch.items()
    per_sequence = (at_large["gb"] - at_small["gb"]) / (large - small)
    return {
        **at_large,
        "gb_by_batch": {batch: counts["gb"] for batch, counts in by_batch.items()},
        "gb_at_profile_tokens": at_large["gb"] + per_sequence * (profile_batch - large),
    }


def compiled_pair(name: str, spec: dict, batches: tuple[int, int], length: int) -> dict:
    """Both sides' compiled step for the pair's configuration under the GPU profile's dtype policy (float32 weights
    under bf16 autocast, or bf16 weights where the profile trains that way), at two batch sizes. A step's bytes are
    a fixed part (passes over weights and their gradients) plus a part per sequence; the two batches give both, and
    so the bytes at the profile's own token count (`gb_at_profile_tokens`), where the fixed part weighs far less."""
    weights, autocast_dtype = training_dtypes(PROFILES["gpu"]["pairs"][name], getattr(torch, PROFILES["gpu"]["dtype"]))
    reference, ours = build_pair(name, spec["config"])
    vocab = reference.config.vocab_size
    # an encoder-decoder's targets keep their share of the profile's length
    target_length = spec["target_length"] * length // spec["length"] if "target_length" in spec else None
    profile_batch = spec["batch"] * spec["length"] / length  # the profile's tokens, in sequences of `length`

    def batch_of(batch: int) -> dict:
        return training_batch(KINDS[name].task, vocab, batch, length, target_length, "cpu")

    sides = {
        side: counts_by_batch(model.to(weights), batch_of, batches, profile_batch, autocast_dtype)
        for side, model in (("reference", reference), ("ours", ours))
    }
    return {
        "reference": KINDS[name].reference,
        "shape": {"config": spec["config"], "batches": list(batches), "length": length},
        "profile_tokens": spec["batch"] * spec["length"],
        "weights": str(weights).removeprefix("torch."),
        **sides,
        "ratios": {
            key: sides["ours"][key] / sides["reference"][key] for key in ("gb", "gb_at_profile_tokens", "kernels")
        },
    }


def run(profile_name: str, pairs: list[str] | None, batches: list[int], length: int, output: Path | None = None):
    count_inductor_bytes()
    profile = PROFILES[profile_name]
    command = f"python -m benchmarks.compiled --profile {profile_name} --batches {batches[0]} {batches[1]}"
    command += f" --length {length}" + (f" --pairs {' '.join(pairs)}" if pairs else "")
    record = {**header(f"compiled-{profile_name}", command, torch.device("cpu")), "pairs": {}, "errors": {}}
    for name in pairs or list(profile["pairs"]):
        try:
            result = record["pairs"][name] = compiled_pair(name, profile["pairs"][name], tuple(batches), length)
        except Exception as error:  # a pair inductor cannot compile on the CPU is recorded, not fatal
            record["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
            print(f"{name:12s} failed: {record['errors'][name]}", flush=True)
            continue
        ours, reference, ratios = result["ours"], result["reference"], result["ratios"]
        print(
            f"{name:12s} GB {ours['gb']:8.3f} / {reference['gb']:8.3f} ({ratios['gb']:.3f}x; "
            f"{ratios['gb_at_profile_tokens']:.3f}x at {result['profile_tokens']} tokens)  "
            f"kernels {ours['kernels']:5d} / {reference['kernels']:5d}  "
            f"graphs {ours['graphs']} / {reference['graphs']}  breaks {ours['graph_breaks']} / "
            f"{reference['graph_breaks']}",
            flush=True,
        )
    if profile_name != "smoke" or output is not None:
        write(record, f"compiled-{profile_name}", output or RESULTS / f"compiled-{profile_name}-{record['date']}.json")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--pairs", nargs="+", choices=sorted(KINDS), help="default: every pair of the profile")
    parser.add_argument("--batches", type=int, nargs=2, default=[2, 4], help="two batch sizes (default: 2 4)")
    parser.add_argument(
        "--length", type=int, help="tokens per sequence (default: 256, or the profile's shortest sequence if shorter)"
    )
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/compiled-<profile>-<date>.json")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    # the smoke shapes' position tables hold fewer than 256 positions
    shortest = min(spec["length"] for spec in PROFILES[args.profile]["pairs"].values())
    run(args.profile, args.pairs, args.batches, args.length or min(256, shortest), args.output)


if __name__ == "__main__":
    main()
