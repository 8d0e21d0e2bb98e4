"""The multi-process half of tests/test_global_balancing.py: run by it as

    torchrun --standalone --nproc_per_node 2 tests/support/balancing_worker.py OUT_DIR

A tiny MoE decoder trained with the load-balancing loss and the z-loss on, each rank fed deliberately different
tokens (rank 0 the low half of the vocabulary, rank 1 the high half, so their experts' loads differ), compared with
one process training on the same global batch:

- `fsdp`, `ddp`: plain torch loops (`fully_shard` per block then the root; `DistributedDataParallel`), STEPS steps of
  a mean token loss, each rank as many real tokens, padded in different places; `router_aux_loss_scope` "global" and
  "local".
- `trainer`: Trainer (DDP on the CPU, `average_tokens_across_devices`, 2 micro-batches accumulated per step), rows
  of unequal padding, so each rank's micro-batches hold different numbers of tokens; the one-process reference takes
  the same steps as Trainer takes them in one process (`num_items_in_batch` over the accumulated batch). Also the
  local scope with every rank fed the same rows: the router losses counted once, not once per rank.

Rank 0 writes OUT_DIR/results.json; an exception on any rank fails the launch.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, Trainer

from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.model.modeling_tfm_stack import TfmBlock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, whose conftest holds the tiny configs
from conftest import tiny_config  # noqa: E402

from support.ranks import (  # noqa: E402
    RecordInputs,
    full_state,
    largest_difference,
    logged_losses,
    mean_over_ranks,
    trainer_arguments,
    write_results,
)

STEPS, ACCUMULATION = 6, 2
PER_RANK, SEQUENCE, VOCAB, PADDED = 2, 16, 96, 5
LEARNING_RATE, MAX_GRAD_NORM = 1e-2, 1.0
OVERRIDES = dict(
    vocab_size=VOCAB,
    attention_bias=False,  # a key bias's gradient is rounding noise, which Adam turns into steps of the lr's size
    num_experts=4,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.1,
    router_z_loss_coef=0.01,
)
SCOPES = ("global", "local")


def rank_batch(step: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s rows of step `step`: its own half of the vocabulary, PADDED pad tokens at the end of one row
    (row 0 on rank 0, row 1 on rank 1), so both ranks hold as many real tokens."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    low, high = (3, VOCAB // 2) if rank == 0 else (VOCAB // 2, VOCAB)
    input_ids = torch.randint(low, high, (PER_RANK, SEQUENCE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[rank % PER_RANK, -PADDED:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def joined(batches: list[dict]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([batch[key] for batch in batches]) for key in batches[0]}


def optimizer_for(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)  # Trainer's adamw_torch


def train_step(model, optimizer, batch: dict) -> torch.Tensor:
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def load(folder: Path, scope: str):
    return AutoModelForCausalLM.from_pretrained(folder, router_aux_loss_scope=scope).train()


def one_process(folder: Path, scope: str) -> dict:
    """The whole global batch at every step, in this process alone."""
    model = load(folder, scope)
    optimizer = optimizer_for(model)
    world = dist.get_world_size()
    losses = [
        train_step(model, optimizer, joined([rank_batch(step, rank) for rank in range(world)])).item()
        for step in range(STEPS)
    ]
    return {"losses": losses, "state": full_state(model)}


def shard_per_block(model):
    for module in model.modules():
        if isinstance(module, TfmBlock):
            fully_shard(module)
    return fully_shard(model)


def torch_scenario(folder: Path, wrap) -> dict:
    """Each scope: this rank's half of every global batch through `wrap(model)`, against one process."""
    rank = dist.get_rank()
    result = {}
    for scope in SCOPES:
        expected = one_process(folder, scope)
        model = load(folder, scope)
        wrapped = wrap(model)
        optimizer = optimizer_for(wrapped)
        losses = [mean_over_ranks(train_step(wrapped, optimizer, rank_batch(step, rank))) for step in range(STEPS)]
        result[scope] = {
            "losses": losses,
            "reference_losses": expected["losses"],
            "final_difference": largest_difference(full_state(model), expected["state"]),
        }
    return result


def trainer_rows(world: int, same_on_every_rank: bool) -> list[dict]:
    """The dataset, in the order a sequential sampler hands it out (rows `PER_RANK * (world * k + r)` on to rank r):
    PADDED pads at the end of three rows in five, so the ranks' micro-batches hold different numbers of real tokens;
    or, `same_on_every_rank`, every rank's micro-batch the same rows, where the local and global losses agree."""
    rows = []
    for index in range(STEPS * ACCUMULATION * PER_RANK * world):
        source = index // (PER_RANK * world) * PER_RANK + index % PER_RANK if same_on_every_rank else index
        input_ids = rank_batch(source, source // PER_RANK % world)["input_ids"][0]
        attention_mask = torch.ones(SEQUENCE, dtype=torch.long)
        if source % 5 in (0, 2, 3):
            attention_mask[-PADDED:] = 0
        input_ids = input_ids.masked_fill(attention_mask == 0, 0)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        rows.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return rows


def trainer_reference(folder: Path, scope: str, micro_batches: list[dict]) -> dict:
    """Trainer's steps in one process: every micro-batch's loss over the tokens of its whole accumulated batch, the
    gradients summed, then one clipped AdamW step."""
    model = load(folder, scope)
    optimizer = optimizer_for(model)
    losses = []
    for step in range(STEPS):
        batches = micro_batches[step * ACCUMULATION : (step + 1) * ACCUMULATION]
        num_items = sum((batch["labels"][:, 1:] != -100).sum() for batch in batches)
        total = 0.0
        for batch in batches:
            loss = model(**batch, num_items_in_batch=num_items).loss
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return {"losses": losses, "state": full_state(model)}


def trainer_scenario(folder: Path, out: Path) -> dict:
    world = dist.get_world_size()
    result = {}
    cases = {"global": ("global", False), "local": ("local", False), "local_same_rows": ("local", True)}
    for case, (scope, same_on_every_rank) in cases.items():
        model = load(folder, scope)
        recorder = RecordInputs(model, keys=("input_ids", "attention_mask", "labels"))
        arguments = trainer_arguments(
            out / f"trainer-{case}",
            per_device_train_batch_size=PER_RANK,
            gradient_accumulation_steps=ACCUMULATION,
            max_steps=STEPS,
            learning_rate=LEARNING_RATE,
        )
        trainer = Trainer(model=model, args=arguments, train_dataset=trainer_rows(world, same_on_every_rank))
        trainer.train()
        gathered = [None] * world
        dist.all_gather_object(gathered, recorder.batches)
        # micro-batch m of the global batch: every rank's m-th batch
        micro_batches = [joined([batches[m] for batches in gathered]) for m in range(len(recorder.batches))]
        expected = trainer_reference(folder, scope, micro_batches)
        tokens = [[int((batch["labels"][:, 1:] != -100).sum()) for batch in batches] for batches in gathered]
        result[case] = {
            "distributed_type": str(trainer.accelerator.distributed_type),
            "losses": logged_losses(trainer),
            "reference_losses": expected["losses"],
            "final_difference": largest_difference(full_state(model), expected["state"]),
            "scored_tokens_per_rank": tokens,
        }
    return result


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    folder = out / "model"
    if rank == 0:
        torch.manual_seed(0)
        TfmDecoderForCausalLM(tiny_config(**OVERRIDES)).save_pretrained(folder)
    dist.barrier()
    results = {
        "world_size": dist.get_world_size(),
        "fsdp": torch_scenario(folder, shard_per_block),
        "ddp": torch_scenario(folder, DistributedDataParallel),
        "trainer": trainer_scenario(folder, out),
    }
    write_results(out, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(Path(sys.argv[1]))
