"""Quality at equal compute: GPT-2-style vs modern vs MoE decoders, BERT-style vs modern encoders.

    python -m benchmarks.quality --profile cpu  # writes benchmarks/results/quality-cpu-<date>.json (~35 min, 2 cores)

Within a study every model sees the same tokenizer, the same training blocks (batch x length x steps tokens), the
same learning-rate schedule and the same seeds; parameter counts are matched (the MoE decoder matches the dense ones
in *active* parameters). Dropout is off for all. Each run is a plain `hf-tfm train` run (`hf_tfm.training.run`).

The final score is the validation loss computed here, the same way for every model: token-weighted cross-entropy
over the whole validation split, with one fixed set of masked positions for the encoders. It excludes the MoE
router loss that `Trainer`'s `eval_loss` includes (0.01 x the load-balancing loss); the learning curves are
`Trainer`'s eval_loss and so carry that small offset for the MoE model.
"""

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
from transformers import DataCollatorForLanguageModeling

from benchmarks.pairs import parameter_count
from benchmarks.record import header, write
from hf_tfm.hub.card import RUN_RECORD
from hf_tfm.training import tokenizers
from hf_tfm.training.callbacks import logged
from hf_tfm.training.checkpoints import load_saved
from hf_tfm.training.data import load_task_data
from hf_tfm.training.run import RunSpec, load_tokenizer, train
from hf_tfm.training.tasks import MLM_PROBABILITY, TASKS, tokenize

# 4 layers of width 128 with 4 heads. The classic models' learned position table, biases and wider heads for K/V
# are matched by the modern models' wider SwiGLU (400: parameters equal to within 1%); the MoE decoder's two active
# experts of 200 equal that one SwiGLU. (Widths are multiples of 4 floats: CPU grouped_mm needs 16-byte strides.)
_BODY = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    tie_word_embeddings=True,
    vocab_size=4096,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    embedding_dropout=0.0,
)
_CLASSIC = dict(
    _BODY,
    position_embedding_type="learned",
    max_position_embeddings=128,
    norm_type="layernorm",
    attention_bias=True,
    mlp_bias=True,
    ffn_type="mlp",
    intermediate_size=512,
)
_MODERN = dict(
    _BODY,
    position_embedding_type="rope",
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    max_position_embeddings=128,
    norm_type="rmsnorm",
    norm_bias=False,
    attention_bias=False,
    mlp_bias=False,
    ffn_type="glu",
    hidden_act="silu",
    num_key_value_heads=2,
    intermediate_size=400,
)

STUDIES = {
    "decoders": {
        "task": "causal-lm",
        "learning_rate": 3e-3,
        "models": {
            "gpt2-style": dict(_CLASSIC, model_type="tfm_decoder", norm_position="pre", hidden_act="gelu_new"),
            "modern": dict(_MODERN, model_type="tfm_decoder", norm_position="pre"),
            "moe (same active)": dict(
                _MODERN,
                model_type="tfm_decoder",
                norm_position="pre",
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=200,
                router_aux_loss_coef=0.01,
            ),
        },
    },
    "encoders": {
        "task": "masked-lm",
        "learning_rate": 1e-3,
        "models": {
            "bert-style": dict(
                _CLASSIC,
                model_type="tfm_encoder",
                norm_position="post",
                embedding_norm=True,
                final_norm=False,
                hidden_act="gelu",
                type_vocab_size=2,
            ),
            "modern": dict(_MODERN, model_type="tfm_encoder", norm_position="pre", final_norm=True),
        },
    },
}

PROFILES = {
    # 2 CPU cores, one single-threaded run per core
    "cpu": dict(
        steps=500,
        batch_size=16,
        max_length=128,
        seeds=[0, 1, 2],
        workers=2,
        threads=1,
        max_files=None,
        max_eval_samples=512,
        bf16=False,
        scale={},
    ),
    # an H100: wider and deeper models, 4x the tokens
    "gpu": dict(
        steps=2000,
        batch_size=32,
        max_length=128,
        seeds=[0, 1, 2],
        workers=1,
        threads=None,
        max_files=None,
        max_eval_samples=None,
        bf16=True,
        scale=dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8),
    ),
    # for tests: every code path in seconds
    "smoke": dict(
        steps=3,
        batch_size=4,
        max_length=32,
        seeds=[0, 1],
        workers=1,
        threads=1,
        max_files=40,
        max_eval_samples=8,
        bf16=False,
        scale={},
    ),
}


def scaled(config: dict, scale: dict) -> dict:
    """A larger profile widens every model by the same factor, so the parameter match holds."""
    if not scale:
        return config
    factor = scale["hidden_size"] / config["hidden_size"]
    grown = dict(config, **scale)
    for width in ("intermediate_size", "moe_intermediate_size"):
        if width in config:
            grown[width] = round(config[width] * factor)
    return grown


def validation_loss(model, tokenizer, task: str, features, batch_size: int = 32) -> float:
    """Token-weighted cross-entropy over every validation block; masked positions drawn from a fixed seed, so every
    model is scored on the same masks. (The collator's own `seed` refuses to run in a worker process.)"""
    model.eval()
    mlm = task == "masked-lm"
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=mlm, mlm_probability=MLM_PROBABILITY, return_tensors="pt")
    torch.manual_seed(0)
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(features), batch_size):
            batch = collate([{"input_ids": ids} for ids in features[start : start + batch_size]["input_ids"]])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
            labels = batch["labels"] if mlm else batch["labels"][:, 1:]
            logits = logits if mlm else logits[:, :-1]
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
            ).item()
            count += int((labels != -100).sum())
    return total / count


def one_run(job: dict) -> dict:
    """One training run in its own process (so that two can share the CPU, one thread each)."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    spec = RunSpec(**job["spec"])
    result = finished_run(job) or train(spec)
    (Path(spec.output_dir) / STUDY_SPEC).write_text(json.dumps(study_spec(job), indent=2))
    data = load_task_data(spec.task, max_files=spec.max_files)
    tokenizer = load_tokenizer(spec.tokenizer)
    features = tokenize(spec.task, data, tokenizer, spec.max_length)["validation"]
    model = load_saved(result["model_dir"])
    return {
        "study": job["study"],
        "model": job["model"],
        "seed": spec.seed,
        "validation_loss": validation_loss(model, tokenizer, spec.task, features),
        "parameters": parameter_count(model, active=False),
        "active_parameters": parameter_count(model, active=True),
        "curve": logged(result["log"], "eval_loss"),
        "train_curve": logged(result["log"], "loss"),
        "seconds": result["seconds"],
    }


STUDY_SPEC = "study_spec.json"  # what a finished run was trained with, next to its model folder


def study_spec(job: dict) -> dict:
    """Everything a run's result depends on: its RunSpec and the model config it names."""
    return {"spec": job["spec"], "config": json.loads(Path(job["spec"]["model"]).read_text())}


def finished_run(job: dict) -> dict | None:
    """The result of this very run if an earlier, interrupted study already completed it with the same RunSpec
    and model config: a crash late in a long study does not cost the runs it finished."""
    output = Path(job["spec"]["output_dir"])
    folder, recorded = output / "model", output / STUDY_SPEC
    if not (folder / RUN_RECORD).is_file() or not recorded.is_file():
        return None
    if json.loads(recorded.read_text()) != study_spec(job):
        return None
    return {**json.loads((folder / RUN_RECORD).read_text()), "model_dir": str(folder), "log": str(output / "log.csv")}


def shared_tokenizer(task: str, folder: Path, vocab_size: int, max_files: int | None) -> str:
    """One tokenizer per study, trained on its training split, for every model and seed."""
    if not (folder / "tokenizer.json").is_file():
        data = load_task_data(task, max_files=max_files)
        texts = TASKS[task].texts(data["train"])
        tokenizers.train_tokenizer(texts, TASKS[task].tokenizer, vocab_size).save_pretrained(folder)
    return str(folder)


def jobs(profile: dict, work: Path, studies: list[str]) -> list[dict]:
    planned = []
    for study_name in studies:
        study = STUDIES[study_name]
        tokenizer = shared_tokenizer(
            study["task"], work / study_name / "tokenizer", _BODY["vocab_size"], profile["max_files"]
        )
        for model_name, config in study["models"].items():
            config_file = work / study_name / f"{model_name.split()[0]}.json"
            config_file.write_text(json.dumps(scaled(config, profile["scale"]), indent=2))
            for seed in profile["seeds"]:
                spec = dict(
                    task=study["task"],
                    model=str(config_file),
                    tokenizer=tokenizer,
                    output_dir=str(work / study_name / f"{model_name.split()[0]}-seed{seed}"),
                    max_steps=profile["steps"],
                    batch_size=profile["batch_size"],
                    max_length=profile["max_length"],
                    learning_rate=study["learning_rate"],
                    lr_scheduler_type="cosine",
                    warmup_ratio=0.05,
                    weight_decay=0.1,
                    seed=seed,
                    eval_steps=max(1, profile["steps"] // 10),
                    save_steps=profile["steps"],
                    keep_checkpoints=1,
                    evaluate_before=False,
                    overwrite=True,
                    max_files=profile["max_files"],
                    max_eval_samples=profile["max_eval_samples"],
                    bf16=profile["bf16"],
                    use_cpu=not torch.cuda.is_available(),
                )
                planned.append({"study": study_name, "model": model_name, "spec": spec, "threads": profile["threads"]})
    return planned


def summarise(runs: list[dict]) -> list[dict]:
    """Per study and model: mean, standard deviation and range of the final validation loss over seeds."""
    rows = []
    for study in dict.fromkeys(r["study"] for r in runs):
        for model in dict.fromkeys(r["model"] for r in runs if r["study"] == study):
            losses = [r["validation_loss"] for r in runs if r["study"] == study and r["model"] == model]
            mean = statistics.fmean(losses)
            first = next(r for r in runs if r["study"] == study and r["model"] == model)
            rows.append(
                {
                    "study": study,
                    "model": model,
                    "seeds": len(losses),
                    "mean_loss": mean,
                    "std_loss": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                    "min_loss": min(losses),
                    "max_loss": max(losses),
                    "perplexity": math.exp(mean),
                    "parameters": first["parameters"],
                    "active_parameters": first["active_parameters"],
                }
            )
    return rows


def run(
    profile_name: str,
    studies: list[str] | None = None,
    work: Path | None = None,
    output: Path | None = None,
    command: str | None = None,
) -> dict:
    profile = PROFILES[profile_name]
    studies = studies or list(STUDIES)
    work = work or Path("runs") / f"quality-{profile_name}"
    work.mkdir(parents=True, exist_ok=True)
    for study in studies:
        (work / study).mkdir(exist_ok=True)
    planned = jobs(profile, work, studies)
    if profile["workers"] > 1:
        with ProcessPoolExecutor(profile["workers"], mp_context=get_context("spawn")) as pool:
            runs = list(pool.map(one_run, planned))
    else:
        runs = [one_run(job) for job in planned]
    command = command or f"python -m benchmarks.quality --profile {profile_name}"
    record = {
        **header(profile_name, command, torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "settings": {key: value for key, value in profile.items()},
        "studies": {
            name: {
                "task": STUDIES[name]["task"],
                "learning_rate": STUDIES[name]["learning_rate"],
                "configs": {m: scaled(c, profile["scale"]) for m, c in STUDIES[name]["models"].items()},
            }
            for name in studies
        },
        "tokens_per_run": profile["steps"] * profile["batch_size"] * profile["max_length"],
        "summary": summarise(runs),
        "runs": runs,
    }
    print("| study | model | params (active) | validation loss, mean +- std (min-max) over seeds | perplexity |")
    print("|---|---|---|---|---|")
    for row in record["summary"]:
        print(
            f"| {row['study']} | {row['model']} | {row['parameters']:,} ({row['active_parameters']:,}) | "
            f"{row['mean_loss']:.3f} +- {row['std_loss']:.3f} ({row['min_loss']:.3f}-{row['max_loss']:.3f}) | "
            f"{row['perplexity']:.1f} |"
        )
    write(record, f"quality-{profile_name}", output)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--studies", nargs="+", choices=sorted(STUDIES))
    parser.add_argument("--work-dir", type=Path, help="where the runs are written (default runs/quality-<profile>)")
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/quality-<profile>-<date>.json")
    args = parser.parse_args(argv)
    run(
        args.profile,
        args.studies,
        args.work_dir,
        args.output,
        command="python -m benchmarks.quality " + " ".join(argv or sys.argv[1:]),
    )


if __name__ == "__main__":
    main()
