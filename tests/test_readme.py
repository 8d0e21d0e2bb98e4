"""README.md and the guides in docs/ as a first-time user reads them: every Python snippet runs as written (from an
empty folder, offline), every repository path, test and module they name exists, every link resolves, and the
guides document every config field."""

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
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # what a user reads, front page first
TEXTS = {page.relative_to(REPO).as_posix(): page.read_text() for page in PAGES}
TEXT = "\n".join(TEXTS.values())  # every page, for what any of them names


def code_blocks(language: str) -> list[tuple[str, int, str]]:
    """(page, its n-th block of `language`, the block) for every page."""
    return [
        (name, index, block)
        for name, text in TEXTS.items()
        for index, block in enumerate(re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S))
    ]


PYTHON_BLOCKS = code_blocks("python")
SHELL_BLOCKS = code_blocks("bash")
# shell blocks the suite cannot run inside itself, each with the file that runs its commands instead
RUN_ELSEWHERE = {
    ("README.md", 0): ".ci/run",  # make test: CI runs it; make run: `hf-tfm demo`, test_main_job_smoke runs it
    ("docs/serving.md", 0): "tests/support/vllm_serving.py",  # vLLM lives in its own venv (make test-vllm)
}
PROSES = [re.sub(r"^```.*?^```", "", text, flags=re.M | re.S) for text in TEXTS.values()]  # each page's, apart
# the Markdown files whose links must resolve: the pages, and the repository's other documents
LINKED = [
    *PAGES,
    *(REPO / name for name in ("CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/README.md", "benchmarks/NOTES.md")),
    REPO / "configs" / "accelerate" / "README.md",
]
# the repository's own top-level folders and files: a word starting with one of them is a path in the repository
TOP_LEVEL = {"hf_tfm", "hf_tfm_cli", "tests", "benchmarks", "examples", "docs", ".ci", "configs", "model_cards"}
TOP_FILES = {"Makefile", "pyproject.toml", "README.md", "CONTRIBUTING.md", "CHANGELOG.md", "LICENSE"}


def _words() -> list[str]:
    """Every whitespace-separated word inside a `code span`, and every link target."""
    spans = [span for prose in PROSES for span in re.findall(r"`([^`]+)`", prose)]
    spans += [target for prose in PROSES for target in re.findall(r"\]\(([^)\s#]+)", prose)]  # without the anchor
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
    """Guards the extraction itself: the pages name many paths, tests and modules, and hold snippets."""
    assert {name for name, _, _ in PYTHON_BLOCKS} >= {"README.md", "docs/models.md", "docs/convert.md"}
    assert "tests/test_config.py" in repository_paths() and "examples/train_seq2seq.py" in repository_paths()
    assert "hf_tfm.convert.upcycle.upcycle" in module_names()
    assert len(TEXT.splitlines()) > 5 * len(TEXTS["README.md"].splitlines())  # the guides hold the detail


def test_readme_is_a_front_page():
    """README.md leads with the two commands and stays a page a reader takes in at once; the detail is in docs/."""
    front = TEXTS["README.md"]
    assert len(front.splitlines()) <= 160
    commands = re.search(r"^```bash\n(.*?)^```", front, re.M | re.S).group(1).splitlines()
    assert [line.split()[:2] for line in commands] == [["make", "run"], ["make", "test"]]
    assert all(f"(docs/{page.name})" in front for page in PAGES[1:]), "a guide the front page does not link"


def links() -> list[tuple[str, str]]:
    """(file, link target) for every relative Markdown link of the linked documents."""
    found = []
    for document in LINKED:
        prose = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if not re.match(r"[a-z]+://", target):
                found.append((document.relative_to(REPO).as_posix(), target))
    return found


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub (and mkdocs) give a page's headings: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.*)$", text, re.M)
    }


@pytest.mark.parametrize("document, target", links())
def test_readme_link_resolves(document, target):
    file, _, anchor = target.partition("#")
    path = (REPO / document).parent / file if file else REPO / document
    assert path.exists(), f"{document} links {target}: no such file"
    if anchor:
        assert anchor in heading_anchors(path.read_text()), f"{document} links {target}: no such heading"


@pytest.mark.parametrize("path", repository_paths())
def test_readme_path_exists(path):
    file, _, test_name = path.partition("::")
    assert (REPO / file).exists(), f"the pages name {file}, which does not exist"
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
        pytest.fail(f"the pages name {name}: no such module")
    target = importlib.import_module(module_name) if end < len(parts) else None
    for attribute in parts[end:]:
        assert hasattr(target, attribute), f"the pages name {name}: {module_name} has no {attribute}"
        target = getattr(target, attribute)


def user_env(tmp_path: Path) -> dict:
    """A first-time user's environment: offline, the installed hf_tfm (not the checkout on sys.path), a module cache
    of the test's own."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}


@pytest.mark.parametrize("page, index, snippet", PYTHON_BLOCKS, ids=[f"{p}-{i + 1}" for p, i, _ in PYTHON_BLOCKS])
@pytest.mark.slow
def test_readme_python_snippet_runs_as_written(page, index, snippet, tmp_path):
    """From an empty folder, offline, with the installed hf_tfm (not the checkout on sys.path). A `print(...)` line
    whose comment shows the output must print it."""
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=tmp_path,
        env=user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{page} snippet {index + 1} fails:\n{result.stderr[-3000:]}"
    for expected in re.findall(r"^print\(.*\)\s+#\s*(.+?)\s*$", snippet, re.M):
        assert expected in result.stdout, f"{page} snippet {index + 1} prints {result.stdout!r}, not {expected!r}"


def shell_ids(blocks) -> list[str]:
    return [f"{page}-{index + 1}" for page, index, _ in blocks]


RUN_HERE = [block for block in SHELL_BLOCKS if block[:2] not in RUN_ELSEWHERE]


@pytest.mark.parametrize("page, index, block", RUN_HERE, ids=shell_ids(RUN_HERE))
@pytest.mark.slow
def test_readme_shell_block_runs_as_written(page, index, block, tmp_path):
    """In a folder laid out as the repository's root (its `examples`, `configs` and `benchmarks` linked in, since the
    blocks are written for a clone), offline, with the installed `hf-tfm` and `python` first on PATH: every command
    of the block succeeds (`set -euo pipefail`)."""
    for folder in ("examples", "configs", "benchmarks"):
        (tmp_path / folder).symlink_to(REPO / folder)
    env = {
        **user_env(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",  # two processes share two cores: torch's spinning threads would slow both
        "TOKENIZERS_PARALLELISM": "false",
    }
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"{page} shell block {index + 1} fails:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )


ELSEWHERE = [block for block in SHELL_BLOCKS if block[:2] in RUN_ELSEWHERE]


def test_every_block_not_run_here_exists():
    assert sorted(RUN_ELSEWHERE) == sorted(block[:2] for block in ELSEWHERE)


@pytest.mark.parametrize("page, index, block", ELSEWHERE, ids=shell_ids(ELSEWHERE))
def test_readme_shell_block_not_run_here_runs_elsewhere(page, index, block):
    """A block the suite cannot run inside itself (the set-up commands, a vLLM server): every option and `make`
    target of the block appears in the file that runs it instead."""
    runner = (REPO / RUN_ELSEWHERE[page, index]).read_text()
    code = re.sub(r"#.*", "", block)
    words = re.findall(r"(?<!\S)--[a-z-]+", code) + [f"make {target}" for target in re.findall(r"\bmake (\w+)", code)]
    missing = [word for word in words if word not in runner and word != "make run"]
    assert missing == [], f"{page} shell block {index + 1}: {RUN_ELSEWHERE[page, index]} does not run {missing}"
    if "make run" in code:  # the main job (`hf-tfm demo`), which test_main_job_smoke runs at 1% of its steps
        assert "hf-tfm demo" in (REPO / "Makefile").read_text()
        assert "def test_main_job_smoke(" in (REPO / "tests" / "test_train.py").read_text()


def test_readme_documents_every_config_field():
    """The guides' config tables (docs/models.md, docs/moe.md) name every field an hf_tfm config adds to
    transformers' PreTrainedConfig."""
    import dataclasses

    from transformers import PreTrainedConfig

    from hf_tfm import TfmEncoderDecoderConfig

    inherited = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    fields = [field.name for field in dataclasses.fields(TfmEncoderDecoderConfig) if field.name not in inherited]
    tables = TEXTS["docs/models.md"] + TEXTS["docs/moe.md"]
    assert [name for name in fields if f"`{name}`" not in tables] == []


def test_the_backend_table_is_the_rules():
    """docs/models.md's table of what each backend refuses is the one `python -m hf_tfm.tables` prints."""
    from hf_tfm.tables import backends_table

    assert backends_table() in TEXTS["docs/models.md"], "docs/models.md's table is stale: python -m hf_tfm.tables"
