"""How long the read is from a causal LM's head down to its attention: the distinct functions of hf_tfm that one
training forward (with labels) of a Llama-converted model runs, against the functions of transformers'
`modeling_llama.py` that `LlamaForCausalLM` runs, counted with `sys.setprofile`; the decision points those functions
hold; plus the lines of those functions and of the package's main parts.

    python -m benchmarks.reading_path

Comprehension and generator-expression frames are counted apart: Python 3.11 gives each its own frame, Python 3.12
inlines them (PEP 709). Llama's loss and masks live in transformers' shared modules, not in modeling_llama.py, so they
are not in its count; hf_tfm's own loss is in its. So Llama is counted again with its loss (`loss_utils.py`), and both
sides with every function of transformers that they run (the loss, the masks, the output decorators, the attention
interface): the whole read.

A decision point is a branch a reader must follow: an `if` statement or clause (a comprehension's too), a conditional
expression, a loop (`for`, `while`, a comprehension's `for`), and each operand of `and` / `or` past the first. They are
counted on the source of every function that runs, taken or not; a comprehension or lambda is counted with the function
that holds it, and a lambda defined at module level (a rules table's) on its own.
"""

import ast
import inspect
import sys
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import hf_tfm
from hf_tfm.convert import to_tfm
from hf_tfm.model.configuration_tfm import TfmConfig

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


def decision_points(node: ast.AST) -> int:
    """The branches in `node`'s source: if statements and clauses, conditional expressions, loops, and each `and` /
    `or` operand past the first."""
    count = 0
    for child in ast.walk(node):
        if isinstance(child, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While)):
            count += 1
        elif isinstance(child, ast.comprehension):
            count += 1 + len(child.ifs)
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
    return count


def _function_nodes(filename: str) -> dict[int, ast.AST]:
    """Each function and lambda of a file by the first line of its code object (a decorated function's first
    decorator), the nested ones left out: their branches are counted with the function that holds them."""
    nodes = {}

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            is_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if is_function and not nested:
                decorators = getattr(child, "decorator_list", [])
                nodes[min([child.lineno] + [decorator.lineno for decorator in decorators])] = child
            visit(child, nested or is_function)

    visit(ast.parse(Path(filename).read_text()), nested=False)
    return nodes


def branches(codes: list) -> int:
    """The decision points of the functions `codes` run (comprehension frames are counted with their function)."""
    trees, total = {}, 0
    for code in codes:
        nodes = trees.setdefault(code.co_filename, _function_nodes(code.co_filename))
        node = nodes.get(code.co_firstlineno)
        if node is not None and (code.co_name == "<lambda>") == isinstance(node, ast.Lambda):
            total += decision_points(node)
    return total


def summary(codes: list) -> dict:
    named = [code for code in codes if not code.co_name.startswith("<")]  # not <listcomp>, <genexpr>, ...
    return {
        "functions": len(named),
        "comprehension_frames": len(codes) - len(named),
        "decision_points": branches(codes),
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
            "model bundle (hf_tfm/model/, what ships as remote code)": sum(
                len(path.read_text().splitlines())
                for path in (PACKAGE / "model").glob("*.py")
                if path.name != "__init__.py"
            ),
            "package": package_lines,
        },
    }


def main() -> None:
    result = reading_path()
    for side in ("hf_tfm", "llama", "llama with its loss", "hf_tfm and transformers", "llama and transformers"):
        counts = result[side]
        print(
            f"{side}: {counts['functions']} functions ({counts['comprehension_frames']} comprehension frames more), "
            f"{counts['decision_points']} decision points, {counts['lines']} lines"
        )
        if side in ("hf_tfm", "llama"):
            for name in counts["names"]:
                print(f"    {name}")
    for part, lines in result["lines"].items():
        print(f"{part}: {lines} lines")


if __name__ == "__main__":
    main()
