"""One `Trainer` run for any task and paradigm (`hf-tfm train`), and evaluation of a saved model (`hf-tfm evaluate`).

Everything that can be wrong with the inputs (data columns, empty splits, tokenizer larger than the model, output
folder, preset name, damaged checkpoint) is checked before the first step. Checkpoints are manifested
(`checkpoints.py`), so `resume=True` continues from the newest complete one, and the final model folder is
written next to the old one and swapped in, so a failed save never costs a good model.
"""

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import torch
import transformers
from accelerate import PartialState
from transformers import (
    AutoConfig,
    AutoTokenizer,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
)

from ..hub.card import RUN_RECORD, write_card_from_run
from . import tokenizers
from .callbacks import CSVLogCallback, RouterBiasCallback, RouterStatsCallback
from .checkpoints import (
    WEIGHT_FILES,
    ManifestCallback,
    checkpoints,
    last_good_checkpoint,
    load_saved,
    replace_folder,
    step_of,
)
from .data import EMBEDDED_NAME, check_task, load_task_data
from .tasks import (
    HEADLINE,
    HEADS,
    argmax_logits,
    baselines,
    collator,
    compute_metrics_for,
    label_names,
    task_for_architecture,
    tokenize,
)



@dataclass
class RunSpec:
    """Everything `hf-tfm train` takes; the defaults train a small model on the embedded data in minutes."""

    task: str
    model: str = "llama-mini"  # a preset name, a config.json file, or a folder (a config, or a checkpoint to fine-tune)
    output_dir: str = "runs/train"
    data: str | None = None  # None = the embedded default; else a local file or a datasets name
    validation_file: str | None = None
    dataset_config: str | None = None
    columns: dict[str, str] = field(default_factory=dict)  # the task's column name -> the data's
    tokenizer: str | None = None  # a folder; default: the checkpoint's, else one trained on the data
    vocab_size: int = 4096  # of a tokenizer trained here
    max_length: int = 128
    max_steps: int = 200
    batch_size: int = 16
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-3
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    eval_steps: int | None = None  # default: 4 evaluations per run
    save_steps: int | None = None  # default: 4 checkpoints per run
    keep_checkpoints: int = 2
    logging_steps: int | None = None  # default: 20 logs per run
    seed: int = 0
    bf16: bool = False
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    report_to: list[str] = field(default_factory=list)  # e.g. ["tensorboard"]
    resume: bool = False
    overwrite: bool = False
    evaluate_before: bool = True  # measure the untrained model too, for the before -> after summary
    max_files: int | None = None  # embedded data: read only this many stdlib files (tests)
    max_eval_samples: int | None = None
    config_overrides: dict = field(default_factory=dict)  # applied to a fresh model's config
    dropout: float | None = None  # overrides every dropout field of a fresh model's config
    use_cpu: bool = False


# ---------------------------------------------------------------- checks that run before anything is trained


def presets() -> dict[str, Path]:
    root = files("hf_tfm.presets")
    return {entry.name: Path(str(entry)) for entry in root.iterdir() if entry.joinpath("config.json").is_file()}


def resolve_model(model: str) -> tuple[Path, bool]:
    """(folder or config.json holding the config, whether it carries weights to fine-tune)."""
    path = Path(model)
    if path.is_file() and path.suffix == ".json":
        return path, False
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json")
        return path, any((path / name).is_file() for name in WEIGHT_FILES)
    known = presets()
    if model in known:
        return known[model], False
    raise ValueError(f"unknown model {model!r}: not a folder, a config.json file or a preset (presets: {', '.join(sorted(known))})")


def load_config(path: Path):
    import hf_tfm  # noqa: F401  (registers the tfm model types with AutoConfig)

    if path.is_file():
        return AutoConfig.for_model(**json.loads(path.read_text()))
    return AutoConfig.from_pretrained(path)


def check_head(task: str, config, model: str) -> None:
    available = getattr(config, "auto_classes", {})
    if HEADS[task] not in available:
        raise ValueError(
            f"task {task} needs a {HEADS[task]} head, which model_type {config.model_type!r} ({model}) does not have; "
            f"its heads: {', '.join(available) or 'none (not an hf_tfm config)'}"
        )


def prepare_output_dir(spec: RunSpec) -> Path:
    output = Path(spec.output_dir)
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise PermissionError(f"output directory {output} is not writable ({error.strerror}); choose another --output-dir") from error
    earlier = output / "checkpoints"
    if checkpoints(earlier) and not (spec.resume or spec.overwrite):
        raise FileExistsError(f"{earlier} holds checkpoints of an earlier run: pass --resume to continue it or --overwrite to start over")
    if spec.overwrite and not spec.resume and PartialState().is_main_process:
        shutil.rmtree(earlier, ignore_errors=True)
        (output / "log.csv").unlink(missing_ok=True)
    PartialState().wait_for_everyone()
    return output


def resume_checkpoint(output: Path) -> Path:
    checkpoint, passed_over = last_good_checkpoint(output / "checkpoints")
    for _, reason in passed_over:
        print(f"resume: passing over {reason}")
    if checkpoint is None:
        raise FileNotFoundError(f"--resume: no complete checkpoint under {output / 'checkpoints'}; start again without --resume")
    if PartialState().is_main_process:
        for broken, _ in passed_over:  # newer than the good one and unusable: the killed run's half-written saves
            shutil.rmtree(broken, ignore_errors=True)
    PartialState().wait_for_everyone()
    return checkpoint


def load_tokenizer(folder: str | Path):
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ValueError(f"no usable tokenizer in {folder} ({error}); pass --tokenizer <folder>") from error


def check_vocabulary(tokenizer, config, model: str) -> None:
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but {model} has vocab_size={config.vocab_size}: ids past "
            f"{config.vocab_size - 1} have no embedding. Use the model's own tokenizer or train from a config."
        )


# ---------------------------------------------------------------- building the run


def fresh_config(spec: RunSpec, config, tokenizer, labels: list[str] | None):
    pad = tokenizer.pad_token_id
    updates = {"vocab_size": len(tokenizer), "pad_token_id": pad}
    updates["bos_token_id"] = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    updates["eos_token_id"] = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if config.model_type == "tfm_encoder_decoder":
        updates["decoder_start_token_id"] = pad
    if spec.dropout is not None:
        updates.update({name: spec.dropout for name in ("hidden_dropout", "attention_dropout", "embedding_dropout") if hasattr(config, name)})
    updates.update(spec.config_overrides)
    return AutoConfig.for_model(**{**config.to_dict(), **updates, **label_fields(labels)})


def label_fields(labels: list[str] | None) -> dict:
    if labels is None:
        return {}
    return {"num_labels": len(labels), "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}


def build_model(spec: RunSpec, config_path: Path, pretrained: bool, tokenizer, labels):
    auto_class = getattr(transformers, HEADS[spec.task])
    if pretrained:
        return load_saved(config_path, auto_class, **label_fields(labels))
    torch.manual_seed(spec.seed)
    return auto_class.from_config(fresh_config(spec, load_config(config_path), tokenizer, labels))


def training_arguments(spec: RunSpec, output: Path) -> TrainingArguments:
    arguments_class = Seq2SeqTrainingArguments if spec.task == "seq2seq" else TrainingArguments
    quarter = max(1, spec.max_steps // 4)
    return arguments_class(
        output_dir=str(output / "checkpoints"),
        max_steps=spec.max_steps,
        per_device_train_batch_size=spec.batch_size,
        per_device_eval_batch_size=spec.batch_size,
        gradient_accumulation_steps=spec.gradient_accumulation_steps,
        learning_rate=spec.learning_rate,
        lr_scheduler_type=spec.lr_scheduler_type,
        warmup_steps=math.ceil(spec.warmup_ratio * spec.max_steps),
        weight_decay=spec.weight_decay,
        eval_strategy="steps",
        eval_steps=spec.eval_steps or quarter,
        save_strategy="steps",
        save_steps=spec.save_steps or quarter,
        logging_steps=spec.logging_steps or max(1, spec.max_steps // 20),
        seed=spec.seed,
        data_seed=spec.seed,
        bf16=spec.bf16,
        activation_checkpointing=spec.gradient_checkpointing,
        torch_compile=spec.torch_compile,
        report_to=spec.report_to,
        # without an accelerator, say so: else `accelerate launch` on CPU starts N processes that each train alone
        use_cpu=spec.use_cpu or not torch.accelerator.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=True,
        save_only_model=False,
    )


def make_trainer(spec: RunSpec, model, tokenizer, features, labels, args, callbacks):
    trainer_class = Seq2SeqTrainer if spec.task == "seq2seq" else Trainer
    classifying = spec.task in ("sequence-classification", "token-classification")
    return trainer_class(
        model=model,
        args=args,
        train_dataset=features["train"],
        eval_dataset=features["validation"],
        data_collator=collator(spec.task, tokenizer, model),
        processing_class=tokenizer,
        compute_metrics=compute_metrics_for(spec.task, tokenizer, labels) if classifying else None,
        preprocess_logits_for_metrics=argmax_logits if classifying else None,
        callbacks=callbacks,
    )


def final_metrics(trainer, task: str) -> dict[str, float]:
    """Validation scores of the trained model; seq2seq decodes greedily for its text metrics."""
    if task == "seq2seq":  # generating is slow: only here, not in the evaluations during training
        trainer.args.predict_with_generate, trainer.args.generation_max_length = True, 32
        trainer.compute_metrics = compute_metrics_for(task, trainer.processing_class)
    metrics = trainer.evaluate()
    if task == "seq2seq":
        trainer.args.predict_with_generate, trainer.compute_metrics = False, None
    scores = {key.removeprefix("eval_"): value for key, value in metrics.items() if key.startswith("eval_")}
    scores = {k: v for k, v in scores.items() if k not in ("runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time")}
    if task in ("causal-lm", "masked-lm", "seq2seq"):
        scores["perplexity"] = math.exp(scores["loss"])
    return scores


def record(spec: RunSpec, trainer, before: dict | None, after: dict, baseline: list[dict], seconds: float) -> dict:
    training = {
        k: getattr(trainer.args, k)
        for k in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
                  "lr_scheduler_type", "warmup_steps", "weight_decay", "seed", "bf16", "optim")
    }
    training = {k: getattr(v, "value", v) for k, v in training.items()}  # enums (optimizer, schedule) as their names
    training["world_size"] = trainer.args.world_size
    return {
        "task": spec.task,
        "model": spec.model,
        "dataset": spec.data or EMBEDDED_NAME,
        "training": training,
        "results": [{"split": "validation", "metric": k, "value": v} for k, v in after.items()],
        "before_training": [{"split": "validation", "metric": k, "value": v} for k, v in (before or {}).items()],
        "baselines": baseline,
        "seconds": seconds,
        "description": f"{trainer.state.global_step} optimizer steps of `{type(trainer).__name__}` on {spec.data or EMBEDDED_NAME}.",
    }


def save_final(output: Path, model, tokenizer, run: dict) -> Path:
    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / RUN_RECORD).write_text(json.dumps(run, indent=2))
        # named after the run, not the staging folder the card is written in
        write_card_from_run(folder, model, run, repo_id=f"hf-tfm-{output.name}")

    return replace_folder(write, output / "model")


# ---------------------------------------------------------------- the run


def train(spec: RunSpec) -> dict:
    started = time.time()
    check_task(spec.task)
    output = prepare_output_dir(spec)
    resume_from = resume_checkpoint(output) if spec.resume else None
    config_path, pretrained = resolve_model(spec.model)
    config = load_config(config_path)
    check_head(spec.task, config, spec.model)

    data = load_task_data(spec.task, spec.data, spec.validation_file, spec.dataset_config, spec.columns, spec.max_files)
    if spec.max_eval_samples:
        data["validation"] = data["validation"].select(range(min(spec.max_eval_samples, len(data["validation"]))))
    labels = label_names(spec.task, data)
    tokenizer = run_tokenizer(spec, output, config_path, pretrained, data)
    if pretrained:
        check_vocabulary(tokenizer, config, spec.model)
    model = build_model(spec, config_path, pretrained, tokenizer, labels)
    args = training_arguments(spec, output)
    with args.main_process_first(desc="tokenizing"):
        features = tokenize(spec.task, data, tokenizer, spec.max_length, labels)

    csv_log = CSVLogCallback(output / "log.csv")
    callbacks = [csv_log, ManifestCallback(spec.keep_checkpoints)]
    if model.config.num_experts:
        callbacks += [RouterBiasCallback(), RouterStatsCallback()]
    trainer = make_trainer(spec, model, tokenizer, features, labels, args, callbacks)
    before = None
    if resume_from is not None:
        csv_log.truncate_after(step_of(resume_from))
    elif spec.evaluate_before:
        before = final_metrics(trainer, spec.task)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    after = final_metrics(trainer, spec.task)

    run = record(spec, trainer, before, after, baselines(spec.task, data, len(tokenizer), labels), time.time() - started)
    if trainer.is_world_process_zero():
        save_final(output, trainer.model, tokenizer, run)
    return {**run, "model_dir": str(output / "model"), "log": str(output / "log.csv")}


def run_tokenizer(spec: RunSpec, output: Path, config_path: Path, pretrained: bool, data):
    """The tokenizer of this run, saved under the output folder so that a resumed run, and every other process of
    a distributed one, use the very same one."""
    saved = output / "tokenizer"
    with PartialState().main_process_first():
        if saved.is_dir() and (spec.resume or not PartialState().is_main_process):
            return load_tokenizer(saved)
        if spec.tokenizer:
            tokenizer = load_tokenizer(spec.tokenizer)
        elif pretrained:
            tokenizer = load_tokenizer(config_path)
        else:
            texts = training_texts(spec.task, data["train"])
            tokenizer = tokenizers.train_tokenizer(texts, tokenizers.DEFAULT_TOKENIZER[spec.task], spec.vocab_size)
        tokenizer.save_pretrained(saved)
    return tokenizer


def training_texts(task: str, train) -> list[str]:
    if task == "seq2seq":
        return [*train["source"], *train["target"]]
    if task == "token-classification":
        return [" ".join(words) for words in train["tokens"]]
    return list(train["text"])


def evaluate_saved(folder: str, data: str | None = None, validation_file: str | None = None, columns=None,
                   max_files: int | None = None, batch_size: int = 16, max_length: int = 128) -> dict:
    """Scores of a saved model on the validation split of its task's data (the embedded default unless given)."""
    model = load_saved(folder)
    task = task_for_architecture(model.config.architectures[0])
    tokenizer = load_tokenizer(folder)
    check_vocabulary(tokenizer, model.config, folder)
    dataset = load_task_data(task, data, validation_file, columns=columns, max_files=max_files)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)] if task.endswith("classification") else None
    features = tokenize(task, dataset, tokenizer, max_length, labels)
    spec = RunSpec(task=task, model=folder, batch_size=batch_size)
    with tempfile.TemporaryDirectory() as scratch:  # Trainer wants an output folder; evaluation writes nothing there
        trainer = make_trainer(spec, model, tokenizer, features, labels, training_arguments(spec, Path(scratch)), callbacks=[])
        scores = final_metrics(trainer, task)
    return {"task": task, "model": folder, "metrics": scores, "headline": HEADLINE[task][0]}


