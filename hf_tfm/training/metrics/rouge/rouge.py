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
"""ROUGE F-measures with Google's `rouge_score` package. An `evaluate` metric module."""

import evaluate
import numpy as np
from rouge_score import rouge_scorer

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
ROUGE (Recall-Oriented Understudy for Gisting Evaluation, Lin 2004) compares a generated text with one or more
references: `rouge1` and `rouge2` from overlapping unigrams and bigrams, `rougeL` from the longest common subsequence
of the whole texts, and `rougeLsum` from the summary-level LCS over sentences separated by newlines ("\\n"): put one
sentence per line for `rougeLsum` (this module does not split sentences, which would need nltk's punkt data).

Scores are F-measures from 0 to 1, computed by `rouge_score.rouge_scorer.RougeScorer`. With several references,
each prediction takes the reference with the best F-measure (`RougeScorer.score_multi`). The aggregate is the plain
mean over the examples, deterministic and exact; the Hub's `rouge` reports the median of bootstrap resamples of that
mean (`BootstrapAggregator`'s mid), which differs from it slightly.

The default tokenizer of `rouge_score` lowercases and keeps only the ASCII letters and digits [a-z0-9]: text in
another script scores 0. Pass `tokenizer` (a callable from a string to a list of tokens) for such text.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the generated texts.
    references (`list` of `str`, or `list` of `list` of `str`): one or several references per prediction.
    rouge_types (`list` of `str` or `str`, defaults to `["rouge1", "rouge2", "rougeL", "rougeLsum"]`): any of
        `rouge1` ... `rouge9`, `rougeL`, `rougeLsum`.
    use_aggregator (`bool`, defaults to `True`): return the mean F-measure of each type; with `False`, the list of the
        per-example F-measures.
    use_stemmer (`bool`, defaults to `False`): apply the Porter stemmer to the words of more than 3 letters (default
        tokenizer only).
    tokenizer (callable, *optional*): from a string to its list of tokens, replacing `rouge_score`'s default tokenizer.

Returns:
    a dict from each ROUGE type to its F-measure (`float`), or to the list of per-example F-measures.

Examples:

    >>> rouge = hf_tfm.training.metrics.load_metric("rouge")
    >>> rouge.compute(predictions=["the cat sat"], references=["the cat sat down"], rouge_types=["rouge1"])
    {'rouge1': 0.8571428571428571}
"""

_CITATION = """
@inproceedings{lin-2004-rouge, title = "{ROUGE}: A Package for Automatic Evaluation of Summaries",
    author = "Lin, Chin-Yew", booktitle = "Text Summarization Branches Out", year = "2004",
    address = "Barcelona, Spain", publisher = "Association for Computational Linguistics", pages = "74--81"}
"""

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


class _CallableTokenizer:
    """Adapts a callable to the `tokenize` method `rouge_score` expects."""

    def __init__(self, function):
        self.function = function

    def tokenize(self, text):
        return list(self.function(text))


def _check_rouge_type(rouge_type):
    if rouge_type in ("rougeL", "rougeLsum"):
        return
    if len(rouge_type) == 6 and rouge_type.startswith("rouge") and rouge_type[5] in "123456789":
        return
    raise ValueError(f"unknown ROUGE type {rouge_type!r}: use rouge1 ... rouge9, rougeL or rougeLsum")


_URLS = {
    "codebase_urls": ["https://github.com/google-research/google-research/tree/master/rouge"],
    "reference_urls": ["https://aclanthology.org/W04-1013/"],
}


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, shared.TEXTS_WITH_REFERENCES, **_URLS)
class Rouge(evaluate.Metric):
    def _compute(
        self, predictions, references, rouge_types=None, use_aggregator=True, use_stemmer=False, tokenizer=None
    ):
        references = shared.reference_lists("rouge", predictions, references)
        if rouge_types is None:
            rouge_types = DEFAULT_ROUGE_TYPES
        elif isinstance(rouge_types, str):
            rouge_types = [rouge_types]
        rouge_types = list(rouge_types)
        if not rouge_types:
            raise ValueError("rouge_types must name at least one ROUGE type")
        for rouge_type in rouge_types:
            _check_rouge_type(rouge_type)

        scorer = rouge_scorer.RougeScorer(
            rouge_types=rouge_types,
            use_stemmer=use_stemmer,
            tokenizer=None if tokenizer is None else _CallableTokenizer(tokenizer),
        )
        scores = {rouge_type: [] for rouge_type in rouge_types}
        for prediction, refs in zip(predictions, references):
            result = scorer.score(refs[0], prediction) if len(refs) == 1 else scorer.score_multi(refs, prediction)
            for rouge_type in rouge_types:
                scores[rouge_type].append(float(result[rouge_type].fmeasure))
        if use_aggregator:
            return {rouge_type: float(np.mean(values)) for rouge_type, values in scores.items()}
        return scores
