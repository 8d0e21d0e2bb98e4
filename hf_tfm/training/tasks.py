"""What each task trains: the head, how its columns become model inputs, how batches are collated, how it is
scored, and the trivial baselines its scores must beat."""

from collections import Counter
from functools import partial

import numpy as np
from datasets import Dataset, DatasetDict
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

from .data import TASK_COLUMNS
from .metrics import classification_metrics, classification_scores, generation_metrics, generation_scores

HEADS = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
}
# the task a saved head was trained for, read off its `architectures` entry
TASK_BY_HEAD_SUFFIX = {
    "ForCausalLM": "causal-lm",
    "ForMaskedLM": "masked-lm",
    "ForConditionalGeneration": "seq2seq",
    "ForSequenceClassification": "sequence-classification",
    "ForTokenClassification": "token-classification",
}
# the metric each task's summary leads with, and whether higher is better
HEADLINE = {
    "causal-lm": ("perplexity", False),
    "masked-lm": ("perplexity", False),
    "seq2seq": ("exact_match", True),
    "sequence-classification": ("accuracy", True),
    "token-classification": ("f1", True),
}
MLM_PROBABILITY = 0.15


def task_for_architecture(architecture: str) -> str:
    for suffix, task in TASK_BY_HEAD_SUFFIX.items():
        if architecture.endswith(suffix):
            return task
    raise ValueError(f"no training task uses the head {architecture!r}; heads: {', '.join(TASK_BY_HEAD_SUFFIX)}")


def label_names(task: str, data: DatasetDict) -> list[str] | None:
    """Class names of a classification task, from the ClassLabel feature (or the sorted values seen in train)."""
    if task == "sequence-classification":
        feature = data["train"].features["label"]
        return list(feature.names) if hasattr(feature, "names") else sorted({str(v) for v in data["train"]["label"]})
    if task == "token-classification":
        feature = data["train"].features["tags"].feature
        return list(feature.names) if hasattr(feature, "names") else sorted({str(t) for row in data["train"]["tags"] for t in row})
    return None


def lm_blocks(tokenizer, texts: list[str], block_size: int) -> Dataset:
    """Concatenate the documents (each ended by EOS) and cut fixed-length training blocks."""
    ids = [token for row in tokenizer(texts)["input_ids"] for token in (*row, tokenizer.eos_token_id)]
    usable = len(ids) // block_size * block_size
    return Dataset.from_dict({"input_ids": [ids[i : i + block_size] for i in range(0, usable, block_size)]})


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


def tokenize(task: str, data: DatasetDict, tokenizer, max_length: int, labels: list[str] | None = None) -> DatasetDict:
    """Model inputs for every split: input ids (plus labels where the task has them), truncated to `max_length`."""
    if task == "causal-lm":
        return DatasetDict({split: lm_blocks(tokenizer, list(rows["text"]), max_length) for split, rows in data.items()})

    def encode(batch):
        if task == "masked-lm":
            return tokenizer(batch["text"], truncation=True, max_length=max_length, return_special_tokens_mask=True)
        if task == "seq2seq":
            return tokenizer(batch["source"], text_target=batch["target"], truncation=True, max_length=max_length)
        if task == "sequence-classification":
            encoding = tokenizer(batch["text"], truncation=True, max_length=max_length)
            encoding["labels"] = _label_ids(batch["label"], labels)
            return encoding
        encoding = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_length)
        encoding["labels"] = [_aligned_tags(encoding, i, _label_ids(tags, labels)) for i, tags in enumerate(batch["tags"])]
        return encoding

    return data.map(encode, batched=True, remove_columns=list(TASK_COLUMNS[task]))


def collator(task: str, tokenizer, model=None):
    if task == "causal-lm":
        return DataCollatorForLanguageModeling(tokenizer, mlm=False)
    if task == "masked-lm":
        return DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=MLM_PROBABILITY)
    if task == "seq2seq":
        return DataCollatorForSeq2Seq(tokenizer, model=model)
    if task == "token-classification":
        return DataCollatorForTokenClassification(tokenizer)
    return DataCollatorWithPadding(tokenizer)


def argmax_logits(logits, labels):
    """Keep only predicted ids during evaluation instead of accumulating [N, L, C] logits."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


def f1_average(task: str, labels: list[str]) -> str:
    """Macro F1 over classes; for two token tags (O + one entity tag), F1 of the entity tag."""
    return "binary" if task == "token-classification" and len(labels) == 2 else "macro"


def compute_metrics_for(task: str, tokenizer, labels: list[str] | None = None):
    """The `compute_metrics` a Trainer gets for `task` (None for the LM tasks: their metric is exp(eval_loss))."""
    if task in ("sequence-classification", "token-classification"):
        return partial(classification_metrics, average=f1_average(task, labels))
    if task == "seq2seq":
        return partial(generation_metrics, tokenizer=tokenizer)
    return None


def baselines(task: str, data: DatasetDict, vocab_size: int, labels: list[str] | None) -> list[dict]:
    """Scores of trivial predictors on the validation split: what training has to beat."""
    validation, train = data["validation"].to_dict(), data["train"].to_dict()  # columns as plain lists
    uniform = [{"name": "uniform over the vocabulary", "metric": "perplexity", "value": float(vocab_size)}]
    if task in ("causal-lm", "masked-lm"):
        return uniform
    if task == "seq2seq":
        most_common = Counter(train["target"]).most_common(1)[0][0]
        return uniform + [
            {"name": "copy the source", "metric": metric, "value": value}
            for metric, value in generation_scores(validation["source"], validation["target"]).items()
        ] + [
            {"name": f"always {most_common!r}", "metric": metric, "value": value}
            for metric, value in generation_scores([most_common] * len(validation["target"]), validation["target"]).items()
        ]
    if task == "sequence-classification":
        references = _label_ids(validation["label"], labels)
        majority = Counter(_label_ids(train["label"], labels)).most_common(1)[0][0]
        scores = classification_scores([majority] * len(references), references, "macro")
        return [{"name": f"majority class ({labels[majority]})", "metric": m, "value": v} for m, v in scores.items()]
    references = [t for tags in validation["tags"] for t in _label_ids(tags, labels)]
    scores = classification_scores([0] * len(references), references, f1_average(task, labels))
    return [{"name": f"always {labels[0]}", "metric": m, "value": v} for m, v in scores.items()]
