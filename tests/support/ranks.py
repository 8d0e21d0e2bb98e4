"""What the multi-process workers (fsdp_worker, balancing_worker, mesh_worker, deepspeed_worker) share: the Trainer
arguments of a deterministic comparison with one process, the gathered state and its largest difference, the loss
averaged over ranks, and a recorder of the batches each rank trained on. Imported inside a launched worker."""

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback, TrainingArguments


def trainer_arguments(out: Path, **fields) -> TrainingArguments:
    """Trainer set up to take exactly the steps a one-process loop takes: a constant learning rate, torch's AdamW
    without weight decay, clipping at 1.0, batches in dataset order (with accelerate's sharding, batch `world * k + r`
    to rank r), a loss logged every step, nothing saved or reported. `fields` adds the run's own."""
    defaults = dict(
        output_dir=str(out),
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        train_sampling_strategy="sequential",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return TrainingArguments(**{**defaults, **fields})


def logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from every rank when it is sharded (a collective: every rank calls it)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def full_state(model) -> dict[str, torch.Tensor]:
    """Parameters and buffers, gathered where sharded."""
    return {name: full(tensor) for name, tensor in model.state_dict().items()}


def largest_difference(actual: dict, expected: dict) -> list:
    """[the largest absolute difference, the tensor it is in], over tensors named alike."""
    assert sorted(actual) == sorted(expected), sorted(set(actual) ^ set(expected))
    return max([(actual[name].double() - expected[name].double()).abs().max().item(), name] for name in expected)


def mean_over_ranks(loss: torch.Tensor) -> float:
    """The global batch's loss where every rank holds as many tokens: the mean of the ranks' mean losses."""
    loss = loss.detach().clone().float()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss.item()


class RecordInputs(TrainerCallback):
    """The inputs (`keys`) of every training forward on this rank: a forward pre-hook, since Trainer passes the batch
    as keyword arguments."""

    def __init__(self, model, keys=("input_ids",)):
        self.keys, self.batches = keys, []
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        if module.training:
            self.batches.append({key: kwargs[key].clone() for key in self.keys})


def write_results(out: Path, results: dict) -> None:
    """Rank 0 writes OUT/results.json; every rank waits for it."""
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
