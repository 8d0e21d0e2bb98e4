"""The training tasks, one `Task` record each in `TASKS`: the head it trains, the columns it reads, the tokenizer a
fresh model gets, its collator and scores, and the trivial baselines its scores must beat. Every other module (data,
run, report, checkpoints, model cards) reads these records instead of keeping its own table.

Importable without `datasets` or `evaluate` (model cards read the records in a core install): those are imported
inside the functions that use them.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

from .metrics import classification_metrics, classification_scores, generation_metrics, generation_scores
from .tokenizers import train_tokenizer

MLM_PROBABILITY = 0.15


@dataclass(frozen=True)
class Head:
    """A kind of model head, known by how its class name ends (`TfmEncoderForMaskedLM` -> "ForMaskedLM")."""

    suffix: str
    auto_class: str  # the transformers Auto class that loads it
    pipeline_tag: str  # the Hub pipeline it serves


# hf_tfm's heads, and the converters' sources (GPT-2's "LMHeadModel"); a base model ("...Model") extracts features
HEADS = {
    head.suffix: head
    for head in (
        Head("ForCausalLM", "AutoModelForCausalLM", "text-generation"),
        Head("LMHeadModel", "AutoModelForCausalLM", "text-generation"),
        Head("ForMaskedLM", "AutoModelForMaskedLM", "fill-mask"),
        Head("ForConditionalGeneration", "AutoModelForSeq2SeqLM", "text2text-generation"),
        Head("ForSequenceClassification", "AutoModelForSequenceClassification", "text-classification"),
        Head("ForTokenClassification", "AutoModelForTokenClassification", "token-classification"),
        Head("ForQuestionAnswering", "AutoModelForQuestionAnswering", "question-answering"),
        # ELECTRA's discriminator: no Hub pipeline runs replaced-token detection; its body extracts features
        Head("ForPreTraining", "AutoModelForPreTraining", "feature-extraction"),
        Head("Model", "AutoModel", "feature-extraction"),
    )
}


def head_for_architecture(architecture: str) -> Head | None:
    """The head a class name (a config's `architectures` entry) ends with; the longest suffix wins."""
    suffix = max((s for s in HEADS if architecture.endswith(s)), key=len, default=None)
    return HEADS.get(suffix)


# ----------------------------------------------------------------------- each task's inputs and baselines


def _label_ids(values: list, names: list[str]) -> list[int]:
    if all(isinstance(v, (int, np.integer)) for v in values):
        if any(not 0 <= v < len(names) for v in values):
            raise ValueError(f"label ids must lie in [0, {len(names)}); got {sorted(set(values))[:10]}")
        return [int(v) for v in values]
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted({str(v) for v in values} - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} do not appear in the training split, whose labels are {names}")
    return [index[str(v)] for v in values]


def _aligned_tags(encoding, row: int, tags: list[int]) -> list[int]:
    """Each word's tag on its first sub-word; -100 on later sub-words and special tokens (ignored by the loss)."""
    labels, previous = [], None
    for word in encoding.word_ids(row):
        labels.append(-100 if word is None or word == previous else tags[word])
        previous = word
    return labels


def _encode_masked_lm(tokenizer, batch, max_length: int, labels):
    return tokenizer(batch["text"], truncation=True, max_length=max_length, return_special_tokens_mask=True)


def _encode_seq2seq(tokenizer, batch, max_length: int, labels):
    return tokenizer(batch["source"], text_target=batch["target"], truncation=True, max_length=max_length)


def _encode_sequence_classification(tokenizer, batch, max_length: int, labels: list[str]):
    encoding = tokenizer(batch["text"], truncation=True, max_length=max_length)
    encoding["labels"] = _label_ids(batch["label"], labels)
    return encoding


def _encode_token_classification(tokenizer, batch, max_length: int, labels: list[str]):
    encoding = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_length)
    encoding["labels"] = [_aligned_tags(encoding, i, _label_ids(tags, labels)) for i, tags in enumerate(batch["tags"])]
    return encoding


def _uniform(vocab_size: int) -> list[dict]:
    return [{"name": "uniform over the vocabulary", "metric": "perplexity", "value": float(vocab_size)}]


def _language_model_baselines(validation: dict, train: dict, vocab_size: int, labels, average) -> list[dict]:
    return _uniform(vocab_size)


def _seq2seq_baselines(validation: dict, train: dict, vocab_size: int, labels, average) -> list[dict]:
    most_common = Counter(train["target"]).most_common(1)[0][0]
    references = validation["target"]
    guesses = {"copy the source": validation["source"], f"always {most_common!r}": [most_common] * len(references)}
    return _uniform(vocab_size) + [
        {"name": name, "metric": metric, "value": value}
        for name, guess in guesses.items()
        for metric, value in generation_scores(guess, references).items()
    ]


def _sequence_classification_baselines(validation: dict, train: dict, vocab_size: int, labels: list[str], average):
    references = _label_ids(validation["label"], labels)
    majority = Counter(_label_ids(train["label"], labels)).most_common(1)[0][0]
    scores = classification_scores([majority] * len(references), references, average)
    return [{"name": f"majority class ({labels[majority]})", "metric": m, "value": v} for m, v in scores.items()]


def _token_classification_baselines(validation: dict, train: dict, vocab_size: int, labels: list[str], average):
    references = [t for tags in validation["tags"] for t in _label_ids(tags, labels)]
    scores = classification_scores([0] * len(references), references, average)
    return [{"name": f"always {labels[0]}", "metric": m, "value": v} for m, v in scores.items()]


@dataclass(frozen=True)
class Task:
    """Everything training knows about one task."""

    name: str
    head: Head
    columns: tuple[str, ...]  # the columns it reads, under their standard names (`--column standard=yours` renames)
    tokenizer: str  # the kind trained for a fresh model: "bpe", "wordpiece" or "unigram" (see tokenizers.py)
    headline: str  # the metric its summary leads with
    higher_is_better: bool
    collator: Callable  # (tokenizer, model) -> the Trainer's data collator
    metrics: Callable | None  # the Trainer's `compute_metrics` before binding; None: perplexity, from the eval loss
    label_column: str | None = None  # classification: the column whose values name the classes
    perplexity: bool = False  # a language-modelling loss: its final scores add exp(loss)
    generates: bool = False  # Seq2SeqTrainer, and final scores from greedy decoding (only then: generating is slow)
    texts: Callable = lambda train: list(train["text"])  # the training split's texts, to train a tokenizer on
    # (tokenizer, batch, max_length, labels) -> a batch of model inputs; None: the texts joined and cut into blocks
    encode: Callable | None = None
    # (validation, train, vocab_size, labels, F1 average) -> the scores of trivial predictors (each split a dict of
    # columns)
    baselines: Callable = _language_model_baselines
    binary_f1: bool = False  # with two labels, F1 of the second (an entity tag against O) instead of macro F1

    @property
    def classifies(self) -> bool:
        return self.label_column is not None

    def f1_average(self, labels: list[str]) -> str:
        """How F1 averages over this task's classes: macro, or binary for two labels where `binary_f1`."""
        return "binary" if self.binary_f1 and len(labels) == 2 else "macro"


TASKS = {
    task.name: task
    for task in (
        Task(
            name="causal-lm",
            head=HEADS["ForCausalLM"],
            columns=("text",),
            tokenizer="bpe",
            headline="perplexity",
            higher_is_better=False,
            collator=lambda tokenizer, model: DataCollatorForLanguageModeling(tokenizer, mlm=False),
            metrics=None,
            perplexity=True,
        ),
        Task(
            name="masked-lm",
            head=HEADS["ForMaskedLM"],
            columns=("text",),
            tokenizer="wordpiece",
            headline="perplexity",
            higher_is_better=False,
            collator=lambda tokenizer, model: DataCollatorForLanguageModeling(
                tokenizer, mlm=True, mlm_probability=MLM_PROBABILITY
            ),
            metrics=None,
            perplexity=True,
            encode=_encode_masked_lm,
        ),
        Task(
            name="seq2seq",
            head=HEADS["ForConditionalGeneration"],
            columns=("source", "target"),
            tokenizer="unigram",
            headline="exact_match",
            higher_is_better=True,
            collator=lambda tokenizer, model: DataCollatorForSeq2Seq(tokenizer, model=model),
            metrics=generation_metrics,
            perplexity=True,
            generates=True,
            texts=lambda train: [*train["source"], *train["target"]],
            encode=_encode_seq2seq,
            baselines=_seq2seq_baselines,
        ),
        Task(
            name="sequence-classification",
            head=HEADS["ForSequenceClassification"],
            columns=("text", "label"),
            tokenizer="wordpiece",
            headline="accuracy",
            higher_is_better=True,
            collator=lambda tokenizer, model: DataCollatorWithPadding(tokenizer),
            metrics=classification_metrics,
            label_column="label",
            encode=_encode_sequence_classification,
            baselines=_sequence_classification_baselines,
        ),
        Task(
            name="token-classification",
            head=HEADS["ForTokenClassification"],
            columns=("tokens", "tags"),
            tokenizer="wordpiece",
            headline="f1",
            higher_is_better=True,
            collator=lambda tokenizer, model: DataCollatorForTokenClassification(tokenizer),
            metrics=classification_metrics,
            label_column="tags",
            texts=lambda train: [" ".join(words) for words in train["tokens"]],
            encode=_encode_token_classification,
            baselines=_token_classification_baselines,
            binary_f1=True,
        ),
    )
}


def check_task(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[task]


def task_for_architecture(architecture: str) -> str:
    """The task a saved head was trained for, read off its `architectures` entry."""
    head = head_for_architecture(architecture)
    for task in TASKS.values():
        if task.head == head:
            return task.name
    heads = ", ".join(task.head.suffix for task in TASKS.values())
    raise ValueError(f"no training task uses the head {architecture!r}; heads: {heads}")


def label_names(task: str, data) -> list[str] | None:
    """Class names of a classification task, from the ClassLabel feature (or the sorted values seen in train)."""
    column = TASKS[task].label_column
    if column is None:
        return None
    feature, values = data["train"].features[column], data["train"][column]
    if hasattr(feature, "feature"):  # token tags: a sequence of labels per row
        feature, values = feature.feature, [value for row in values for value in row]
    return list(feature.names) if hasattr(feature, "names") else sorted({str(v) for v in values})


def lm_blocks(tokenizer, texts: list[str], block_size: int):
    """Concatenate the documents (each ended by EOS) and cut fixed-length training blocks, as a `datasets.Dataset`."""
    from datasets import Dataset

    ids = [token for row in tokenizer(texts)["input_ids"] for token in (*row, tokenizer.eos_token_id)]
    usable = len(ids) // block_size * block_size
    return Dataset.from_dict({"input_ids": [ids[i : i + block_size] for i in range(0, usable, block_size)]})


def tokenize(task: str, data, tokenizer, max_length: int, labels: list[str] | None = None):
    """Model inputs for every split: input ids (plus labels where the task has them), truncated to `max_length`."""
    from datasets import DatasetDict

    record = TASKS[task]
    if record.encode is None:
        return DatasetDict(
            {split: lm_blocks(tokenizer, list(rows["text"]), max_length) for split, rows in data.items()}
        )
    encode = partial(record.encode, tokenizer, max_length=max_length, labels=labels)
    return data.map(encode, batched=True, remove_columns=list(record.columns))


def trained_tokenizer(task: str, train_split, vocab_size: int):
    """A fresh model's tokenizer: the task's kind (BPE for causal LMs, WordPiece for encoders, ...) trained on the
    training split's texts."""
    return train_tokenizer(TASKS[task].texts(train_split), TASKS[task].tokenizer, vocab_size)


def collator(task: str, tokenizer, model=None):
    return TASKS[task].collator(tokenizer, model)


def argmax_logits(logits, labels):
    """Keep only predicted ids during evaluation instead of accumulating [N, L, C] logits."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


def compute_metrics_for(task: str, tokenizer, labels: list[str] | None = None):
    """The `compute_metrics` a Trainer gets for `task` (None for the LM tasks: their metric is exp(eval_loss))."""
    record = TASKS[task]
    if record.metrics is None:
        return None
    if record.classifies:
        return partial(record.metrics, average=record.f1_average(labels))
    return partial(record.metrics, tokenizer=tokenizer)


def baselines(task: str, data, vocab_size: int, labels: list[str] | None) -> list[dict]:
    """Scores of trivial predictors on the validation split: what training has to beat."""
    validation, train = data["validation"].to_dict(), data["train"].to_dict()  # columns as plain lists
    record = TASKS[task]
    average = record.f1_average(labels) if record.classifies else None
    return record.baselines(validation, train, vocab_size, labels, average)
