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
"""Accuracy: the (weighted) fraction of predictions equal to their reference. An `evaluate` metric module."""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Accuracy is the proportion of correct predictions among all the predictions:

    accuracy = (TP + TN) / (TP + TN + FP + FN)

With `sample_weight`, each example counts with its weight. Ranges from 0 to 1 (or from 0 to the number, or total
weight, of the examples with `normalize=False`). Written with numpy only; the values agree with
`sklearn.metrics.accuracy_score`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted labels.
    references (`list` of `int`): ground-truth labels, as many as the predictions.
    normalize (`bool`, defaults to `True`): return the fraction of correct predictions; with `False`, their number
        (the sum of their weights with `sample_weight`).
    sample_weight (`list` of `float`, *optional*): one non-negative weight per example; defaults to 1 each.

Returns:
    accuracy (`float` or `int`): the fraction (or number, with `normalize=False`) of correct predictions.

Examples:

    >>> accuracy = hf_tfm.training.metrics.load_metric("accuracy")
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2])
    {'accuracy': 0.5}
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], normalize=False)
    {'accuracy': 2}
    >>> accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], sample_weight=[0.5, 2, 0.7, 0.8])
    {'accuracy': 0.625}
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


def _weights(sample_weight, n):
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=np.float64)
    if weights.shape != (n,):
        raise ValueError(f"sample_weight must hold one weight per example ({n}), got shape {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("sample_weight must be finite and non-negative")
    return weights


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
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
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.accuracy_score.html"],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        predictions = np.asarray(predictions, dtype=np.int64)
        references = np.asarray(references, dtype=np.int64)
        if predictions.shape != references.shape:
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        if predictions.size == 0:
            raise ValueError("accuracy needs at least one prediction")
        weights = _weights(sample_weight, predictions.size)
        correct = (predictions == references).astype(np.float64)
        if normalize:
            if weights is not None and weights.sum() == 0:
                raise ValueError("sample_weight sums to zero")
            return {"accuracy": float(np.average(correct, weights=weights))}
        if weights is None:
            return {"accuracy": int(correct.sum())}
        return {"accuracy": float(np.dot(correct, weights))}
