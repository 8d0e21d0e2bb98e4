"""The multi-process half of tests/test_deepspeed.py: run by it as

    DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node 2 tests/support/deepspeed_worker.py OUT_DIR

DeepSpeed's engine on its CPU accelerator over gloo, driven as a user's own loop drives it (`deepspeed.initialize`,
`engine.backward`, `engine.step`, a torch AdamW, gradients clipped at 1.0), each rank fed different rows (the low and
the high half of the vocabulary). Under ZeRO-3 the models load through `HfDeepSpeedConfig` + `from_pretrained`,
which partitions every weight as it is created (`deepspeed.zero.Init`). Checked, ZeRO-2 and ZeRO-3:

- `dense`: a Llama-converted model trains as one process does on the global batch, and as `LlamaForCausalLM` does
  under the same engine;
- `moe_local`: a Mixtral-converted model as `MixtralForCausalLM` (router losses on) does under the same engine
  (each rank balances its own tokens, as the reference does);
- `moe_global`: the same model with `router_aux_loss_scope="global"` as one process does on the global batch;
- `skipped_experts` (ZeRO-3): 8 experts, rank 0 two tokens a step (at most 4 experts reached per layer), rank 1 a
  full batch; finishes because hf_tfm's MoE block is a ZeRO-3 leaf (`_z3_leaf`);
- `saved` (ZeRO-3): `engine.save_16bit_model` gathers the trained weights; `from_pretrained` on them equals the
  engine's own weights, gathered;
- `resized` (ZeRO-3): `resize_token_embeddings` on a partitioned model keeps every old row, and the engine trains it.
- `trainer`: Trainer with `TrainingArguments(deepspeed=<ZeRO-3 config>)` (accelerate's DeepSpeed plugin underneath)
  under this launch, the model loaded after the arguments (so partitioned at creation, as transformers documents):
  its logged losses against one process on the global batch.

Rank 0 writes OUT_DIR/results.json.
"""

import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
import transformers
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig

from hf_tfm.convert import to_tfm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest and the families' tiny models
from support.families import tiny_reference  # noqa: E402
from support.ranks import logged_losses, mean_over_ranks, trainer_arguments, write_results  # noqa: E402

STEPS, PER_RANK, SEQUENCE, VOCAB, LEARNING_RATE, MAX_GRAD_NORM = 4, 2, 12, 97, 1e-2, 1.0


def ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": PER_RANK,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
        "zero_allow_untested_optimizer": True,  # a torch AdamW, as one process uses
        "gradient_clipping": MAX_GRAD_NORM,  # DeepSpeed 0.19 clips at 1.0 unless told; Trainer sets max_grad_norm
        "steps_per_print": 10**6,
        "wall_clock_breakdown": False,
    }


def rank_rows(step: int, rank: int, rows: int = PER_RANK, length: int = SEQUENCE) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    low, high = (3, VOCAB // 2) if rank == 0 else (VOCAB // 2, VOCAB)
    return torch.randint(low, high, (rows, length), generator=generator)


def global_rows(step: int) -> torch.Tensor:
    return torch.cat([rank_rows(step, rank) for rank in range(dist.get_world_size())])


ALIVE = {}  # transformers reads the HfDeepSpeedConfig through a weak reference: it must outlive the model's use


def load(folder: Path, stage: int, **fields):
    """from_pretrained as Trainer's DeepSpeed integration loads: under ZeRO-3 with an HfDeepSpeedConfig alive, which
    makes transformers partition every weight at creation (zero.Init) and gather them where it reads them whole
    (`resize_token_embeddings`)."""
    ALIVE["config"] = HfDeepSpeedConfig(ds_config(stage)) if stage == 3 else None
    model = AutoModelForCausalLM.from_pretrained(folder, **fields)
    return model, transformers.integrations.is_deepspeed_zero3_enabled()


def engine_for(model, stage: int):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(stage))
    return engine


def train_engine(engine, rows_of_step) -> list[float]:
    losses = []
    for step in range(STEPS):
        rows = rows_of_step(step)
        loss = engine(input_ids=rows, labels=rows).loss
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(loss))
    return losses


def train_alone(folder: Path, **fields) -> list[float]:
    """One process, the global batch at every step (each rank computes it alone, outside DeepSpeed)."""
    ALIVE.clear()  # no ZeRO-3 partitioning at load
    model = AutoModelForCausalLM.from_pretrained(folder, **fields).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        rows = global_rows(step)
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def under_engine(folder: Path, stage: int, **fields) -> dict:
    model, zero3 = load(folder, stage, **fields)
    engine = engine_for(model.train(), stage)
    return {"losses": train_engine(engine, lambda step: rank_rows(step, dist.get_rank())), "zero3_init": zero3}


def skipped_experts(folder: Path) -> dict:
    """Rank 0's two tokens reach at most 4 of each layer's 8 experts; rank 1's 24 reach the rest."""
    model, _ = load(folder, 3, experts_implementation="eager")
    engine = engine_for(model.train(), 3)
    rank = dist.get_rank()

    def rows(step):
        return rank_rows(step, rank, rows=1, length=2) if rank == 0 else rank_rows(step, rank)

    reached = []
    handles = [
        module.register_forward_hook(lambda module, args, output: reached.append(output[2].unique().numel()))
        for name, module in model.named_modules()
        if name.endswith("mlp.router")
    ]
    losses = train_engine(engine, rows)
    for handle in handles:
        handle.remove()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, max(reached))
    leaves = [name for name, module in model.named_modules() if deepspeed.utils.z3_leaf_module(module)]
    return {"losses": losses, "most_experts_reached_per_rank": gathered, "leaf_modules": leaves}


def saved_and_resized(folder: Path, out: Path) -> dict:
    """Train under ZeRO-3, gather the weights with save_16bit_model, reload them; then resize a partitioned model."""
    model, _ = load(folder, 3)
    engine = engine_for(model.train(), 3)
    train_engine(engine, lambda step: rank_rows(step, dist.get_rank()))
    saved = out / "zero3-16bit"
    engine.save_16bit_model(str(saved), "pytorch_model.bin")
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        trained = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    result = {}
    if dist.get_rank() == 0:
        ALIVE.clear()
        model.config.save_pretrained(saved)
        reloaded = dict(AutoModelForCausalLM.from_pretrained(saved).named_parameters())
        result["saved_difference"] = max(
            (reloaded[name] - value).abs().max().item() for name, value in trained.items()
        )
        result["saved_parameters"] = sorted(trained) == sorted(reloaded)
    dist.barrier()

    model, _ = load(folder, 3)  # on every rank, ZeRO-3 again
    with deepspeed.zero.GatheredParameters([model.get_input_embeddings().weight]):
        before = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(VOCAB + 7)
    with deepspeed.zero.GatheredParameters([model.get_input_embeddings().weight]):
        after = model.get_input_embeddings().weight.detach().clone()
    result["resized_shape"] = list(after.shape)
    result["old_rows_kept"] = torch.equal(after[:VOCAB], before)
    result["resized_vocab_size"] = model.config.vocab_size
    engine = engine_for(model.train(), 3)
    rows = torch.full((PER_RANK, SEQUENCE), VOCAB + 3)  # a new token
    loss = engine(input_ids=rows, labels=rows).loss
    engine.backward(loss)
    engine.step()
    result["resized_loss_finite"] = bool(torch.isfinite(loss))
    return result


def trainer_on_the_cpu(folder: Path, out: Path) -> dict:
    """Trainer with a ZeRO-3 configuration under this 2-process launch: the processes accelerate counts, whether the
    model was partitioned at load, and the logged losses against one process (computed first: the arguments keep
    ZeRO-3 on for every later load)."""
    from transformers import Trainer

    one_process = train_alone(folder)
    arguments = trainer_arguments(
        out / "trainer",
        deepspeed=ds_config(3),
        per_device_train_batch_size=PER_RANK,
        max_steps=STEPS,
        learning_rate=LEARNING_RATE,
    )
    model = AutoModelForCausalLM.from_pretrained(folder)
    rows = [{"input_ids": row, "labels": row} for step in range(STEPS) for row in global_rows(step)]
    trainer = Trainer(model=model, args=arguments, train_dataset=rows)
    trainer.train()
    return {
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "zero3_init": transformers.integrations.is_deepspeed_zero3_enabled(),
        "losses": logged_losses(trainer),
        "one_process": one_process,
    }


def main(out: Path) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    folders = {"dense": out / "llama", "moe": out / "mixtral", "eight_experts": out / "mixtral-8"}
    references = {"dense": out / "llama-reference", "moe": out / "mixtral-reference"}
    if rank == 0:
        for kind, family, fields in (("dense", "llama", {}), ("moe", "mixtral", {"output_router_logits": True})):
            reference = tiny_reference(family, **fields)  # Mixtral adds its router losses only with router logits
            reference.save_pretrained(references[kind])
            to_tfm(reference).save_pretrained(folders[kind])
        to_tfm(tiny_reference("mixtral", num_local_experts=8)).save_pretrained(folders["eight_experts"])
    dist.barrier()
    results = {
        "world_size": dist.get_world_size(),
        "versions": {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__},
    }
    for stage in (2, 3):
        results[f"zero{stage}"] = {
            "dense": {
                **under_engine(folders["dense"], stage),
                "one_process": train_alone(folders["dense"]),
                "reference_class": under_engine(references["dense"], stage)["losses"],
            },
            "moe_local": {
                **under_engine(folders["moe"], stage),
                "reference_class": under_engine(references["moe"], stage)["losses"],
            },
            "moe_global": {
                **under_engine(folders["moe"], stage, router_aux_loss_scope="global"),
                "one_process": train_alone(folders["moe"], router_aux_loss_scope="global"),
            },
        }
    results["skipped_experts"] = skipped_experts(folders["eight_experts"])
    results["zero3_saved_and_resized"] = saved_and_resized(folders["dense"], out)
    results["trainer"] = trainer_on_the_cpu(folders["dense"], out)
    write_results(out, results)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(Path(sys.argv[1]))
