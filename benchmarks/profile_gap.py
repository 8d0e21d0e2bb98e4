"""Where a speed gap comes from: one batch-1 decode step (the CPU profile's worst rows) of each causal pair,
taken apart by the profilers.

    python -m benchmarks.profile_gap                  # writes benchmarks/results/profile-cpu-<date>.json
    python -m benchmarks.profile_gap --profile smoke  # the tests' tiny shapes: profile-smoke-<date>.json
    python -m benchmarks.profile_gap --profile smoke --gpu-depth  # and the GPU profile's layer count

Per model: median step time (alternating, like benchmarks.speed), Python function calls per step (cProfile),
aten operators per step, the same two counts per decode step of a whole `generate()` loop (`generate_step_counts`,
what tests/test_step_budget.py holds to budgets), the time per token of that loop (`generate_token_us`, both caches),
and from one torch.profiler run the step time and the CPU time inside top-level operators. Their difference is the
time outside operators: Python module calls, output dataclasses, mask and cache bookkeeping (inflated, like the
operator time, by the profiler itself).

At the smoke shapes a step is host time almost entirely, as a GPU's batch-1 decoding of a small model is: the CPU's
ratio there predicts the host's share of the GPU's decoding rows. `--gpu-depth` gives each tiny model the GPU
profile's number of layers (GPT-2 124M's 12), so that the per-layer frames count as often as they do on the GPU.
"""

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from benchmarks.measure import alternating_medians, generate_work
from benchmarks.pairs import KINDS, PROFILES, build_pair
from benchmarks.record import header, write
from hf_tfm.compat import CACHE_NAME

PROMPT, STEPS = 16, 200  # the speed profile's prompt length; steps per measurement
GENERATE_REPEATS = 11  # alternating generate() runs per length (generate_token_us)
GENERATE_PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10]])  # the batch-1 prompt generate() continues in both measures


def decode_step(model, cache, token, position):
    """One cached forward of a single token; the cache is cropped back, so every call does the same work."""

    def step():
        with torch.inference_mode():
            model(token, **{CACHE_NAME: cache}, use_cache=True, position_ids=position, logits_to_keep=1)
        cache.crop(-1)

    return step


def prefilled(model, vocab_size: int):
    # full-length layers, even for sliding ones (whose cache layers cannot be cropped back): the prompt is shorter
    # than any profiled window, so a step does the same work either way
    cache = DynamicCache()
    prompt = torch.randint(3, vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(prompt, **{CACHE_NAME: cache}, use_cache=True)
    return decode_step(model, cache, prompt[:, -1:], torch.tensor([[PROMPT]]))


class OperatorCount(TorchDispatchMode):
    """Counts the aten operators dispatched while active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def generate_step_counts(model, cache_implementation: str = "dynamic", steps: int = 4) -> dict[str, float]:
    """Python function calls (cProfile) and aten operators per decode step of a batch-1 greedy `generate()`, the
    whole loop included (input preparation, the model, logits processing): a run of `2 * steps` new tokens minus a run
    of `steps`, divided by `steps`, so the prompt and the per-call set-up cancel. Counts do not depend on machine load:
    tests compare them (tests/test_step_budget.py)."""
    prompt = GENERATE_PROMPT
    model.generation_config.eos_token_id = None  # every run decodes all its tokens

    def counts(new_tokens: int) -> tuple[int, int]:
        options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1)
        if cache_implementation == "static":
            options["cache_implementation"] = "static"

        def run():
            with torch.no_grad():
                model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)

        run()  # first calls (warnings once, lazy set-up) are not steps
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        with OperatorCount() as operators:
            run()
        return pstats.Stats(profiler).total_calls, operators.count

    (calls, operators), (more_calls, more_operators) = counts(steps), counts(2 * steps)
    return {"python_calls": (more_calls - calls) / steps, "aten_ops": (more_operators - operators) / steps}


def generate_token_us(models: dict, cache_implementation: str) -> dict[str, float]:
    """Microseconds per token of a batch-1 greedy `generate()` loop, each model's (benchmarks.speed's generation work):
    a run of 40 new tokens minus a run of 8, over 32, medians of `GENERATE_REPEATS` alternating runs (the prompt and
    the per-call set-up cancel)."""
    work = {
        f"{key}-{tokens}": generate_work(model, GENERATE_PROMPT, tokens, cache_implementation, outputs=[])
        for key, model in models.items()
        for tokens in (8, 40)
    }
    timed = alternating_medians(work, warmup=2, repeats=GENERATE_REPEATS, device=torch.device("cpu"))
    return {key: (timed[f"{key}-40"]["median_s"] - timed[f"{key}-8"]["median_s"]) / 32 * 1e6 for key in models}


def python_calls(step) -> float:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(STEPS):
        step()
    profiler.disable()
    return pstats.Stats(profiler).total_calls / STEPS


def operator_time(step) -> tuple[float, float, float]:
    """Under torch.profiler: (aten operators per step, microseconds per step inside top-level operators,
    microseconds per step in all). Both times come from the same profiled run, so their difference is the time
    spent outside operators (the profiler slows both)."""
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        profiled = (time.perf_counter() - start) / STEPS * 1e6
    top = [e for e in recorded.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    every = [e for e in recorded.events() if e.name.startswith("aten::")]
    return len(every) / STEPS, sum(e.cpu_time_total for e in top) / STEPS, profiled


def at_gpu_depth(name: str, config: dict) -> dict:
    """`config` with the number of layers of the pair's GPU profile (under the reference config's own name for it)."""
    kind = KINDS[name]
    gpu = kind.config_class(**kind.defaults, **PROFILES["gpu"]["pairs"][name]["config"])
    depth = kind.config_class.attribute_map.get("num_hidden_layers", "num_hidden_layers")
    # a per-layer list would not fit the new depth: the family's default pattern of layer types follows it
    fields = {key: value for key, value in config.items() if key != "layer_types"}
    return {**fields, depth: gpu.num_hidden_layers}


def profile_pair(name: str, profile_name: str, gpu_depth: bool = False) -> dict:
    config = PROFILES[profile_name]["pairs"][name]["config"]
    reference, ours = build_pair(name, at_gpu_depth(name, config) if gpu_depth else config)
    vocab = reference.config.vocab_size
    steps = {"reference": prefilled(reference, vocab), "ours": prefilled(ours, vocab)}
    timed = alternating_medians(steps, warmup=20, repeats=STEPS, device=torch.device("cpu"))
    row = {"pair": name, "reference_class": KINDS[name].reference, "layers": reference.config.num_hidden_layers}
    for key, step in steps.items():
        operators, inside, profiled = operator_time(step)
        row[key] = {
            "step_us": timed[key]["median_s"] * 1e6,
            "python_calls": python_calls(step),
            "aten_ops": operators,
            "profiled_step_us": profiled,
            "operator_us": inside,
            "overhead_us": profiled - inside,
        }
    row["time_ratio"] = row["ours"]["step_us"] / row["reference"]["step_us"]
    models = {"reference": reference, "ours": ours}
    row["generate_token_us"] = {cache: generate_token_us(models, cache) for cache in ("dynamic", "static")}
    # the regression guard's counts (tests/test_step_budget.py), here at this profile's shapes
    row["generate_step"] = {
        cache: {"reference": generate_step_counts(reference, cache), "ours": generate_step_counts(ours, cache)}
        for cache in ("dynamic", "static")
    }
    return row


def main(profile_name: str = "cpu", output: Path | None = None, gpu_depth: bool = False) -> dict:
    rows = [profile_pair(name, profile_name, gpu_depth) for name, kind in KINDS.items() if kind.task == "causal"]
    options = f"--profile {profile_name}" + (" --gpu-depth" if gpu_depth else "")
    record = {
        **header(profile_name, f"python -m benchmarks.profile_gap {options}", torch.device("cpu")),
        "prompt_length": PROMPT,
        "steps": STEPS,
        "rows": rows,
    }
    for row in rows:
        ref, ours = row["reference"], row["ours"]
        print(
            f"{row['pair']:8s} ({row['layers']} layers) step us {ref['step_us']:7.0f} -> {ours['step_us']:7.0f} "
            f"(ratio {row['time_ratio']:.3f})  "
            f"python calls {ref['python_calls']:6.0f} -> {ours['python_calls']:6.0f}  "
            f"aten ops {ref['aten_ops']:5.0f} -> "
            f"{ours['aten_ops']:5.0f}  overhead us {ref['overhead_us']:6.0f} -> {ours['overhead_us']:6.0f}"
        )
        for cache, times in row["generate_token_us"].items():
            print(
                f"{'':8s} generate() {cache:7s} us per token {times['reference']:6.0f} -> {times['ours']:6.0f} "
                f"(ratio {times['ours'] / times['reference']:.3f})"
            )
    write(record, f"profile-{profile_name}" + ("-gpu-depth" if gpu_depth else ""), output)
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu"])
    parser.add_argument("--gpu-depth", action="store_true", help="the GPU profile's number of layers")
    arguments = parser.parse_args()
    main(arguments.profile, gpu_depth=arguments.gpu_depth)
