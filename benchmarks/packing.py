"""Beyond parity, padding-free packing (`hf-tfm train --packing`): real (non-padding) training tokens per second of
the same hf_tfm model on the same examples, padded (each batch of `batch` examples padded to its longest, the padded
collators of `hf-tfm train`) against packed (`batch` rows of `max_length` tokens, whole examples packed best-fit,
`hf_tfm.training.data.pack_examples` and `packing_collator`). Both spend at most the same token budget per step,
`batch x max_length`; packing fills it with real tokens, so it needs fewer steps for the same examples.

The examples are the embedded corpus at its natural lengths, through `hf-tfm train`'s own data path: the stdlib
docstrings, a tokenizer trained on them as a fresh run trains it, each docstring one example cut at `max_length`
(masked LM: `tasks.tokenize`; causal LM: `data.document_examples`, what --packing trains on). Both variants train on
all of the same examples, each step a forward with labels, backward and AdamW step; their time over all steps is
timed alternately. The speedup is packed / padded real tokens per second; the padding fraction of each variant's
batches is the evidence of what packing saves (tests/test_packing.py proves the losses equal).
"""

import random

import torch
import transformers
from datasets import Dataset

from benchmarks.measure import alternating_medians, train_step_work
from hf_tfm.training.data import (
    document_examples,
    load_task_data,
    pack_examples,
    packing_collator,
    packing_fill_id,
)
from hf_tfm.training.run import RunSpec, fresh_config, load_config, resolve_model
from hf_tfm.training.tasks import TASKS, collator, tokenize, trained_tokenizer

CPU = torch.device("cpu")

PROFILES = {
    # 2 cores, fp32: `hf-tfm train`'s default presets, max_length and vocabulary; the same 256 examples trained in
    # batches of 4 and of 16 (its default --batch-size)
    "cpu": {
        "pairs": {
            "llama-1.3m": dict(task="causal-lm", max_length=128, batches=[4, 16], examples=256),
            "bert-1.4m": dict(task="masked-lm", max_length=128, batches=[4, 16], examples=256),
        },
        "max_files": 200,
        "vocab_size": 4096,
        "warmup": 1,
        "repeats": 3,
    },
    # for tests: every code path at a toy shape, in seconds
    "smoke": {
        "pairs": {
            "llama-1.3m": dict(task="causal-lm", max_length=32, batches=[4], examples=16),
            "bert-1.4m": dict(task="masked-lm", max_length=32, batches=[4], examples=16),
        },
        "max_files": 20,
        "vocab_size": 300,
        "warmup": 1,
        "repeats": 1,
    },
}


def training_examples(task: str, tokenizer, data, max_length: int) -> list[dict]:
    """One example per docstring, as `hf-tfm train` builds them (with --packing for the causal LM: whole
    documents, which the padded variant then pads)."""
    if task == "causal-lm":
        examples = document_examples(tokenizer, list(data["train"]["text"]), max_length)
    else:
        examples = tokenize(task, data, tokenizer, max_length)["train"]
    return [dict(row) for row in examples]


def batches(task: str, tokenizer, examples: list[dict], batch: int, max_length: int) -> tuple[list[dict], list[dict]]:
    """(padded batches, packed batches) of the same examples: `batch` examples per padded step, `batch` rows of
    packed examples per packed step, drawn in a shuffled order as Trainer draws them."""
    fill_id = packing_fill_id(tokenizer)
    rows = pack_examples(Dataset.from_list(examples), max_length, fill_id, causal_lm_labels=task == "causal-lm")
    rows = [dict(rows[i]) for i in random.Random(0).sample(range(len(rows)), len(rows))]
    real = sum(len(example["input_ids"]) for example in examples)
    assert real == sum(token != fill_id for row in rows for token in row["input_ids"]), "packing lost tokens"
    padded = collate_steps(collator(task, tokenizer), examples, batch)
    return padded, collate_steps(packing_collator(task, tokenizer), rows, batch)


def collate_steps(collate, items: list[dict], batch: int) -> list[dict]:
    steps = []
    for step, start in enumerate(range(0, len(items), batch)):
        torch.manual_seed(step)  # the masked LM's masks
        steps.append(collate(items[start : start + batch]))
    return steps


def token_evidence(examples: list[dict], padded: list[dict], packed: list[dict]) -> dict:
    """Real tokens, and per variant its steps, token slots and the fraction of them that is padding."""
    real = sum(len(example["input_ids"]) for example in examples)
    assert real == sum(int(batch["attention_mask"].sum()) for batch in padded)
    evidence = {"real_tokens": real, "padded_widths": [batch["input_ids"].shape[1] for batch in padded]}
    for variant, steps in (("padded", padded), ("packed", packed)):
        slots = sum(batch["input_ids"].numel() for batch in steps)
        evidence[variant] = {"steps": len(steps), "slots": slots, "padding_fraction": 1 - real / slots}
    return evidence


def steps_work(model, batches_: list[dict], optimizer):
    steps = [train_step_work(model, batch, optimizer, None) for batch in batches_]

    def run():
        for step in steps:
            step()

    return run


def packing_pair(name: str, spec: dict, profile: dict) -> tuple[dict, list[dict]]:
    """One model trained on the same examples padded and packed, at each batch size: (evidence, rows)."""
    task = spec["task"]
    data = load_task_data(task, max_files=profile["max_files"])
    tokenizer = trained_tokenizer(task, data["train"], profile["vocab_size"])
    config_path, _ = resolve_model(name)
    config = fresh_config(RunSpec(task=task, model=name), load_config(config_path), tokenizer, None)
    torch.manual_seed(0)
    model = getattr(transformers, TASKS[task].head.auto_class).from_config(config).train()
    everything = training_examples(task, tokenizer, data, spec["max_length"])
    # drawn in a shuffled order, as Trainer draws them
    examples = [everything[i] for i in random.Random(0).sample(range(len(everything)), spec["examples"])]
    evidence = {
        "task": task,
        "shape": spec,
        "attn_implementation": model.config._attn_implementation,
        "examples_available": len(everything),
        "batches": {},
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = []
    for batch in spec["batches"]:
        padded, packed = batches(task, tokenizer, examples, batch, spec["max_length"])
        tokens = token_evidence(examples, padded, packed)
        evidence["batches"][batch] = {"tokens": tokens}
        work = {"padded": steps_work(model, padded, optimizer), "packed": steps_work(model, packed, optimizer)}
        timed = alternating_medians(work, profile["warmup"], profile["repeats"], CPU)
        throughput = {variant: tokens["real_tokens"] / timed[variant]["median_s"] for variant in work}
        rows.append(
            {
                "technique": "packing",
                "pair": name,
                "variant": f"{task}, batch {batch} x max_length {spec['max_length']}",
                "measure": "real train tokens/s",
                "unit": "tokens/s",
                "reference": throughput["padded"],
                "ours": throughput["packed"],
                "speedup": throughput["packed"] / throughput["padded"],
                "seconds": {"reference": timed["padded"], "ours": timed["packed"]},
            }
        )
    return evidence, rows


def measure(profile_name: str) -> tuple[dict, list[dict]]:
    """Every pair of the profile: ({pair: evidence}, rows)."""
    profile = PROFILES[profile_name]
    evidence, rows = {}, []
    for name, spec in profile["pairs"].items():
        evidence[name], pair_rows = packing_pair(name, spec, profile)
        rows += pair_rows
    return evidence, rows
