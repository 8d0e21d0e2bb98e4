"""Model cards filled from the real model and run: metadata that `huggingface_hub.ModelCard` parses and validates,
an architecture table read off the config, the training run's data and arguments, and only the evaluation numbers
that were actually measured (from the caller, or from the run record `hf_tfm_run.json` the training code writes).

    write_model_card(folder, model, results, dataset, training, ...)   # from a model in memory
    write_card_from_run(folder, model, run=None, ...)                   # from a run record (dict or the folder's file)
    refresh_card(folder)                                                # `hf-tfm card FOLDER`: load, read, (re)write
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..convert.record import PARADIGMS
from ..model.modeling_tfm import TfmPreTrainedModel
from ..model.modeling_tfm_layers import TfmGLU, TfmMLP
from ..model.modeling_tfm_loading import AUTO_CLASSES
from ..model.modeling_tfm_moe import TfmExperts, TfmMoE
from ..presets import shipped_folder
from ..training.checkpoints import load_saved
from ..training.tasks import HEADS, TASKS, head_for_architecture

RUN_RECORD = "hf_tfm_run.json"
CARD_NAME = "README.md"
DEFAULT_LICENSE = "apache-2.0"

# per model type: paradigm name, and the Auto class of the paradigm's main head (whose pipeline tag is the fallback
# when neither the task nor the head says more)
GENERATIVE_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM")
DEFAULT_LIMITATIONS = (
    "A small research model: it demonstrates an architecture and a training pipeline, and is not a general-purpose "
    "language model. Its outputs reflect its training data only; it has not been evaluated for factuality, bias or "
    "safety, and must not be used for decisions that affect people."
)


class RunRecordError(ValueError):
    """A run record (`hf_tfm_run.json`) that does not have the expected shape."""


@dataclass
class Measurement:
    split: str
    metric: str  # an `evaluate` metric id, e.g. "perplexity", "loss", "accuracy"
    value: float


@dataclass
class Baseline:
    name: str  # e.g. "majority class", "uniform over the vocabulary"
    metric: str
    value: float


@dataclass
class RunRecord:
    """What the training code records next to the model (`hf_tfm_run.json`); every field is optional."""

    task: str | None = None
    dataset: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    results: list[Measurement] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)
    description: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # the data settings of the run (`hf-tfm evaluate` reuses them)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "run record") -> RunRecord:
        if not isinstance(data, Mapping):
            raise RunRecordError(f"{source}: expected a JSON object, got {type(data).__name__}")
        task = data.get("task")
        if task is not None and task not in TASKS:
            raise RunRecordError(f"{source}: unknown task {task!r}; expected one of {', '.join(TASKS)}")
        training = data.get("training") or {}
        if not isinstance(training, Mapping):
            raise RunRecordError(f"{source}: `training` must be an object of training arguments")
        return cls(
            task=task,
            dataset=data.get("dataset"),
            training=dict(training),
            results=[
                Measurement(*_entry(r, ("split", "metric"), source, "results")) for r in data.get("results") or []
            ],
            baselines=[
                Baseline(*_entry(b, ("name", "metric"), source, "baselines")) for b in data.get("baselines") or []
            ],
            description=data.get("description"),
            data=dict(data.get("data") or {}),
        )


def _entry(item: Any, keys: tuple[str, str], source: str, where: str) -> tuple[str, str, float]:
    if not isinstance(item, Mapping) or any(not isinstance(item.get(k), str) for k in keys):
        raise RunRecordError(
            f"{source}: every entry of `{where}` needs string {keys[0]!r} and {keys[1]!r}, got {item!r}"
        )
    value = item.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RunRecordError(f"{source}: `{where}` entry {item!r} needs a finite number as 'value'")
    return item[keys[0]], item[keys[1]], float(value)


def read_run_record(folder: str | Path) -> RunRecord | None:
    """The run record saved in `folder`, or None when there is none. A malformed one raises `RunRecordError`
    (a `ValueError`)."""
    path = Path(folder) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RunRecordError(f"{path} is not valid JSON: {error}") from error
    return RunRecord.from_dict(data, source=str(path))


def active_parameters(model: TfmPreTrainedModel) -> int:
    """Parameters a token passes through: all of them, less the routed experts it is not sent to."""
    idle = 0
    for module in model.modules():
        if isinstance(module, TfmExperts):
            per_expert = sum(weight.numel() for weight in module.parameters(recurse=False)) // module.num_experts
            idle += (module.num_experts - model.config.num_experts_per_tok) * per_expert
    return model.num_parameters() - idle


def auto_class_of(model_or_architecture: TfmPreTrainedModel | str, config=None) -> str:
    """The transformers Auto class that loads this head, read off `AUTO_CLASSES`."""
    if isinstance(model_or_architecture, str):
        architecture = model_or_architecture
    else:
        architecture, config = type(model_or_architecture).__name__, model_or_architecture.config
    for auto_name, class_name in AUTO_CLASSES.get(config.model_type, {}).items():
        if class_name == architecture:
            return auto_name
    paradigm = PARADIGMS.get(getattr(config, "model_type", None))
    return paradigm.auto_class if paradigm is not None else "AutoModel"


def pipeline_tag_of(model: TfmPreTrainedModel, task: str | None = None) -> str:
    """The Hub pipeline tag: from the training task, else from the head, else from the model type's main head."""
    if task is not None:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
        return TASKS[task].head.pipeline_tag
    head = head_for_architecture(type(model).__name__)
    if head is not None and type(model).__name__ in AUTO_CLASSES.get(model.config.model_type, {}).values():
        return head.pipeline_tag
    main_head = PARADIGMS[model.config.model_type].auto_class
    return next(head.pipeline_tag for head in HEADS.values() if head.auto_class == main_head)


def is_moe(model: TfmPreTrainedModel) -> bool:
    return any(isinstance(module, TfmMoE) for module in model.modules())


def architecture_rows(model: TfmPreTrainedModel) -> list[tuple[str, str]]:
    config = model.config
    heads = f"{config.num_attention_heads} / {config.num_key_value_heads} (head_dim {config.head_dim})"
    position = config.position_embedding_type
    if position == "rope":  # one RoPE, or one per layer type (local and global theta)
        kinds = sorted(set(config.layer_types)) if config.nested_rope() else [None]
        ropes = [(kind, config.rope_parameters_for(kind)) for kind in kinds]
        position += (
            " ("
            + "; ".join(
                (f"{kind}: " if kind else "") + f"{rope['rope_type']}, theta {rope['rope_theta']:g}"
                for kind, rope in ropes
            )
            + ")"
        )
    layers = str(config.num_hidden_layers)
    if config.model_type == "tfm_encoder_decoder":
        layers = f"{config.num_hidden_layers} encoder + {config.decoder_layers} decoder"
    rows = [
        ("paradigm", PARADIGMS[config.model_type].description),
        ("head", type(model).__name__),
        ("layers", layers),
        ("hidden size", str(config.hidden_size)),
        ("attention heads / kv heads", heads),
        ("position scheme", position),
        ("norm", f"{config.norm_type}, {config.norm_position}-norm"),
    ]
    dense = f"{config.ffn_type} ({config.hidden_act}), intermediate {config.intermediate_size}"
    moe_layers = sum(isinstance(module, TfmMoE) for module in model.modules())
    total_layers = sum(1 for _ in _blocks(model))
    if not moe_layers:
        feed_forward = dense
    elif moe_layers < total_layers:
        feed_forward = f"{dense} in the dense layers"
    else:
        feed_forward = "experts in every layer"
    rows += [
        ("feed-forward", feed_forward),
        (
            "experts / top-k",
            f"{config.num_experts} / top-{config.num_experts_per_tok}" if config.num_experts else "dense",
        ),
    ]
    if config.num_experts:
        rows += [
            ("MoE layers", f"{moe_layers} of {total_layers}"),
            ("expert width", f"{config.moe_intermediate_size} (gated, {config.hidden_act})"),
            (
                "router",
                f"{config.scoring_func}, top-{config.num_experts_per_tok}"
                + (" renormalised" if config.norm_topk_prob else "")
                + f", aux loss coef {config.router_aux_loss_coef:g}",
            ),
        ]
        if config.shared_expert_intermediate_size:
            rows.append(("shared expert", f"width {config.shared_expert_intermediate_size}"))
    rows += [
        ("vocabulary", str(config.vocab_size)),
        ("tied embeddings", str(config.tie_word_embeddings)),
        ("parameters (total / active per token)", f"{model.num_parameters():,} / {active_parameters(model):,}"),
    ]
    return rows


def _blocks(model: TfmPreTrainedModel):
    """The Transformer blocks of every stack: the modules whose `mlp` is a dense feed-forward or an MoE layer."""
    for module in model.modules():
        if isinstance(getattr(module, "mlp", None), (TfmMLP, TfmGLU, TfmMoE)):
            yield module


def _human(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def _measurements(results: Iterable[Measurement | Mapping]) -> list[Measurement]:
    return [
        r if isinstance(r, Measurement) else Measurement(r["split"], r["metric"], float(r["value"])) for r in results
    ]


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _has_tokenizer(folder: Path) -> bool:
    return any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
    )


def write_model_card(
    folder: str | Path,
    model: TfmPreTrainedModel,
    results: Iterable[Measurement | Mapping],
    dataset: str | None,
    training: str | Mapping[str, Any] | None,
    repo_id: str | None = None,
    license: str = DEFAULT_LICENSE,
    *,
    task: str | None = None,
    baselines: Iterable[Baseline | Mapping] = (),
    description: str | None = None,
    limitations: str | None = None,
) -> ModelCard:
    """Render `model_cards/tfm_model.md` for `model` and save it as `folder/README.md`.

    `results` are the measured evaluation numbers (they become the card's `model-index`; none means the card says
    that no evaluation was recorded). `training` is either prose or a mapping of training arguments (rendered as a
    table). `task` is the training task of a run record (`causal-lm`, `masked-lm`, `seq2seq`,
    `sequence-classification`, `token-classification`): it picks the pipeline tag, else the head does.
    """
    folder = Path(folder)
    config = model.config
    model_type = config.model_type
    name = repo_id or folder.name
    results = _measurements(results)
    baselines = [
        b if isinstance(b, Baseline) else Baseline(b["name"], b["metric"], float(b["value"])) for b in baselines
    ]
    pipeline_tag = pipeline_tag_of(model, task)
    auto_class = auto_class_of(model)
    total, active = model.num_parameters(), active_parameters(model)
    moe = is_moe(model)

    tags = ["hf_tfm", model_type, PARADIGMS[model_type].description, config.position_embedding_type]
    if moe:
        tags += ["moe", "mixture-of-experts"]
    tags.append("custom_code")  # the repo carries its modeling code (auto_map) for trust_remote_code loading
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        license=license,
        tags=tags,
        datasets=[dataset] if dataset else None,
        model_name=name,
        eval_results=[
            EvalResult(
                task_type=pipeline_tag,
                dataset_type=dataset or "unknown",
                dataset_name=dataset or "unknown",
                dataset_split=result.split,
                metric_type=result.metric,
                metric_value=float(result.value),
            )
            for result in results
        ]
        or None,
    )
    summary = f"{_human(total)} parameters"
    if moe:
        summary = (
            f"Mixture of Experts, {config.num_experts} experts, top-{config.num_experts_per_tok}: {_human(total)} "
            f"parameters, {_human(active)} active per token"
        )
    if isinstance(training, Mapping):
        training_rows, training_text = [(k, _format_value(v)) for k, v in sorted(training.items())], None
    else:
        training_rows, training_text = [], training
    if limitations is None:
        limitations = DEFAULT_LIMITATIONS
        if not results:
            limitations += " No evaluation was recorded for it, so its quality is unknown."
        if moe:
            limitations += (
                f" As a Mixture of Experts, it needs all {config.num_experts} experts in memory ({total:,} parameters)"
                f" while each token is computed with {active:,} of them."
            )
    card = ModelCard.from_template(
        data,
        template_path=str(shipped_folder("model_cards") / "tfm_model.md"),
        model_name=name,
        paradigm=PARADIGMS[model_type].description,
        summary=summary,
        task=task,
        pipeline_tag=pipeline_tag,
        architecture=architecture_rows(model),
        dataset=dataset,
        description=description,
        training_text=training_text,
        training_rows=training_rows,
        results=[{"split": r.split, "metric": r.metric, "value": _format_value(r.value)} for r in results],
        baselines=[{"name": b.name, "metric": b.metric, "value": _format_value(b.value)} for b in baselines],
        auto_class=auto_class,
        generative=auto_class in GENERATIVE_AUTO_CLASSES,
        has_tokenizer=_has_tokenizer(folder),
        repo_id=name,
        limitations=limitations,
    )
    card = ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))  # the template's blank lines around optional parts
    folder.mkdir(parents=True, exist_ok=True)
    _save_card(card, folder / CARD_NAME)
    return card


def _save_card(card: ModelCard, path: Path) -> None:
    """Write-then-rename: a staged save may hold README.md as a hard link to the previous folder's, which an
    in-place write would change too."""
    temporary = path.with_name(f".{path.name}.tmp")
    card.save(temporary)
    os.replace(temporary, path)


def write_card_from_run(
    folder: str | Path,
    model: TfmPreTrainedModel,
    run: Mapping[str, Any] | RunRecord | None = None,
    *,
    repo_id: str | None = None,
    license: str = DEFAULT_LICENSE,
) -> ModelCard:
    """Write `folder/README.md` for `model` from a run record (a dict of the `hf_tfm_run.json` shape, or by default
    the folder's own `hf_tfm_run.json`). Without any record the card says that no evaluation was recorded."""
    if run is None:
        record = read_run_record(folder) or RunRecord()
    elif isinstance(run, RunRecord):
        record = run
    else:
        record = RunRecord.from_dict(run)
    return write_model_card(
        folder,
        model,
        results=record.results,
        dataset=record.dataset,
        training=record.training or None,
        repo_id=repo_id,
        license=license,
        task=record.task,
        baselines=record.baselines,
        description=record.description,
    )


def refresh_card(folder: str | Path, *, repo_id: str | None = None, license: str | None = None) -> ModelCard:
    """`hf-tfm card FOLDER`: load the model saved in `folder`, read its run record (`hf_tfm_run.json`) if any, and
    (re)write `folder/README.md`. The repo id and license of an existing card are kept unless given."""
    folder = Path(folder)
    return _rewrite_card(folder, load_saved(folder).eval(), _read_card(folder / CARD_NAME), repo_id, license)


def _read_card(path: Path) -> ModelCard | None:
    if not path.is_file():
        return None
    try:
        return ModelCard.load(path, ignore_metadata_errors=True)
    except (ValueError, OSError, yaml.YAMLError):  # an unreadable old card is replaced, not an error
        return None


def _rewrite_card(folder: Path, model, old: ModelCard | None, repo_id=None, license=None, tags=()) -> ModelCard:
    """The card from the folder's run record (if any) and the model, keeping the old card's name and license."""
    if old is not None:
        repo_id = repo_id or old.data.get("model_name")  # the model-index name, or the top-level key without results
        license = license or old.data.get("license")
    card = write_card_from_run(folder, model, repo_id=repo_id, license=license or DEFAULT_LICENSE)
    if any(tag not in card.data.tags for tag in tags):
        card.data.tags += [tag for tag in tags if tag not in card.data.tags]
        _save_card(card, folder / CARD_NAME)
    return card


# the text of the stub card transformers' push_to_hub writes when a repo has none
TRANSFORMERS_STUB = "This model card has been automatically generated."


def keeps_card(card: ModelCard | None) -> bool:
    """Whether a card must stay rather than be rewritten from the model alone: one a training run wrote (it reports
    results or names its data), or one hf_tfm did not write (the user's own; transformers' stub excepted)."""
    if card is None:
        return False
    if card.data.get("eval_results") or card.data.get("datasets"):
        return True
    return "hf_tfm" not in (card.data.get("tags") or []) and TRANSFORMERS_STUB not in card.text


def write_card_on_save(folder: str | Path, model, *, repo_id: str | None = None, tags=()) -> ModelCard | None:
    """The card `save_pretrained` and `push_to_hub` of an hf_tfm model leave in `folder`: written from the folder's
    run record (if any) and the model, unless the folder's README.md is a card to keep (`keeps_card`). Returns the
    new card, or None when the old one was kept (or the model is not an hf_tfm one, e.g. a remote-code copy)."""
    folder = Path(folder)
    old = _read_card(folder / CARD_NAME)
    if keeps_card(old) or not isinstance(model, TfmPreTrainedModel):
        return None
    return _rewrite_card(folder, model, old, repo_id, tags=tags or ())


def hub_card_to_keep(repo_id: str, *, token=None, revision: str | None = None) -> bool:
    """Whether the card the Hub repo already holds is one to keep (`keeps_card`); False when it has none."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        path = hf_hub_download(repo_id, CARD_NAME, revision=revision, token=token)
    except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
        return False
    return keeps_card(_read_card(Path(path)))
