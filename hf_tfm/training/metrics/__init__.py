"""Metric modules for `evaluate`, shipped with the package because the Hub's metric scripts are unreachable offline.

Each metric is an ordinary `evaluate` metric script in its own folder, `<name>/<name>.py` (the Hub's layout), so
`evaluate.load("/path/to/hf_tfm/training/metrics/accuracy")` works with or without a network; `load_metric("accuracy")`
does that for you. Loading a local path never contacts the Hub, whatever HF_HUB_OFFLINE / HF_EVALUATE_OFFLINE say.

Notes on `evaluate` (0.4.x) and these modules:

- `evaluate.load` copies the script into its modules cache, `$HF_MODULES_CACHE/evaluate_modules/metrics/<name>/<hash>/`
  (`~/.cache/huggingface/modules` by default), under a file lock, then imports it from there; concurrent processes
  (pytest-xdist workers, several ranks) loading the same metric are safe. Where that folder is not writable, point
  HF_MODULES_CACHE at one that is *before* `evaluate` is first imported (it reads the variable once, at import).
- `evaluate` stores the predictions in an Arrow file under `~/.cache/huggingface/metrics` unless the module is created
  with `keep_in_memory=True`; `load_metric` makes that the default (for `num_process=1`), so computing writes nothing.
- A metric script must use `import evaluate` and subclass `evaluate.Metric`, not `from evaluate import Metric`:
  `evaluate` takes the first `EvaluationModule` subclass it finds in the script's namespace as the metric.
- The scripts are thin wrappers over the libraries that score (scikit-learn, sacrebleu, rouge_score); what they share
  (their `MetricInfo`, features, input checks) is in `shared.py`, imported by its absolute name because `evaluate`
  copies only the script into its cache.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import evaluate
    from transformers import EvalPrediction, PreTrainedTokenizerBase

METRICS_DIR = Path(__file__).resolve().parent
METRIC_NAMES = ("accuracy", "exact_match", "f1", "rouge", "sacrebleu")  # perplexity: exp(eval loss), in the run
IGNORE_INDEX = -100


def metric_path(name: str) -> Path:
    """The folder of the shipped metric `name`, to pass to `evaluate.load`."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; the metrics shipped with hf_tfm are: {', '.join(METRIC_NAMES)}")
    return METRICS_DIR / name


def load_metric(name: str, **kwargs: Any) -> evaluate.EvaluationModule:
    """`evaluate.load` of a shipped metric by its local path (no network); `kwargs` go to `evaluate.load`
    (`config_name`, `experiment_id`, `num_process`, `process_id`, `cache_dir`, ...). `keep_in_memory` defaults to
    True for a single process, so that computing writes no cache file."""
    import evaluate

    path = metric_path(name)
    if kwargs.get("num_process", 1) == 1:
        kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(path), **kwargs)


@cache
def _cached_metric(name: str) -> evaluate.EvaluationModule:
    return load_metric(name)


def _predictions(eval_pred: EvalPrediction):
    predictions = eval_pred.predictions
    if isinstance(predictions, (tuple, list)):  # (logits, past_key_values, hidden_states, ...)
        predictions = predictions[0]
    return np.asarray(predictions)


def classification_scores(predictions: list[int], references: list[int], average: str = "macro") -> dict[str, float]:
    """Accuracy and F1 (`average` as in the f1 metric) of class ids against references."""
    accuracy = _cached_metric("accuracy").compute(predictions=predictions, references=references)["accuracy"]
    f1 = _cached_metric("f1").compute(predictions=predictions, references=references, average=average)["f1"]
    return {"accuracy": float(accuracy), "f1": float(f1)}


def classification_metrics(eval_pred: EvalPrediction, average: str = "macro") -> dict[str, float]:
    """Accuracy and F1 (macro by default) for a `Trainer`'s `compute_metrics`, for sequence classification (logits
    (N, C), labels (N,)) and token classification (logits (N, T, C), labels (N, T), flattened; positions labelled -100
    are left out). Predictions already reduced to class ids (by `preprocess_logits_for_metrics`) are used as they
    are."""
    predictions = _predictions(eval_pred)
    labels = np.asarray(eval_pred.label_ids)
    if not (predictions.ndim == labels.ndim and np.issubdtype(predictions.dtype, np.integer)):
        predictions = predictions.argmax(axis=-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions of shape {predictions.shape} do not match labels of shape {labels.shape}")
    keep = labels != IGNORE_INDEX
    predictions, labels = predictions[keep].tolist(), labels[keep].tolist()
    if not labels:
        raise ValueError("every label is -100: nothing to score")
    return classification_scores(predictions, labels, average)


def generation_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """SacreBLEU, chrF, ROUGE and exact match (stripped) of generated texts against reference texts."""
    bleu = _cached_metric("sacrebleu").compute(predictions=predictions, references=references)
    rouge = _cached_metric("rouge").compute(predictions=predictions, references=references)
    exact = _cached_metric("exact_match").compute(predictions=predictions, references=references, strip=True)
    return {"bleu": bleu["score"], "chrf": bleu["chrf"], **rouge, "exact_match": exact["exact_match"]}


def generation_metrics(eval_pred: EvalPrediction, tokenizer: PreTrainedTokenizerBase) -> dict[str, float]:
    """`generation_scores` of generated token ids against the labels, for a `Seq2SeqTrainer` with
    `predict_with_generate=True`; -100 (in labels and in padded predictions) decodes as padding."""
    predictions = _predictions(eval_pred)
    labels = np.asarray(eval_pred.label_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    predictions = np.where(predictions == IGNORE_INDEX, pad, predictions)
    labels = np.where(labels == IGNORE_INDEX, pad, labels)
    texts = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
    return generation_scores(texts, references)


__all__ = [
    "IGNORE_INDEX",
    "METRICS_DIR",
    "METRIC_NAMES",
    "classification_metrics",
    "classification_scores",
    "generation_metrics",
    "generation_scores",
    "load_metric",
    "metric_path",
]
