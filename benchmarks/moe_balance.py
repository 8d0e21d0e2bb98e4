"""Does the load-balancing loss keep experts balanced? Train a tiny MoE decoder (8 experts, top-2) on the embedded
corpus with `router_aux_loss_coef` on and at 0, and report each layer's busiest-expert load (1.0 = uniform).

    python benchmarks/moe_balance.py      # prints both runs, writes benchmarks/results/moe-balance-<date>.json
"""

import datetime
import json
from pathlib import Path

import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

from hf_tfm import TfmDecoderConfig, TfmDecoderForCausalLM
from hf_tfm.training.callbacks import RouterStatsCallback
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm.training.tasks import lm_blocks
from hf_tfm.training.tokenizers import train_byte_level_bpe


def tiny_moe_config(tokenizer, aux_coef: float, **fields) -> TfmDecoderConfig:
    """The experiment's model: a 2-layer decoder of hidden size 32, every layer 8 experts, top-2."""
    return TfmDecoderConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        ffn_type="glu",
        hidden_act="silu",
        norm_type="rmsnorm",
        position_embedding_type="rope",
        mlp_bias=False,
        attention_bias=False,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        router_aux_loss_coef=aux_coef,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )


def final_max_load(
    aux_coef: float, steps: int = 300, max_files: int = 120, output_dir: str = "runs/moe-balance", seed: int = 0
):
    """Train and return {layer: max_load over the last logging window} plus the stats callback (for heat maps)."""
    torch.manual_seed(seed)
    corpus = stdlib_docstrings(max_files=max_files)
    tokenizer = train_byte_level_bpe(corpus["train"], vocab_size=512)
    config = tiny_moe_config(tokenizer, aux_coef)
    stats = RouterStatsCallback()
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=steps // 10,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        seed=seed,
    )
    Trainer(
        model=TfmDecoderForCausalLM(config),
        args=args,
        train_dataset=lm_blocks(tokenizer, corpus["train"], 32),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[stats],
    ).train()
    last = stats.history[-1]["load"]
    return {name: float(row.max() * row.numel()) for name, row in zip(stats.layer_names, last)}, stats


def main() -> None:
    results = {}
    for coef in (0.05, 0.0):
        loads, stats = final_max_load(coef, output_dir=f"runs/moe-balance-{coef}")
        results[f"router_aux_loss_coef={coef}"] = loads
        stats.save_heatmap(f"runs/moe-balance-{coef}/expert_load.png")
        print(
            f"aux coef {coef}: busiest expert / uniform per layer: {loads}  "
            f"(heat map runs/moe-balance-{coef}/expert_load.png)"
        )
    today = datetime.date.today().isoformat()
    out = Path(__file__).parent / "results" / f"moe-balance-{today}.json"
    out.write_text(
        json.dumps({"command": "python benchmarks/moe_balance.py", "date": today, "max_load": results}, indent=2)
        + "\n"
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
