"""Global-batch against per-rank MoE balancing at two processes: the tiny 8-expert top-2 decoder of moe_balance.py
trained by Trainer (DDP over gloo) on the embedded corpus with `router_aux_loss_scope` "local" and "global", the
same three seeds, data and steps; reported: validation loss, and the experts' load spread on the validation text
(each layer's busiest expert as a multiple of the uniform load, and the loads' coefficient of variation) and in each
rank's last training window.

    python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/moe_global_balance.py [--sampling S]

`--sampling sequential` (the default) hands each rank consecutive blocks of the corpus, a few modules' docstrings per
micro-batch: batches of one domain, the case global balancing is meant for; `random` shuffles. Writes
benchmarks/results/moe-global-balance-<sampling>-<date>.json from rank 0.
"""

import argparse
import datetime
import json
from pathlib import Path

import torch
import torch.distributed as dist
from moe_balance import tiny_moe_config
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.model.modeling_tfm_moe import TfmRouter
from hf_tfm.training.callbacks import RouterStatsCallback
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm.training.tasks import lm_blocks
from hf_tfm.training.tokenizers import train_byte_level_bpe

STEPS, PER_RANK, BLOCK, AUX_COEF, MAX_FILES, SEEDS = 300, 8, 32, 0.05, 120, (0, 1, 2)


@torch.no_grad()
def validation_loads(model, blocks) -> list[torch.Tensor]:
    """Each MoE layer's share of the top-k assignments over every validation token (evaluation mode: no collective)."""
    routers = [module for module in model.modules() if isinstance(module, TfmRouter)]
    counts = [torch.zeros(router.num_experts) for router in routers]

    def counter(index):
        def hook(module, args, output):  # returns None: the router's output stays as it is
            counts[index].add_(torch.bincount(output[2].flatten(), minlength=module.num_experts))

        return hook

    handles = [router.register_forward_hook(counter(index)) for index, router in enumerate(routers)]
    model.eval()
    for start in range(0, len(blocks), 64):
        model(input_ids=torch.tensor(blocks[start : start + 64]["input_ids"]))
    for handle in handles:
        handle.remove()
    return [count / count.sum() for count in counts]


def spread(load: torch.Tensor) -> dict[str, float]:
    return {"max_load": round(load.max().item() * load.numel(), 3), "cv": round((load.std() / load.mean()).item(), 3)}


def train(scope: str, sampling: str, seed: int, corpus: dict, tokenizer) -> dict:
    torch.manual_seed(seed)
    model = TfmDecoderForCausalLM(tiny_moe_config(tokenizer, AUX_COEF, router_aux_loss_scope=scope))
    stats = RouterStatsCallback()
    arguments = TrainingArguments(
        output_dir=f"runs/moe-global-balance-{scope}",
        max_steps=STEPS,
        per_device_train_batch_size=PER_RANK,
        per_device_eval_batch_size=64,
        learning_rate=3e-3,
        logging_steps=STEPS // 10,
        train_sampling_strategy=sampling,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        seed=seed,
    )
    validation = lm_blocks(tokenizer, corpus["validation"], BLOCK)
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=lm_blocks(tokenizer, corpus["train"], BLOCK),
        eval_dataset=validation,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[stats],
    )
    trained = trainer.train()
    evaluation = trainer.evaluate()
    window = [None] * dist.get_world_size()  # each rank's own last training window
    dist.all_gather_object(window, [spread(load) for load in stats.history[-1]["load"]])
    return {
        "validation_loss": round(evaluation["eval_loss"], 4),
        "validation_spread": dict(zip(stats.layer_names, map(spread, validation_loads(model, validation)))),
        "last_window_spread_per_rank": [dict(zip(stats.layer_names, layers)) for layers in window],
        "train_loss": round(trained.training_loss, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampling", choices=("sequential", "random"), default="sequential")
    sampling = parser.parse_args().sampling
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    corpus = stdlib_docstrings(max_files=MAX_FILES)
    tokenizer = train_byte_level_bpe(corpus["train"], vocab_size=512)
    results = {
        scope: [train(scope, sampling, seed, corpus, tokenizer) for seed in SEEDS] for scope in ("local", "global")
    }
    if dist.get_rank() == 0:
        today = datetime.date.today().isoformat()
        command = "python -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/moe_global_balance.py"
        record = {
            "command": f"{command} --sampling {sampling}",
            "date": today,
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
            "setup": dict(processes=dist.get_world_size(), steps=STEPS, per_rank_batch=PER_RANK, block=BLOCK,
                          router_aux_loss_coef=AUX_COEF, max_files=MAX_FILES, sampling=sampling, seeds=SEEDS),
            "results": results,
        }  # fmt: skip
        out = Path(__file__).parent / "results" / f"moe-global-balance-{sampling}-{today}.json"
        out.write_text(json.dumps(record, indent=2) + "\n")
        for scope, runs in results.items():
            losses = [run["validation_loss"] for run in runs]
            spreads = [layer["max_load"] for run in runs for layer in run["validation_spread"].values()]
            print(f"{scope}: validation loss {losses}, busiest expert / uniform {min(spreads)}-{max(spreads)}")
        print(f"written: {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
