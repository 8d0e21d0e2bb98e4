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
"""Exact match: the fraction of predicted strings equal to their reference. An `evaluate` metric module."""

import re
import string
import unicodedata

import evaluate
import numpy as np

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
Exact match is the fraction of predictions that are, character for character, the same string as their reference,
after the optional normalisations below (all off by default, as in the Hub's `exact_match`). They apply in this
order: `regexes_to_ignore`, `ignore_case`, `ignore_punctuation`, `ignore_numbers`, `strip`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): predicted texts.
    references (`list` of `str`): reference texts, as many as the predictions.
    regexes_to_ignore (`list` of `str`, *optional*): regular expressions whose matches are deleted first.
    ignore_case (`bool`, defaults to `False`): compare case-folded strings (`str.casefold`, so "Straße" == "STRASSE").
    ignore_punctuation (`bool`, defaults to `False`): delete ASCII punctuation (`string.punctuation`) and every
        Unicode punctuation character (categories P*: « » ¿ 。 …).
    ignore_numbers (`bool`, defaults to `False`): delete the digits 0-9.
    strip (`bool`, defaults to `False`): strip leading and trailing whitespace and collapse inner runs of whitespace to
        one space.

Returns:
    exact_match (`float`): from 0 to 1, the fraction of exact matches.

Examples:

    >>> exact_match = hf_tfm.training.metrics.load_metric("exact_match")
    >>> exact_match.compute(predictions=["Paris", "rome "], references=["Paris", "Rome"])
    {'exact_match': 0.5}
    >>> exact_match.compute(predictions=["Paris", "rome "], references=["Paris", "Rome"], ignore_case=True, strip=True)
    {'exact_match': 1.0}
"""

_CITATION = """
@inproceedings{rajpurkar-etal-2016-squad, title = "{SQ}u{AD}: 100,000+ Questions for Machine Comprehension of Text",
    author = "Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy",
    booktitle = "Proceedings of the 2016 Conference on Empirical Methods in Natural Language Processing",
    year = "2016", pages = "2383--2392"}
"""

_WHITESPACE = re.compile(r"\s+")
_DIGITS = str.maketrans("", "", string.digits)


def _strip_punctuation(text):
    return "".join(
        char for char in text if char not in string.punctuation and not unicodedata.category(char).startswith("P")
    )


def normalize(
    text, regexes_to_ignore=None, ignore_case=False, ignore_punctuation=False, ignore_numbers=False, strip=False
):
    """One string normalised as `exact_match` compares it."""
    for pattern in regexes_to_ignore or ():
        text = re.sub(pattern, "", text)
    if ignore_case:
        text = text.casefold()
    if ignore_punctuation:
        text = _strip_punctuation(text)
    if ignore_numbers:
        text = text.translate(_DIGITS)
    if strip:
        text = _WHITESPACE.sub(" ", text).strip()
    return text


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, shared.TEXTS)
class ExactMatch(evaluate.Metric):
    def _compute(
        self,
        predictions,
        references,
        regexes_to_ignore=None,
        ignore_case=False,
        ignore_punctuation=False,
        ignore_numbers=False,
        strip=False,
    ):
        shared.check_pairs("exact_match", predictions, references)
        if any(text is None for text in (*predictions, *references)):
            raise ValueError("exact_match compares strings, got None")
        if isinstance(regexes_to_ignore, str):
            regexes_to_ignore = [regexes_to_ignore]
        options = {
            "regexes_to_ignore": regexes_to_ignore,
            "ignore_case": ignore_case,
            "ignore_punctuation": ignore_punctuation,
            "ignore_numbers": ignore_numbers,
            "strip": strip,
        }
        matches = [
            normalize(prediction, **options) == normalize(reference, **options)
            for prediction, reference in zip(predictions, references)
        ]
        return {"exact_match": float(np.mean(matches))}
