"""One `Trainer` run for any task and paradigm (`hf-tfm train`), and evaluation of a saved model (`hf-tfm evaluate`).

Everything that can be wrong with the inputs (data columns, empty splits, tokenizer larger than the model, output
folder, preset name, damaged checkpoint) is checked before the first step. Checkpoints are manifested
(`checkpoints.py`), so `resume=True` continues from the newest complete one, and the final model folder is
written next to the old one and swapped in, so a failed save never costs a good model.
"""

import copy
import difflib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import torch
import transformers
from accelerate import PartialState
from huggingface_hub.errors import StrictDataclassError
from transformers import (
    AutoConfig,
    AutoTokenizer,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer import TRAINER_STATE_NAME

from hf_tfm_cli.spec import RunSpec

from ..compat import checkpointing_argument, load_trainer_checkpoint
from ..hub.card import RUN_RECORD, read_run_record, write_card_from_run
from ..model.modeling_tfm_loading import AUTO_CLASSES
from ..presets import preset_path
from .callbacks import CSVLogCallback, RouterBiasCallback, RouterStatsCallback
from .checkpoints import (
    WEIGHT_FILES,
    ManifestCallback,
    checkpoints,
    last_good_checkpoint,
    load_saved,
    replace_folder,
    step_of,
    write_json_atomic,
)
from .data import EMBEDDED_NAME, check_packing, load_task_data, packed_training_features, packing_collator
from .memory import peak_memory
from .tasks import (
    TASKS,
    argmax_logits,
    baselines,
    check_task,
    collator,
    compute_metrics_for,
    label_names,
    task_for_architecture,
    tokenize,
    trained_tokenizer,
)

# files of a run's output folder besides checkpoints/, model/ and tokenizer/
LOG = "log.csv"
BEFORE_TRAINING = "before_training.json"  # the untrained model's scores, kept for a resumed run's record
EXPERT_LOAD = "expert_load.png"  # MoE runs: the router load per layer and expert over training

# ---------------------------------------------------------------- checks that run before anything is trained


def resolve_model(model: str) -> tuple[Path, bool]:
    """(folder or config.json holding the config, whether it carries weights to fine-tune)."""
    path = Path(model)
    if path.is_file() and path.suffix == ".json":
        return path, False
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json")
        return path, any((path / name).is_file() for name in WEIGHT_FILES)
    try:
        return preset_path(model), False
    except ValueError as error:  # it names the presets, or the new name of a renamed one
        raise ValueError(f"unknown model {model!r}: not a folder or a config.json file, and {error}") from None


def load_config(path: Path):
    import hf_tfm  # noqa: F401  (registers the tfm model types with AutoConfig)

    try:
        if path.is_file():
            return AutoConfig.for_model(**json.loads(path.read_text()))
        return AutoConfig.from_pretrained(path)
    except StrictDataclassError as error:  # a field of the wrong type: one line naming it, not a traceback
        raise ValueError(f"{path}: {config_problem(error)}") from error


def config_problem(error: Exception) -> str:
    """The line of a config validation error that names the field (huggingface_hub's strict dataclasses put it
    last, after a heading)."""
    return str(error.__cause__ or error).strip().splitlines()[-1].strip()


def check_head(task: str, config, model: str) -> None:
    """The task's head exists for this config: an hf_tfm model type's from its table of heads, a transformers model
    type's (the reference classes `hf-tfm compare` trains) from transformers' auto class, built on the meta device."""
    head = TASKS[task].head.auto_class
    if config.model_type not in AUTO_CLASSES:
        try:
            with torch.device("meta"):
                getattr(transformers, head).from_config(config)
            return
        except ValueError:
            available = "none that transformers maps to it"
    else:
        available = ", ".join(AUTO_CLASSES[config.model_type])
        if head in AUTO_CLASSES[config.model_type]:
            return
    raise ValueError(
        f"task {task} needs a {head} head, which model_type {config.model_type!r} ({model}) does not have; "
        f"its heads: {available}"
    )


def prepare_output_dir(spec: RunSpec) -> Path:
    output = Path(spec.output_dir)
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise PermissionError(
            f"output directory {output} is not writable ({error.strerror}); choose another --output-dir"
        ) from error
    earlier = output / "checkpoints"
    if checkpoints(earlier) and not (spec.resume or spec.overwrite):
        raise FileExistsError(
            f"{earlier} holds checkpoints of an earlier run: pass --resume to continue it or --overwrite to start over"
        )
    if spec.overwrite and not spec.resume and PartialState().is_main_process:
        shutil.rmtree(earlier, ignore_errors=True)
        for name in (LOG, BEFORE_TRAINING, EXPERT_LOAD):
            (output / name).unlink(missing_ok=True)
    PartialState().wait_for_everyone()
    return output


def resume_checkpoint(output: Path) -> Path:
    checkpoint, passed_over = last_good_checkpoint(output / "checkpoints")
    for _, reason in passed_over:
        print(f"resume: passing over {reason}")
    if checkpoint is None:
        raise FileNotFoundError(
            f"--resume: no complete checkpoint under {output / 'checkpoints'}; start again without --resume"
        )
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
        updates.update(
            {
                name: spec.dropout
                for name in ("hidden_dropout", "attention_dropout", "embedding_dropout")
                if hasattr(config, name)
            }
        )
    updates.update(spec.config_overrides)
    try:
        return AutoConfig.for_model(**{**config.to_dict(), **updates, **label_fields(labels)})
    except (StrictDataclassError, TypeError, ValueError) as error:  # the config's own validation names the field
        if not spec.config_overrides:
            raise
        given = " ".join(
            f"--set {key}={value if isinstance(value, str) else json.dumps(value)}"
            for key, value in spec.config_overrides.items()
        )
        raise ValueError(f"{given}: {config_problem(error)}") from error


def model_label(spec: RunSpec) -> str:
    """The model a run trained, as `hf-tfm compare` names a variant: `NAME:field=value,...` when `--set` changed
    fields of the preset or config (the summary and the card must not show a variant as the model it varies)."""
    if not spec.config_overrides:
        return spec.model
    overrides = spec.config_overrides
    shown = {key: value if isinstance(value, str) else json.dumps(value) for key, value in overrides.items()}
    return spec.model + ":" + ",".join(f"{key}={value}" for key, value in shown.items())


def check_overrides(spec: RunSpec, config, pretrained: bool) -> None:
    """`--set` may only name a field of the model's config class (a misspelled one would be kept and ignored), and
    only for a fresh model."""
    if pretrained and (spec.config_overrides or spec.dropout is not None):
        raise ValueError(f"--set and --dropout change a fresh model's config; {spec.model} is a trained checkpoint")
    config_class = type(config)
    valid = {f.name for f in fields(config_class)} | set(getattr(config_class, "attribute_map", {}))
    for key in spec.config_overrides:
        if key not in valid:
            nearest = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            raise ValueError(f"--set {key}: {config_class.__name__} has no field {key!r}{hint}")


def label_fields(labels: list[str] | None) -> dict:
    if labels is None:
        return {}
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {n: i for i, n in enumerate(labels)},
    }


def build_model(spec: RunSpec, config_path: Path, pretrained: bool, tokenizer, labels):
    auto_class = getattr(transformers, TASKS[spec.task].head.auto_class)
    if pretrained:
        return load_saved(config_path, auto_class, **label_fields(labels))
    torch.manual_seed(spec.seed)
    return auto_class.from_config(fresh_config(spec, load_config(config_path), tokenizer, labels))


def training_arguments(spec: RunSpec, output: Path) -> TrainingArguments:
    arguments_class = Seq2SeqTrainingArguments if TASKS[spec.task].generates else TrainingArguments
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
        **checkpointing_argument(spec.gradient_checkpointing),
        torch_compile=spec.torch_compile,
        report_to=spec.report_to,
        # without an accelerator, say so: else `accelerate launch` on CPU starts N processes that each train alone
        use_cpu=spec.use_cpu or not torch.accelerator.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=True,
        save_only_model=False,
        logging_nan_inf_filter=False,  # log the true loss; StopOnNonFiniteLoss stops at the first non-finite one
    )


class NonFiniteLoss(ValueError):
    def __init__(self, step: int, loss: float):
        super().__init__(f"non-finite training loss {loss} at step {step}")
        self.step, self.loss = step, loss


class StopOnNonFiniteLoss:
    """Trainer mixin: raise `NonFiniteLoss` at the first micro-batch whose loss is NaN or infinite, before the
    optimizer applies its gradients, so neither the model in memory nor any later checkpoint holds NaN weights.
    Costs one host sync per micro-batch, as Trainer's own `logging_nan_inf_filter` check (turned off here) does."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(self.state.global_step + 1, loss.item())
        return loss


class PackedTraining:
    """Trainer mixin for --packing: training batches come from `train_collator` (`--batch-size` rows of whole
    examples packed `--max-length` tokens each), evaluation keeps the padded `data_collator`, so eval losses compare
    with runs without packing."""

    train_collator = None

    def get_train_dataloader(self):
        if self.train_collator is None:
            return super().get_train_dataloader()
        padded, self.data_collator = self.data_collator, self.train_collator
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = padded


ROUTER_LOSS_WEIGHTS = ("router_aux_loss_coef", "router_z_loss_coef")


class TaskLossEvaluation:
    """Trainer mixin: evaluations score the task's loss alone. An MoE model's loss adds its weighted router losses,
    as transformers' MoE models' does; they regularize training, and left in they would raise the validation loss
    and perplexity above what the predictions earn, and above a dense model's at the same predictions."""

    def evaluate(self, *args, **kwargs):
        config = self.model.config
        weights = {name: getattr(config, name) for name in ROUTER_LOSS_WEIGHTS if getattr(config, name, None)}
        for name in weights:
            setattr(config, name, 0.0)
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            for name, weight in weights.items():
                setattr(config, name, weight)


class RunTrainer(StopOnNonFiniteLoss, TaskLossEvaluation, PackedTraining, Trainer):
    pass


class RunSeq2SeqTrainer(StopOnNonFiniteLoss, TaskLossEvaluation, Seq2SeqTrainer):
    pass


def make_trainer(spec: RunSpec, model, tokenizer, features, labels, args, callbacks):
    trainer_class = RunSeq2SeqTrainer if TASKS[spec.task].generates else RunTrainer
    classifying = TASKS[spec.task].classifies
    trainer = trainer_class(
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
    # router statistics are added to the logs in place: first, so report_to integrations and log.csv get them too
    router_stats = trainer.pop_callback(RouterStatsCallback)
    if router_stats is not None:
        trainer.callback_handler.callbacks.insert(0, router_stats)
    if spec.packing:
        trainer.train_collator = packing_collator(spec.task, tokenizer)
    return trainer


def final_metrics(trainer, task: str) -> dict[str, float]:
    """Validation scores of the trained model; seq2seq decodes greedily for its text metrics."""
    generates = TASKS[task].generates
    if generates:  # generating is slow: only here, not in the evaluations during training
        trainer.args.predict_with_generate, trainer.args.generation_max_length = True, 32
        trainer.compute_metrics = compute_metrics_for(task, trainer.processing_class)
        # Seq2SeqTrainer writes every generation default (max_length=20, ...) into the model's generation config,
        # and a saved max_length makes every later generate(max_new_tokens=...) warn that both are set
        generation_config = copy.deepcopy(trainer.model.generation_config)
    metrics = trainer.evaluate()
    if generates:
        trainer.args.predict_with_generate, trainer.compute_metrics = False, None
        trainer.model.generation_config = generation_config
    scores = {key.removeprefix("eval_"): value for key, value in metrics.items() if key.startswith("eval_")}
    scores = {
        k: v
        for k, v in scores.items()
        if k not in ("runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time")
    }
    if TASKS[task].perplexity:
        scores["perplexity"] = math.exp(scores["loss"])
    return scores


def record(
    spec: RunSpec, trainer, before: dict | None, after: dict, baseline: list[dict], seconds: float, peak: dict
) -> dict:
    training = {
        k: getattr(trainer.args, k)
        for k in (
            "max_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "learning_rate",
            "lr_scheduler_type",
            "warmup_steps",
            "weight_decay",
            "seed",
            "bf16",
            "optim",
        )
    }
    training = {k: getattr(v, "value", v) for k, v in training.items()}  # enums (optimizer, schedule) as their names
    training["world_size"] = trainer.args.world_size
    training["packing"] = spec.packing
    return {
        "task": spec.task,
        "model": model_label(spec),
        "dataset": spec.data or EMBEDDED_NAME,
        "data": data_settings(spec),  # what `hf-tfm evaluate` reads to score the same validation split
        "training": training,
        "results": [{"split": "validation", "metric": k, "value": v} for k, v in after.items()],
        "before_training": [{"split": "validation", "metric": k, "value": v} for k, v in (before or {}).items()],
        "baselines": baseline,
        "seconds": seconds,
        "peak_memory": peak or None,  # memory.peak_memory: what training added, and how it was measured
        "description": (
            f"{trainer.state.global_step} optimizer steps of `{type(trainer).__name__}` "
            f"on {spec.data or EMBEDDED_NAME}."
        ),
    }


def save_final(output: Path, model, tokenizer, run: dict) -> Path:
    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / RUN_RECORD).write_text(json.dumps(run, indent=2))
        if model.config.model_type in AUTO_CLASSES:  # hf_tfm's card describes hf_tfm configs; a reference class's
            # named after the run, not the staging folder the card is written in
            write_card_from_run(folder, model, run, repo_id=f"hf-tfm-{output.name}")

    return replace_folder(write, output / "model")


# ---------------------------------------------------------------- the run


def train(spec: RunSpec) -> dict:
    started = time.time()
    check_task(spec.task)
    if spec.packing:
        check_packing(spec.task)
    output = prepare_output_dir(spec)
    resume_from = resume_checkpoint(output) if spec.resume else None
    config_path, pretrained = resolve_model(spec.model)
    config = load_config(config_path)
    check_head(spec.task, config, spec.model)
    check_overrides(spec, config, pretrained)

    data = run_data(spec.task, data_settings(spec))
    labels = label_names(spec.task, data)
    tokenizer = run_tokenizer(spec, output, config_path, pretrained, data)
    if pretrained:
        check_vocabulary(tokenizer, config, spec.model)
    model = build_model(spec, config_path, pretrained, tokenizer, labels)
    args = training_arguments(spec, output)
    with args.main_process_first(desc="tokenizing"):
        features = tokenize(spec.task, data, tokenizer, spec.max_length, labels)
        if spec.packing:
            features = packed_training_features(spec.task, data, tokenizer, spec.max_length, features)

    csv_log = CSVLogCallback(output / LOG)
    callbacks = [csv_log, ManifestCallback(spec.keep_checkpoints)]
    router_stats = RouterStatsCallback() if getattr(model.config, "num_experts", 0) else None
    if router_stats:
        callbacks += [RouterBiasCallback(), router_stats]
    trainer = make_trainer(spec, model, tokenizer, features, labels, args, callbacks)
    if resume_from is not None:
        csv_log.truncate_after(step_of(resume_from))
    before = before_training(spec, trainer, output, resume_from)
    peak = {}  # a finished run, resumed, trains nothing
    if resume_from is not None and step_of(resume_from) >= spec.max_steps:
        # Trainer checks max_steps only after a step: resuming a finished run would train one step past it
        load_trainer_checkpoint(trainer, str(resume_from))
        trainer.state = TrainerState.load_from_json(str(resume_from / TRAINER_STATE_NAME))
    else:
        with peak_memory(args.device) as peak:
            train_until_diverged(trainer, output, csv_log, resume_from)
    after = final_metrics(trainer, spec.task)

    scores = baselines(spec.task, data, len(tokenizer), labels)
    run = record(spec, trainer, before, after, scores, time.time() - started, peak)
    result = {"model_dir": str(output / "model"), "log": str(output / LOG)}
    if trainer.is_world_process_zero():
        save_final(output, trainer.model, tokenizer, run)
        if router_stats and router_stats.history:  # a resumed run draws the steps since it resumed
            router_stats.save_heatmap(output / EXPERT_LOAD)
            result["expert_load"] = str(output / EXPERT_LOAD)
    return {**run, **result}


def before_training(spec: RunSpec, trainer, output: Path, resume_from: Path | None) -> dict | None:
    """The untrained model's scores: measured by a fresh run and kept in the output folder, so that a resumed run,
    whose model is no longer untrained, records the same before -> after as an uninterrupted one."""
    kept = output / BEFORE_TRAINING
    if resume_from is not None:
        return json.loads(kept.read_text()) if kept.is_file() else None
    if not spec.evaluate_before:
        return None
    before = final_metrics(trainer, spec.task)
    if trainer.is_world_process_zero():
        write_json_atomic(kept, before)
    return before


def train_until_diverged(trainer, output: Path, csv_log, resume_from: Path | None) -> None:
    """`trainer.train()`, stopped at the first non-finite loss with the step, the value (also in log.csv, as is)
    and the newest checkpoint to go back to, all saved before the divergence."""
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except NonFiniteLoss as diverged:
        if trainer.is_world_process_zero():
            csv_log.write(diverged.step, trainer.state.epoch, {"loss": diverged.loss})
        good, _ = last_good_checkpoint(output / "checkpoints")
        back = f"the last good checkpoint is {good} (--resume continues from it)" if good else "none was saved"
        raise ValueError(
            f"training diverged: the loss was {diverged.loss} at step {diverged.step}; stopped before applying "
            f"that step, so no checkpoint holds its weights, and {back}. Try a lower --learning-rate."
        ) from None


DATA_SETTINGS = (
    "data",
    "validation_file",
    "dataset_config",
    "columns",
    "max_files",
    "max_length",
    "max_eval_samples",
    "seed",
)
SOURCE_SETTINGS = ("validation_file", "dataset_config", "columns", "max_files")  # belong to one `data` source


def data_settings(spec: RunSpec) -> dict:
    """The RunSpec fields that decide which examples a run trains and is scored on (kept in its run record)."""
    return {name: getattr(spec, name) for name in DATA_SETTINGS}


def run_data(task: str, settings: dict):
    """Train and validation splits as `data_settings` describe them: the same for `train` and `evaluate`."""
    data = load_task_data(
        task,
        settings["data"],
        settings["validation_file"],
        settings["dataset_config"],
        settings["columns"],
        settings["max_files"],
    )
    sizes = {split: len(data[split]) for split in ("train", "validation")}
    if not all(sizes.values()):
        rows = f"{sizes['train']} training and {sizes['validation']} validation rows; both splits need rows"
        if settings["max_files"]:
            raise ValueError(
                f"--max-files {settings['max_files']}: the embedded {task} data of that many stdlib "
                f"files has {rows}: raise --max-files"
            )
        raise ValueError(f"the {task} data {settings['data'] or EMBEDDED_NAME} has {rows}")
    if settings["max_eval_samples"]:
        data["validation"] = data["validation"].select(range(min(settings["max_eval_samples"], sizes["validation"])))
    return data


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
            tokenizer = trained_tokenizer(spec.task, data["train"], spec.vocab_size)
        tokenizer.save_pretrained(saved)
    return tokenizer


def evaluate_saved(
    folder: str,
    data: str | None = None,
    validation_file: str | None = None,
    dataset_config: str | None = None,
    columns: dict | None = None,
    max_files: int | None = None,
    max_eval_samples: int | None = None,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> dict:
    """Scores of a saved model on a validation split: by default the very split its training run was scored on
    (the data settings in its run record), else the embedded default; arguments given replace those settings."""
    model = load_saved(folder)
    task = task_for_architecture(model.config.architectures[0])
    tokenizer = load_tokenizer(folder)
    check_vocabulary(tokenizer, model.config, folder)
    run = read_run_record(folder)
    recorded = dict(run.data) if run else {}
    if data is not None and data != recorded.get("data"):  # other data: the run's file-specific settings do not apply
        recorded = {k: v for k, v in recorded.items() if k not in SOURCE_SETTINGS}
    given = {
        "data": data,
        "validation_file": validation_file,
        "dataset_config": dataset_config,
        "columns": columns,
        "max_files": max_files,
        "max_eval_samples": max_eval_samples,
        "max_length": max_length,
    }
    defaults = data_settings(RunSpec(task=task))
    settings = {**defaults, **recorded, **{k: v for k, v in given.items() if v is not None}}
    batch_size = batch_size or (run.training.get("per_device_train_batch_size") if run else None) or RunSpec.batch_size
    dataset = run_data(task, settings)
    classifying = TASKS[task].classifies
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)] if classifying else None
    features = tokenize(task, dataset, tokenizer, settings["max_length"], labels)
    spec = RunSpec(task=task, model=folder, batch_size=batch_size)
    with tempfile.TemporaryDirectory() as scratch:  # Trainer wants an output folder; evaluation writes nothing there
        trainer = make_trainer(
            spec, model, tokenizer, features, labels, training_arguments(spec, Path(scratch)), callbacks=[]
        )
        scores = final_metrics(trainer, task)
    scored = {
        **settings,
        "data": settings["data"] or EMBEDDED_NAME,
        "split": "validation",
        "rows": len(dataset["validation"]),
        "batch_size": batch_size,
        "settings_from": f"{RUN_RECORD if recorded else 'the defaults'} and the options given",
    }
    return {"task": task, "model": folder, "metrics": scores, "headline": TASKS[task].headline, "scored_on": scored}
