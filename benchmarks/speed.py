"""Speed and memory of hf_tfm against the transformers reference classes, pair by pair (benchmarks/pairs.py).

    python -m benchmarks.speed --profile cpu     # writes benchmarks/results/cpu-<date>.json
    python -m benchmarks.speed --profile gpu     # on an H100: bf16, eager and torch.compile
    python -m benchmarks.report                  # turns the latest results into benchmarks/REPORT.md + charts

Per pair, on identical weights and configs (dropout included): training-step tokens/s (AdamW step included),
inference forward latency, peak memory of both, and greedy generation tokens/s at each batch size with the dynamic
and the static cache. Every ratio is ours / reference in time or bytes: below 1.0 means hf_tfm is faster or smaller.
"""

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.measure import (
    alternating_medians,
    forward_work,
    generate_work,
    kernel_table,
    peak_bytes,
    ran_compiled,
    train_step_work,
    training_batch,
)
from benchmarks.pairs import KINDS, PROFILES, build_pair, parameter_count, train_flops_per_token, training_dtypes
from benchmarks.record import RESULTS, header, write

# peak dense bf16 flop/s by device name, for MFU (NVIDIA data sheets); unknown devices get no MFU
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def timed_row(measure: str, work: dict, profile: dict, device, variant: str, tokens_per_call: int | None) -> dict:
    """Time both models' `work`: as tokens/s when each call processes `tokens_per_call` tokens, else as latency."""
    timed = alternating_medians(work, profile["warmup"], profile["repeats"], device)
    medians = {key: timed[key]["median_s"] for key in ("reference", "ours")}
    shown = {key: tokens_per_call / seconds if tokens_per_call else seconds * 1e3 for key, seconds in medians.items()}
    return {
        "measure": measure,
        "variant": variant,
        "unit": "tokens/s" if tokens_per_call else "ms",
        **shown,
        "time_ratio": medians["ours"] / medians["reference"],
        "seconds": timed,
    }


def memory_row(measure: str, work: dict, device) -> dict:
    peaks = {name: peak_bytes(fn, device) for name, fn in work.items()}
    return {
        "measure": measure,
        "unit": "MiB",
        "reference": peaks["reference"] / 2**20,
        "ours": peaks["ours"] / 2**20,
        "memory_ratio": peaks["ours"] / peaks["reference"],
    }


def maybe_compiled(models: dict, compiled: bool) -> dict:
    """The models, each through torch.compile when `compiled`, with dynamo's caches emptied first: pairs share code
    objects (transformers' and hf_tfm's modules), and one that passes dynamo's recompile limit in an earlier pair
    silently runs eagerly in the later ones."""
    if compiled:
        torch._dynamo.reset()
    return {name: torch.compile(model) if compiled else model for name, model in models.items()}


def require_compiled(work: dict, device) -> None:
    """Fails loudly when a compiled row would time eager code (after its warm-up calls, which compiled it)."""
    for name, call in work.items():
        if not ran_compiled(call, device):
            raise RuntimeError(f"the compiled {name} model ran eagerly: dynamo did not compile it (recompile limit?)")


def inference_rows(
    name: str, spec: dict, profile: dict, device, dtype, compiled: bool, errors: list[str]
) -> list[dict]:
    task = KINDS[name].task
    reference, ours = build_pair(name, spec["config"])
    models = {"reference": reference.to(device, dtype), "ours": ours.to(device, dtype)}
    inputs = training_batch(
        task, reference.config.vocab_size, spec["batch"], spec["length"], spec.get("target_length"), device
    )
    rows = [logit_difference(models, inputs)]
    for variant in ("eager", "compiled") if compiled else ("eager",):
        work = {
            key: forward_work(model, inputs) for key, model in maybe_compiled(models, variant == "compiled").items()
        }
        if variant == "compiled":
            for call in work.values():  # compiles, outside the timed repeats
                call()
            require_compiled(work, device)
        rows.append(timed_row("forward latency", work, profile, device, variant, tokens_per_call=None))
        if variant == "eager":
            rows.append(memory_row("forward peak memory", work, device))
    if task == "masked":
        return rows
    for batch in profile["generate_batches"]:
        prompt = training_batch(
            "causal", reference.config.vocab_size, batch, profile["prompt_length"], None, device, seed=1
        )["input_ids"]
        for cache in ("dynamic", "static"):
            try:  # one failing configuration (e.g. a CUDA-graph crash) must not hide the others
                rows.append(generation_row(models, prompt, cache, profile, device))
            except Exception as error:
                errors.append(error_line(f"generate batch {batch} ({cache} cache)", error))
    return rows


def logit_difference(models: dict, inputs: dict) -> dict:
    """Evidence that both sides compute the same function on the measured batch: the largest logit difference."""
    features = {key: value for key, value in inputs.items() if key != "labels"}
    if models["ours"].config.is_encoder_decoder:
        features["decoder_input_ids"] = inputs["labels"]
    with torch.inference_mode():
        logits = {key: model(**features).logits.float() for key, model in models.items()}
    return {
        "measure": "max logit difference",
        "unit": "abs",
        "reference": logits["reference"].abs().max().item(),
        "ours": (logits["ours"] - logits["reference"]).abs().max().item(),
    }


def generation_row(models: dict, prompt, cache: str, profile: dict, device) -> dict:
    outputs = {"reference": [], "ours": []}
    work = {
        key: generate_work(model, prompt, profile["new_tokens"], cache, outputs[key]) for key, model in models.items()
    }
    batch = prompt.shape[0]
    generation_profile = dict(profile, warmup=profile["generate_warmup"], repeats=profile["generate_repeats"])
    row = timed_row(
        f"generate batch {batch}",
        work,
        generation_profile,
        device,
        f"{cache} cache",
        tokens_per_call=batch * profile["new_tokens"],
    )
    row["same_tokens"] = bool(torch.equal(outputs["reference"][-1], outputs["ours"][-1]))
    return row


def error_line(part: str, error: Exception) -> str:
    traceback.print_exc()
    return f"{part}: {type(error).__name__}: {error}".splitlines()[0][:500]


def training_rows(
    name: str, spec: dict, profile: dict, device, autocast_dtype, compiled: bool, with_kernels: bool
) -> tuple[list[dict], dict]:
    task = KINDS[name].task
    reference, ours = build_pair(name, spec["config"])
    weights, autocast_dtype = training_dtypes(spec, autocast_dtype)
    models = {"reference": reference.to(device, weights).train(), "ours": ours.to(device, weights).train()}
    inputs = training_batch(
        task, reference.config.vocab_size, spec["batch"], spec["length"], spec.get("target_length"), device
    )
    tokens = inputs["input_ids"].numel() + (inputs["labels"].numel() if task == "seq2seq" else 0)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizers = {key: torch.optim.AdamW(model.parameters(), lr=1e-4, **fused) for key, model in models.items()}
    rows = []
    kernels = {}
    for variant in ("eager", "compiled") if compiled else ("eager",):
        runnable = maybe_compiled(models, variant == "compiled")
        work = {key: train_step_work(runnable[key], inputs, optimizers[key], autocast_dtype) for key in models}
        if variant == "compiled":
            for call in work.values():  # compiles, outside the timed repeats
                call()
            require_compiled(work, device)
        rows.append(timed_row("train", work, profile, device, variant, tokens_per_call=tokens))
        if variant == "eager":
            rows.append(memory_row("train peak memory", work, device))
        if with_kernels:
            kernels[variant] = {key: kernel_table(call, device) for key, call in work.items()}
    facts = {
        "active_parameters": {key: parameter_count(model) for key, model in models.items()},
        "attn_implementation": {key: model.config._attn_implementation for key, model in models.items()},
        "train_tokens_per_step": tokens,
    }
    if kernels:
        facts["train_kernels"] = kernels
    peak = peak_flops(device)
    if peak and task != "seq2seq":
        flops = train_flops_per_token(models["ours"], spec["length"])
        for row in rows:
            if row["measure"] == "train":
                row["mfu"] = {key: row[key] * flops / peak for key in ("reference", "ours")}
    return rows, facts


def run_pair(name: str, profile: dict, device, options: dict) -> dict:
    """Every row of one pair. `options`: `parts` (of "inference" and "training"), `compiled` (whether this pair gets
    compiled rows), `kernels` (a profiler kernel table of each training variant)."""
    spec = profile["pairs"][name]
    dtype = getattr(torch, profile["dtype"])
    parts = options["parts"]
    result = {"reference": KINDS[name].reference, "shape": spec, "parts": list(parts), "rows": [], "errors": []}
    for part in parts:
        try:
            if part == "inference":
                result["rows"] += inference_rows(
                    name, spec, profile, device, dtype, options["compiled"], result["errors"]
                )
            else:
                autocast = dtype if dtype != torch.float32 else None
                rows, facts = training_rows(
                    name, spec, profile, device, autocast, options["compiled"], options["kernels"]
                )
                result["rows"] += rows
                result.update(facts)
        except Exception as error:  # a reference that crashes (e.g. under compile) is a result, not the end of the run
            result["errors"].append(error_line(part, error))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def run(
    profile_name: str,
    pairs: list[str] | None = None,
    output: Path | None = None,
    command: str | None = None,
    parts: tuple[str, ...] = ("inference", "training"),
    compiled_pairs: list[str] | None = None,
    kernels: bool = False,
) -> dict:
    """Measures `pairs` (default: all of the profile's) and writes after each. `compiled_pairs` names the pairs that
    get compiled rows (default: every pair, when the profile compiles); the rows say which were compiled."""
    profile = PROFILES[profile_name]
    device = torch.device(profile["device"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    command = command or f"python -m benchmarks.speed --profile {profile_name}"
    settings = {key: value for key, value in profile.items() if key != "pairs"}
    record = {**header(profile_name, command, device), "settings": settings, "pairs": {}}
    path = results_path(record, output)
    for name in pairs or list(profile["pairs"]):
        compiled = profile["compile"] if compiled_pairs is None else name in compiled_pairs
        options = {"parts": parts, "compiled": compiled, "kernels": kernels}
        record["pairs"][name] = run_pair(name, profile, device, options)
        for row in record["pairs"][name]["rows"]:
            ratio = row.get("time_ratio", row.get("memory_ratio", float("nan")))
            print(
                f"{name:8s} {row['measure']:22s} {row.get('variant', ''):14s} ref {row['reference']:10.4g}  "
                f"ours {row['ours']:10.4g} {row['unit']:9s} ratio {ratio:.3f}",
                flush=True,
            )
        for error in record["pairs"][name]["errors"]:
            print(f"{name:8s} error: {error}", flush=True)
        record = merge_and_write(record, path)  # after every pair: a call killed at its time limit keeps the rest
    return record


def results_path(record: dict, output: Path | None) -> Path:
    """Where this run's pairs go: `output`, else today's file for the profile, unless that file was measured on
    another device, versions or settings; then a numbered sibling (sorting after it), never an overwrite."""
    if output is not None:
        return output
    path, number = RESULTS / f"{record['profile']}-{record['date']}.json", 1
    while path.is_file() and not same_setup(json.loads(path.read_text()), record):
        number += 1
        path = RESULTS / f"{record['profile']}-{record['date']}-{number}.json"
    return path


def same_setup(earlier: dict, record: dict) -> bool:
    keys = ("device", "versions", "settings")
    return all(earlier[key] == record[key] for key in keys)


def merge_and_write(record: dict, path: Path) -> dict:
    """Pairs measured by separate calls on the same day and setup (`--pairs`, `--train-only`, `--inference-only`, to
    stay within a time limit per call) join one results file; a pair measured again replaces its earlier rows of the
    parts it measured (training, inference) and keeps the others."""
    if path.is_file():
        earlier = json.loads(path.read_text())
        if not same_setup(earlier, record):
            raise SystemExit(
                f"error: {path} was measured on another device, versions or settings; pass another --output"
            )
        commands = earlier.get("commands", [earlier["command"]])
        if commands[-1] != record["command"]:
            commands = [*commands, record["command"]]
        pairs = dict(earlier["pairs"])
        for name, pair in record["pairs"].items():
            pairs[name] = joined_pair(pairs[name], pair) if name in pairs else pair
        record = {**record, "commands": commands, "pairs": pairs}
    write(record, record["profile"], path)
    return record


def part_of(measure_or_error: str) -> str:
    """The part ("training" or "inference") a row's measure or an error line belongs to."""
    return "training" if measure_or_error.startswith("train") else "inference"


def joined_pair(earlier: dict, pair: dict) -> dict:
    """`pair` with `earlier`'s rows and errors of the parts `pair` did not measure (its training facts too)."""
    measured = set(pair.get("parts", ("inference", "training")))
    rows = [row for row in earlier["rows"] if part_of(row["measure"]) not in measured] + pair["rows"]
    rows.sort(key=lambda row: part_of(row["measure"]) == "training")  # inference rows first, as one call writes them
    errors = [error for error in earlier["errors"] if part_of(error) not in measured]
    parts = sorted(measured | set(earlier.get("parts", ())))
    return {**earlier, **pair, "parts": parts, "rows": rows, "errors": errors + pair["errors"]}


# (--train-only, --inference-only) -> the parts of each pair that run
PARTS = {(False, False): ("inference", "training"), (True, False): ("training",), (False, True): ("inference",)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--pairs", nargs="+", choices=sorted(KINDS), help="default: every pair of the profile")
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/<profile>-<date>.json")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--train-only", action="store_true", help="training rows only (no forward or generation)")
    only.add_argument("--inference-only", action="store_true", help="forward and generation rows only")
    parser.add_argument(
        "--compiled-pairs",
        nargs="*",
        choices=sorted(KINDS),
        help="the pairs that get compiled rows (default: the profile's)",
    )
    parser.add_argument("--kernels", action="store_true", help="a profiler kernel table of each training variant")
    args = parser.parse_args(argv)
    if PROFILES[args.profile]["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: profile {args.profile!r} needs a CUDA device and none is visible")
    run(
        args.profile,
        args.pairs,
        args.output,
        command="python -m benchmarks.speed " + " ".join(argv or sys.argv[1:]),
        parts=PARTS[(args.train_only, args.inference_only)],
        compiled_pairs=args.compiled_pairs,
        kernels=args.kernels,
    )


if __name__ == "__main__":
    main()
