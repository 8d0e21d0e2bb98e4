"""A GPU training step, predicted on the CPU: one step of each pair traced at its real shape and dtype policy without
computing anything, for hf_tfm and the reference class.

    python -m benchmarks.trace --profile gpu      # writes benchmarks/results/trace-gpu-<date>.json
    python -m benchmarks.trace --profile smoke    # every pair at toy shapes, in seconds
    python -m benchmarks.trace --pairs bart --peak-places   # what the peak holds, by the line that allocated it

The models are built and run under `FakeTensorMode`: every tensor has a shape, a dtype and a device but no values, so
a GPT-2 124M step at 16 x 1024 costs seconds and no memory. `StepTrace`, a dispatch mode above it, sees every aten
operator the step runs (forward, backward and the AdamW update), as a GPU would get them:
- kernels: operators that are not views or metadata (each is at least one kernel launch on a GPU);
- bytes: what each of them reads (its tensor inputs; a gather or scatter what its indices pick, a copy or fill not
  its target) and writes (its tensor outputs), in GiB;
- matmul FLOPs by the dtype of their inputs (torch's flop formulas): a matmul left in float32 under autocast shows;
- host synchronisations: the operators that read a value into Python or size an output by the values (the list of
  `benchmarks.host_sync.waits_for_device`), each named with the code that made it;
- peak memory: the most bytes held at once by the storages the counted step allocated (each counted from the operator
  that made it until it is freed), as a GPU allocator's peak above the memory held when the step starts (the
  parameters and the optimizer's state; allocator rounding and a backend's workspace aside); with `--peak-places`,
  what is held at that moment, summed by the line of hf_tfm or transformers that allocated it, the 16 largest
  (backward's allocations count under "outside hf_tfm and transformers");
- unfused attention: sdpa calls whose query, key, value or mask has a last dimension of another stride than 1, which
  a GPU's fused kernels (flash, memory-efficient, cuDNN) refuse, running them on the math path (`UnfusedAttention`;
  the CPU's kernels take any layout, so a CPU run cannot show it). The calls a GPU fuses run without their
  attention dropout, which CUDA's fused kernels apply inside the kernel and the CPU's refuse (the math path, its
  scores held, would be counted instead); a call whose mask needs a gradient (T5's position bias) still takes the
  CPU's math path, on both sides.
A value-dependent operator gets a made-up answer (0, or every element selected), so the step runs on. Each pair's
inference forward of the same batch is traced alike (`trace_forward`), and a generating pair's batch-1 decode step
(`trace_decode`), which a GPU pays in launches.

The dtype policy is the GPU profile's: fp32 weights under bf16 autocast (CPU autocast here: its lists of operators
cast down are CUDA's for matmuls), or bf16 weights where the profile trains that way (`train_weights`). The step
is traced twice and the second is counted: a first step pays one-off work (lazily built state, hf_tfm's input-value
check) that a training run pays once.
"""

import argparse
import math
import sys
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from benchmarks.host_sync import caller, waits_for_device
from benchmarks.measure import training_batch
from benchmarks.pairs import KINDS, PROFILES, training_dtypes
from benchmarks.record import RESULTS, header, write
from hf_tfm.compat import CACHE_NAME
from hf_tfm.convert import tfm_model_for

# metadata and aliasing: no kernel, no bytes
NO_KERNEL = frozenset(
    {
        "detach",
        "alias",
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "_unsafe_view",  # a view of a tensor just made (reshape's, after a copy); not flagged as one
        "lift_fresh",
        "_to_copy_noop",
        "set_",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "promote_types",
        "_record_function_enter_new",  # the profiler's markers (the optimizer's step)
        "_record_function_exit",
    }
)


# reads of a tensor at given indices, which read only the elements they pick
GATHERS = frozenset({"gather", "index_select", "embedding", "index"})
# in-place writes into a tensor at given indices, which read and write only what their source covers
SCATTERS = frozenset({"scatter_", "scatter_add_", "index_put_", "_index_put_impl_", "index_add_", "index_copy_"})
# in-place writes that do not read their target: a copy reads its source only, a fill nothing
OVERWRITES = frozenset({"copy_", "fill_", "zero_"})
# in-place matmuls (an accumulated weight gradient: `addmm_`), counted by their out-of-place formula
OUT_OF_PLACE = {"addmm_": torch.ops.aten.addmm, "baddbmm_": torch.ops.aten.baddbmm, "addbmm_": torch.ops.aten.addbmm}


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def _bytes(tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def _made_up(func, args, kwargs):
    """The answer of a value-dependent operator that fake tensors cannot give: 0 for a value read, every element
    selected for a selection (the upper bound, and a causal LM's scored rows), the target itself for an indexed
    write."""
    name = func.overloadpacket.__name__
    if name in ("_local_scalar_dense", "item"):
        return False if args[0].dtype == torch.bool else 0
    if name in ("is_nonzero", "equal", "allclose"):
        return True
    if name in ("nonzero", "argwhere"):
        return torch.zeros((args[0].numel(), args[0].dim()), dtype=torch.long, device=args[0].device)
    if name == "masked_select":
        return torch.zeros(args[0].numel(), dtype=args[0].dtype, device=args[0].device)
    if name == "index":  # boolean mask rows: all of them
        source, indices = args[0], args[1]
        position = next(i for i, index in enumerate(indices) if index is not None and index.dtype == torch.bool)
        mask = indices[position]
        shape = (*source.shape[:position], mask.numel(), *source.shape[position + mask.dim() :])
        return torch.zeros(shape, dtype=source.dtype, device=source.device)
    if name in ("index_put", "index_put_", "_index_put_impl_"):
        return args[0] if name.endswith("_") else args[0].clone()
    raise NotImplementedError(f"the trace cannot make up the result of {func}")


def _keep(*alive) -> None:
    """A finalizer that does nothing: what it was given stays referenced until it runs."""


def hands_back_its_input(name: str, args) -> bool:
    """Dropout in eval mode or with p=0 returns its input (aten's `_dropout_impl`): no kernel, no memory, though a
    fake tensor makes a new one, and no freeing: the input lives on as the output."""
    return name in ("dropout", "feature_dropout", "alpha_dropout") and (not args[2] or args[1] == 0)


def refused_by_gpu_kernels(args, kwargs) -> bool:
    """Whether CUDA's fused sdpa kernels refuse this call for its layout (torch's
    `check_last_dim_stride_equals_1_dense`: query, key, value and mask need a last dimension of stride 1 on a GPU)."""
    inputs = [*args[:4], kwargs.get("attn_mask")]
    return any(isinstance(x, torch.Tensor) and x.shape[-1] > 1 and x.stride(-1) != 1 for x in inputs)


class FusedAttention(TorchFunctionMode):
    """Runs each `scaled_dot_product_attention` call that a GPU would fuse without its attention dropout. CUDA's fused
    kernels apply the dropout inside the kernel (the H200 run, gpu-2026-11-27-2.json: GPT-2 and BERT, attention
    dropout 0.1, train on cuDNN's flash kernels on both sides), where the CPU's fused kernel takes none and falls back
    to the math path, which holds the scores, their softmax and a dropout mask per layer and runs a dozen operators
    for the one. So a trace on the CPU counts the fused kernel, as the GPU runs it; the dropout's random numbers are
    not counted. torch.compile traces through it (benchmarks.compiled)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention or refused_by_gpu_kernels(args, kwargs):
            return func(*args, **kwargs)
        if len(args) > 4:  # dropout_p given by position
            return func(*args[:4], 0.0, *args[5:], **kwargs)
        return func(*args, **{**kwargs, "dropout_p": 0.0})


class UnfusedAttention(FusedAttention):
    """`FusedAttention` that also records, while `trace.counting`, each sdpa call that CUDA's fused kernels would
    refuse for its layout, with the code that made it. A `StepTrace` enters its own; `trace` is whatever has a
    `counting` flag."""

    def __init__(self, trace):
        super().__init__()
        self.trace = trace
        self.calls = 0  # every sdpa call seen while counting
        self.places: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and self.trace.counting:
            self.calls += 1
            if refused_by_gpu_kernels(args, kwargs):
                self.places.append(caller())
        return super().__torch_function__(func, types, args, kwargs)


class StepTrace(TorchDispatchMode):
    """Counts, per aten operator reaching the dispatcher: kernels, bytes read and written, matmul FLOPs by input
    dtype, host synchronisations (with their places); with `places`, what the peak holds, by allocating line. Pause
    with `counting = False`."""

    def __init__(self, places: bool = False):
        super().__init__()
        self.places = places
        self.held: dict[int, tuple[str, int]] = {}  # with places: each live storage's allocating line and bytes
        self.peak_places: Counter = Counter()
        self.counting = True
        self.kernels = 0
        self.bytes_read = self.bytes_written = 0
        self.flops: Counter = Counter()
        self.operators: Counter = Counter()
        self.syncs: list[str] = []
        self.live = self.peak = 0
        self.allocated = WeakIdKeyDictionary()  # the storages the counted step made: freed, they leave `live`
        self.attention = UnfusedAttention(self)  # sdpa calls are seen above the dispatcher: a function mode

    def __enter__(self):
        self.attention.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.attention.__exit__(*exc)

    def allocate(self, tensors: list[torch.Tensor]) -> None:
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage not in self.allocated:  # a view or an in-place result shares a storage already counted
                self.allocated[storage] = None
                self.live += storage.nbytes()
                if self.places:
                    self.held[id(storage)] = (caller().split(" <- ")[0], storage.nbytes())
                weakref.finalize(storage, self.free, storage.nbytes(), id(storage))
        if self.live > self.peak and self.places:
            self.peak_places = Counter()
            for place, nbytes in self.held.values():
                self.peak_places[place] += nbytes
        self.peak = max(self.peak, self.live)

    def free(self, nbytes: int, key: int) -> None:
        self.live -= nbytes
        self.held.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if waits_for_device(func, args, kwargs):
            if self.counting:
                self.syncs.append(f"{func.overloadpacket.__name__} at {caller()}")
            try:
                return func(*args, **kwargs)
            except Exception:  # fake tensors have no values to answer with
                return _made_up(func, args, kwargs)
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if hands_back_its_input(name, args):
            # the device hands back the input: it lives as long as the fake's new output does
            weakref.finalize(out.untyped_storage(), _keep, args[0].untyped_storage())
            return out
        if not self.counting or func.namespace == "prim" or func.is_view:
            return out
        self.allocate(_tensors(out))
        if name in NO_KERNEL:
            return out
        self.kernels += 1
        self.operators[name] += 1
        if name in GATHERS:  # reads what its indices pick: as many elements as it writes
            self.bytes_read += _bytes(_tensors(list(args[1:]) + list(kwargs.values()))) + _bytes(_tensors(out))
            self.bytes_written += _bytes(_tensors(out))
        elif name in OVERWRITES:
            self.bytes_read += _bytes(_tensors(list(args[1:]) + list(kwargs.values())))
            self.bytes_written += _bytes(_tensors(out))
        elif name in SCATTERS:  # touches its target where the source goes: the source's bytes, read and written
            moved = _bytes(_tensors(list(args[1:]) + list(kwargs.values())))
            self.bytes_read += moved
            self.bytes_written += moved
        else:
            self.bytes_read += _bytes(_tensors(list(args) + list(kwargs.values())))
            self.bytes_written += _bytes(_tensors(out))
        formula = flop_registry.get(func.overloadpacket) or flop_registry.get(OUT_OF_PLACE.get(name))
        if formula is not None:  # torch's formula, given the tensors (it reads their shapes)
            flops = formula(*args, **kwargs, out_val=out)
            self.flops[str(_tensors(list(args))[0].dtype).removeprefix("torch.")] += flops
        return out

    def summary(self) -> dict:
        return {
            "kernels": self.kernels,
            "read_gib": self.bytes_read / 2**30,
            "written_gib": self.bytes_written / 2**30,
            "bytes_gib": (self.bytes_read + self.bytes_written) / 2**30,
            "matmul_tflops": {dtype: flops / 1e12 for dtype, flops in sorted(self.flops.items())},
            "peak_gib": self.peak / 2**30,
            "host_syncs": len(self.syncs),
            "sync_places": sorted(Counter(self.syncs).items()),
            "top_operators": self.operators.most_common(12),
            "unfused_attention": sorted(Counter(self.attention.places).items()),
            **(
                {"peak_places": [(place, nbytes / 2**30) for place, nbytes in self.peak_places.most_common(16)]}
                if self.places
                else {}
            ),
        }


def build_fake_pair(name: str, config_fields: dict, dtype: torch.dtype) -> dict:
    """The reference model and hf_tfm's model of the converted config, with fake weights (the same shapes; values
    do not exist, so "the same weights" is the same shapes) in `dtype`: built in it, because a fake tensor cannot be
    swapped by `.to()`. Call inside FakeTensorMode."""
    kind = KINDS[name]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        reference = kind.model_class(kind.config_class(**kind.defaults, **config_fields))
        ours = tfm_model_for(reference)  # to_tfm's model, without copying (and comparing) values
    finally:
        torch.set_default_dtype(default_dtype)
    for model in (reference, ours):
        if kind.experts_implementation is not None:
            model.set_experts_implementation(kind.experts_implementation)
    return {"reference": reference, "ours": ours}


def autocast_policy(dtype: torch.dtype | None):
    """CPU autocast to `dtype` (None: off). The context manager is CPU autocast's own; on a GPU the same step would
    run under CUDA autocast, whose matmul, attention and loss lists it shares."""
    return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def trace_step(model, inputs: dict, autocast_dtype, steps: int = 2, places: bool = False) -> dict:
    """One training step (forward with labels, backward, fused-style AdamW step, gradients freed) traced after
    `steps - 1` untraced ones."""
    config = model.config
    moe = bool(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0))
    inputs = {**inputs, "output_router_logits": True} if moe else inputs
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # as the GPU profile
    trace = StepTrace(places)
    with trace:
        for step in range(steps):
            trace.counting = step == steps - 1
            with autocast_policy(autocast_dtype):
                loss = model(**inputs).loss
            loss.backward()
            optimizer.step()
            model.zero_grad(set_to_none=True)
    return trace.summary()


def trace_forward(model, features: dict) -> dict:
    """One inference forward (eval mode, no labels, under inference_mode) traced after an untraced one: what an
    evaluation or serving forward costs. Composite operators (linear) show as themselves here."""
    model.eval()
    trace = StepTrace()
    with torch.inference_mode(), trace:
        for step in range(2):
            trace.counting = step == 1
            model(**features)
    return trace.summary()


def trace_decode(model, prompt_length: int) -> dict:
    """One batch-1 decode step after a prompt of `prompt_length` tokens and an untraced step: what generate() pays a
    token where the GPU waits on the launches (batch-1 decoding is launch-bound), so kernels are the count that
    matters here. A decoder-only model decodes on a static cache; an encoder-decoder reads the prompt as its source
    (encoded once, untraced) and decodes from one token on dynamic caches, as generate() does by default."""
    model.eval()
    prompt = torch.zeros(1, prompt_length, dtype=torch.long)
    trace = StepTrace()
    with torch.inference_mode(), trace:
        trace.counting = False
        if model.config.is_encoder_decoder:
            cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
            step = {"encoder_outputs": model.get_encoder()(input_ids=prompt), "decoder_input_ids": prompt[:, :1]}
        else:
            cache = StaticCache(config=model.config, max_cache_len=prompt_length + 2)
            model(input_ids=prompt, use_cache=True, **{CACHE_NAME: cache})
            step = {"input_ids": prompt[:, :1]}
        for number in range(2):
            trace.counting = number == 1
            if not model.config.is_encoder_decoder:
                step["cache_position"] = torch.tensor([prompt_length + number])
            model(**step, use_cache=True, **{CACHE_NAME: cache})
    return trace.summary()


def trace_pair(name: str, spec: dict, places: bool = False) -> dict:
    """Both sides' training step at the pair's `spec` shape, under the GPU profile's dtype policy whatever the
    profile, and both sides' inference forward in the profile's dtype (its weights, as the GPU profile runs it)."""
    task = KINDS[name].task
    low = getattr(torch, PROFILES["gpu"]["dtype"])
    weights, autocast_dtype = training_dtypes(PROFILES["gpu"]["pairs"][name], low)
    with FakeTensorMode(allow_non_fake_inputs=True):
        models = build_fake_pair(name, spec["config"], weights)
        vocab = models["reference"].config.vocab_size
        inputs = training_batch(task, vocab, spec["batch"], spec["length"], spec.get("target_length"), "cpu")
        sides = {}
        for side, model in models.items():
            sides[side] = trace_step(model, inputs, autocast_dtype, places=places)
        models = build_fake_pair(name, spec["config"], low)
        features = {key: value for key, value in inputs.items() if key != "labels"}
        if models["ours"].config.is_encoder_decoder:
            features["decoder_input_ids"] = inputs["labels"].clamp(min=0)  # (the labels' -100 padding, if any)
        forward = {side: trace_forward(model, features) for side, model in models.items()}
        decode = None
        if task != "masked":  # a decoder's two steps end at the profile's length (GPT-2's positions)
            decode = {side: trace_decode(model, spec["length"] - 2) for side, model in models.items()}
    ratios = {
        key: sides["ours"][key] / sides["reference"][key] if sides["reference"][key] else math.nan
        for key in ("kernels", "bytes_gib")
    }
    return {
        "reference": KINDS[name].reference,
        "shape": spec,
        "weights": str(weights).removeprefix("torch."),
        "autocast": None if autocast_dtype is None else str(autocast_dtype).removeprefix("torch."),
        **sides,
        "ratios": ratios,
        "forward": forward,
        **({"decode": decode} if decode else {}),
    }


def unfused_calls(counts: dict) -> int:
    """The sdpa calls a GPU would not fuse, over every place that made them."""
    return sum(calls for _, calls in counts["unfused_attention"])


def run(profile_name: str, pairs: list[str] | None = None, output: Path | None = None, places: bool = False) -> dict:
    profile = PROFILES[profile_name]
    command = f"python -m benchmarks.trace --profile {profile_name}" + (f" --pairs {' '.join(pairs)}" if pairs else "")
    command += " --peak-places" if places else ""
    record = {**header(f"trace-{profile_name}", command, torch.device("cpu")), "pairs": {}}
    for name in pairs or list(profile["pairs"]):
        result = record["pairs"][name] = trace_pair(name, profile["pairs"][name], places)
        ours, reference = result["ours"], result["reference"]
        print(
            f"{name:12s} kernels {ours['kernels']:6d} / {reference['kernels']:6d}  "
            f"GiB {ours['bytes_gib']:8.2f} / {reference['bytes_gib']:8.2f}  "
            f"syncs {ours['host_syncs']} / {reference['host_syncs']}  "
            f"unfused attention {unfused_calls(ours)} / {unfused_calls(reference)}  "
            f"matmul TFLOP {ours['matmul_tflops']} / {reference['matmul_tflops']}",
            flush=True,
        )
        for side in ("ours", "reference") if places else ():
            print(f"  {side}: peak {result[side]['peak_gib']:.2f} GiB, of it")
            for place, gib in result[side]["peak_places"]:
                print(f"    {gib:7.3f} GiB  {place}")
    path = output or RESULTS / f"trace-{profile_name}-{record['date']}.json"
    if (profile_name != "smoke" and not places) or output is not None:  # a look at the peak is not a results file
        write(record, f"trace-{profile_name}", path)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--pairs", nargs="+", choices=sorted(KINDS), help="default: every pair of the profile")
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/trace-<profile>-<date>.json")
    parser.add_argument(
        "--peak-places",
        action="store_true",
        help="print what each side's peak holds, by allocating line (written only with --output)",
    )
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    run(args.profile, args.pairs, args.output, args.peak_places)


if __name__ == "__main__":
    main()
