"""Token classification with an hf_tfm encoder and a plain `Trainer`; `accelerate launch` runs it unchanged.

Columns `tokens` (a list of words) -> `tags` (one label per word); the embedded data tags the words of a
function's docstring that name one of its parameters (O / PARAM). Words are split into WordPiece sub-words
(tokenizer trained on the train split unless --tokenizer is given); each word's label goes on its first sub-word
and -100 (ignored by the loss) on the rest and on [CLS]/[SEP]. Prints and saves the evaluation accuracy and the F1
of the non-"O" tags over words; saves the model and tokenizer to --output-dir for
`AutoModelForTokenClassification.from_pretrained`.

    python examples/train_token_classification.py --max-steps 300
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml examples/train_token_classification.py
"""

import common
from datasets import ClassLabel, List, Value
from transformers import (
    AutoModelForTokenClassification,
    DataCollatorForTokenClassification,
    Trainer,
)

from hf_tfm.training.metrics import load_metric


def main() -> None:
    args = common.parser(__doc__, output_dir="runs/token-classification").parse_args()
    training_args = common.training_arguments(args)

    data = common.load_data("token-classification", args)
    if not isinstance(data["train"].features["tags"].feature, ClassLabel):  # tags from a file: classes by sorted value
        names = sorted({str(tag) for tags in data["train"]["tags"] for tag in tags})
        data = data.cast_column("tags", List(Value("string"))).cast_column("tags", List(ClassLabel(names=names)))
    names = data["train"].features["tags"].feature.names
    entities = [i for i, name in enumerate(names) if name != "O"]  # the F1 leaves out the "no entity" tag
    texts = [" ".join(words) for words in data["train"]["tokens"]]
    tokenizer = common.tokenizer(args, training_args, texts, kind="wordpiece")
    config = common.model_config(args, tokenizer, "tfm_encoder", **common.label_maps(names))
    model = AutoModelForTokenClassification.from_config(config)

    def tokenize_and_align(batch):
        inputs = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=args.max_length)
        inputs["labels"] = []
        for row, tags in enumerate(batch["tags"]):
            labels, previous = [], None
            for word in inputs.word_ids(row):  # the word each sub-word comes from; None for [CLS], [SEP]
                labels.append(-100 if word is None or word == previous else tags[word])
                previous = word
            inputs["labels"].append(labels)
        return inputs

    with training_args.main_process_first(desc="tokenizing"):
        data = data.map(tokenize_and_align, batched=True, remove_columns=["tokens", "tags"])

    # the evaluate modules hf_tfm ships (evaluate.load("accuracy") would need the Hub), over scikit-learn
    accuracy, f1 = load_metric("accuracy"), load_metric("f1")

    def word_metrics(prediction):  # over labelled positions only: one per word
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        labelled = prediction.label_ids != -100
        predicted, expected = logits.argmax(-1)[labelled], prediction.label_ids[labelled]
        return {
            **accuracy.compute(predictions=predicted, references=expected),
            # micro F1 over the entity tags: from the words tagged, or that should be, with an entity tag
            **f1.compute(predictions=predicted, references=expected, labels=entities, average="micro"),
        }

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        data_collator=DataCollatorForTokenClassification(tokenizer),  # pads inputs, and labels with -100
        processing_class=tokenizer,
        compute_metrics=word_metrics,
    )
    common.train(trainer)
    common.save(trainer, trainer.evaluate())


if __name__ == "__main__":
    main()
