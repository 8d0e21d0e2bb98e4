"""The main job (`hf-tfm demo`, `make run`): small models of all three paradigms trained on data the package
builds offline from the standard library's sources, evaluated against trivial baselines, saved with tokenizer,
generation config and model card, and summarised in a table and a loss-curve PNG. About 10 minutes on 2 CPU cores.

    causal-lm                decoder (Llama-style)         docstrings, next token
    masked-lm                encoder (BERT-style)          docstrings, masked tokens
    seq2seq                  encoder-decoder (T5-style)    function signature -> how many arguments a call passes
    sequence-classification  the masked-LM encoder, tuned  docstring -> which stdlib package
    token-classification     the masked-LM encoder, tuned  docstring words -> is it a parameter name

The causal-LM and masked-LM runs are comparisons (`hf_tfm.training.compare`): each trains beside transformers' own
`GPT2LMHeadModel` / `BertForMaskedLM` of the same parameter count on the same tokenizer, batches and budget, and
the summary and the loss curves show both.
"""

import json
import shutil
import time
from pathlib import Path

from .compare import compare
from .generate import generate_text
from .report import plot_loss_curves, print_summary, summary_markdown
from .run import RunSpec, train

# (task, model, steps at scale 1, extra RunSpec fields); "{masked-lm}" is the folder the masked-LM run saved
RUNS = [
    ("causal-lm", "llama-1.3m", 600, {"learning_rate": 3e-3, "weight_decay": 0.1}),
    ("masked-lm", "bert-1.4m", 600, {"learning_rate": 1e-3, "batch_size": 16}),
    ("seq2seq", "t5-1.9m", 800, {"learning_rate": 2e-3, "batch_size": 32, "max_length": 64, "vocab_size": 2048}),
    ("sequence-classification", "{masked-lm}", 250, {"learning_rate": 5e-4}),
    ("token-classification", "{masked-lm}", 250, {"learning_rate": 5e-4, "max_length": 96}),
]
# the reference class each task's run is compared with (`hf-tfm compare`), and the name the summary gives it
COMPARED_WITH = {"causal-lm": ("gpt2", "GPT2LMHeadModel"), "masked-lm": ("bert", "BertForMaskedLM")}
PROMPTS = {
    "causal-lm": ["Return the"],
    "seq2seq": ["get(self, key, default=None)", "print(*args, sep=' ', end='\\n', file=None, flush=False)"],
}


def run_main_job(
    output_dir: str = "runs/demo",
    scale: float = 1.0,
    max_files: int | None = None,
    seed: int = 0,
    max_eval_samples: int | None = 256,
    overwrite: bool = False,
) -> list[dict]:
    started = time.time()
    output = Path(output_dir)
    check_earlier_run(output, overwrite)
    results, saved = [], {}
    for number, (task, model, steps, extra) in enumerate(RUNS, 1):
        model = model.format(**saved)
        print(f"\n== run {number} of {len(RUNS)}: {task}, {model} ==", flush=True)
        spec = RunSpec(
            task=task,
            model=model,
            output_dir=str(output / task),
            max_steps=max(2, round(steps * scale)),
            seed=seed,
            max_files=max_files,
            max_eval_samples=max_eval_samples,
            overwrite=True,
            use_cpu=True,
            **extra,
        )
        result, reference = compared(spec, output / task) if task in COMPARED_WITH else (train(spec), None)
        result["samples"] = (
            generate_text(result["model_dir"], PROMPTS[task], max_new_tokens=16) if task in PROMPTS else []
        )
        results += [result] if reference is None else [result, reference]
        saved[task] = result["model_dir"]

    panels = {f"{r['task']}, {r['reference']}" if r.get("reference") else r["task"]: r["log"] for r in results}
    curves = plot_loss_curves(panels, output / "loss_curves.png")
    table = summary_markdown(results)
    (output / "summary.md").write_text(table + "\n")
    (output / "summary.json").write_text(json.dumps(results, indent=2, default=str))
    print("\n== hf-tfm demo summary ==")
    print_summary(results)
    for result in results:
        for sample in result["samples"]:
            print(f"{result['task']} sample: {sample}")
    print(f"loss curves: {curves}\nsummary: {output / 'summary.md'}\nwall time: {time.time() - started:.0f} s")
    return results


def compared(spec: RunSpec, folder: Path) -> tuple[dict, dict]:
    """`spec`'s run and its reference class's, as `hf-tfm compare` trains them (dropout off, one tokenizer, the same
    batches), from a fresh folder; the reference's result named for the summary."""
    if folder.exists():  # check_earlier_run allowed it: a compare would read the earlier runs back
        shutil.rmtree(folder)
    name, class_name = COMPARED_WITH[spec.task]
    record = compare(spec, [spec.model, name], [spec.seed], folder)
    ours, reference = (record["runs"][label][0] for label in (spec.model, name))
    parameters = next(row["parameters"] for row in record["models"] if row["label"] == name)
    named = {
        "model": f"{class_name} (transformers), {parameters:,} parameters",
        "reference": class_name,
        "samples": [],
    }
    return ours, {**reference, **named}


def check_earlier_run(output: Path, overwrite: bool) -> None:
    """Refuse to replace an earlier demo run unless asked to: each run's folder is overwritten as it starts."""
    earlier = [p.name for p in (*(output / task for task, *_ in RUNS), output / "summary.json") if p.exists()]
    if earlier and not overwrite:
        raise FileExistsError(
            f"{output} holds an earlier demo run ({', '.join(earlier)}): pass --overwrite to replace it, or "
            f"--output-dir <another folder> to keep it"
        )
