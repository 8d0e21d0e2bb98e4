"""The embedded default corpus: docstrings and function signatures of the Python standard library, read offline
from its source files.

Sources are parsed with `ast`, never imported (some stdlib modules act on import). Each docstring comes with
what it documents (module, class or function; its name, package and parameters), and each function definition with
its signature as written, which the embedded tasks in `data.py` turn into labels.
"""

import ast
import functools
import hashlib
import sysconfig
from pathlib import Path

_SKIPPED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__pycache__"}
MIN_DOCSTRING_CHARS = 40


def _source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts))


def _parameters(node: ast.AST) -> list[str]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    arguments = node.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
    return [a.arg for a in named if a is not None and a.arg not in ("self", "cls")]


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _records(path: Path, root: Path) -> list[dict]:
    tree = _parse(path)
    if tree is None:
        return []
    relative = path.relative_to(root)
    package = relative.parts[0].removesuffix(".py")
    nodes = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
    ]
    records = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if not doc or len(doc) < MIN_DOCSTRING_CHARS:
            continue
        kind = "module" if isinstance(node, ast.Module) else "class" if isinstance(node, ast.ClassDef) else "function"
        name = path.stem if kind == "module" else node.name
        records.append(
            {
                "path": str(relative),
                "package": package,
                "kind": kind,
                "name": name,
                "parameters": _parameters(node),
                "docstring": doc,
            }
        )
    return records


def in_validation(key: str) -> bool:
    """A stable ~5% validation bucket for `key` (a file path or a text), the same on every machine and run."""
    return hashlib.md5(key.encode()).digest()[0] % 20 == 0


@functools.lru_cache(maxsize=4)
def stdlib_records(max_files: int | None = None) -> tuple[dict, ...]:
    """Every docstring of the running interpreter's standard library with what it documents, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _source_files(root)[:max_files]
    if not files:
        raise FileNotFoundError(f"no Python source files under the standard library folder {root}")
    return tuple(record for path in files for record in _records(path, root))


@functools.lru_cache(maxsize=4)
def stdlib_signatures(max_files: int | None = None) -> tuple[dict, ...]:
    """Every function definition of the standard library, documented or not: its name, its file and its signature as
    written, less `def` and the colon (`get(self, key, default=None)`), in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    signatures = []
    for path in _source_files(root)[:max_files]:
        tree = _parse(path)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                signature = f"{node.name}({ast.unparse(node.args)})"
                signatures.append({"path": str(path.relative_to(root)), "name": node.name, "signature": signature})
    return tuple(signatures)


def stdlib_docstrings(max_files: int | None = None) -> dict[str, list[str]]:
    """Docstrings split ~95/5 into train and validation by file, so validation text comes from unseen modules."""
    splits: dict[str, list[str]] = {"train": [], "validation": []}
    for record in stdlib_records(max_files):
        splits["validation" if in_validation(record["path"]) else "train"].append(record["docstring"])
    return splits
