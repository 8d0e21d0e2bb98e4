"""Beyond parity, chunked loss (`loss_chunk_size`): a training step without optimizer (forward with labels, backward,
gradients freed) of a GPT-2-124M-shaped and a Llama-shaped pair (the real vocabularies, fewer layers for the CPU),
the reference against hf_tfm at its default `loss_chunk_size`, at 0 (the plain path, holding the full [tokens,
vocab] logits) and at a sweep of sizes, so that the default is chosen by measurement. Every hf_tfm variant is the
same model, its `config.loss_chunk_size` set before each step. Ratios are ours / reference in seconds or bytes.
"""

import torch

from benchmarks.measure import alternating_medians, peak_bytes, train_step_work, training_batch
from benchmarks.pairs import KINDS, SMOKE_DECODER, build_pair

CPU = torch.device("cpu")

# Llama-shaped with Llama 2's vocabulary, 2 layers
LLAMA_SHAPE = dict(
    hidden_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    intermediate_size=1376,
    vocab_size=32000,
    max_position_embeddings=1024,
)

PROFILES = {
    # 2 cores, fp32, eager: about 6 minutes in all (a GPT-2 step: 1.8 s at 2 x 256 tokens, 8 s at 2 x 1024)
    "cpu": {
        "pairs": {
            # GPT2Config() is GPT-2 124M (vocab 50257, width 768, 12 heads); 2 of its 12 layers
            "gpt2": dict(config=dict(n_layer=2), batch=2, length=256, sweep=[128, 256, 512, 1024]),
            # a longer batch, where the logits outweigh the head's weight gradient (as in real training)
            "gpt2-long": dict(kind="gpt2", config=dict(n_layer=2), batch=2, length=1024, sweep=[256, 1024]),
            "llama": dict(config=LLAMA_SHAPE, batch=2, length=256, sweep=[256, 1024]),
            "llama-long": dict(kind="llama", config=LLAMA_SHAPE, batch=2, length=1024, sweep=[256, 1024]),
        },
        "warmup": 1,
        "repeats": 6,
    },
    # for tests: every code path at a toy shape, in seconds
    "smoke": {
        "pairs": {
            "gpt2": dict(
                config=dict(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=64),
                batch=2,
                length=8,
                sweep=[4],
            ),
            "llama": dict(
                config=SMOKE_DECODER,
                batch=2,
                length=8,
                sweep=[],
            ),
        },
        "warmup": 1,
        "repeats": 2,
    },
}


def chunk_variants(default: int, sweep: list[int]) -> dict[str, int]:
    """hf_tfm's variants by label: the default, the plain path (0), then the sweep (sizes already listed skipped)."""
    variants = {f"loss_chunk_size {default}, default": default, "loss_chunk_size 0, plain": 0}
    for size in sweep:
        if size not in variants.values():
            variants[f"loss_chunk_size {size}"] = size
    return variants


def with_chunk_size(model, size: int, step):
    def run():
        model.config.loss_chunk_size = size
        step()

    return run


def same_loss(reference, ours, inputs, variants: dict[str, int]) -> dict[str, dict]:
    """Evidence that each variant trains the same function: on the untouched weights, with the same dropout seed,
    the loss and the LM head's gradient against the reference's, and whether the logits came back."""

    def loss_and_head_gradient(model):
        torch.manual_seed(0)
        output = model(**inputs)
        output.loss.backward()
        gradient = model.get_output_embeddings().weight.grad.clone()
        model.zero_grad(set_to_none=True)
        return output.loss.item(), gradient, output.logits is not None

    loss, gradient, _ = loss_and_head_gradient(reference)
    evidence = {}
    for label, size in variants.items():
        ours.config.loss_chunk_size = size
        our_loss, our_gradient, logits = loss_and_head_gradient(ours)
        evidence[label] = {
            "loss_chunk_size": size,
            "loss_difference": abs(our_loss - loss),
            "head_gradient_difference": (our_gradient - gradient).abs().max().item(),
            "logits_returned": logits,
        }
    return evidence


def chunked_loss_pair(name: str, spec: dict, profile: dict) -> tuple[dict, list[dict]]:
    """The training-step rows of one pair: time and peak memory of each hf_tfm variant against the reference."""
    kind = spec.get("kind", name)
    reference, ours = build_pair(kind, spec["config"])
    reference.train()
    ours.train()
    default = ours.config.loss_chunk_size
    variants = chunk_variants(default, spec["sweep"])
    inputs = training_batch("causal", reference.config.vocab_size, spec["batch"], spec["length"], None, CPU)
    pair = {
        "reference": KINDS[kind].reference,
        "shape": spec,
        "default_loss_chunk_size": default,
        "train_tokens_per_step": inputs["input_ids"].numel(),
        "variants": same_loss(reference, ours, inputs, variants),
    }
    work = {"reference": train_step_work(reference, inputs, None, None)}
    ours_step = train_step_work(ours, inputs, None, None)
    work.update({label: with_chunk_size(ours, size, ours_step) for label, size in variants.items()})
    timed = alternating_medians(work, profile["warmup"], profile["repeats"], CPU)
    peaks = {label: peak_bytes(step, CPU) for label, step in work.items()}
    rows = []
    for label in variants:
        common = {"technique": "chunked loss", "pair": name, "variant": label}
        rows.append(
            {
                **common,
                "measure": "train step",
                "unit": "ms",
                "reference": timed["reference"]["median_s"] * 1e3,
                "ours": timed[label]["median_s"] * 1e3,
                "time_ratio": timed[label]["median_s"] / timed["reference"]["median_s"],
                "seconds": {"reference": timed["reference"], "ours": timed[label]},
            }
        )
        rows.append(
            {
                **common,
                "measure": "train peak memory",
                "unit": "MiB",
                "reference": peaks["reference"] / 2**20,
                "ours": peaks[label] / 2**20,
                "memory_ratio": peaks[label] / peaks["reference"],
            }
        )
    return pair, rows


def measure(profile_name: str) -> tuple[dict, list[dict]]:
    """Every pair of the profile: ({pair: evidence}, rows)."""
    profile = PROFILES[profile_name]
    evidence, rows = {}, []
    for name, spec in profile["pairs"].items():
        evidence[name], pair_rows = chunked_loss_pair(name, spec, profile)
        rows += pair_rows
    return evidence, rows
