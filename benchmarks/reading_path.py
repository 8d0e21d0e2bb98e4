"""How long the read is from a causal LM's head down to its attention: the distinct functions of hf_tfm that one
training forward (with labels) of a Llama-converted model runs, against the functions of transformers'
`modeling_llama.py` that `LlamaForCausalLM` runs, counted with `sys.setprofile`; plus the lines of those functions
and of the package's main parts.

    python -m benchmarks.reading_path

Comprehension and generator-expression frames are counted apart: Python 3.11 gives each its own frame, Python 3.12
inlines them (PEP 709). Llama's loss and masks live in transformers' shared modules, not in modeling_llama.py, so they
are not in its count; hf_tfm's own loss is in its. So Llama is counted again with its loss (`loss_utils.py`), and both
sides with every function of transformers that they run (the loss, the masks, the output decorators, the attention
interface): the whole read.
"""

import inspect
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import hf_tfm
from hf_tfm.configuration_tfm import TfmConfig
from hf_tfm.convert import to_tfm

PACKAGE = Path(hf_tfm.__file__).resolve().parent
TRANSFORMERS = Path(transformers.__file__).resolve().parent


def functions_run(model: torch.nn.Module, inputs: dict, belongs) -> list:
    """The code objects of the functions `belongs(filename)` accepts that one forward of `model` runs (after one
    untimed forward, so lazily built state is not counted)."""
    model(**inputs)
    seen = {}

    def profile(frame, event, arg):
        if event == "call" and belongs(frame.f_code.co_filename):
            seen[frame.f_code] = None

    sys.setprofile(profile)
    try:
        model(**inputs)
    finally:
        sys.setprofile(None)
    return list(seen)


def in_hf_tfm_or_transformers(filename: str) -> bool:
    return filename.startswith((str(PACKAGE), str(TRANSFORMERS)))


def summary(codes: list) -> dict:
    named = [code for code in codes if not code.co_name.startswith("<")]  # not <listcomp>, <genexpr>, ...
    return {
        "functions": len(named),
        "comprehension_frames": len(codes) - len(named),
        "lines": sum(len(inspect.getsource(code).splitlines()) for code in named),
        "names": sorted(f"{Path(code.co_filename).name}: {code.co_qualname}" for code in named),
    }


def reading_path() -> dict:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    reference = LlamaForCausalLM(config).train()
    ours = to_tfm(reference).train()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    inputs = {"input_ids": ids, "labels": ids}
    package_lines = sum(len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py"))
    return {
        "hf_tfm": summary(functions_run(ours, inputs, lambda name: name.startswith(str(PACKAGE)))),
        "llama": summary(functions_run(reference, inputs, lambda name: name.endswith("modeling_llama.py"))),
        # Llama's loss is transformers' loss_utils, hf_tfm's its own module: both sides with their loss
        "llama with its loss": summary(
            functions_run(reference, inputs, lambda name: name.endswith(("modeling_llama.py", "loss_utils.py")))
        ),
        # the whole read, transformers' shared modules included (the loss, the masks, the output decorators)
        "hf_tfm and transformers": summary(functions_run(ours, inputs, in_hf_tfm_or_transformers)),
        "llama and transformers": summary(functions_run(reference, inputs, in_hf_tfm_or_transformers)),
        "lines": {
            "TfmConfig": len(inspect.getsource(TfmConfig).splitlines()),
            "modeling_tfm.py (the heads)": len((PACKAGE / "modeling_tfm.py").read_text().splitlines()),
            "package": package_lines,
        },
    }


def main() -> None:
    result = reading_path()
    for side in ("hf_tfm", "llama", "llama with its loss", "hf_tfm and transformers", "llama and transformers"):
        counts = result[side]
        print(
            f"{side}: {counts['functions']} functions ({counts['comprehension_frames']} comprehension frames more), "
            f"{counts['lines']} lines"
        )
        if side in ("hf_tfm", "llama"):
            for name in counts["names"]:
                print(f"    {name}")
    for part, lines in result["lines"].items():
        print(f"{part}: {lines} lines")


if __name__ == "__main__":
    main()
