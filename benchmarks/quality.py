"""Quality at equal compute: GPT-2-style vs modern vs MoE decoders and transformers' GPT2LMHeadModel, BERT-style vs
modern encoders and transformers' BertForMaskedLM.

    python -m benchmarks.quality --profile cpu  # writes benchmarks/results/quality-cpu-<date>.json

Each study is one `hf-tfm compare` (`hf_tfm.training.compare`) of hf_tfm configs and a reference class: the same
tokenizer, batches, schedule and seeds for every model, dropout off, parameter counts matched (the MoE decoder
matches the dense ones in *active* parameters, the hf_tfm configs to within 1%, the reference to within 5%). The
score is each run's final validation loss: Trainer's evaluation of the validation split (its first
`max_eval_samples` examples), the task's loss alone (an MoE model's router losses left out).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.record import header, write
from hf_tfm.training.compare import compare
from hf_tfm_cli.spec import RunSpec

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
        "reference": "gpt2",
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
        "reference": "bert",
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

SCORE = "each run's final Trainer evaluation of the validation split, the task's loss alone (router losses left out)"

PROFILES = {
    # 2 CPU cores
    "cpu": dict(
        steps=500, batch_size=16, max_length=128, seeds=[0, 1, 2], max_files=None, max_eval_samples=512, bf16=False,
        scale={},
    ),
    # an H100: wider and deeper models, 4x the tokens
    "gpu": dict(
        steps=2000, batch_size=32, max_length=128, seeds=[0, 1, 2], max_files=None, max_eval_samples=None, bf16=True,
        scale=dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8),
    ),
    # for tests: every code path in seconds
    "smoke": dict(
        steps=3, batch_size=4, max_length=32, seeds=[0, 1], max_files=40, max_eval_samples=8, bf16=False, scale={},
    ),
}  # fmt: skip


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


def base_spec(profile: dict, study: dict) -> RunSpec:
    """What every run of a study shares: task, data, budget and schedule (compare sets model, seed and folder)."""
    return RunSpec(
        task=study["task"],
        vocab_size=_BODY["vocab_size"],
        max_steps=profile["steps"],
        batch_size=profile["batch_size"],
        max_length=profile["max_length"],
        learning_rate=study["learning_rate"],
        lr_scheduler_type="cosine",
        warmup_ratio=0.05,
        weight_decay=0.1,
        eval_steps=max(1, profile["steps"] // 10),
        save_steps=profile["steps"],
        keep_checkpoints=1,
        evaluate_before=False,
        max_files=profile["max_files"],
        max_eval_samples=profile["max_eval_samples"],
        bf16=profile["bf16"],
        use_cpu=not torch.cuda.is_available(),
    )


def run_study(profile: dict, name: str, folder: Path) -> tuple[list[dict], list[dict]]:
    """One study as a compare: (a summary row per model, a row per run with its validation curve)."""
    study = STUDIES[name]
    folder.mkdir(parents=True, exist_ok=True)
    models = {}  # compare's label (the config file, or the reference's name) -> the study's name for the model
    for model_name, config in study["models"].items():
        config_file = folder / f"{model_name.split()[0]}.json"
        config_file.write_text(json.dumps(scaled(config, profile["scale"]), indent=2))
        models[str(config_file)] = model_name
    models[study["reference"]] = f"{study['reference']} (transformers)"
    compared = compare(base_spec(profile, study), list(models), profile["seeds"], folder)
    summary, runs = [], []
    for row in compared["models"]:
        loss = row["metrics"]["loss"]  # compare's mean and range over the seeds
        losses = loss["values"]
        summary.append(
            {
                "study": name,
                "model": models[row["label"]],
                "seeds": len(losses),
                "mean_loss": loss["mean"],
                "std_loss": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                "min_loss": loss["min"],
                "max_loss": loss["max"],
                "perplexity": row["metrics"]["perplexity"]["mean"],
                "parameters": row["parameters"],
                "active_parameters": row["active_parameters"],
                "tokens_per_second": row["tokens_per_second"],
                "peak_memory_bytes": row["peak_memory_bytes"],
            }
        )
        for seed, value, curve in zip(profile["seeds"], losses, row["curves"]):
            runs.append(
                {"study": name, "model": models[row["label"]], "seed": seed, "validation_loss": value, "curve": curve}
            )
    return summary, runs


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
    summary, runs = [], []
    for name in studies:
        rows, study_runs = run_study(profile, name, work / name)
        summary += rows
        runs += study_runs
    command = command or f"python -m benchmarks.quality --profile {profile_name}"
    record = {
        **header(profile_name, command, torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "settings": profile,
        "studies": {
            name: {
                "task": STUDIES[name]["task"],
                "learning_rate": STUDIES[name]["learning_rate"],
                "reference": STUDIES[name]["reference"],
                "configs": {m: scaled(c, profile["scale"]) for m, c in STUDIES[name]["models"].items()},
            }
            for name in studies
        },
        "tokens_per_run": profile["steps"] * profile["batch_size"] * profile["max_length"],
        "score": SCORE,
        "summary": summary,
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
