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
"""Accuracy: the (weighted) fraction of predictions equal to their reference, by `sklearn.metrics.accuracy_score`.
An `evaluate` metric module."""

import evaluate
from sklearn.metrics import accuracy_score

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
Accuracy is the proportion of correct predictions among all the predictions:

    accuracy = (TP + TN) / (TP + TN + FP + FN)

With `sample_weight`, each example counts with its weight. Ranges from 0 to 1 (or from 0 to the number, or total
weight, of the examples with `normalize=False`). Computed by `sklearn.metrics.accuracy_score`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted labels.
    references (`list` of `int`): ground-truth labels, as many as the predictions.
    normalize (`bool`, defaults to `True`): return the fraction of correct predictions; with `False`, their number
        (the sum of their weights with `sample_weight`).
    sample_weight (`list` of `float`, *optional*): one non-negative weight per example; defaults to 1 each.

Returns:
    accuracy (`float`): the fraction (or number, with `normalize=False`) of correct predictions.

Examples:

    >>> accuracy = hf_tfm.training.metrics.load_metric("accuracy")
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2])
    {'accuracy': 0.5}
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], normalize=False)
    {'accuracy': 2.0}
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], sample_weight=[0.5, 2, 0.7, 0.8])
    {'accuracy': 0.625}
"""


_URL = "https://scikit-learn.org/stable/modules/generated/sklearn.metrics.accuracy_score.html"


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, shared.SKLEARN_CITATION, shared.CLASS_IDS, reference_urls=[_URL])
class Accuracy(evaluate.Metric):
    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        shared.check_pairs("accuracy", predictions, references)
        weights = shared.sample_weights(sample_weight, len(predictions))
        if normalize and weights is not None and weights.sum() == 0:
            raise ValueError("sample_weight sums to zero")
        return {"accuracy": float(accuracy_score(references, predictions, normalize=normalize, sample_weight=weights))}
