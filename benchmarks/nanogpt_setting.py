"""GPT-2 124M trained in nanoGPT's setting, compiled: hf_tfm's model, a minimal GPT written here in the style of
nanoGPT's model, and transformers' `GPT2LMHeadModel`, side by side in one process on the same weights and batch.

    python -m benchmarks.nanogpt_setting --profile gpu --output $OUT/nanogpt.json   # on an H100 / H200
    python -m benchmarks.nanogpt_setting --profile smoke                            # the same code, tiny, on a CPU
    python -m benchmarks.nanogpt_setting --predict   # the GPU shape's compiled steps, as inductor counts them on a CPU

nanoGPT's setting: dropout 0, a vocabulary of 50304 rows (50257 tokens rounded up to a multiple of 64, as nanoGPT
sets `vocab_size`), bf16 autocast over float32 weights, fused AdamW, 16 x 1024 tokens a step, every model through
`torch.compile`. The three models compute one function (GPT-2's tanh GELU in all three; the largest logit difference
is recorded), so the rows compare only how each runs it: training tokens/s (alternating medians, lowest and highest
repeat too), MFU (nanoGPT's accounting, `train_flops_per_token`) and the training step's peak memory.

`MiniGPT` is this repository's own code, written for this comparison: one block class with one fused q/k/v
projection, `scaled_dot_product_attention(is_causal=True)`, the head tied to the token table, plain cross-entropy.
"""

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.modeling_outputs import CausalLMOutput

from benchmarks.compiled import count_inductor_bytes, counts_by_batch
from benchmarks.measure import alternating_medians, peak_bytes, ran_compiled, train_step_work, training_batch
from benchmarks.pairs import train_flops_per_token
from benchmarks.record import header, write
from benchmarks.speed import peak_flops
from hf_tfm.convert import to_tfm

# the GPU shape is nanoGPT's GPT-2 124M run (block 1024, 12 x 768, 12 heads) at 16 sequences a step
PROFILES = {
    "gpu": dict(
        device="cuda", model=dict(n_layer=12, n_head=12, n_embd=768), batch=16, length=1024, warmup=3, repeats=20
    ),
    "smoke": dict(device="cpu", model=dict(n_layer=2, n_head=4, n_embd=32), batch=2, length=16, warmup=1, repeats=3),
}
VOCABULARY_ROWS = 50304  # GPT-2's 50257 tokens rounded up to a multiple of 64, nanoGPT's choice


@dataclass
class MiniGPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int


class Block(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.mlp_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class MiniGPT(nn.Module):
    """GPT-2 as nanoGPT writes it. `forward(input_ids, labels)` scores each token's successor, as transformers' causal
    LMs do with `labels=input_ids`: the targets move one place left, the logits stay whole."""

    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> CausalLMOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if labels is None:
            return CausalLMOutput(logits=logits)
        targets = F.pad(labels[:, 1:], (0, 1), value=-100)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    @classmethod
    def holding(cls, reference: GPT2LMHeadModel) -> "MiniGPT":
        """A MiniGPT with `reference`'s weights (GPT-2's Conv1D layers hold their weights transposed)."""
        config = reference.config
        model = cls(MiniGPTConfig(config.n_layer, config.n_head, config.n_embd, config.vocab_size, config.n_positions))
        source = reference.transformer
        with torch.no_grad():
            model.wte.weight.copy_(source.wte.weight)
            model.wpe.weight.copy_(source.wpe.weight)
            model.ln_f.load_state_dict(source.ln_f.state_dict())
            for block, layer in zip(model.h, source.h):
                block.ln_1.load_state_dict(layer.ln_1.state_dict())
                block.ln_2.load_state_dict(layer.ln_2.state_dict())
                pairs = [
                    (block.c_attn, layer.attn.c_attn),
                    (block.c_proj, layer.attn.c_proj),
                    (block.c_fc, layer.mlp.c_fc),
                    (block.mlp_proj, layer.mlp.c_proj),
                ]
                for linear, conv in pairs:
                    linear.weight.copy_(conv.weight.t())
                    linear.bias.copy_(conv.bias)
        return model


def build_models(shape: dict, seed: int = 0) -> dict[str, nn.Module]:
    """The reference in nanoGPT's setting, hf_tfm's conversion of it and a MiniGPT holding the same weights."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCABULARY_ROWS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_positions=1024, **shape
    )
    reference = GPT2LMHeadModel(config)
    return {"reference": reference, "ours": to_tfm(reference), "nanogpt_style": MiniGPT.holding(reference)}


MODELS = ["reference", "ours", "nanogpt_style"]  # build_models' names


def largest_logit_difference(models: dict, input_ids: torch.Tensor) -> float:
    """How far hf_tfm's and MiniGPT's logits are from the reference's on the measured batch, in float32."""
    with torch.inference_mode():
        logits = {name: model(input_ids=input_ids).logits.float() for name, model in models.items()}
    return max((logits[name] - logits["reference"]).abs().max().item() for name in ("ours", "nanogpt_style"))


def run(profile_name: str, output: Path | None, command: str) -> dict:
    """Times the three models' compiled training steps. The record is written after each stage (the logit check, each
    model's compile, the timed steps), so a run stopped at its time limit keeps what it measured; a model that fails
    to compile is an error line of the record, and the others are still timed."""
    profile = PROFILES[profile_name]
    device = torch.device(profile["device"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    models = {name: model.to(device).train() for name, model in build_models(profile["model"]).items()}
    inputs = training_batch("causal", 50257, profile["batch"], profile["length"], None, device)
    record = {
        **header(profile_name, command, device),
        "setting": {**profile, "vocabulary_rows": VOCABULARY_ROWS, "dropout": 0.0, "autocast": "bfloat16"},
        "train_tokens_per_step": inputs["input_ids"].numel(),
        "max_logit_difference": largest_logit_difference(models, inputs["input_ids"][:2]),
        "compile_seconds": {},
        "errors": {},
    }
    path = write(record, f"nanogpt-{profile_name}", output)
    fused = {"fused": True} if device.type == "cuda" else {}
    torch._dynamo.reset()
    work = {}
    for name, model in models.items():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        call = train_step_work(torch.compile(model), inputs, optimizer, torch.bfloat16)
        start = time.perf_counter()
        try:
            call()  # compiles, outside the timed repeats
            if not ran_compiled(call, device):
                raise RuntimeError("dynamo did not compile it: the step ran eagerly")
            work[name] = call
        except Exception as error:  # a model that cannot compile is a result, not the end of the run
            record["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        record["compile_seconds"][name] = round(time.perf_counter() - start, 1)
        write(record, f"nanogpt-{profile_name}", path)
    timed = alternating_medians(work, profile["warmup"], profile["repeats"], device)
    flops = train_flops_per_token(models["reference"], profile["length"])  # one architecture: the same for all three
    peak = peak_flops(device)
    speed = {name: record["train_tokens_per_step"] / timed[name]["median_s"] for name in work}
    record["models"] = {
        name: {
            "tokens_per_s": speed[name],
            "seconds": timed[name],
            "mfu": speed[name] * flops / peak if peak else None,
            "peak_memory_mib": peak_bytes(work[name], device) / 2**20,
        }
        for name in work
    }
    record["ratios"] = {
        f"ours_over_{name}_tokens_per_s": speed["ours"] / speed[name]
        for name in ("nanogpt_style", "reference")
        if "ours" in speed and name in speed
    }
    for name, row in record["models"].items():
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        memory = row["peak_memory_mib"]
        print(f"{name:14s} {row['tokens_per_s']:12,.0f} tokens/s  MFU {mfu:>6s}  peak {memory:9.1f} MiB")
    for name, error in record["errors"].items():
        print(f"{name:14s} error: {error}")
    print(f"max logit difference {record['max_logit_difference']:.3g}; ratios {record['ratios']}", flush=True)
    write(record, f"nanogpt-{profile_name}", path)
    return record


def predict(
    profile_name: str, batches: tuple[int, int], length: int, output: Path | None, command: str, names: list[str]
) -> dict:
    """The compiled step of each model named predicted on the CPU, as `benchmarks.compiled` predicts the pairs':
    inductor's bytes and kernels at `batches` sequences of `length` tokens, and the bytes on the line through them at
    the profile's token count; graphs and graph breaks."""
    count_inductor_bytes()
    profile = PROFILES[profile_name]
    models = {name: model for name, model in build_models(profile["model"]).items() if name in names}
    profile_batch = profile["batch"] * profile["length"] / length

    def batch_of(batch: int) -> dict:
        return training_batch("causal", 50257, batch, length, None, "cpu")

    sides = {
        name: counts_by_batch(model, batch_of, batches, profile_batch, autocast_dtype=torch.bfloat16)
        for name, model in models.items()
    }
    record = {
        **header(f"nanogpt-compiled-{profile_name}", command, torch.device("cpu")),
        "shape": {"model": profile["model"], "batches": list(batches), "length": length},
        "profile_tokens": profile["batch"] * profile["length"],
        "models": sides,
    }
    for name, counts in sides.items():
        print(
            f"{name:14s} GB {counts['gb']:8.3f} ({counts['gb_at_profile_tokens']:8.2f} at {record['profile_tokens']} "
            f"tokens)  kernels {counts['kernels']:5d}  graphs {counts['graphs']}  breaks {counts['graph_breaks']}",
            flush=True,
        )
    write(record, f"nanogpt-compiled-{profile_name}", output)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/nanogpt-<profile>-<date>.json")
    parser.add_argument(
        "--predict",
        action="store_true",
        help="predict each compiled step on the CPU: inductor's bytes and kernels (benchmarks.compiled's method)",
    )
    parser.add_argument("--batches", type=int, nargs=2, default=[2, 4], help="with --predict (default: 2 4)")
    parser.add_argument("--length", type=int, default=256, help="with --predict (default: 256)")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=MODELS, help="with --predict: these models only (default: all)"
    )
    args = parser.parse_args(argv)
    command = "python -m benchmarks.nanogpt_setting " + " ".join(argv or sys.argv[1:])
    if args.predict:
        predict(args.profile, tuple(args.batches), args.length, args.output, command, args.models)
        return
    if PROFILES[args.profile]["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: profile {args.profile!r} needs a CUDA device and none is visible")
    run(args.profile, args.output, command)


if __name__ == "__main__":
    main()
