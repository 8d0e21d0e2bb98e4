"""The read from a causal LM's head to its attention stays short: the distinct hf_tfm functions one training forward of
a Llama-converted model runs, and the decision points they hold (`benchmarks.reading_path`), exact counts against
budgets that only come down. Before the core rebuild: 21 functions, 204 decision points; LlamaForCausalLM's modeling
file 9 functions, 10 decision points. The one rise, 116 to 118 points: LayerDrop's check in the stack's layer loop, a
training feature the references have (benchmarks/NOTES.md)."""

import pytest

from benchmarks.reading_path import reading_path

READING_PATH_BUDGET = 29
DECISION_POINTS_BUDGET = 118  # LayerDrop's draw before each layer (BART, OPT) added the stack's one check


@pytest.mark.slow
def test_the_reading_path_stays_within_its_budget():
    result = reading_path()
    ours, llama = result["hf_tfm"], result["llama"]
    assert ours["functions"] <= READING_PATH_BUDGET, "\n".join(ours["names"])
    assert ours["decision_points"] <= DECISION_POINTS_BUDGET
    # the count sees the reference's classes (the control)
    assert (llama["functions"], llama["decision_points"]) == (9, 10), llama["names"]
    # one forward per module: the block, the stack, the attention each run one body
    assert sum(name.endswith("TfmBlock.forward") for name in ours["names"]) == 1
    # the input validator is one call from the stack's forward
    assert [name for name in ours["names"] if "modeling_tfm_inputs" in name] == [
        "modeling_tfm_inputs.py: InputRules.check"
    ]


def test_decision_points_count_every_branch_kind():
    """The counter's control: each kind of branch the docstring names counts once."""
    import ast

    from benchmarks.reading_path import decision_points

    source = "def f(a, b):\n    if a and b or a:\n        pass\n    x = 1 if a else 2\n    for _ in b:\n        pass\n"
    source += "    while a:\n        break\n    return [y for y in b if y]\n"
    # if, two and/or operands past the first, conditional, for, while, a comprehension's for and its if
    assert decision_points(ast.parse(source)) == 8
