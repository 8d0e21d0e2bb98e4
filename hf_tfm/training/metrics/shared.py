"""What the shipped metric scripts share: their `MetricInfo`, the input features, and the checks on their inputs.

The scripts import this module by its absolute name (`from hf_tfm.training.metrics import shared`): `evaluate.load`
copies only the script itself into its modules cache (a sibling imported relatively would have to be copied too, and
`evaluate` would hash only the script), while an absolute import of the installed package works from any copy.
Import the module, not names from it: `evaluate` takes the first `evaluate.Metric` subclass in a script's namespace as
its metric, so a script must not hold any other one.
"""

import datasets
import evaluate
import numpy as np

CLASS_IDS = datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")})
TEXTS = datasets.Features(
    {"predictions": datasets.Value("string", id="sequence"), "references": datasets.Value("string", id="sequence")}
)
# one or several references per prediction: `evaluate` tries these features in order
TEXTS_WITH_REFERENCES = [
    datasets.Features(
        {
            "predictions": datasets.Value("string", id="sequence"),
            "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
        }
    ),
    TEXTS,
]

SKLEARN_CITATION = """
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


def with_info(description: str, kwargs_description: str, citation: str, features, **urls):
    """Class decorator of a shipped `evaluate.Metric`: its `_info` (a fresh `MetricInfo` each call: `evaluate` writes
    into it) and its docstring (what `add_start_docstrings` gives the Hub's scripts). `urls`: `homepage`,
    `codebase_urls`, `reference_urls`."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=description,
            inputs_description=kwargs_description,
            citation=citation,
            features=features,
            license="Apache-2.0",
            **urls,
        )

    def decorate(metric_class):
        metric_class._info = _info
        metric_class.__doc__ = description + kwargs_description + (metric_class.__doc__ or "")
        return metric_class

    return decorate


def check_pairs(metric: str, predictions, references) -> None:
    """One reference (or list of references) per prediction, and at least one prediction."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if len(predictions) == 0:
        raise ValueError(f"{metric} needs at least one prediction")


def reference_lists(metric: str, predictions: list[str], references: list) -> list[list[str]]:
    """Checked predictions and references as one list of reference strings per prediction (a string is one)."""
    check_pairs(metric, predictions, references)
    references = [[ref] if isinstance(ref, str) else list(ref) for ref in references]
    if any(not refs for refs in references):
        raise ValueError("every prediction needs at least one reference")
    if any(text is None for text in predictions) or any(text is None for refs in references for text in refs):
        raise ValueError(f"{metric} scores strings, got None")
    return references


def sample_weights(sample_weight, num_examples: int) -> np.ndarray | None:
    """`sample_weight` checked to be one finite, non-negative weight per example (scikit-learn checks only the count,
    and with a message that does not name the argument)."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=np.float64)
    if weights.shape != (num_examples,):
        raise ValueError(f"sample_weight must hold one weight per example ({num_examples}), got shape {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("sample_weight must be finite and non-negative")
    return weights
