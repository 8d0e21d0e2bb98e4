"""Causal-LM pre-training of an hf_tfm decoder with a plain `Trainer`; runs unchanged under `accelerate launch`.

    python examples/train_causal_lm.py --config configs/llama-tiny --max-steps 200
    python examples/train_causal_lm.py --config configs/llama-tiny --num-experts 8   # MoE: also writes expert_load.png
    accelerate launch examples/train_causal_lm.py --config configs/gpt2-124m
"""

import argparse

from transformers import AutoConfig, AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

import hf_tfm  # noqa: F401  (registers the tfm model types)
from hf_tfm.training.callbacks import RouterBiasCallback, RouterStatsCallback
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm.training.main_job import lm_blocks
from hf_tfm.training.tokenizers import train_byte_level_bpe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/llama-tiny", help="a preset folder or any tfm config.json folder")
    parser.add_argument("--output-dir", default="runs/causal-lm")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-experts", type=int, default=None, help="override the preset: MoE feed-forward layers")
    args = parser.parse_args()

    corpus = stdlib_docstrings()
    tokenizer = train_byte_level_bpe(corpus["train"], vocab_size=4096)
    config = AutoConfig.from_pretrained(
        args.config,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **({"num_experts": args.num_experts, "ffn_type": "glu"} if args.num_experts else {}),
    )
    model = AutoModelForCausalLM.from_config(config)
    router_stats = RouterStatsCallback()
    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=args.output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=1e-3,
            lr_scheduler_type="cosine",
            warmup_steps=args.max_steps // 20,
            logging_steps=max(1, args.max_steps // 20),
            report_to=[],
        ),
        train_dataset=lm_blocks(tokenizer, corpus["train"], args.block_size),
        eval_dataset=lm_blocks(tokenizer, corpus["validation"], args.block_size),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[router_stats, RouterBiasCallback()],  # both are no-ops for dense models
    )
    trainer.train()
    print(trainer.evaluate())
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    if router_stats.history:
        router_stats.save_heatmap(f"{args.output_dir}/expert_load.png")


if __name__ == "__main__":
    main()
