"""Causal-LM pre-training of an hf_tfm decoder with a plain `Trainer`; `accelerate launch` runs it unchanged.

The documents are tokenized with a byte-level BPE (trained on the train split unless --tokenizer is given), joined
with EOS and cut into blocks of --max-length tokens. Prints and saves the evaluation loss and perplexity; saves
the model and tokenizer to --output-dir for `AutoModelForCausalLM.from_pretrained`.

    python examples/train_causal_lm.py --config llama-19m --max-steps 200
    python examples/train_causal_lm.py --config llama-19m --num-experts 8    # MoE: also writes expert_load.png
    python examples/train_causal_lm.py --train-file corpus.txt --config gpt2-124m
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml examples/train_causal_lm.py
    accelerate launch --config_file configs/accelerate/fsdp.yaml examples/train_causal_lm.py --config gpt2-124m
"""

import math
from itertools import chain

import common
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer

from hf_tfm.training.callbacks import RouterBiasCallback, RouterStatsCallback


def main() -> None:
    parser = common.parser(__doc__, output_dir="runs/causal-lm", config="llama-19m")
    parser.add_argument("--num-experts", type=int, help="Mixture of Experts: routed experts per feed-forward layer")
    args = parser.parse_args()
    training_args = common.training_arguments(args)

    data = common.load_data("causal-lm", args)
    tokenizer = common.tokenizer(args, training_args, data["train"]["text"], kind="bpe")
    moe = {"num_experts": args.num_experts, "ffn_type": "glu"} if args.num_experts else {}
    config = common.model_config(args, tokenizer, "tfm_decoder", **moe)
    model = AutoModelForCausalLM.from_config(config)

    def tokenize(batch):  # every document ends with EOS, so that blocks spanning two documents show the boundary
        return {"input_ids": [ids + [tokenizer.eos_token_id] for ids in tokenizer(batch["text"])["input_ids"]]}

    def blocks(batch):  # concatenate, then cut into full blocks (the remainder of each map batch is dropped)
        ids = list(chain.from_iterable(batch["input_ids"]))
        usable = len(ids) // args.max_length * args.max_length
        return {"input_ids": [ids[i : i + args.max_length] for i in range(0, usable, args.max_length)]}

    with training_args.main_process_first(desc="tokenizing"):
        data = data.map(tokenize, batched=True, remove_columns=["text"]).map(blocks, batched=True)
    print(f"{len(data['train'])} train / {len(data['validation'])} validation blocks of {args.max_length} tokens")

    router_stats = RouterStatsCallback()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),  # labels = input_ids; the model shifts
        processing_class=tokenizer,
        callbacks=[router_stats, RouterBiasCallback()] if config.num_experts else None,
    )
    common.train(trainer)
    metrics = trainer.evaluate()
    metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50))
    common.save(trainer, metrics)
    if router_stats.history and trainer.is_world_process_zero():
        router_stats.save_heatmap(f"{args.output_dir}/expert_load.png")


if __name__ == "__main__":
    main()
