"""A regression guard for decode speed that timing noise cannot fool: per batch-1 greedy decode step of `generate()`
(dynamic and static cache; dense, MoE, sliding-window, sink, latent-attention and encoder-decoder pairs), the Python
function calls (cProfile) and the aten operators dispatched, hf_tfm against the reference class holding the same
weights (`benchmarks.profile_gap.generate_step_counts`). Counts do not depend on the machine's load.

Aten operators (GPU kernels) may cost at most each pair's committed budget, a multiple of the reference's count,
lowered when a change brings the count down, never raised to let a regression through. Python calls have one loose
budget for every pair (issue 29): a GPU pays for kernels, not interpreter frames, and readable code wins over a saved
frame; the budget still catches a per-layer or per-token regression (llama dynamic sits highest, at 1.30x)."""

import math

import pytest
import torch

from benchmarks.pairs import PROFILES, build_pair
from benchmarks.profile_gap import generate_step_counts
from hf_tfm.modeling_tfm_stack import TfmBlock

PYTHON_CALLS_BUDGET = 1.35
# (pair, cache): (Python calls, aten operators), hf_tfm / reference, measured on transformers 5.24 at the smoke shapes;
# the Python-call column is the loose PYTHON_CALLS_BUDGET for every pair. Decode runs q/k/v as three matmuls, as
# Llama's reference does (joint_projections joins them only in training): GPT-2's reference runs one (c_attn), so
# its pairs count two operators more per layer than before issue 29
BUDGETS = {
    ("gpt2", "dynamic"): (PYTHON_CALLS_BUDGET, 1.19),
    ("gpt2", "static"): (PYTHON_CALLS_BUDGET, 1.15),
    ("llama", "dynamic"): (PYTHON_CALLS_BUDGET, 1.00),
    ("llama", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("mixtral", "dynamic"): (PYTHON_CALLS_BUDGET, 1.00),
    ("mixtral", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("qwen3", "dynamic"): (PYTHON_CALLS_BUDGET, 1.00),
    ("qwen3", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("gemma2", "dynamic"): (PYTHON_CALLS_BUDGET, 1.00),
    ("gemma2", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("t5", "dynamic"): (PYTHON_CALLS_BUDGET, 1.14),
    ("t5", "static"): (PYTHON_CALLS_BUDGET, 1.01),
    ("bart", "dynamic"): (PYTHON_CALLS_BUDGET, 0.97),
    ("bart", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("qwen2_moe", "dynamic"): (PYTHON_CALLS_BUDGET, 0.91),
    ("qwen2_moe", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("gemma3_text", "dynamic"): (PYTHON_CALLS_BUDGET, 1.00),
    ("gemma3_text", "static"): (PYTHON_CALLS_BUDGET, 1.00),
    ("gpt_oss", "dynamic"): (PYTHON_CALLS_BUDGET, 1.02),
    ("gpt_oss", "static"): (PYTHON_CALLS_BUDGET, 1.02),
    ("deepseek_v3", "dynamic"): (PYTHON_CALLS_BUDGET, 0.95),
    ("deepseek_v3", "static"): (PYTHON_CALLS_BUDGET, 0.96),
}


def pair(name: str):
    return build_pair(name, PROFILES["smoke"]["pairs"][name]["config"])


@pytest.mark.parametrize(("name", "cache"), list(BUDGETS))
def test_a_decode_step_costs_no_more_than_its_budget(name, cache):
    reference, ours = pair(name)
    theirs, mine = generate_step_counts(reference, cache), generate_step_counts(ours, cache)
    for index, measure in enumerate(("python_calls", "aten_ops")):
        budget = BUDGETS[(name, cache)][index]
        ratio = mine[measure] / theirs[measure]
        assert ratio <= budget + 1e-9, (
            f"{name} {cache} cache: {mine[measure]:.0f} {measure} per decode step against the reference's "
            f"{theirs[measure]:.0f} ({ratio:.3f}x), over the budget of {budget}x"
        )


def test_the_counts_are_exact_and_see_a_regression(monkeypatch):
    _, model = pair("llama")
    counts = generate_step_counts(model)
    assert generate_step_counts(model) == counts  # the same work, the same counts
    assert all(value > 0 and math.isclose(value, round(value)) for value in counts.values())
    forward = TfmBlock.forward

    def slower(self, *args, **kwargs):  # one needless Python call and one operator per layer
        abs(torch.zeros(()))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(TfmBlock, "forward", slower)
    layers = model.config.num_hidden_layers
    slowed = generate_step_counts(model)
    assert slowed["python_calls"] >= counts["python_calls"] + 2 * layers
    assert slowed["aten_ops"] >= counts["aten_ops"] + layers
