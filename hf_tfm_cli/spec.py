"""`RunSpec`, everything `hf-tfm train` takes, and the number checks every command shares.

Torch-free on purpose: the `hf-tfm` parser is built from these fields, so `--help` and argument errors answer
without importing torch, transformers or datasets. Each field's metadata says how it appears on the command line
(help, group, bounds); `RunSpec.__post_init__` applies the same bounds to runs started from Python.
"""

import argparse
import math
import re
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields

# the tasks `hf-tfm train` offers; hf_tfm.training's task records must cover exactly these (tests check it)
TASKS = ("causal-lm", "masked-lm", "seq2seq", "sequence-classification", "token-classification")


def describe(kind: type, low=None, high=None, low_open: bool = False) -> str:
    """`an integer >= 1`, `a number in [0, 1]`, `a number > 0`: the accepted range, said once for every message."""
    noun = "an integer" if kind is int else "a number"
    if low is not None and high is not None:
        return f"{noun} in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f"{noun} {'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{noun} <= {high}"
    return noun


def check_number(value, kind: type, low=None, high=None, low_open: bool = False) -> str | None:
    """The problem with `value` (None when it is fine): wrong kind, not finite, or out of range."""
    wrong_kind = isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int)
    if wrong_kind or not math.isfinite(value):
        return f"must be {describe(kind, low, high, low_open)}, got {value!r}"
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        return f"must be {describe(kind, low, high, low_open)}, got {value!r}"
    return None


def number(kind: type, low=None, high=None, low_open: bool = False):
    """An argparse `type=` that parses `kind` and enforces the range, so argparse names the argument in its error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {describe(kind, low, high, low_open)}, got {text!r}") from None
        problem = check_number(value, kind, low, high, low_open)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = describe(kind, low, high, low_open)  # argparse names the type in some messages
    return parse


positive_int = number(int, 1)
positive_float = number(float, 0, low_open=True)


def parameter_count(text: str) -> int:
    """`200K`, `1.5M`, `300000`: a number of parameters (an argparse `type=`)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6}[match.group(2).lower()] if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a parameter count such as 200K, 1.5M or 300000, got {text!r}")
    return round(value)


parameter_count.__name__ = "parameter count"


def value_kind(spec_field: Field) -> type:
    """`int` for `int | None`, `dict` for `dict[str, str]`: the kind of value a field holds, without its None."""
    kind = spec_field.type
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return typing.get_origin(kind) or kind


def option(
    default=MISSING,
    *,
    help: str = "",
    group: str = "training",
    low=None,
    high=None,
    low_open=False,
    choices=None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
    cli: bool = True,
):
    """A RunSpec field with what the parser needs: `flag` overrides the option name (`--column` for `columns`),
    `aliases` are other names it keeps answering to, `low`/`high` bound numbers (inclusive unless `low_open`),
    `cli=False` keeps a field off the command line."""
    metadata = {
        "help": help,
        "group": group,
        "low": low,
        "high": high,
        "low_open": low_open,
        "choices": choices,
        "flag": flag,
        "aliases": aliases,
        "metavar": metavar,
        "cli": cli,
    }
    if isinstance(default, (list, dict)):
        return field(default_factory=type(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class RunSpec:
    """Everything `hf-tfm train` takes; the defaults train a small model on the embedded data in minutes.
    One field here is one option of `hf-tfm train` (the parser is built from these fields)."""

    task: str = option(choices=TASKS, group="run")
    model: str = option(
        "llama-1.3m",
        group="run",
        help="a preset name (e.g. llama-1.3m, see docs/models.md), a config.json file, or a model folder to fine-tune",
    )
    output_dir: str = option("runs/train", group="run")
    data: str | None = option(
        None,
        group="data",
        help="a local .txt/.json/.jsonl/.csv/.parquet file or a datasets name (default: embedded stdlib docstrings)",
    )
    validation_file: str | None = option(None, group="data")
    dataset_config: str | None = option(None, group="data")
    columns: dict[str, str] = option(
        {},
        group="data",
        flag="--column",
        metavar="TASK_COLUMN=YOURS",
        help="map a column the task reads to one in the data",
    )
    tokenizer: str | None = option(
        None, group="data", help="a tokenizer folder (default: the checkpoint's, else one trained on the data)"
    )
    vocab_size: int = option(4096, group="data", low=1, help="of a tokenizer trained on the data")
    max_length: int = option(128, group="data", low=2, help="tokens per example")
    max_files: int | None = option(None, group="data", low=1, help="embedded data: read only this many stdlib files")
    max_eval_samples: int | None = option(None, group="data", low=1)
    max_steps: int = option(200, low=1)
    batch_size: int = option(16, low=1, help="per device: examples per step (with --packing, rows of packed examples)")
    packing: bool = option(
        False,
        help="train without padding (causal-lm, masked-lm): whole examples packed into rows of --max-length tokens "
        "(best fit), --batch-size rows per step, attention and positions kept within each example; a causal LM "
        "trains on whole documents instead of fixed blocks. Evaluation stays padded",
    )
    gradient_accumulation_steps: int = option(1, low=1)
    learning_rate: float = option(1e-3, low=0)
    lr_scheduler_type: str = option("cosine")
    warmup_ratio: float = option(0.05, low=0, high=1)
    weight_decay: float = option(0.01, low=0)
    eval_steps: int | None = option(None, low=1, help="default: 4 evaluations per run")
    save_steps: int | None = option(None, low=1, help="default: 4 checkpoints per run")
    keep_checkpoints: int = option(2, low=1)
    logging_steps: int | None = option(None, low=1, help="default: 20 logs per run")
    seed: int = option(0, low=0)
    dropout: float | None = option(None, low=0, high=1, help="set every dropout of a fresh model")
    config_overrides: dict = option(
        {}, flag="--set", metavar="FIELD=VALUE", help="override a fresh model's config field (JSON values)"
    )
    bf16: bool = option(False)
    gradient_checkpointing: bool = option(False)
    torch_compile: bool = option(
        False,
        flag="--compile",
        aliases=("--torch-compile",),
        help="torch.compile the model (Trainer's torch_compile, inductor): one graph per step, no graph break",
    )
    report_to: list[str] = option([], help="tensorboard, wandb, ... (CSV is always written)")
    resume: bool = option(False, help="continue from the newest complete checkpoint in --output-dir")
    overwrite: bool = option(False, help="discard the checkpoints of an earlier run in --output-dir")
    use_cpu: bool = option(False)
    evaluate_before: bool = option(True, cli=False)  # measure the untrained model too, for the before -> after summary

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of: {', '.join(TASKS)}")
        for spec_field in fields(self):
            meta, value = spec_field.metadata, getattr(self, spec_field.name)
            if value is None or (meta["low"] is None and meta["high"] is None):
                continue
            problem = check_number(value, value_kind(spec_field), meta["low"], meta["high"], meta["low_open"])
            if problem:
                raise ValueError(f"{spec_field.name} {problem}")
