"""hf_tfm's modules import each other in one direction only: no import cycle, counting every import statement
(function-level ones too; a package's own `__init__` importing its modules is not a cycle). A cycle is how a refactor
quietly couples two layers (the model code and the card code, the CLI and its command handlers did once)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tfm.moved import MOVED

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hf_tfm", "hf_tfm_cli")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "metrics" in path.parts:  # evaluate's metric scripts, loaded by path
                continue
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict) -> set[str]:
    """The modules of `modules` an import statement runs: each target, and for `from x import y` the submodule y."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        if node.level:
            package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            base = ".".join(part for part in (package, node.module) if part)
        else:
            base = node.module
        targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = set()
    for target in targets:
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        if target in modules and target != module and not module.startswith(target + "."):
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[name] |= imported(name, path, node, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, found = {}, {}, [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 30 and graph["hf_tfm.convert.engine"] >= {"hf_tfm.convert.families", "hf_tfm.modeling_tfm"}
    assert cycles(graph) == []


def test_a_cycle_is_found():
    """Negative control: the package init and a module importing each other are one cycle."""
    graph = import_graph()
    graph["hf_tfm.modeling_tfm_saving"].add("hf_tfm.hub.card")  # what the saving code once did
    assert any({"hf_tfm.modeling_tfm_saving", "hf_tfm.hub.card"} <= set(cycle) for cycle in cycles(graph))


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_keeps_its_old_name_for_a_release(old):
    """hf_tfm/moved.py: importing a module by the name it had before the plain-core layout warns, naming its new place,
    and gives the new module itself (its private names too), in a fresh interpreter so the warning is not cached."""
    new = MOVED[old]
    script = f"""
import importlib, warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    importlib.import_module({old!r})
except DeprecationWarning as warning:
    print("warned:", warning)
warnings.simplefilter("ignore", DeprecationWarning)
print("same:", importlib.import_module({old!r}) is importlib.import_module({new!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"warned: {old} moved to {new}" in result.stdout and "same: True" in result.stdout
