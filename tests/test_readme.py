"""README.md as a first-time user reads it: every Python snippet runs as written (from an empty folder, offline),
every repository path, test and module it names exists."""

import importlib
import importlib.util
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)
PROSE = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
# the repository's own top-level folders and files: a word starting with one of them is a path in the repository
TOP_LEVEL = {"hf_tfm", "hf_tfm_cli", "tests", "benchmarks", "examples", "docs", ".ci", "configs", "model_cards"}
TOP_FILES = {"Makefile", "pyproject.toml", "README.md", "CONTRIBUTING.md", "CHANGELOG.md", "LICENSE"}


def _words() -> list[str]:
    """Every whitespace-separated word inside a `code span`, and every link target."""
    spans = re.findall(r"`([^`]+)`", PROSE) + re.findall(r"\]\(([^)\s]+)\)", PROSE)
    return [word.split("(")[0].rstrip(".,;:)'\"").lstrip("'\"") for span in spans for word in span.split()]


def _expand_braces(word: str) -> list[str]:
    """`examples/train_{a,b}.py` -> the two paths."""
    parts = re.split(r"\{([^}]*)\}", word)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(combination) for combination in itertools.product(*choices)]


def repository_paths() -> list[str]:
    paths = set()
    for word in _words():
        if "<" in word or "*" in word or "://" in word:  # placeholders, globs, addresses
            continue
        if word.split("/")[0] in TOP_LEVEL and "/" in word or word in TOP_FILES:
            paths.update(_expand_braces(word))
    return sorted(paths)


def module_names() -> list[str]:
    """Dotted names of hf_tfm and the benchmarks (`hf_tfm.convert.upcycle.upcycle`, `python -m benchmarks.report`)."""
    return sorted({word for word in _words() if re.fullmatch(r"(hf_tfm|benchmarks)(\.\w+)+", word)})


def test_readme_names_paths_and_modules():
    """Guards the extraction itself: the README names many paths, tests and modules."""
    assert len(PYTHON_BLOCKS) >= 1
    assert "tests/test_config.py" in repository_paths() and "examples/train_seq2seq.py" in repository_paths()
    assert "hf_tfm.convert.upcycle.upcycle" in module_names()


@pytest.mark.parametrize("path", repository_paths())
def test_readme_path_exists(path):
    file, _, test_name = path.partition("::")
    assert (REPO / file).exists(), f"README.md names {file}, which does not exist"
    if test_name:
        assert re.search(rf"^def {re.escape(test_name)}\(", (REPO / file).read_text(), re.M), f"no {path}"


@pytest.mark.parametrize("name", module_names())
def test_readme_module_exists(name):
    parts = name.split(".")
    for end in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        module_name = ".".join(parts[:end])
        try:
            if importlib.util.find_spec(module_name) is not None:
                break
        except ModuleNotFoundError:
            continue
    else:
        pytest.fail(f"README.md names {name}: no such module")
    target = importlib.import_module(module_name) if end < len(parts) else None
    for attribute in parts[end:]:
        assert hasattr(target, attribute), f"README.md names {name}: {module_name} has no {attribute}"
        target = getattr(target, attribute)


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_snippet_runs_as_written(index, tmp_path):
    """From an empty folder, offline, with the installed hf_tfm (not the checkout on sys.path). A `print(...)` line
    whose comment shows the output must print it."""
    snippet = PYTHON_BLOCKS[index]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README snippet {index + 1} fails:\n{result.stderr[-3000:]}"
    for expected in re.findall(r"^print\(.*\)\s+#\s*(.+?)\s*$", snippet, re.M):
        assert expected in result.stdout, f"README snippet {index + 1} prints {result.stdout!r}, not {expected!r}"


def test_readme_documents_every_config_field():
    """The config tables name every field an hf_tfm config adds to transformers' PreTrainedConfig."""
    import dataclasses

    from transformers import PreTrainedConfig

    from hf_tfm import TfmEncoderDecoderConfig

    inherited = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    fields = [field.name for field in dataclasses.fields(TfmEncoderDecoderConfig) if field.name not in inherited]
    assert [name for name in fields if f"`{name}`" not in README] == []
