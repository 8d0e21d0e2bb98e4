"""Training mode against the references, family by family: each reference with every dropout its config names set to
a rate (embeddings, attention weights, sublayer outputs, inside the feed-forward and each expert, after T5's final
norm, LayerDrop), converted with `to_tfm`, then one training forward of each under the same seed, for many seeds.
Prints a table (the largest seeded loss difference, and each side's mean loss over the seeds with its standard error)
and writes it as JSON. tests/test_training_parity.py asserts the same with two seeds.

    python -m benchmarks.training_parity [--seeds 40] [--rate 0.2] [--families t5 bart] [--output FILE]
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
import transformers

from hf_tfm.convert import to_tfm
from hf_tfm.convert.families import FAMILIES

# parameters hf_tfm trains that the reference does not have: left out of the gradient norm (docs/differences.md)
OWN_PARAMETERS = {
    "modernbert": {
        "lm_head.dense.bias": "the MLM head's dense layer always has a bias; ModernBERT's has none unless "
        "classifier_bias (off in the published checkpoints), so it converts as zeros: the same logits, but it trains"
    },
}


def reference_config(name: str, **fields):
    """The family's tiny reference config (its record's `tiny` fields), with `fields`."""
    record = FAMILIES[name]
    return getattr(transformers, record.config_class)(**{**record.tiny, **fields})


def dropout_fields(name: str, rate: float) -> dict[str, float]:
    """Every dropout probability the reference's config holds (LayerDrop's too), bar the task heads' (no head here
    reads them)."""
    config = reference_config(name)
    return {
        field: rate
        for field, value in vars(config).items()
        if ("dropout" in field or "pdrop" in field or "layerdrop" in field)
        and "classif" not in field
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }


def batch(config) -> dict:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, config.vocab_size, (2, 9), generator=generator)
    if config.is_encoder_decoder:
        return {"input_ids": input_ids, "labels": torch.randint(3, config.vocab_size, (2, 5), generator=generator)}
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def seeded_step(model, inputs: dict, seed: int, leave_out=(), **extra) -> tuple[float, float]:
    """The loss of one training forward under `seed`, and the norm of every gradient it gives (bar `leave_out`)."""
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(**inputs, **extra).loss
    loss.backward()
    gradients = [p.grad for name, p in model.named_parameters() if p.grad is not None and name not in leave_out]
    return loss.item(), torch.linalg.vector_norm(torch.stack([g.norm() for g in gradients])).item()


def training_pair(name: str, rate: float):
    """The reference with its dropouts at `rate` and hf_tfm's conversion of it, both in training mode, the keyword
    arguments the reference's forward needs for its router losses, and a batch."""
    torch.manual_seed(0)
    reference_class = getattr(transformers, FAMILIES[name].reference)
    reference = reference_class(reference_config(name, **dropout_fields(name, rate))).train()
    ours = to_tfm(reference).train()
    ours.set_attn_implementation(reference.config._attn_implementation)
    extra = {"output_router_logits": True} if hasattr(reference.config, "num_experts") else {}
    return reference, ours, extra, batch(reference.config)


def family_row(name: str, seeds: int, rate: float) -> dict:
    reference, ours, extra, inputs = training_pair(name, rate)
    own = OWN_PARAMETERS.get(name, {})
    theirs = [seeded_step(reference, inputs, seed, **extra)[0] for seed in range(seeds)]
    mine = [seeded_step(ours, inputs, seed, own)[0] for seed in range(seeds)]

    def mean_and_error(losses):
        return statistics.fmean(losses), statistics.stdev(losses) / len(losses) ** 0.5

    return {
        "dropout_fields": sorted(dropout_fields(name, rate)),
        "largest_seeded_difference": max(abs(a - b) for a, b in zip(theirs, mine)),
        "reference_mean": mean_and_error(theirs),
        "hf_tfm_mean": mean_and_error(mine),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    rows = {name: family_row(name, args.seeds, args.rate) for name in args.families}
    columns = ["family", f"dropout fields at {args.rate}", "largest seeded loss difference"]
    print("| " + " | ".join([*columns, "mean loss, reference", "mean loss, hf_tfm"]) + " |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        (ref_mean, ref_error), (our_mean, our_error) = row["reference_mean"], row["hf_tfm_mean"]
        print(
            f"| {name} | {', '.join(row['dropout_fields'])} | {row['largest_seeded_difference']:.1e} "
            f"| {ref_mean:.4f} ± {ref_error:.4f} | {our_mean:.4f} ± {our_error:.4f} |"
        )
    record = {"seeds": args.seeds, "rate": args.rate, "torch": torch.__version__, "families": rows}
    if args.output:
        args.output.write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
