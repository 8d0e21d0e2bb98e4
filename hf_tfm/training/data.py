"""Training data for the five tasks: the embedded default (derived offline from the standard library's docstrings
and function signatures), a local text/JSON/CSV/Parquet file, or a `datasets` dataset name. Every source ends as a
`DatasetDict` with `train` and `validation` splits whose columns carry the task's standard names (`Task.columns`),
checked before any training starts. `--packing` trains on rows of whole examples packed without padding (the end of
this module: its examples, packer and collators).
"""

import ast
import bisect
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
from transformers import default_data_collator

from .corpus import in_validation, stdlib_records, stdlib_signatures
from .tasks import TASKS, check_task, collator

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


# ---------------------------------------------------------------- padding-free training (--packing)

PACKABLE_TASKS = ("causal-lm", "masked-lm")  # a label per token: examples can share a row without padding
PACKING_CHUNK = 10_000  # examples packed together (one `map` batch): best fit fills rows from this many


def check_packing(task: str) -> None:
    if task not in PACKABLE_TASKS:
        raise ValueError(
            f"--packing: task {task} cannot be packed (it trains causal-lm and masked-lm only). "
            + (
                "An encoder-decoder's cross-attention cannot tell which example's encoder output a packed decoder "
                "token belongs to; train seq2seq padded, without --packing."
                if task == "seq2seq"
                else "A classifier pools or labels each padded example as a whole; train it without --packing."
            )
        )


def document_examples(tokenizer, texts: list[str], max_length: int) -> Dataset:
    """Causal-LM training examples for --packing: each document on its own, ended by EOS and cut at `max_length`,
    at its natural length (the padded path's `lm_blocks` cuts fixed blocks across documents instead)."""
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    rows = tokenizer(texts)["input_ids"]
    return Dataset.from_dict({"input_ids": [[*row, *end][:max_length] for row in rows]})


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """The indices of `lengths` in bins of at most `capacity`: longest first, each into the bin it leaves the least
    room in (a new bin when none has room). Bins come out nearly full whatever the length distribution: chosen over
    first fit in a shuffled window for that (the filled token budget is what packing buys), and because it is
    deterministic and done once with the data; Trainer shuffles the packed rows."""
    wrong = [length for length in lengths if not 0 < length <= capacity]
    if wrong:
        raise ValueError(
            f"--packing: an example of {wrong[0]} tokens; packed examples hold 1 to {capacity} (--max-length)"
        )
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (tokens still free, bin), sorted: the best fit is the first with enough
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[index]
        slot = bisect.bisect_left(room, (length, -1))
        if slot == len(room):
            bins.append([])
            free, target = capacity, len(bins) - 1
        else:
            free, target = room.pop(slot)
        bins[target].append(index)
        if free > length:
            bisect.insort(room, (free - length, target))
    return bins


def pack_examples(examples: Dataset, max_length: int, pad_token_id: int, causal_lm_labels: bool = False) -> Dataset:
    """Whole examples packed into rows of exactly `max_length` tokens (`best_fit_decreasing`), `position_ids`
    restarting at 0 for each, so the model keeps attention and positions within each example. The few tokens left
    at a row's end are one more example of padding: pad tokens, positions from 0, labels -100 (the model needs no
    attention_mask, and static shapes suit torch.compile). Keeps `input_ids`, `token_type_ids` and `labels`;
    `causal_lm_labels` makes labels as DataCollatorWithFlattening does: the inputs, -100 at each example's first
    token (which nothing before it in the row may predict)."""
    fill = {"input_ids": pad_token_id, "token_type_ids": 0, "labels": -100}

    def pack(batch):
        columns = {name: batch[name] for name in fill if name in batch}
        if causal_lm_labels:
            columns["labels"] = [[-100, *ids[1:]] for ids in batch["input_ids"]]
        lengths = [len(ids) for ids in batch["input_ids"]]
        rows = {name: [] for name in (*columns, "position_ids")}
        for members in best_fit_decreasing(lengths, max_length):
            tail = max_length - sum(lengths[i] for i in members)
            for name, values in columns.items():
                rows[name].append([v for i in members for v in values[i]] + [fill[name]] * tail)
            rows["position_ids"].append([p for n in [*(lengths[i] for i in members), tail] for p in range(n)])
        return rows

    examples = examples.filter(lambda ids: len(ids) > 0, input_columns="input_ids")  # an empty text: nothing to train
    return examples.map(pack, batched=True, batch_size=PACKING_CHUNK, remove_columns=examples.column_names)


class DataCollatorForPackedMaskedLM:
    """Masked-LM batches of packed rows (`pack_examples`): masked by the padded path's collator
    (DataCollatorForLanguageModeling: special tokens, the rows' padding tails included, are never masked), with the
    rows' `position_ids` passed through and no attention_mask (an all-ones mask would make each row one example)."""

    def __init__(self, padded_collator):
        self.padded_collator = padded_collator

    def __call__(self, rows: list[dict]) -> dict:
        batch = self.padded_collator(rows)
        batch.pop("attention_mask", None)
        return batch


def packing_fill_id(tokenizer) -> int:
    """The token of the rows' padding tails: the pad token (a special token, never masked), else EOS."""
    fill = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if fill is None:
        raise ValueError("--packing: the tokenizer has neither a pad nor an EOS token to fill the rows' ends with")
    return fill


def packing_collator(task: str, tokenizer):
    """The training collator of `--packing`: a batch of packed rows (`pack_examples`) as tensors."""
    check_packing(task)
    if task == "causal-lm":
        return default_data_collator  # the rows carry their labels
    return DataCollatorForPackedMaskedLM(collator(task, tokenizer))


def packed_training_features(task: str, data: DatasetDict, tokenizer, max_length: int, features: DatasetDict):
    """`features` with the training split as --packing trains on it: whole examples packed into rows of
    `max_length` tokens (causal-lm: documents one by one, `document_examples`; masked-lm: the tokenized examples).
    The validation split stays as it is, padded per example."""
    check_packing(task)
    causal = task == "causal-lm"
    examples = document_examples(tokenizer, list(data["train"]["text"]), max_length) if causal else features["train"]
    train = pack_examples(examples, max_length, packing_fill_id(tokenizer), causal_lm_labels=causal)
    return DatasetDict(train=train, validation=features["validation"])
