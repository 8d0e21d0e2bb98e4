"""`hf-tfm compare`: a user's models against transformers' own `GPT2LMHeadModel`, `BertForMaskedLM`,
`T5ForConditionalGeneration` and `BartForConditionalGeneration`, on the same data at the same budget.

Every model is an ordinary `hf-tfm train` run (`hf_tfm.training.run.train`) under OUTPUT/runs/<label>/seed-<seed>, with
one tokenizer (OUTPUT/tokenizer, trained once on the data), the same budget, schedule and seeds, dropout off; the
batches are then the same for every model (the same data, tokenizer, batch size and seed give Trainer the same
order). A reference (`gpt2`, `bert`, `t5`, `bart`) takes the width, depth and heads of the first hf_tfm model and
the feed-forward width that brings its parameter count to that model's (active parameters for MoE), written to
OUTPUT/configs/<label>.json. A finished run is read back, an interrupted one resumed: a killed compare, run again,
continues where it stopped. OUTPUT gets compare.json (the record), compare.md (the table) and compare.png (the
validation curves).
"""

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import transformers

from hf_tfm_cli.spec import RunSpec

from ..hub.card import RUN_RECORD, active_parameters
from ..model.modeling_tfm_loading import AUTO_CLASSES
from .callbacks import logged
from .run import LOG, data_settings, fresh_config, load_config, resolve_model, run_data, train
from .tasks import TASKS, trained_tokenizer


@dataclass(frozen=True)
class Reference:
    """A transformers class to compare with: its config class, the task its head trains, and the config fields that
    give it a model's width, depth and heads (`shape(like, max_length)`) and a feed-forward width (`inner`)."""

    config_class: str
    task: str
    shape: Callable  # (the first hf_tfm model's config, max_length) -> config fields
    inner: tuple[str, ...]
    dropout: dict


def decoder_layers(like) -> int:
    return getattr(like, "decoder_layers", None) or like.num_hidden_layers


REFERENCES = {
    "gpt2": Reference(
        "GPT2Config", "causal-lm",
        lambda like, length: dict(n_embd=like.hidden_size, n_layer=like.num_hidden_layers,
                                  n_head=like.num_attention_heads, n_positions=length),
        ("n_inner",), dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    ),
    "bert": Reference(
        "BertConfig", "masked-lm",
        lambda like, length: dict(hidden_size=like.hidden_size, num_hidden_layers=like.num_hidden_layers,
                                  num_attention_heads=like.num_attention_heads, max_position_embeddings=length),
        ("intermediate_size",), dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    ),
    "t5": Reference(
        "T5Config", "seq2seq",
        lambda like, length: dict(d_model=like.hidden_size, d_kv=like.hidden_size // like.num_attention_heads,
                                  num_layers=like.num_hidden_layers, num_decoder_layers=decoder_layers(like),
                                  num_heads=like.num_attention_heads),
        ("d_ff",), dict(dropout_rate=0.0),
    ),
    "bart": Reference(
        "BartConfig", "seq2seq",
        lambda like, length: dict(d_model=like.hidden_size, max_position_embeddings=length,
                                  encoder_layers=like.num_hidden_layers, decoder_layers=decoder_layers(like),
                                  encoder_attention_heads=like.num_attention_heads,
                                  decoder_attention_heads=like.num_attention_heads),
        ("encoder_ffn_dim", "decoder_ffn_dim"), dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
    ),
}  # fmt: skip
MATCH_TOLERANCE = 0.05  # a reference within 5% of the target parameter count


@dataclass
class Entry:
    """One model of a comparison: `name` (a preset, a config.json, a model folder, or a reference) with `overrides`
    (`NAME:field=value,field=value`), shown as `label`."""

    label: str
    name: str
    overrides: dict = field(default_factory=dict)

    @property
    def reference(self) -> bool:
        return self.name in REFERENCES


def parse_model(text: str) -> Entry:
    name, _, fields_text = text.partition(":")
    overrides = {}
    for item in filter(None, fields_text.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"model {text!r}: expected NAME:field=value[,field=value], got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return Entry(label=text, name=name, overrides=overrides)


def counted_parameters(config, task: str) -> tuple[int, int]:
    """(total, active) parameters of the task's model built from `config` on the meta device."""
    with torch.device("meta"):
        model = getattr(transformers, TASKS[task].head.auto_class).from_config(config)
    active = active_parameters(model) if config.model_type in AUTO_CLASSES else model.num_parameters()
    return model.num_parameters(), active


def reference_config(name: str, task: str, like, target: int, tokenizer, max_length: int):
    """The reference `name` with `like`'s width, depth and heads, dropout off, its feed-forward width solved
    (parameters are linear in it) so that it holds `target` parameters; refused, naming what to change, when no
    width does."""
    reference = REFERENCES[name]
    if reference.task != task:
        raise ValueError(
            f"reference {name!r} trains {reference.task}, not {task}: compare it under --task {reference.task}"
        )
    # the run's tokenizer's ids: a reference's defaults (GPT-2's 50256) lie outside a smaller vocabulary
    special = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if task == "seq2seq":  # decoding starts from the padding token, as hf_tfm's encoder-decoders do
        special["decoder_start_token_id"] = tokenizer.pad_token_id
    config_class = getattr(transformers, reference.config_class)

    def config(size: int):
        return config_class(**reference.shape(like, max(max_length, 2)), **special, **reference.dropout,
                            **dict.fromkeys(reference.inner, size))  # fmt: skip

    counts = [counted_parameters(config(size), task)[0] for size in (4, 8)]
    per_unit = (counts[1] - counts[0]) / 4
    size = 4 * round((target - counts[0] + 4 * per_unit) / per_unit / 4)
    if size < 4 or abs(counted_parameters(config(size), task)[0] - target) > MATCH_TOLERANCE * target:
        raise ValueError(
            f"reference {name!r} cannot hold {target:,} parameters at width {like.hidden_size} and depth "
            f"{like.num_hidden_layers} (the first hf_tfm model's) by its feed-forward width "
            f"({', '.join(reference.inner)}) alone: widen the first hf_tfm model's intermediate_size, or put a larger "
            "model first"
        )
    return config(size)


def folder_name(label: str) -> str:
    """A model's label as a folder name."""
    return label.replace("/", "_").replace(":", "@")


def run_spec(base: RunSpec, entry: Entry, model: str, seed: int, runs: Path, tokenizer: Path) -> RunSpec:
    """`entry`'s run with `seed`, in runs/seed-<seed>, on the comparison's tokenizer: dropout off, resumed where an
    earlier run left checkpoints."""
    folder = runs / f"seed-{seed}"
    started = (folder / "checkpoints").is_dir() and any((folder / "checkpoints").iterdir())
    overrides = {} if entry.reference else entry.overrides
    return replace(
        base, model=model, output_dir=str(folder), seed=seed, config_overrides=overrides,
        dropout=None if entry.reference else 0.0, tokenizer=str(tokenizer), resume=started, overwrite=not started,
    )  # fmt: skip


def finished(spec: RunSpec) -> dict | None:
    """A finished run's record, read back instead of training again, with where its model and log are (as `train`
    returns them)."""
    folder = Path(spec.output_dir)
    path = folder / "model" / RUN_RECORD
    if not path.is_file():
        return None
    return {**json.loads(path.read_text()), "model_dir": str(folder / "model"), "log": str(folder / LOG)}


def prepared(base: RunSpec, models: list[str], output: Path, command: str) -> tuple[list[Entry], object, dict]:
    """The entries of `models` (checked: no model twice, at least one hf_tfm model to size the references by, each
    a fresh config), the comparison's tokenizer (trained once on the data into OUTPUT/tokenizer), and each hf_tfm
    model's fresh config, dropout off."""
    entries = [parse_model(text) for text in models]
    if len({entry.label for entry in entries}) < len(entries):
        raise ValueError(f"--models names a model twice: {models}")
    ours = [entry for entry in entries if not entry.reference]
    if not ours:
        raise ValueError(f"--models needs an hf_tfm model (a preset or config) to size the references by: {models}")
    data = run_data(base.task, data_settings(base))
    tokenizer_folder = output / "tokenizer"
    if not tokenizer_folder.is_dir():
        trained_tokenizer(base.task, data["train"], base.vocab_size).save_pretrained(tokenizer_folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    configs = {}
    for entry in ours:
        try:
            path, pretrained = resolve_model(entry.name)
        except ValueError as error:
            raise ValueError(f"{error}; or a reference: {', '.join(REFERENCES)}") from None
        if pretrained:
            raise ValueError(
                f"model {entry.name}: {command} trains fresh models; give its config.json, not a checkpoint"
            )
        spec = replace(base, config_overrides=entry.overrides, dropout=0.0)
        configs[entry.label] = fresh_config(spec, load_config(path), tokenizer, None)
    return entries, tokenizer, configs


def compare(base: RunSpec, models: list[str], seeds: list[int], output: str | Path) -> dict:
    """Train every model of `models` (see `Entry`) with every seed on `base`'s task, data and budget; the table,
    record and figure in `output`."""
    if base.eval_steps and base.eval_steps > base.max_steps:
        raise ValueError(
            f"--eval-steps {base.eval_steps} is more than --max-steps {base.max_steps}: no evaluation would run "
            "during training, so there would be no validation curve; lower --eval-steps or raise --max-steps"
        )
    output = Path(output)
    entries, tokenizer, configs = prepared(base, models, output, "compare")
    ours = [entry for entry in entries if not entry.reference]
    paths = {entry.label: entry.name for entry in ours}  # as given: a run records the preset's name, not its folder
    target = counted_parameters(configs[ours[0].label], base.task)[1]
    (output / "configs").mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry.reference:
            config = reference_config(
                entry.name, base.task, configs[ours[0].label], target, tokenizer, base.max_length
            )
            configs[entry.label] = config
            paths[entry.label] = str(output / "configs" / f"{entry.name}.json")
            config.to_json_file(paths[entry.label])

    rows, runs_by_label = [], {}
    for entry in entries:
        total, active = counted_parameters(configs[entry.label], base.task)
        runs, curves = [], []
        for seed in seeds:
            runs_folder = output / "runs" / folder_name(entry.label)
            spec = run_spec(base, entry, paths[entry.label], seed, runs_folder, output / "tokenizer")
            runs.append(finished(spec) or train(spec))
            curves.append(logged(Path(spec.output_dir) / LOG, "eval_loss"))
        rows.append(summary(entry, total, active, runs, curves, base))
        runs_by_label[entry.label] = runs
    record = {"task": base.task, "data": data_settings(base), "budget": budget(base), "seeds": seeds, "models": rows}
    (output / "compare.json").write_text(json.dumps(record, indent=2))
    (output / "compare.md").write_text(table(record))
    plot(rows, output / "compare.png", figure_title(record))
    return {**record, "runs": runs_by_label}  # each model's runs as `train` returns them, seed by seed


def budget(base: RunSpec) -> dict:
    return {
        "steps": base.max_steps,
        "batch_size": base.batch_size,
        "max_length": base.max_length,
        "tokens": base.max_steps * base.batch_size * base.max_length,
        "learning_rate": base.learning_rate,
        "lr_scheduler_type": base.lr_scheduler_type,
    }


def summary(entry: Entry, total: int, active: int, runs: list[dict], curves: list, base: RunSpec) -> dict:
    """Per model: parameters, each validation metric's mean and spread (min to max) over the seeds, tokens/s, and
    the most memory training added (`memory.peak_memory`; none for a run read back from before it was recorded)."""
    metrics = {}
    for run in runs:
        for result in run["results"]:
            metrics.setdefault(result["metric"], []).append(result["value"])
    tokens = budget(base)["tokens"]
    # every seed's, or none: a run read back from before peaks were recorded leaves the model's unmeasured
    peaks = [run["peak_memory"] for run in runs if run.get("peak_memory")]
    peaks = peaks if len(peaks) == len(runs) else []
    return {
        "label": entry.label,
        "reference": entry.reference,
        "parameters": total,
        "active_parameters": active,
        "metrics": {
            name: {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "values": values}
            for name, values in metrics.items()
        },
        "tokens_per_second": statistics.fmean(tokens / run["seconds"] for run in runs),  # whole run, evaluations in
        # the least over the seeds: the first run of a process also pays its one-time allocations
        "peak_memory_bytes": min(peak["bytes"] for peak in peaks) if peaks else None,
        "peak_memory_measure": peaks[0]["measure"] if peaks else None,
        "curves": curves,
    }


def table(record: dict) -> str:
    names = sorted({name for row in record["models"] for name in row["metrics"]})
    lines = [
        "| model | parameters (active) | "
        + " | ".join(f"validation {name}" for name in names)
        + " | tokens/s | peak memory, MiB |",
        "|---" * (len(names) + 4) + "|",
    ]
    for row in record["models"]:
        cells = []
        for name in names:
            value = row["metrics"].get(name)
            cells.append("" if value is None else f"{value['mean']:.4g} ({value['min']:.4g}-{value['max']:.4g})")
        label = row["label"] + (" (transformers)" if row["reference"] else "")
        peak = row["peak_memory_bytes"]
        memory = "" if peak is None else f"{peak / 2**20:,.0f}"
        lines.append(
            f"| {label} | {row['parameters']:,} ({row['active_parameters']:,}) | "
            + " | ".join(cells)
            + f" | {row['tokens_per_second']:,.0f} | {memory} |"
        )
    measures = sorted({row["peak_memory_measure"] for row in record["models"] if row["peak_memory_measure"]})
    note = (
        f"\nPeak memory: the most that training added to the weights, least over the seeds ({', '.join(measures)}).\n"
    )
    return "\n".join(lines) + "\n" + (note if measures else "")


def figure_title(record: dict) -> str:
    """What a figure compares: the task, the data and the training budget."""
    data, budget = record["data"].get("data") or "the embedded corpus", record["budget"]
    return (
        f"{record['task']}: validation loss, mean over {len(record['seeds'])} seed(s)\n"
        f"data: {data}; {budget['steps']} steps of {budget['batch_size']} x {budget['max_length']} tokens, "
        f"learning rate {budget['learning_rate']:g}"
    )


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Every model's validation loss over the steps, the mean over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.4), layout="tight")
    axes = figure.add_subplot()
    axes.set_title(title, fontsize=10)
    for row in rows:
        steps = [step for step, _ in row["curves"][0]]
        means = [statistics.fmean(curve[i][1] for curve in row["curves"]) for i in range(len(steps))]
        axes.plot(steps, means, marker="o", label=row["label"])
    axes.set_xlabel("step")
    axes.set_ylabel("validation loss")
    axes.legend()
    FigureCanvasAgg(figure).print_png(str(path))
