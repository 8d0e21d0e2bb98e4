"""Beyond parity, no host synchronisation in the decode loop: batch-1 greedy decoding of a Llama-shaped pair, the
reference (LlamaForCausalLM) against hf_tfm, with sdpa attention and the dynamic and static caches.

A host synchronisation (the CPU waiting for the accelerator to finish, to read a value) costs nothing measurable on
the CPU, where these rows are timed: the evidence that matters there is the count of synchronisations each model's
forward makes per decode step, and each whole generate() call per new token (generate()'s own stopping checks
included), counted by `HostSyncCounter` on the same run. On a GPU each one stalls the launch queue once per token.
"""

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.cache_utils import StaticCache

import hf_tfm
from benchmarks.measure import alternating_medians, generate_work
from benchmarks.pairs import KINDS, SMOKE_DECODER, build_pair
from hf_tfm.compat import CACHE_NAME

CPU = torch.device("cpu")

# aten ops that make the host wait for the device: reading a value into Python (`item()`, `int()`, `float()`,
# `bool()` and `if tensor:`, `__index__`, printing: all of them `_local_scalar_dense`, or under torch.inference_mode,
# where composite ops reach the dispatch mode whole, `item` and `is_nonzero`), comparisons that answer a Python bool,
# and ops whose output size depends on the values (`nonzero`, `torch.where(mask)`, boolean-mask indexing, `unique`,
# `bincount`)
READS_VALUES = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "is_nonzero",
        "equal",
        "allclose",
        "nonzero",
        "nonzero_numpy",
        "argwhere",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "bincount",
    }
)
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
# Tensor methods that copy to the host without an aten op the dispatch mode would see
HOST_COPIES = ("tolist", "numpy", "cpu")


def waits_for_device(func, args, kwargs) -> bool:
    """Whether an aten op call makes the host wait for the device (on a GPU: a synchronisation)."""
    name = func.overloadpacket.__name__
    if name in READS_VALUES:
        return True
    if name == "where":  # torch.where(condition) alone is nonzero
        return func._overloadname == "default"
    if name == "repeat_interleave":  # repeats given as a tensor: the output size is their sum, unless given
        return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    if name == "histc":  # min == max (by default 0 and 0): the range is the values' own minimum and maximum
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        high = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return low == high
    if name in INDEXING:  # a boolean mask index is turned into indices by nonzero
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return False


# the package folders a place is named in: by folder, not by a name in the path (a checkout in a folder named hf_tfm
# holds torch's frames too, and torch's own wrappers, such as dynamo's disable, sit between transformers' frames)
PLACES = tuple(str(Path(package.__file__).parent) + "/" for package in (hf_tfm, transformers))


def caller() -> str:
    """The innermost frames of hf_tfm or transformers on the stack, as `file:line Class.function`."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None and len(frames) < 3:
        path = frame.f_code.co_filename
        if path.startswith(PLACES):
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            frames.append(f"{path.rsplit('/', 1)[-1]}:{frame.f_lineno} {name}")
        frame = frame.f_back
    return " <- ".join(frames) or "outside hf_tfm and transformers"


class HostSyncCounter(TorchDispatchMode):
    """Records every operation that would make the host wait for the device, whatever device the tensors are on: a
    CPU run counts what a GPU run would wait on. Works at the aten level, so it also sees the reads that torch and
    transformers make inside other calls (a boolean index calling nonzero, `if mask.all():`), plus the tensor methods
    that copy to the host without an aten op (`HOST_COPIES`). `syncs` lists them as `op at place`; counting can be
    paused by setting `counting`. One overcount on the CPU: outside inference mode, `one_hot` shows the value checks
    its CPU kernel makes, which on an accelerator are device-side asserts."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []
        self.counting = True
        self._originals = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.counting and waits_for_device(func, args, kwargs):
            self.syncs.append(f"{func.overloadpacket.__name__} at {caller()}")
        return func(*args, **kwargs)

    def _host_copy(self, name: str) -> Callable:
        original = self._originals[name]

        def copy(tensor, *args, **kwargs):
            if self.counting:
                self.syncs.append(f"{name} at {caller()}")
            return original(tensor, *args, **kwargs)

        return copy

    def __enter__(self):
        for name in HOST_COPIES:
            self._originals[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._host_copy(name))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


def syncs_per_call(model: torch.nn.Module, run: Callable[[], object]) -> list[list[str]]:
    """Runs `run()` and returns, for each call of `model` (the module itself, not its submodules) in order, the host
    synchronisations made inside it. generate() calls the model once for the prompt, then once per decode step."""
    calls = []
    counter = HostSyncCounter()
    counter.counting = False

    def start(*_):
        counter.syncs = []
        calls.append(counter.syncs)
        counter.counting = True

    def stop(*_):
        counter.counting = False

    hooks = [model.register_forward_pre_hook(start), model.register_forward_hook(stop)]
    try:
        with counter:
            run()
    finally:
        for hook in hooks:
            hook.remove()
    return calls


PROFILES = {
    # 2 cores, fp32: a Llama-shaped decoder small enough that a decode step is dominated by per-layer overheads,
    # as batch-1 decoding is on a GPU; about a minute in all
    "cpu": {
        "config": dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=688,
            vocab_size=8192,
            max_position_embeddings=512,
        ),
        "prompt_length": 8,
        "new_tokens": 64,
        "warmup": 1,
        "repeats": 6,
    },
    "smoke": {"config": SMOKE_DECODER, "prompt_length": 4, "new_tokens": 3, "warmup": 1, "repeats": 2},
}


def greedy_steps_by_hand(
    model, first_ids, cache, steps: int, padding_mask: bool, positions: bool = False, **encoder
) -> list[list[str]]:
    """The host syncs of each forward of a greedy batch-1 generation written out: `first_ids` (a decoder's prompt,
    or an encoder-decoder's start token with `encoder_outputs` and the source `attention_mask` in `encoder`), then
    `steps` single-token steps on `cache` (None: the model makes one), each with a growing all-ones padding mask
    (what generate() passes for a padded batch, and transformers before 5.23 always) or none, and with the tokens'
    `position_ids` (a decoder's, as generate() passes them) or without."""
    prefix = "decoder_" if encoder else ""

    def run():
        ids, seen, past = first_ids, first_ids.shape[1], cache
        with torch.no_grad():
            for _ in range(steps + 1):
                inputs = {f"{prefix}input_ids": ids, f"{prefix}attention_mask": None}
                if padding_mask:
                    inputs[f"{prefix}attention_mask"] = torch.ones(1, seen, dtype=torch.long)
                if positions:
                    inputs[f"{prefix}position_ids"] = torch.arange(seen - ids.shape[1], seen)[None]
                output = model(**inputs, **encoder, **{CACHE_NAME: past}, use_cache=True)
                ids, seen, past = output.logits[:, -1:].argmax(-1), seen + 1, output.get(CACHE_NAME)

    return syncs_per_call(model, run)


def per_step(calls: list[list[str]]) -> dict:
    """Syncs of the first forward, per later (decode) step on average, and the places of the decode steps' ones."""
    steps = calls[1:]
    return {
        "first_forward": len(calls[0]),
        "per_decode_step": sum(map(len, steps)) / max(len(steps), 1),
        "decode_step_places": sorted({sync for step in steps for sync in step}),
    }


def sync_counts(model, prompt: torch.Tensor, new_tokens: int, cache: str) -> dict:
    """Host syncs of greedy generation: in the model's forwards through generate() and, for the whole generate()
    call (its own stopping checks included), per new token; in the forwards of decode steps given a padding mask."""
    generate = generate_work(model, prompt, new_tokens, cache, [])
    counts = {"generate() forwards": per_step(syncs_per_call(model, generate))}
    with HostSyncCounter() as counter:
        generate()
    counts["generate() per new token"] = len(counter.syncs) / new_tokens
    past = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + new_tokens) if cache == "static" else None
    counts["forwards given a padding mask"] = per_step(greedy_steps_by_hand(model, prompt, past, new_tokens - 1, True))
    return counts


def measure(profile_name: str) -> tuple[dict, list[dict]]:
    profile = PROFILES[profile_name]
    reference, ours = build_pair("llama", profile["config"])
    new_tokens = profile["new_tokens"]
    prompt = torch.randint(3, profile["config"]["vocab_size"], (1, profile["prompt_length"]))
    evidence = {
        "reference": KINDS["llama"].reference,
        "attn_implementation": reference.config._attn_implementation,
        "host_syncs": {},
        "same_tokens": {},
    }
    rows = []
    models = {"reference": reference, "ours": ours}
    for cache in ("dynamic", "static"):
        variant = f"batch 1, {cache} cache"
        evidence["host_syncs"][variant] = {
            name: sync_counts(model, prompt, new_tokens, cache) for name, model in models.items()
        }
        outputs = {name: [] for name in models}
        work = {name: generate_work(model, prompt, new_tokens, cache, outputs[name]) for name, model in models.items()}
        timed = alternating_medians(work, profile["warmup"], profile["repeats"], CPU)
        evidence["same_tokens"][variant] = all(map(torch.equal, outputs["reference"], outputs["ours"]))
        per_token = {name: {key: value / new_tokens for key, value in timed[name].items()} for name in models}
        rows.append(
            {
                "technique": "no host sync",
                "pair": "llama",
                "variant": variant,
                "measure": "generate() per new token",
                "unit": "ms",
                "reference": per_token["reference"]["median_s"] * 1e3,
                "ours": per_token["ours"]["median_s"] * 1e3,
                "time_ratio": per_token["ours"]["median_s"] / per_token["reference"]["median_s"],
                "seconds": per_token,
            }
        )
    return evidence, rows
