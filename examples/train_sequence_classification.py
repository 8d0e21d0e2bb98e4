"""Sequence classification with an hf_tfm encoder and a plain `Trainer`; `accelerate launch` runs it unchanged.

Columns `text` -> `label`; the embedded data asks which of 8 standard-library packages a docstring documents. A
file's labels may be strings or numbers: the classes are their sorted values. The model classifies the pooled
[CLS] token of a WordPiece tokenizer (trained on the train split unless --tokenizer is given). Prints and saves
the evaluation accuracy; saves the model (with its label names) and tokenizer to --output-dir for
`AutoModelForSequenceClassification.from_pretrained`.

    python examples/train_sequence_classification.py --max-steps 300
    python examples/train_sequence_classification.py --train-file reviews.csv --validation-file dev.csv
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml \
        examples/train_sequence_classification.py
"""

import common
import numpy as np
from datasets import ClassLabel, Value
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    Trainer,
)

from hf_tfm.training.metrics import classification_metrics


def main() -> None:
    args = common.parser(__doc__, output_dir="runs/sequence-classification").parse_args()
    training_args = common.training_arguments(args)

    data = common.load_data("sequence-classification", args)
    if not isinstance(data["train"].features["label"], ClassLabel):  # labels from a file: classes by sorted value
        names = sorted({str(label) for label in data["train"]["label"]})
        data = data.cast_column("label", Value("string")).cast_column("label", ClassLabel(names=names))
    names = data["train"].features["label"].names
    tokenizer = common.tokenizer(args, training_args, data["train"]["text"], kind="wordpiece")
    config = common.model_config(args, tokenizer, "tfm_encoder", **common.label_maps(names))
    model = AutoModelForSequenceClassification.from_config(config)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=args.max_length)

    with training_args.main_process_first(desc="tokenizing"):
        data = data.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        data_collator=DataCollatorWithPadding(tokenizer),  # pads each batch to its longest text
        processing_class=tokenizer,
        compute_metrics=classification_metrics,  # accuracy and macro F1 through the shipped evaluate modules
    )
    common.train(trainer)
    metrics = trainer.evaluate()
    metrics["eval_majority_baseline"] = float(
        np.bincount(data["validation"]["labels"]).max() / len(data["validation"])
    )
    common.save(trainer, metrics)


if __name__ == "__main__":
    main()
