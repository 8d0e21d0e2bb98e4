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
"""Perplexity from per-token negative log-likelihoods measured by the caller. An `evaluate` metric module.

Unlike the Hub's `perplexity` metric, which takes texts and a `model_id` and downloads and runs that model itself (so
it cannot work offline, nor on a model that is not on the Hub), this module runs no model: the caller scores the
tokens with its own model and passes the losses.
"""

import datasets
import evaluate
import numpy as np

from hf_tfm.training.metrics import shared

_DESCRIPTION = """
Perplexity (PPL) is the exponential of the mean negative log-likelihood (NLL) per token:

    PPL = exp(sum of the NLL of every scored token / number of scored tokens)

This module runs no model (the Hub's `perplexity` metric downloads `model_id` from the Hub and runs it, which cannot
work offline). The caller measures, with its own model, the NLL of each scored token in nats (natural log, as
`torch.nn.functional.cross_entropy(..., reduction="none")` returns it) and passes one list of losses per sequence,
leaving out the positions that are not scored (padding, prompt, labels of -100).

The corpus perplexity weighs every token equally (longer sequences weigh more), as `exp(eval_loss)` of a
`transformers.Trainer` does when all batches hold the same number of tokens; `mean_perplexity` is instead the mean of
the per-sequence perplexities, the figure the Hub's metric reports as `mean_perplexity`.
"""

_KWARGS_DESCRIPTION = """
Args:
    losses (`list` of `list` of `float`): for each sequence, the negative log-likelihood in nats (>= 0) of each of its
        scored tokens, e.g. `cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none")` with the
        ignored positions removed. Every sequence needs at least one token.

Returns:
    perplexity (`float`): exp(mean NLL over all the tokens of all the sequences).
    mean_loss (`float`): the mean NLL per token, in nats.
    num_tokens (`int`): the number of scored tokens.
    perplexities (`list` of `float`): the perplexity of each sequence.
    mean_perplexity (`float`): the mean of `perplexities`.

Examples:

    >>> perplexity = hf_tfm.training.metrics.load_metric("perplexity")
    >>> result = perplexity.compute(losses=[[0.0, 2.0], [1.0]])
    >>> round(result["perplexity"], 4), result["mean_loss"], result["num_tokens"]
    (2.7183, 1.0, 3)
"""

_CITATION = """
@article{jelinek1977perplexity,
  title={Perplexity--a measure of the difficulty of speech recognition tasks},
  author={Jelinek, Fred and Mercer, Robert L and Bahl, Lalit R and Baker, James K},
  journal={The Journal of the Acoustical Society of America},
  volume={62},
  number={S1},
  pages={S63--S63},
  year={1977}
}
"""

# Rounding in a log-softmax can give a log-likelihood a hair above 0.
_TOLERANCE = 1e-6


_FEATURES = datasets.Features({"losses": datasets.Sequence(datasets.Value("float64"))})
_URL = "https://huggingface.co/docs/transformers/perplexity"


@shared.with_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, _FEATURES, reference_urls=[_URL])
class Perplexity(evaluate.Metric):
    def _compute(self, losses):
        if len(losses) == 0:
            raise ValueError("perplexity needs at least one sequence of losses")
        sums, counts = [], []
        for index, sequence in enumerate(losses):
            if sequence is None or len(sequence) == 0:
                raise ValueError(f"sequence {index} has no scored tokens")
            values = np.asarray(sequence, dtype=np.float64)
            if not np.all(np.isfinite(values)):
                raise ValueError(f"sequence {index} holds a loss that is not finite")
            if np.any(values < -_TOLERANCE):
                raise ValueError(f"sequence {index} holds a negative loss: losses are negative log-likelihoods")
            sums.append(values.sum())
            counts.append(values.size)
        sums, counts = np.asarray(sums), np.asarray(counts)
        mean_loss = float(sums.sum() / counts.sum())
        perplexities = np.exp(sums / counts)
        return {
            "perplexity": float(np.exp(mean_loss)),
            "mean_loss": mean_loss,
            "num_tokens": int(counts.sum()),
            "perplexities": perplexities.tolist(),
            "mean_perplexity": float(perplexities.mean()),
        }
