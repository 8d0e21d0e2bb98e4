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
"""Corpus BLEU and chrF with the `sacrebleu` library. An `evaluate` metric module."""

import evaluate
import sacrebleu as scb

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
Corpus-level BLEU (Papineni et al., 2002) and chrF (Popović, 2015) computed by SacreBLEU (Post, 2018), which tokenizes
the detokenized texts itself so that scores are comparable across papers. Scores range from 0 to 100, higher is better
(the Hub's `bleu` metric returns 0 to 1 with a different tokenizer; this module matches the Hub's `sacrebleu`).
The returned `signature` records the settings, e.g. `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the system outputs (detokenized).
    references (`list` of `list` of `str`, or `list` of `str`): the references of each prediction; every prediction
        needs the same number of references. A plain string is one reference.
    smooth_method (`str`, defaults to `"exp"`): `"none"`, `"floor"`, `"add-k"` or `"exp"`.
    smooth_value (`float`, *optional*): the value for `"floor"` (0.1) and `"add-k"` (1).
    tokenize (`str`, *optional*): SacreBLEU's tokenizer, `"13a"` by default (`"intl"`, `"zh"`, `"char"`, `"none"`,
        ...); `"ja-mecab"`, `"ko-mecab"` and `"flores*"` need extra packages or downloads.
    lowercase (`bool`, defaults to `False`): lowercase before scoring (BLEU and chrF).
    force (`bool`, defaults to `False`): score text that looks tokenized without a warning.
    use_effective_order (`bool`, defaults to `False`): leave out the n-gram orders with no match (sentence-level use).
    chrf_word_order (`int`, defaults to 0): 2 gives chrF++ instead of chrF.

Returns:
    score (`float`): BLEU, 0 to 100.
    counts (`list` of `int`): matching n-grams for n = 1..4.
    totals (`list` of `int`): n-grams in the predictions for n = 1..4.
    precisions (`list` of `float`): n-gram precisions, 0 to 100.
    bp (`float`): brevity penalty.
    sys_len (`int`): length of the predictions in tokens.
    ref_len (`int`): effective length of the references in tokens.
    chrf (`float`): chrF (or chrF++), 0 to 100.
    signature (`str`): SacreBLEU's BLEU signature.

Examples:

    >>> sacrebleu = hf_tfm.training.metrics.load_metric("sacrebleu")
    >>> result = sacrebleu.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])
    >>> round(result["score"], 1), round(result["chrf"], 1)
    (100.0, 100.0)
"""

_CITATION = """
@inproceedings{post-2018-call, title = "A Call for Clarity in Reporting {BLEU} Scores", author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers", year = "2018",
    pages = "186--191"}
@inproceedings{popovic-2015-chrf, title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\'c}, Maja", booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015", pages = "392--395"}
"""


_URLS = {
    "homepage": "https://github.com/mjpost/sacreBLEU",
    "codebase_urls": ["https://github.com/mjpost/sacreBLEU"],
    "reference_urls": ["https://aclanthology.org/W18-6319/"],
}


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, shared.TEXTS_WITH_REFERENCES, **_URLS)
class Sacrebleu(evaluate.Metric):
    def _compute(self, predictions, references, use_effective_order=False, chrf_word_order=0, **bleu_options):
        # bleu_options: sacrebleu.BLEU's own keywords (smooth_method, smooth_value, tokenize, lowercase, force), with
        # its defaults, which are the Hub metric's; an unknown one is sacrebleu's TypeError, naming it
        references = shared.reference_lists("sacrebleu", predictions, references)
        num_refs = {len(refs) for refs in references}
        if len(num_refs) != 1:
            raise ValueError(f"every prediction needs the same number of references, got {sorted(num_refs)}")
        # sacrebleu wants one stream per reference position: streams[i][j] is the i-th reference of prediction j.
        streams = [list(stream) for stream in zip(*references)]
        bleu = scb.BLEU(effective_order=use_effective_order, **bleu_options)
        score = bleu.corpus_score(predictions, streams)
        chrf = scb.CHRF(word_order=chrf_word_order, lowercase=bleu_options.get("lowercase", False))
        chrf_score = chrf.corpus_score(predictions, streams)
        bleu_fields = ("score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len")
        return {
            **{name: getattr(score, name) for name in bleu_fields},
            "chrf": chrf_score.score,
            "signature": str(bleu.get_signature()),
        }
