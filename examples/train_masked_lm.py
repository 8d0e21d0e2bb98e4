"""Masked-LM pre-training of an hf_tfm encoder (BERT-style) with a plain `Trainer`; `accelerate launch` runs it
unchanged.

Each document is one example ([CLS] text [SEP], cut at --max-length tokens) of a WordPiece tokenizer (trained on the
train split unless --tokenizer is given); the collator masks --mlm-probability of the tokens (80% [MASK], 10% random,
10% kept) and the model predicts them. Prints and saves the evaluation loss and perplexity; saves the model and
tokenizer to --output-dir for `AutoModelForMaskedLM.from_pretrained`.

    python examples/train_masked_lm.py --max-steps 300
    python examples/train_masked_lm.py --config bert-1.4m --train-file corpus.txt
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml examples/train_masked_lm.py
"""

import math

import common
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, Trainer


def main() -> None:
    parser = common.parser(__doc__, output_dir="runs/masked-lm")
    parser.add_argument("--mlm-probability", type=float, default=0.15)
    args = parser.parse_args()
    training_args = common.training_arguments(args)

    data = common.load_data("masked-lm", args)
    tokenizer = common.tokenizer(args, training_args, data["train"]["text"], kind="wordpiece")
    model = AutoModelForMaskedLM.from_config(common.model_config(args, tokenizer, "tfm_encoder"))

    def tokenize(batch):  # the special-tokens mask keeps [CLS]/[SEP] from being chosen for masking
        return tokenizer(batch["text"], truncation=True, max_length=args.max_length, return_special_tokens_mask=True)

    with training_args.main_process_first(desc="tokenizing"):
        data = data.map(tokenize, batched=True, remove_columns=["text"])

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        # pads each batch to its longest example, then masks; labels are -100 except at the masked positions
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=args.mlm_probability),
        processing_class=tokenizer,
    )
    common.train(trainer)
    metrics = trainer.evaluate()
    metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50))
    common.save(trainer, metrics)


if __name__ == "__main__":
    main()
