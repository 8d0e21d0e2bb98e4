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
"""F1: the harmonic mean of precision and recall, per class and averaged, by `sklearn.metrics.f1_score`. An `evaluate`
metric module."""

import evaluate
from sklearn.metrics import f1_score

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
The F1 score is the harmonic mean of precision and recall:

    F1 = 2 * (precision * recall) / (precision + recall) = 2 * TP / (2 * TP + FP + FN)

computed for one class (`average="binary"`) or for every class and then averaged, by `sklearn.metrics.f1_score` (a
class with 2 * TP + FP + FN = 0 scores `zero_division`, 0 by default).
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

# the averages of single-label classification (scikit-learn's "samples" is for multi-label targets)
AVERAGES = ("binary", "micro", "macro", "weighted", None)


_URL = "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.f1_score.html"


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, shared.SKLEARN_CITATION, shared.CLASS_IDS, reference_urls=[_URL])
class F1(evaluate.Metric):
    def _compute(
        self,
        predictions,
        references,
        labels=None,
        pos_label=1,
        average="binary",
        sample_weight=None,
        zero_division=0.0,
    ):
        if average not in AVERAGES:
            raise ValueError(f"average must be one of {AVERAGES}, got {average!r}")
        if labels is not None and len(labels) == 0:  # scikit-learn would return nan
            raise ValueError("labels must name at least one class")
        shared.check_pairs("f1", predictions, references)
        weights = shared.sample_weights(sample_weight, len(predictions))
        score = f1_score(
            references,
            predictions,
            labels=labels,
            pos_label=pos_label,
            average=average,
            sample_weight=weights,
            zero_division=zero_division,
        )
        return {"f1": [float(value) for value in score] if average is None else float(score)}
