"""The read from a causal LM's head to its attention stays short (issue 31): the distinct hf_tfm functions one
training forward of a Llama-converted model runs (`benchmarks.reading_path`), an exact count, against a budget that
only comes down. 35 before issue 31, LlamaForCausalLM's modeling file 9."""

from benchmarks.reading_path import reading_path

READING_PATH_BUDGET = 21


def test_the_reading_path_stays_within_its_budget():
    result = reading_path()
    ours, llama = result["hf_tfm"], result["llama"]
    assert ours["functions"] <= READING_PATH_BUDGET, "\n".join(ours["names"])
    assert llama["functions"] == 9, llama["names"]  # the count sees the reference's classes (the control)
    # one forward per module: the block, the stack, the attention each run one body
    assert sum(name.endswith("TfmBlock.forward") for name in ours["names"]) == 1
    assert not any("plain" in name or "maybe_dropout" in name for name in ours["names"])
