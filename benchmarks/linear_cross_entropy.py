"""Why hf_tfm keeps its own chunked loss: the LM-head loss of one training step (projection, cross-entropy,
backward) three ways, at one shape and three dtype policies:

- `reference`: transformers' way (`ForCausalLMLoss`): the whole [tokens, vocab] logits, upcast to float32, then
  cross-entropy;
- `hf_tfm`: `linear_cross_entropy`, the chunked loss an hf_tfm LM head trains with (chunks sized as a 12-layer
  model's are);
- `torch`: torch's own `torch.nn.functional.linear_cross_entropy` (torch 2.13+) with its chunked path
  (`LinearCrossEntropyOptions()`, every choice on "auto").

    python -m benchmarks.linear_cross_entropy                  # results/linear-cross-entropy-cpu-<date>.json
    python -m benchmarks.linear_cross_entropy --profile smoke  # every path at a toy shape, in seconds

For each: the loss's and the gradients' largest difference from a float64 computation of the same loss (the
reference's own difference is the yardstick), the dtypes the loss's vocabulary matmul is handed (a matmul operator,
or torch's chunked operator, whose inside a dispatch mode cannot see), the time of a step as a ratio to the
reference's (medians of alternating repeats, with their spread) and the peak memory the step allocates. The dtype
policies: float32; float32 weights under bf16 autocast (Trainer's `bf16=True`); bf16 weights.
"""

import argparse
import functools
from pathlib import Path

import torch
from torch.nn import functional
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.measure import alternating_medians, peak_bytes
from benchmarks.record import header, write
from hf_tfm.model.modeling_tfm_lm_head import linear_cross_entropy

CPU = torch.device("cpu")
LAYERS = 12  # hf_tfm sizes its chunks by layers x hidden: a GPT-2-124M-deep model's
PROFILES = {
    # Llama 2's vocabulary, a small model's width: about 2 minutes on 2 cores
    "cpu": dict(tokens=4096, hidden=256, vocab=32000, repeats=5),
    "smoke": dict(tokens=64, hidden=16, vocab=100, repeats=2),
}
POLICIES = {  # (weights' dtype, autocast to bf16)
    "float32": (torch.float32, False),
    "float32 weights, bf16 autocast": (torch.float32, True),
    "bf16": (torch.bfloat16, False),
}


def reference_loss(hidden, weight, labels):
    logits = functional.linear(hidden, weight).float()
    return functional.cross_entropy(logits, labels)


def hf_tfm_loss(hidden, weight, labels):
    return linear_cross_entropy(hidden, weight, None, labels, None, activation_width=LAYERS * hidden.shape[-1])


def torch_loss(hidden, weight, labels):
    return functional.linear_cross_entropy(hidden, weight, labels, options=torch.nn.LinearCrossEntropyOptions())


LOSSES = {"reference": reference_loss, "hf_tfm": hf_tfm_loss, "torch": torch_loss}


class MatmulDtypes(TorchDispatchMode):
    """The dtypes of the tensors each vocabulary-sized matmul (or torch's chunked loss operator) is handed."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
        # (hf_tfm's table may be padded to a multiple of 8 rows)
        vocabulary_sized = any(dim >= self.vocab for tensor in tensors for dim in tensor.shape)
        if vocabulary_sized and (name in ("mm", "addmm") or "linear_cross_entropy" in name):
            operands = tensors[1:3] if name == "addmm" else tensors[:2]  # addmm: (bias, input, weight)
            self.seen.add("/".join(str(tensor.dtype).removeprefix("torch.") for tensor in operands))
        return func(*args, **(kwargs or {}))


def step(loss_fn, hidden, weight, labels, autocast: bool):
    """The loss and its gradients for the hidden states and the weight."""
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(hidden, weight, labels)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


def largest_differences(results, truth) -> dict[str, float]:
    return {
        name: (got.double() - want).abs().max().item()
        for name, got, want in zip(("loss", "hidden_grad", "weight_grad"), results, truth)
    }


def compare(tokens: int, hidden_size: int, vocab: int, repeats: int, weight_dtype, autocast: bool) -> dict:
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(vocab, hidden_size, generator=generator) * 0.02).to(weight_dtype).requires_grad_()
    hidden = torch.randn(tokens, hidden_size, generator=generator).to(weight_dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    labels[::7] = -100  # some tokens unscored, as padding and prompts are
    exact_hidden, exact_weight = (tensor.detach().double().requires_grad_() for tensor in (hidden, weight))
    truth = step(reference_loss, exact_hidden, exact_weight, labels, autocast=False)
    work = {
        name: functools.partial(step, loss_fn, hidden, weight, labels, autocast) for name, loss_fn in LOSSES.items()
    }
    row = {}
    for name, loss_fn in LOSSES.items():
        dtypes = MatmulDtypes(vocab)
        with dtypes:
            results = step(loss_fn, hidden, weight, labels, autocast)
        row[name] = {
            "largest_difference_from_float64": largest_differences(results, truth),
            "vocabulary_matmul_dtypes": sorted(dtypes.seen),
            "peak_bytes": peak_bytes(work[name], CPU),
        }
    seconds = alternating_medians(work, warmup=1, repeats=repeats, device=CPU)
    reference = seconds["reference"]["median_s"]
    for name, timing in seconds.items():
        row[name]["seconds"] = timing
        row[name]["time_ratio"] = timing["median_s"] / reference
        row[name]["time_ratio_spread"] = [timing["min_s"] / reference, timing["max_s"] / reference]
        row[name]["peak_ratio"] = row[name]["peak_bytes"] / row["reference"]["peak_bytes"]
    return row


def run(profile: str) -> dict:
    shape = PROFILES[profile]
    return {
        "shape": shape,
        "policies": {
            policy: compare(shape["tokens"], shape["hidden"], shape["vocab"], shape["repeats"], *dtypes)
            for policy, dtypes in POLICIES.items()
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--output", type=Path, default=None, help="the results file (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    result = run(args.profile)
    for policy, row in result["policies"].items():
        print(policy)
        for name, measured in row.items():
            difference = measured["largest_difference_from_float64"]
            print(
                f"  {name:9s} time {measured['time_ratio']:.2f}x ({measured['time_ratio_spread'][0]:.2f}-"
                f"{measured['time_ratio_spread'][1]:.2f}), peak {measured['peak_ratio']:.2f}x, matmul "
                f"{','.join(measured['vocabulary_matmul_dtypes'])}, loss off by {difference['loss']:.1e}, gradients "
                f"{difference['hidden_grad']:.1e} / {difference['weight_grad']:.1e}"
            )
    command = f"python -m benchmarks.linear_cross_entropy --profile {args.profile}"
    record = {**header(args.profile, command, CPU), **result}
    if args.profile == "cpu" or args.output:
        write(record, f"linear-cross-entropy-{args.profile}", args.output)
    return record


if __name__ == "__main__":
    main()
