# Copyright 2025 The hf-tfm authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""F1: the harmonic mean of precision and recall, per class and averaged. An `evaluate` metric module."""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
The F1 score is the harmonic mean of precision and recall:

    F1 = 2 * (precision * recall) / (precision + recall) = 2 * TP / (2 * TP + FP + FN)

computed for one class (`average="binary"`) or for every class and then averaged. Written with numpy only; the values
agree with `sklearn.metrics.f1_score` (a class with 2 * TP + FP + FN = 0 scores `zero_division`, 0 by default).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted labels.
    references (`list` of `int`): ground-truth labels, as many as the predictions.
    labels (`list` of `int`, *optional*): the classes to score and average over, in this order (default: every label
        seen in the predictions or references, sorted). Ignored with `average="binary"`; with `average="micro"`, a
        subset leaves out the others' counts.
    pos_label (`int`, defaults to 1): the class scored with `average="binary"`.
    average (`str` or `None`, defaults to `"binary"`):
        - `"binary"`: the F1 of `pos_label`; the predictions and references together may hold at most two labels.
        - `"micro"`: from the true positives, false negatives and false positives summed over the classes.
        - `"macro"`: the unweighted mean of the per-class F1.
        - `"weighted"`: the mean of the per-class F1 weighted by each class's number of references (support).
        - `None`: the per-class F1 as a list, in the order of `labels`.
    sample_weight (`list` of `float`, *optional*): one non-negative weight per example.
    zero_division (`float`, defaults to 0.0): the score of a class that is neither predicted nor present.

Returns:
    f1 (`float`, or `list` of `float` with `average=None`): from 0 to 1, higher is better.

Examples:

    >>> f1 = hf_tfm.training.metrics.load_metric("f1")
    >>> f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'f1': 0.6666666666666666}
    >>> f1.compute(predictions=[0, 2, 1, 0, 0, 1], references=[0, 1, 2, 0, 1, 2], average="macro")
    {'f1': 0.26666666666666666}
"""

_CITATION = """
@article{scikit-learn,
  title={Scikit-learn: Machine Learning in {P}ython},
  author={Pedregosa, F. and Varoquaux, G. and Gramfort, A. and Michel, V. and Thirion, B. and Grisel, O. and
          Blondel, M. and Prettenhofer, P. and Weiss, R. and Dubourg, V. and Vanderplas, J. and Passos, A. and
          Cournapeau, D. and Brucher, M. and Perrot, M. and Duchesnay, E.},
  journal={Journal of Machine Learning Research},
  volume={12},
  pages={2825--2830},
  year={2011}
}
"""

AVERAGES = ("binary", "micro", "macro", "weighted", None)


def _safe_divide(numerator, denominator, zero_division):
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.full_like(numerator, float(zero_division))
    np.divide(numerator, denominator, out=out, where=denominator != 0)
    return out


def f1_score(predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None,
             zero_division=0.0):
    """The F1 score over numpy arrays; see the module's description."""
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {AVERAGES}, got {average!r}")
    predictions = np.asarray(predictions, dtype=np.int64)
    references = np.asarray(references, dtype=np.int64)
    if predictions.ndim != 1 or predictions.shape != references.shape:
        raise ValueError(f"{predictions.shape} predictions but {references.shape} references")
    if predictions.size == 0:
        raise ValueError("f1 needs at least one prediction")
    if sample_weight is None:
        weights = np.ones(predictions.size, dtype=np.float64)
    else:
        weights = np.asarray(sample_weight, dtype=np.float64)
        if weights.shape != predictions.shape:
            raise ValueError(f"sample_weight must hold one weight per example ({predictions.size})")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("sample_weight must be finite and non-negative")

    present = np.union1d(predictions, references)
    if average == "binary":
        if present.size > 2:
            raise ValueError(
                f"average='binary' but the labels are multiclass ({present.tolist()}); "
                "choose average='micro', 'macro' or 'weighted'"
            )
        if present.size == 2 and pos_label not in present:
            raise ValueError(f"pos_label={pos_label} is not a valid label: it should be one of {present.tolist()}")
        labels = np.asarray([pos_label], dtype=np.int64)
    elif labels is None:
        labels = present
    else:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if labels.size == 0:
            raise ValueError("labels must not be empty")

    # Per-class weighted counts: rows are labels, columns are examples.
    is_pred = predictions[None, :] == labels[:, None]
    is_true = references[None, :] == labels[:, None]
    tp = (is_pred & is_true) @ weights
    fp = (is_pred & ~is_true) @ weights
    fn = (~is_pred & is_true) @ weights

    if average == "micro":
        tp, fp, fn = tp.sum(keepdims=True), fp.sum(keepdims=True), fn.sum(keepdims=True)
    scores = _safe_divide(2 * tp, 2 * tp + fp + fn, zero_division)
    if average is None:
        return [float(score) for score in scores]
    if average == "weighted":
        support = tp + fn
        if support.sum() == 0:
            return float(zero_division)
        return float(np.average(scores, weights=support))
    return float(scores.mean())


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("int64"),
                    "references": datasets.Value("int64"),
                }
            ),
            license="Apache-2.0",
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.f1_score.html"],
        )

    def _compute(self, predictions, references, labels=None, pos_label=1, average="binary", sample_weight=None,
                 zero_division=0.0):
        score = f1_score(predictions, references, labels=labels, pos_label=pos_label, average=average,
                         sample_weight=sample_weight, zero_division=zero_division)
        return {"f1": score}
