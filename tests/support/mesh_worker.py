"""The multi-process half of tests/test_two_dimensional.py: run by it as

    torchrun --standalone --nproc_per_node 4 tests/support/mesh_worker.py OUT_DIR

2-D parallelism over gloo: `from_pretrained(path, distributed_config=DistributedConfig(fsdp_size=2, tp_size=2))`
lays the 4 ranks out as a 2 x 2 mesh (transformers' ("fsdp", "tp") dimensions, rank = 2 * fsdp + tp): each
fully-sharded data-parallel group of 2 holds tensor-parallel slices. The two tensor-parallel ranks of a group read
the same rows; the two groups read different rows (the low and the high half of the vocabulary). Every rank also
trains the same model alone on the global batch. Two models: a GQA decoder, and an MoE decoder (shared expert)
whose load-balancing loss and z-loss sum the expert loads over the data-parallel ranks
(`router_aux_loss_scope="global"`; the tensor-parallel ranks share their rows and are not summed over).

A plain torch loop (mean token loss, clipped gradients, AdamW) of STEPS steps on each model records the losses, the
first step's gradients and the final parameters, gathered, against the one process. It clips as Trainer does:
`clip_grad_norm_` cannot span the two meshes the parameters live on (the 2-D one, and the fsdp-only one of the
layers tensor parallelism leaves whole). Trainer itself refuses a tensor-parallel layout on the CPU (accelerate
takes one only on GPU distributed types): `trainer_refusal` records its message.

Rank 0 writes OUT_DIR/results.json.
"""

import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from hf_tfm import TfmDecoderForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, whose conftest holds the tiny configs
from conftest import tiny_config  # noqa: E402

from support.ranks import full, largest_difference, write_results  # noqa: E402

STEPS, PER_GROUP, SEQUENCE, VOCAB = 4, 2, 12, 96
LEARNING_RATE, MAX_GRAD_NORM = 1e-2, 1.0
MODELS = {
    "gqa_decoder": dict(num_key_value_heads=2),
    "moe_decoder": dict(
        num_experts=4,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=32,
        router_aux_loss_coef=0.1,
        router_z_loss_coef=0.01,
        router_aux_loss_scope="global",
    ),
}
COMMON = dict(vocab_size=VOCAB, attention_bias=False, tie_word_embeddings=False)


def group_rows(step: int, group: int) -> torch.Tensor:
    """Data-parallel group `group`'s rows of step `step`: its own half of the vocabulary."""
    generator = torch.Generator().manual_seed(1000 * step + group)
    low, high = (3, VOCAB // 2) if group == 0 else (VOCAB // 2, VOCAB)
    return torch.randint(low, high, (PER_GROUP, SEQUENCE), generator=generator)


def clip_per_mesh(parameters, max_norm: float) -> float:
    """Clip the gradients to `max_norm` as Trainer does when they live on several device meshes, which
    `clip_grad_norm_` cannot span: each mesh's norm, gathered, then one total norm."""
    by_mesh = defaultdict(list)
    for parameter in parameters:
        by_mesh[parameter.grad.device_mesh if isinstance(parameter.grad, DTensor) else None].append(parameter)
    norms = [full(get_total_norm([parameter.grad for parameter in group])) for group in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in by_mesh.values():
        clip_grads_with_norm_(group, max_norm, total)
    return total.item()


def train(model, rows_of_step) -> dict:
    """STEPS steps; the losses (averaged over every rank: each data-parallel group holds as many tokens), the first
    step's gradients and the final parameters, gathered."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses, norms, gradients = [], [], None
    for step in range(STEPS):
        rows = rows_of_step(step)
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        if gradients is None:
            gradients = {name: full(parameter.grad) for name, parameter in model.named_parameters()}
        norms.append(clip_per_mesh(model.parameters(), MAX_GRAD_NORM))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().clone())
    for loss in losses:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    parameters = {name: full(parameter) for name, parameter in model.named_parameters()}
    losses = [loss.item() for loss in losses]
    return {"losses": losses, "gradient_norms": norms, "gradients": gradients, "parameters": parameters}


def placements(model) -> list[str]:
    return sorted({str(getattr(parameter, "placements", "not a DTensor")) for parameter in model.parameters()})


def scenario(folder: Path) -> dict:
    from transformers.distributed import DistributedConfig

    one_process = train(
        AutoModelForCausalLM.from_pretrained(folder).train(),
        lambda step: torch.cat([group_rows(step, group) for group in range(2)]),
    )
    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(fsdp_size=2, tp_size=2))
    mesh = model._mesh_manager.get_mesh(("fsdp", "tp"))
    group = mesh.get_local_rank("fsdp")
    sharded = train(model.train(), lambda step: group_rows(step, group))
    return {
        "mesh": {"shape": list(mesh.shape), "dims": list(mesh.mesh_dim_names)},
        "placements": placements(model),
        "losses": sharded["losses"],
        "reference_losses": one_process["losses"],
        "gradient_norms": sharded["gradient_norms"],
        "reference_gradient_norms": one_process["gradient_norms"],
        "gradients": largest_difference(sharded["gradients"], one_process["gradients"]),
        "parameters": largest_difference(sharded["parameters"], one_process["parameters"]),
    }


def trainer_refusal(folder: Path, out: Path) -> str:
    """What Trainer makes of the 2 x 2 mesh on the CPU: accelerate accepts a tensor-parallel layout only for GPU
    distributed types, so Trainer refuses to start; the message is recorded."""
    from transformers.distributed import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(fsdp_size=2, tp_size=2))
    arguments = TrainingArguments(output_dir=str(out / "trainer"), use_cpu=True, report_to=[], max_steps=1)
    try:
        Trainer(model=model, args=arguments, train_dataset=[{"input_ids": torch.ones(4, dtype=torch.long)}] * 8)
    except ValueError as error:
        return str(error)
    return "accepted"


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {"world_size": dist.get_world_size(), "transformers": transformers.__version__}
    for name, fields in MODELS.items():
        folder = out / name
        if dist.get_rank() == 0:
            torch.manual_seed(0)
            TfmDecoderForCausalLM(tiny_config(**COMMON, **fields)).save_pretrained(folder)
        dist.barrier()
        results[name] = scenario(folder)
    results["trainer_refusal"] = trainer_refusal(folder, out)
    write_results(out, results)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(Path(sys.argv[1]))
