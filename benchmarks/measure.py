"""How the speed benchmark times and weighs a pair of models: the same work for both, in the same process, in
alternating order (reference first on even repeats, ours first on odd ones), after warm-up; medians reported.

Each `*_work` function returns a zero-argument callable doing one unit of work, so timing, memory and warm-up share it.
"""

import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternating_medians(
    work: dict[str, Callable[[], object]], warmup: int, repeats: int, device: torch.device
) -> dict[str, dict[str, float]]:
    """Seconds per call of each callable: median, and the lowest and highest of the repeats (the spread)."""
    names = list(work)
    for name in names:
        for _ in range(warmup):
            work[name]()
    seconds = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            synchronize(device)
            start = time.perf_counter()
            work[name]()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {
        name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
        for name, values in seconds.items()
    }


def peak_bytes(work: Callable[[], object], device: torch.device) -> int:
    """The most memory `work` holds at once beyond what was allocated when it started. On CUDA the allocator's
    high-water mark; on the CPU, the running sum of the allocations and frees the profiler records."""
    if device.type == "cuda":
        synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        work()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        work()
    events = sorted(
        (e for e in recorded.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()  # frees are negative
        peak = max(peak, live)
    return peak


def training_batch(
    task: str, vocab_size: int, batch: int, length: int, target_length: int | None, device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random token ids (never special ids 0-2) and labels; masked LM scores 15% of positions."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch, length), generator=generator)
    if task == "causal":
        inputs = {"input_ids": ids, "labels": ids}
    elif task == "masked":
        labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.15, ids, -100)
        inputs = {"input_ids": ids, "labels": labels}
    else:
        labels = torch.randint(3, vocab_size, (batch, target_length), generator=generator)
        inputs = {"input_ids": ids, "labels": labels}
    return {key: value.to(device) for key, value in inputs.items()}


def train_step_work(model, inputs, optimizer, autocast_dtype: torch.dtype | None) -> Callable[[], None]:
    """One optimizer step: forward with labels, backward, AdamW step, gradients freed; with `optimizer` None, no
    optimizer step (forward and backward only). MoE models train with their load-balancing loss, as Mixtral's recipe
    does (hf_tfm adds it whenever labels are given; Mixtral when asked)."""
    config = model.config  # a torch.compile'd model passes attribute lookups through to the original
    moe = bool(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0))
    inputs = {**inputs, "output_router_logits": True} if moe else inputs

    def step():
        with torch.autocast(inputs["input_ids"].device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = model(**inputs).loss
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


def forward_work(model, inputs) -> Callable[[], None]:
    """One inference forward pass over the training batch (no labels, no gradients)."""
    features = {key: value for key, value in inputs.items() if key != "labels"}
    if "decoder_input_ids" not in features and model.config.is_encoder_decoder:
        features["decoder_input_ids"] = inputs["labels"]

    def forward():
        with torch.inference_mode():
            model(**features)

    return forward


def generate_work(model, prompt: torch.Tensor, new_tokens: int, cache: str, outputs: list) -> Callable[[], None]:
    """Greedy generation of exactly `new_tokens` (end-of-sequence suppressed), with the dynamic or static cache.
    Each call appends its output to `outputs`, so a caller can check that both models produced the same tokens."""
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1)
    if cache == "static":
        options["cache_implementation"] = "static"

    def generate():
        with torch.inference_mode():
            outputs.append(model.generate(prompt, attention_mask=torch.ones_like(prompt), **options))

    return generate


def profiled(work: Callable[[], object], device: torch.device):
    """torch.profiler's record of one call of `work` (the device's kernels too on CUDA)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as recorded:
        work()
        synchronize(device)
    return recorded


def kernel_table(work: Callable[[], object], device: torch.device, top: int = 12) -> dict:
    """One call of `work`: how many kernels it launched and their device time, and the `top` kernels by time (name,
    launches, ms); on CUDA also the device's idle time and the host's runtime calls (`device_gaps`). On the CPU the
    aten operators stand for the kernels and their own CPU time for device time."""
    events = profiled(work, device).events()
    gaps = {}
    if device.type == "cuda":
        # a user annotation (the optimizer's `Optimizer.step#AdamW.step`) spans kernels on the device: not one itself
        on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation]
        kernels = [(e.name, e.device_time_total) for e in on_device]
        gaps = device_gaps(on_device, events)
    else:
        kernels = [(e.name, e.self_cpu_time_total) for e in events if e.name.startswith("aten::")]
    totals: dict[str, list] = {}
    for name, micros in kernels:
        entry = totals.setdefault(name, [name, 0, 0.0])
        entry[1] += 1
        entry[2] += micros / 1e3
    ranked = sorted(totals.values(), key=lambda entry: -entry[2])[:top]
    return {
        "kernels": len(kernels),
        "device_ms": sum(micros for _, micros in kernels) / 1e3,
        "top": [[name[:120], count, round(ms, 3)] for name, count, ms in ranked],
        **gaps,
    }


def device_gaps(on_device: list, events: list) -> dict:
    """Where a step's time goes besides its kernels: `idle_ms`, the time between the first kernel's start and the
    last one's end when none ran (the device waiting for the host: launches, a synchronisation, Python), and
    `host_calls`, how often the host called the CUDA runtime for anything but a launch (synchronisations, copies,
    allocations, each of which can stall the queue)."""
    if not on_device:
        return {}
    span = max(e.time_range.end for e in on_device) - min(e.time_range.start for e in on_device)
    calls: dict[str, int] = {}
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("cuda"):
            if "Launch" not in event.name:
                calls[event.name] = calls.get(event.name, 0) + 1
    busy = sum(e.device_time_total for e in on_device)
    return {"idle_ms": round(max(span - busy, 0) / 1e3, 3), "host_calls": dict(sorted(calls.items()))}


def ran_compiled(work: Callable[[], object], device: torch.device) -> bool:
    """Whether one call of `work` ran code torch.compile made. Dynamo falls back to eager silently, e.g. once a code
    object that several models share passes its recompile limit: a compiled row must check that it was compiled."""
    return any(event.name.startswith("Torch-Compiled Region") for event in profiled(work, device).events())
