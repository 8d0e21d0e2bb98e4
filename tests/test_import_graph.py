"""hf_tfm's modules import each other in one direction only: no import cycle, counting every import statement
(function-level ones too; a package's own `__init__` importing its modules is not a cycle). A cycle is how a refactor
quietly couples two layers (the model code and the card code, the CLI and its command handlers did once)."""

import ast
from pathlib import Path

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
    assert len(graph) > 30 and graph["hf_tfm.convert.engine"] >= {
        "hf_tfm.convert.families",
        "hf_tfm.model.modeling_tfm",
    }
    assert cycles(graph) == []


def test_a_cycle_is_found():
    """Negative control: the package init and a module importing each other are one cycle."""
    graph = import_graph()
    graph["hf_tfm.saving"].add("hf_tfm.hub.card")  # what the saving code once did
    assert any({"hf_tfm.saving", "hf_tfm.hub.card"} <= set(cycle) for cycle in cycles(graph))


def test_the_model_bundle_imports_nothing_of_the_package():
    """The model bundle (hf_tfm/model/) ships next to every checkpoint as remote code, flat siblings with relative
    imports: it imports none of the package's other modules (saving, cards and the like are looked up, when loaded),
    and no other module of hf_tfm is imported by it."""
    graph = import_graph()
    bundle = {name for name in graph if name.startswith("hf_tfm.model.")}
    assert len(bundle) >= 10
    for name in bundle:
        assert graph[name] <= bundle, (name, sorted(graph[name] - bundle))


def test_no_module_keeps_an_old_name():
    """No shims: the module renames of the plain-core layout are gone (the package is 0.1.0, with no users of them)."""
    package = REPO / "hf_tfm"
    assert not (package / "moved.py").exists() and not (package / "cli.py").exists()
    assert not [path.name for path in package.glob("modeling_tfm*.py")]


def test_no_test_module_imports_another():
    """What several test files share lives in tests/support/ (or conftest.py): a test module imported by another
    would run its tests' module-level set-up there, and its helpers would change with tests that do not name them."""
    tests = {path.stem for path in (REPO / "tests").glob("test_*.py")}
    importing = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            importing += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] in tests]
    assert importing == []
