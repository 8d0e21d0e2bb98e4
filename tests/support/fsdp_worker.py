"""The multi-process half of tests/test_fsdp.py: run by it as

    torchrun --standalone --nproc_per_node 2 tests/support/fsdp_worker.py OUT_DIR

FSDP2 over gloo on the CPU, driven three ways, each compared with one process training on the same global batch:

- `trainer`: transformers shards the model at load time (`from_pretrained(..., distributed_config=
  DistributedConfig(fsdp_size=2))`, one `fully_shard` per entry of the config's `base_model_fsdp_plan`, then the
  root) and `Trainer` trains it (Trainer leaves such a model to FSDP instead of wrapping it in DDP). Trainer refuses
  to checkpoint such a model's optimizer, so resuming is the next scenario's job.
- `torch`: plain torch, `fully_shard` on every `TfmBlock`, then on the root; a sharded checkpoint of the model and
  optimizer (torch.distributed.checkpoint) saved after RESUME_AT steps, loaded into a fresh sharded model and
  optimizer, which then trains the remaining steps.
- `accelerate`: what Trainer's own `fsdp` / `fsdp_config` arguments (and so `accelerate launch` with
  configs/accelerate/fsdp.yaml, which sets the same plugin) make of a CPU run.

The model is a tiny MoE decoder with auxiliary-loss-free balancing, so the trajectories also check that the expert
counts behind the router biases are summed over the data-parallel ranks: one process counts the whole global batch.
Each rank gets deliberately different data (rank 0 the low half of the vocabulary, rank 1 the high half); `bias`
trains BIAS_STEPS steps with and without the all-reduce and compares the two ranks' biases.
Rank 0 writes OUT_DIR/results.json; an exception on any rank fails the launch.
"""

import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import transformers
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

import hf_tfm.model.modeling_tfm_stack
from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.model.modeling_tfm_stack import TfmBlock
from hf_tfm.training.callbacks import RouterBiasCallback

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

STEPS, RESUME_AT, BIAS_STEPS = 20, 10, 10
PER_RANK, SEQUENCE, VOCAB = 2, 16, 96
LEARNING_RATE, MAX_GRAD_NORM = 1e-2, 1.0
# conftest's tiny decoder, sparse: every layer MoE, balanced by bias alone
OVERRIDES = dict(
    vocab_size=VOCAB,
    # a key bias's gradient is zero up to rounding (softmax ignores a shift shared by all keys), and Adam turns
    # rounding noise into steps of the learning rate's size: it would differ between any two summation orders
    attention_bias=False,
    num_experts=4,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.0,  # the aux loss of a half batch is not half the aux loss of the whole: balance by bias
    router_bias_update_rate=0.05,
)


def rank_rows(step: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s rows of step `step`'s global batch: rank 0 draws from the low half of the vocabulary, rank 1
    from the high half, so that their experts' loads differ."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    low, high = (3, VOCAB // 2) if rank == 0 else (VOCAB // 2, VOCAB)
    return torch.randint(low, high, (PER_RANK, SEQUENCE), generator=generator)


def global_batch(step: int, world: int) -> torch.Tensor:
    return torch.cat([rank_rows(step, rank) for rank in range(world)])


def optimizer_for(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)  # Trainer's adamw_torch


def train_step(model, optimizer, input_ids: torch.Tensor) -> torch.Tensor:
    """One step as Trainer takes it: mean token loss, clipped gradient, AdamW, then the router bias update."""
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad()
    model.update_router_biases()
    return loss.detach()


def biases(model) -> torch.Tensor:
    return torch.stack([buffer for name, buffer in model.named_buffers() if name.endswith("expert_bias")])


def sharding(model) -> dict:
    """Which modules are FSDP units, and how the parameters are held (placements, this rank's share)."""
    parameters = dict(model.named_parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in parameters.values())
    return {
        "units": [name for name, module in model.named_modules() if isinstance(module, FSDPModule)],
        "placements": sorted({str(getattr(p, "placements", "not a DTensor")) for p in parameters.values()}),
        "local_share": local / sum(p.numel() for p in parameters.values()),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
    }


@contextlib.contextmanager
def local_expert_counts():
    """Router bias updates from this process's own expert counts, as if it trained alone."""
    summed = hf_tfm.model.capabilities.sum_over_data_parallel_ranks
    hf_tfm.model.capabilities.sum_over_data_parallel_ranks = lambda model, counts: counts
    try:
        yield
    finally:
        hf_tfm.model.capabilities.sum_over_data_parallel_ranks = summed


def reference(folder: Path) -> dict:
    """One process, the whole global batch at every step (computed on every rank, each alone)."""
    model = AutoModelForCausalLM.from_pretrained(folder).train()
    optimizer = optimizer_for(model)
    world = dist.get_world_size()
    with local_expert_counts():
        losses = [train_step(model, optimizer, global_batch(step, world)).item() for step in range(STEPS)]
    return {"losses": losses, "state": full_state(model)}


def shard_per_block(model):
    """FSDP2 as a user writes it in plain torch: one unit per TfmBlock (`_no_split_modules`), then the root, which
    takes the embeddings, the tied LM head and the final norm."""
    for module in model.modules():
        if isinstance(module, TfmBlock):
            fully_shard(module)
    fully_shard(model)
    return model


def torch_scenario(folder: Path, out: Path, expected: dict) -> dict:
    rank = dist.get_rank()
    model = shard_per_block(AutoModelForCausalLM.from_pretrained(folder)).train()
    result = {"sharding": sharding(model)}
    optimizer = optimizer_for(model)
    checkpoint = out / "sharded-checkpoint"
    losses = []
    for step in range(STEPS):
        if step == RESUME_AT:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint)
        losses.append(mean_over_ranks(train_step(model, optimizer, rank_rows(step, rank))))
    result["losses"] = losses
    uninterrupted = full_state(model)
    result["final_difference"] = largest_difference(uninterrupted, expected["state"])
    dist.barrier()
    result["checkpoint_files"] = sorted(path.name for path in checkpoint.iterdir())

    resumed = shard_per_block(AutoModelForCausalLM.from_pretrained(folder)).train()
    resumed_optimizer = optimizer_for(resumed)
    model_state, optimizer_state = get_state_dict(resumed, resumed_optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(resumed, resumed_optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    result["resumed_losses"] = [
        mean_over_ranks(train_step(resumed, resumed_optimizer, rank_rows(step, rank)))
        for step in range(RESUME_AT, STEPS)
    ]
    result["resumed_final_difference"] = largest_difference(full_state(resumed), uninterrupted)
    return result


def trainer_arguments_for(out: Path, **fields) -> TrainingArguments:
    """The torch scenario's steps, as Trainer takes them."""
    return trainer_arguments(
        out, per_device_train_batch_size=PER_RANK, max_steps=STEPS, learning_rate=LEARNING_RATE, **fields
    )


def trainer_scenario(folder: Path, out: Path, expected: dict) -> dict:
    if not hasattr(transformers.PreTrainedModel, "is_distributed_loading_by_transformers"):
        return {"skipped": f"transformers {transformers.__version__}'s Trainer wraps a load-time-sharded model in DDP"}
    from transformers.distributed import DistributedConfig

    rank, world = dist.get_rank(), dist.get_world_size()
    config = DistributedConfig(fsdp_size=world)
    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=config)
    result = {"sharding": sharding(model)}
    # the global batches in order: a sequential sampler and accelerate's sharding hand batch 2k + r to rank r
    rows = [{"input_ids": row, "labels": row} for step in range(STEPS) for row in global_batch(step, world)]
    recorder = RecordInputs(model)
    trainer = Trainer(
        model=model, args=trainer_arguments_for(out / "trainer"), train_dataset=rows, callbacks=[RouterBiasCallback()]
    )
    result["is_distributed_loading_by_transformers"] = trainer.is_distributed_loading_by_transformers
    trainer.train()
    result["losses"] = logged_losses(trainer)
    result["saw_own_rows"] = len(recorder.batches) == STEPS and all(
        torch.equal(seen["input_ids"], rank_rows(step, rank)) for step, seen in enumerate(recorder.batches)
    )
    result["final_difference"] = largest_difference(full_state(model), expected["state"])
    saved = out / "trainer-final"
    trainer.save_model(str(saved))  # every rank takes part: the weights are gathered to rank 0
    dist.barrier()
    if rank == 0:
        result["saved_difference"] = largest_difference(
            full_state(AutoModelForCausalLM.from_pretrained(saved)), expected["state"]
        )
    return result


def bias_scenario(folder: Path) -> dict:
    """BIAS_STEPS steps of the torch scenario's training with and without the expert counts' all-reduce; each
    rank's biases gathered, so rank 0 can compare them."""
    rank = dist.get_rank()
    result = {}
    for name, counts in (("all_reduced", contextlib.nullcontext()), ("local", local_expert_counts())):
        model = shard_per_block(AutoModelForCausalLM.from_pretrained(folder)).train()
        optimizer = optimizer_for(model)
        with counts:
            for step in range(BIAS_STEPS):
                train_step(model, optimizer, rank_rows(step, rank))
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, biases(model).tolist())
        result[name] = gathered
    return result


def accelerate_scenario(folder: Path, out: Path) -> dict:
    """Trainer's own FSDP arguments on the CPU (the launcher's fsdp.yaml sets the same plugin through the
    environment): accelerate builds the FSDP plugin, then keeps it only for GPU-like distributed types."""
    arguments = trainer_arguments_for(
        out / "trainer-fsdp-arguments",
        fsdp="full_shard",
        fsdp_config={"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["TfmBlock"]},
    )
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(folder), args=arguments)
    return {"distributed_type": str(trainer.accelerator.distributed_type), "is_fsdp_enabled": trainer.is_fsdp_enabled}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    folder = out / "model"
    if rank == 0:
        torch.manual_seed(0)
        TfmDecoderForCausalLM(tiny_config(**OVERRIDES)).save_pretrained(folder)
    dist.barrier()
    seconds = {}
    began = time.perf_counter()
    expected = reference(folder)
    seconds["reference"] = time.perf_counter() - began
    results = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "world_size": dist.get_world_size(),
        "reference_losses": expected["losses"],
        "seconds": seconds,
    }
    for name, scenario in (
        ("torch", lambda: torch_scenario(folder, out, expected)),
        ("trainer", lambda: trainer_scenario(folder, out, expected)),
        ("bias", lambda: bias_scenario(folder)),
        ("accelerate", lambda: accelerate_scenario(folder, out)),
    ):
        began = time.perf_counter()
        results[name] = scenario()
        seconds[name] = time.perf_counter() - began
    write_results(out, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(Path(sys.argv[1]))
