"""What the example scripts share: the command line, the tokenizer, the model config, the training arguments, and the
end of a run (metrics, model and tokenizer saved for `from_pretrained`). Everything specific to a task (tokenizing,
collating, metrics) stays in its `train_*.py`.

The scripts import this file as `common`: Python puts a script's own folder first on `sys.path`, so
`python examples/x.py` and `accelerate launch examples/x.py` both find it, whatever the working directory.
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, TrainingArguments, set_seed

import hf_tfm  # registers tfm_decoder / tfm_encoder / tfm_encoder_decoder with the Auto classes; the presets
from hf_tfm.training.data import load_task_data
from hf_tfm.training.tokenizers import train_tokenizer

# The model a script builds when --config is not given: small enough to train on a laptop CPU in minutes.
SMALL = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512}


def parser(doc: str, output_dir: str, config: str | None = None) -> argparse.ArgumentParser:
    """The options every script takes; a script adds its own before `parse_args()`."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_argument_group("model")
    presets = ", ".join(hf_tfm.preset_names())
    model.add_argument("--config", default=config, help=f"a config folder or a preset ({presets})")
    model.add_argument("--hidden-size", type=int, help="resize the model (head_dim and feed-forward width follow)")
    model.add_argument("--num-layers", type=int, help="resize the model: layers per stack")
    model.add_argument("--num-heads", type=int, help="resize the model: attention heads (they must divide the width)")
    model.add_argument("--tokenizer", help="a saved tokenizer folder; default: train one on the train split")
    model.add_argument("--vocab-size", type=int, default=4096, help="of the tokenizer trained without --tokenizer")
    data = p.add_argument_group("data (default: the embedded stdlib-docstring data)")
    data.add_argument("--train-file", help="a .txt/.json/.jsonl/.csv/.parquet file or a `datasets` name")
    data.add_argument("--validation-file", help="default: 5%% of the train file")
    data.add_argument("--dataset-config", help="the `datasets` configuration of --train-file, if it has several")
    data.add_argument("--max-files", type=int, help="embedded data: read only this many stdlib files (quick runs)")
    data.add_argument("--max-eval-samples", type=int, help="evaluate on only the first N validation examples")
    data.add_argument("--max-length", type=int, default=128, help="tokens per example")
    train = p.add_argument_group("training")
    train.add_argument("--output-dir", default=output_dir)
    train.add_argument("--max-steps", type=int, default=500)
    train.add_argument(
        "--batch-size", type=int, default=16, help="per process (the global batch: times the processes)"
    )
    train.add_argument("--learning-rate", type=float, default=1e-3)
    train.add_argument("--logging-steps", type=int, default=25)
    train.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: only the final save)")
    train.add_argument("--seed", type=int, default=0)
    return p


def load_data(task: str, args):
    """Train and validation splits with the task's standard columns (see `hf_tfm.training.data`)."""
    data = load_task_data(task, args.train_file, args.validation_file, args.dataset_config, max_files=args.max_files)
    if args.max_eval_samples is not None:
        data["validation"] = data["validation"].select(range(min(args.max_eval_samples, len(data["validation"]))))
    return data


def training_arguments(args, cls=TrainingArguments, **task_fields) -> TrainingArguments:
    set_seed(args.seed)  # before the model is built, so that its initial weights depend on --seed alone
    return cls(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=args.max_steps // 20,
        logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        seed=args.seed,
        report_to="none",
        # Without a GPU, `accelerate launch --multi_gpu --num_processes N` starts N processes that would each train
        # alone; use_cpu makes them one gloo process group (`accelerate launch --cpu` runs one process, or mpirun).
        use_cpu=not torch.accelerator.is_available(),
        **task_fields,
    )


def tokenizer(args, training_args, texts, kind: str):
    """--tokenizer, or a `kind` tokenizer (bpe, wordpiece, unigram) trained on `texts` by the main process and saved
    to --output-dir, from where every process loads it: all processes get the very same vocabulary."""
    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    with training_args.main_process_first(desc="tokenizer training"):
        if training_args.local_process_index == 0:
            train_tokenizer(texts, kind, args.vocab_size).save_pretrained(args.output_dir)
    return AutoTokenizer.from_pretrained(args.output_dir)


def model_config(args, tokenizer, model_type: str, **fields):
    """--config (a folder or a preset name), or else a SMALL `model_type`; then `fields`, the tokenizer's vocabulary
    and special tokens, and --hidden-size / --num-layers; validated as one new config."""
    if args.config:
        folder = Path(args.config) if Path(args.config).exists() else hf_tfm.preset_path(args.config)
        base = json.loads((folder / "config.json").read_text())
    else:
        base = {"model_type": model_type, **SMALL}
    if args.num_heads:  # grouped-query attention stays where its key/value heads still divide the new count
        kv_heads = base.get("num_key_value_heads")
        base.update(num_attention_heads=args.num_heads, head_dim=None)
        base["num_key_value_heads"] = kv_heads if kv_heads and args.num_heads % kv_heads == 0 else None
    if args.hidden_size:
        ratio = base.get("intermediate_size", 4 * base["hidden_size"]) / base["hidden_size"]
        base.update(hidden_size=args.hidden_size, head_dim=None, moe_intermediate_size=None)
        # a multiple of 16: transformers' grouped_mm MoE kernel needs 16-byte-aligned expert strides
        base["intermediate_size"] = max(16, round(ratio * args.hidden_size / 16) * 16)
    if args.num_layers:
        base["num_hidden_layers"] = args.num_layers
        if base["model_type"] == "tfm_encoder_decoder":
            base["decoder_layers"] = args.num_layers
    special = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "bos", "eos")}
    base.update(vocab_size=len(tokenizer), **special, **fields)
    return AutoConfig.for_model(base.pop("model_type"), **base)


def label_maps(names: list[str]) -> dict:
    """The config fields that name a classifier's labels (saved with the model, used by pipelines)."""
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def train(trainer) -> None:
    """Train; print and save the training metrics and the trainer state (its log_history holds every logged step)."""
    args, distributed = trainer.args, trainer.accelerator.distributed_type
    print(f"process {args.process_index + 1}/{args.world_size}: {distributed} on {args.device}")
    result = trainer.train()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()


def save(trainer, metrics: dict) -> None:
    """Print and save the evaluation metrics; save the model and tokenizer (only the main process writes)."""
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    if trainer.is_fsdp_enabled:  # checkpoints stay sharded; the final folder is one full state dict
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model()
