"""The embedded default corpus: docstrings of the Python standard library, read offline from its source files.

Sources are parsed with `ast`, never imported (some stdlib modules act on import). The split is by file, so
validation text comes from modules the model never trained on.
"""

import ast
import hashlib
import sysconfig
from pathlib import Path

_SKIPPED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__pycache__"}


def _source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts))


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    docs = (ast.get_docstring(node, clean=True) for node in nodes)
    return [doc for doc in docs if doc and len(doc) >= 40]


def stdlib_docstrings(max_files: int | None = None) -> dict[str, list[str]]:
    """Docstrings of the running interpreter's standard library, split ~95/5 into train and validation by file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _source_files(root)[:max_files]
    if not files:
        raise FileNotFoundError(f"no Python source files under the standard library folder {root}")
    splits: dict[str, list[str]] = {"train": [], "validation": []}
    for path in files:
        bucket = hashlib.md5(str(path.relative_to(root)).encode()).digest()[0] % 20
        splits["validation" if bucket == 0 else "train"].extend(_docstrings(path))
    return splits
