"""Seq2seq training of an hf_tfm encoder-decoder (T5-style) with a plain `Seq2SeqTrainer`; `accelerate launch` runs it
unchanged.

Columns `source` -> `target`; the embedded data maps a standard-library function's signature to how many
arguments a call passes ("get(self, key, default=None)" -> "1 to 2"). A Unigram tokenizer (T5's: <pad>=0, </s>=1,
<unk>=2, every text ends with </s>) is trained on both columns unless --tokenizer is given; the decoder starts from
<pad>. The final evaluation generates (greedy) and scores exact match against the target. Saves the model and
tokenizer to --output-dir for `AutoModelForSeq2SeqLM.from_pretrained`.

    python examples/train_seq2seq.py --max-steps 500
    python examples/train_seq2seq.py --config t5-1.9m --train-file pairs.jsonl
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml examples/train_seq2seq.py
"""

from functools import partial

import common
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from hf_tfm.training.metrics import generation_metrics


def main() -> None:
    parser = common.parser(__doc__, output_dir="runs/seq2seq")
    parser.add_argument("--max-target-length", type=int, default=16, help="target tokens, and generated tokens")
    args = parser.parse_args()
    # predict_with_generate: evaluation generates, so that compute_metrics sees token ids, not logits
    training_args = common.training_arguments(
        args, Seq2SeqTrainingArguments, predict_with_generate=True, generation_max_length=args.max_target_length
    )

    data = common.load_data("seq2seq", args)
    texts = [*data["train"]["source"], *data["train"]["target"]]
    tokenizer = common.tokenizer(args, training_args, texts, kind="unigram")
    config = common.model_config(args, tokenizer, "tfm_encoder_decoder", decoder_start_token_id=tokenizer.pad_token_id)
    model = AutoModelForSeq2SeqLM.from_config(config)

    def tokenize(batch):
        inputs = tokenizer(batch["source"], truncation=True, max_length=args.max_length)
        inputs["labels"] = tokenizer(batch["target"], truncation=True, max_length=args.max_target_length)["input_ids"]
        return inputs

    with training_args.main_process_first(desc="tokenizing"):
        data = data.map(tokenize, batched=True, remove_columns=["source", "target"])

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        # pads inputs with <pad> and labels with -100; the model shifts labels right into decoder_input_ids
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        # exact match, BLEU, chrF and ROUGE through the evaluate modules hf_tfm ships (-100 decodes as <pad>)
        compute_metrics=partial(generation_metrics, tokenizer=tokenizer),
    )
    common.train(trainer)
    common.save(trainer, trainer.evaluate(num_beams=1))


if __name__ == "__main__":
    main()
