"""Training data for the five tasks: the embedded default (derived offline from the standard library's docstrings
and function signatures), a local text/JSON/CSV/Parquet file, or a `datasets` dataset name. Every source ends as a
`DatasetDict` with `train` and `validation` splits whose columns carry the task's standard names (`Task.columns`),
checked before any training starts.
"""

import ast
import re
from collections import Counter
from pathlib import Path

from datasets import (
    ClassLabel,
    Dataset,
    DatasetDict,
    Features,
    Sequence,
    Value,
    load_dataset,
)

from .corpus import in_validation, stdlib_records, stdlib_signatures
from .tasks import TASKS, check_task

FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
EMBEDDED_NAME = "python-stdlib-docstrings"
TOPIC_CLASSES = 8  # the packages with the most docstrings become the classification labels
MAX_WORDS = 64  # token classification: words per docstring paragraph
MAX_SIGNATURE_CHARS = 100  # seq2seq: longer signatures would not fit the demo's 64 tokens


def _first_paragraph(docstring: str) -> str:
    return " ".join(docstring.split("\n\n")[0].split())


def _split(rows: list[dict], key) -> tuple[list[dict], list[dict]]:
    train = [row for row in rows if not in_validation(key(row))]
    return train, [row for row in rows if in_validation(key(row))]


def _dataset_dict(train: list[dict], validation: list[dict], features: Features) -> DatasetDict:
    def build(rows):
        return Dataset.from_dict({name: [row[name] for row in rows] for name in features}, features=features)

    return DatasetDict(train=build(train), validation=build(validation))


def _embedded_text(records) -> DatasetDict:
    rows = [{"text": r["docstring"], "path": r["path"]} for r in records]
    train, validation = _split(rows, key=lambda r: r["path"])  # by file: validation modules are unseen
    return _dataset_dict(train, validation, Features(text=Value("string")))


def arity(signature: str) -> str:
    """How many arguments a call of the function passes, read off its signature: `get(self, key, default=None)` ->
    "1 to 2", `close(self)` -> "0", `replace(self, /, *, name)` -> "1", `run(*args, check=False, **kwargs)` -> "0 or
    more". A leading `self` or `cls` is the bound object, not an argument; keyword-only parameters count too."""
    arguments = ast.parse(f"def {signature}: pass").body[0].args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    keyword_only_required = sum(default is None for default in arguments.kw_defaults)
    fewest = max(len(positional) - len(arguments.defaults), 0) + keyword_only_required
    most = len(positional) + len(arguments.kwonlyargs)
    if arguments.vararg or arguments.kwarg:
        return f"{fewest} or more"
    return str(fewest) if fewest == most else f"{fewest} to {most}"


def _embedded_seq2seq(signatures) -> DatasetDict:
    """A function's signature as written -> how many arguments a call passes (`arity`), for every function of the
    standard library whose signature fits on a short line.

    Split by function name, so no validation function was seen in training under any signature."""
    rows = {}
    for s in signatures:
        if len(s["signature"]) <= MAX_SIGNATURE_CHARS:
            rows.setdefault(s["signature"], {"source": s["signature"], "name": s["name"]})
    for row in rows.values():
        row["target"] = arity(row["source"])
    train, validation = _split(list(rows.values()), key=lambda r: r["name"])
    return _dataset_dict(train, validation, Features(source=Value("string"), target=Value("string")))


def _embedded_topics(records) -> DatasetDict:
    """Docstring -> the standard-library package it documents, over the packages with the most docstrings.

    Split by text, not by file: single-file packages (turtle, _pydecimal) would otherwise fall wholly on one side."""
    packages_by_text: dict[str, set[str]] = {}
    for record in records:
        packages_by_text.setdefault(record["docstring"], set()).add(record["package"])
    unique = {text: packages.pop() for text, packages in packages_by_text.items() if len(packages) == 1}
    names = sorted(p for p, _ in Counter(unique.values()).most_common(TOPIC_CLASSES))
    rows = [{"text": text, "label": names.index(p)} for text, p in unique.items() if p in names]
    train, validation = _split(rows, key=lambda r: r["text"])
    return _dataset_dict(train, validation, Features(text=Value("string"), label=ClassLabel(names=names)))


def _strip_word(word: str) -> str:
    return re.sub(r"^[^\w]+|[^\w]+$", "", word)


def _embedded_parameter_tags(records) -> DatasetDict:
    """Words of a function's docstring, each tagged PARAM when it names one of the function's parameters."""
    rows = []
    for record in records:
        if record["kind"] != "function" or not record["parameters"]:
            continue
        words = _first_paragraph(record["docstring"]).split()[:MAX_WORDS]
        tags = [int(_strip_word(word) in record["parameters"]) for word in words]
        rows.append({"tokens": words, "tags": tags, "path": record["path"]})
    train, validation = _split(rows, key=lambda r: r["path"])
    features = Features(tokens=Sequence(Value("string")), tags=Sequence(ClassLabel(names=["O", "PARAM"])))
    return _dataset_dict(train, validation, features)


# each task's embedded data (tests check that every task in TASKS has one)
EMBEDDED = {
    "causal-lm": _embedded_text,
    "masked-lm": _embedded_text,
    "seq2seq": _embedded_seq2seq,
    "sequence-classification": _embedded_topics,
    "token-classification": _embedded_parameter_tags,
}


def embedded_dataset(task: str, max_files: int | None = None) -> DatasetDict:
    """The task's default data, built offline from the running interpreter's standard library in seconds."""
    check_task(task)
    return EMBEDDED[task](stdlib_signatures(max_files) if task == "seq2seq" else stdlib_records(max_files))


def _load_source(source: str, validation_file: str | None, dataset_config: str | None) -> DatasetDict:
    path = Path(source)
    if path.suffix in FILE_BUILDERS or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"data file {source} not found")
        if path.suffix not in FILE_BUILDERS:
            raise ValueError(
                f"data file {source}: unsupported format {path.suffix!r}; use one of {', '.join(FILE_BUILDERS)}"
            )
        data_files = {"train": str(path)}
        if validation_file:
            if not Path(validation_file).is_file():
                raise FileNotFoundError(f"validation file {validation_file} not found")
            data_files["validation"] = validation_file
        try:
            return load_dataset(FILE_BUILDERS[path.suffix], data_files=data_files)
        except Exception as error:  # datasets raises many types; the file name is what helps
            if "corresponds to no data" in str(error) or path.stat().st_size == 0:
                raise ValueError(f"data file {source} holds no rows; nothing to train on") from error
            raise ValueError(f"could not read data file {source} as {FILE_BUILDERS[path.suffix]}: {error}") from error
    try:
        return load_dataset(source, dataset_config)
    except Exception as error:  # offline, unknown name, private: the datasets message says which
        raise ValueError(f"could not load dataset {source!r} (not a local file either): {error}") from error


def _ensure_validation(data: DatasetDict, source: str) -> DatasetDict:
    if "train" not in data:
        raise ValueError(f"dataset {source} has no 'train' split (splits: {', '.join(data)})")
    if len(data["train"]) == 0:
        raise ValueError(f"dataset {source}: the train split is empty; nothing to train on")
    if "validation" not in data:
        if len(data["train"]) < 2:
            raise ValueError(
                f"dataset {source}: one training row cannot be split into train and validation; pass --validation-file"
            )
        held_out = data["train"].train_test_split(test_size=0.05 if len(data["train"]) >= 40 else 0.5, seed=0)
        data = DatasetDict(train=held_out["train"], validation=held_out["test"])
    if len(data["validation"]) == 0:
        raise ValueError(f"dataset {source}: the validation split is empty")
    return DatasetDict(train=data["train"], validation=data["validation"])


def check_columns(data: DatasetDict, task: str, source: str) -> None:
    for split, dataset in data.items():
        missing = [c for c in TASKS[task].columns if c not in dataset.column_names]
        if missing:
            raise ValueError(
                f"dataset {source} ({split} split) has no column {missing[0]!r}, which task {task} needs "
                f"(columns: {', '.join(dataset.column_names)}); rename with --column {missing[0]}=<your column>"
            )


def load_task_data(
    task: str,
    source: str | None = None,
    validation_file: str | None = None,
    dataset_config: str | None = None,
    columns: dict[str, str] | None = None,
    max_files: int | None = None,
) -> DatasetDict:
    """Train and validation splits for `task`: embedded when `source` is None, else a local file or a dataset name.

    `columns` maps the task's standard column names to the source's (`{"text": "content"}`)."""
    check_task(task)
    if source is None:
        data, source = embedded_dataset(task, max_files), EMBEDDED_NAME
    else:
        data = _ensure_validation(_load_source(source, validation_file, dataset_config), source)
    for standard, theirs in (columns or {}).items():
        if standard not in TASKS[task].columns:
            raise ValueError(f"--column {standard}={theirs}: task {task} reads only {', '.join(TASKS[task].columns)}")
        if theirs not in data["train"].column_names:
            raise ValueError(
                f"dataset {source} has no column {theirs!r} (columns: {', '.join(data['train'].column_names)})"
            )
        data = data.rename_column(theirs, standard)
    check_columns(data, task, source)
    return data.select_columns(list(TASKS[task].columns))
