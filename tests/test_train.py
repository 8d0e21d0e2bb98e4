"""`hf-tfm train / evaluate / generate` and the main job: every task and paradigm end to end at tiny sizes,
checkpoints that survive SIGKILL, and bad input that fails before training with a message naming the problem."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from support.runs import TINY, tiny_config_file, tiny_spec
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.training.callbacks import logged, read_log
from hf_tfm.training.checkpoints import (
    MANIFEST,
    CorruptCheckpoint,
    replace_folder,
    verify,
)
from hf_tfm.training.generate import generate_text
from hf_tfm.training.main_job import run_main_job
from hf_tfm.training.run import RunSpec, train
from hf_tfm.training.tokenizers import train_byte_level_bpe
from hf_tfm_cli import EXAMPLES, TASKS
from hf_tfm_cli.entry import main

PIPELINE_TAGS = {
    "causal-lm": "text-generation",
    "masked-lm": "fill-mask",
    "seq2seq": "text2text-generation",
    "sequence-classification": "text-classification",
    "token-classification": "token-classification",
}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_trains_evaluates_and_saves(tmp_path, capfd, task):
    result = train(tiny_spec(tmp_path, task))
    folder = Path(result["model_dir"])
    expected = {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "hf_tfm_run.json",
        MANIFEST,
    }
    if task in ("causal-lm", "seq2seq"):
        expected.add("generation_config.json")
    assert expected <= {p.name for p in folder.iterdir()}
    verify(folder)
    run = json.loads((folder / "hf_tfm_run.json").read_text())
    metrics = {r["metric"] for r in run["results"]}
    assert "loss" in metrics
    assert {
        "causal-lm": {"perplexity"},
        "masked-lm": {"perplexity"},
        "seq2seq": {"exact_match", "rougeL", "chrf", "perplexity"},
        "sequence-classification": {"accuracy", "f1"},
        "token-classification": {"accuracy", "f1"},
    }[task] <= metrics
    assert run["baselines"], "every task reports the trivial baselines it must beat"
    losses = logged(result["log"], "loss")
    assert [step for step, _ in losses] == list(range(1, 7))
    assert {step for step, _ in logged(result["log"], "eval_loss")} >= {3, 6}
    card = ModelCard.load(folder / "README.md")
    assert {r.metric_type for r in card.data.eval_results} == metrics
    assert card.data.pipeline_tag == PIPELINE_TAGS[task]
    assert card.data.model_name == f"hf-tfm-{task}" and "partial" not in card.text
    assert "SchedulerType" not in card.text and "| lr_scheduler_type | cosine |" in card.text
    if task == "seq2seq":  # scoring by generation must not leave max_length behind: generate() would warn
        assert "max_length" not in json.loads((folder / "generation_config.json").read_text())
        capfd.readouterr()
        assert generate_text(str(folder), ["acquire a lock."], max_new_tokens=4)[0].startswith("acquire a lock. -> ")
        assert "max_new_tokens" not in capfd.readouterr().err


def test_training_lowers_the_loss(tmp_path):
    result = train(tiny_spec(tmp_path, "causal-lm", max_steps=30, eval_steps=30, save_steps=30))
    before = next(r["value"] for r in result["before_training"] if r["metric"] == "loss")
    after = next(r["value"] for r in result["results"] if r["metric"] == "loss")
    assert after < before - 0.5, (before, after)


@pytest.mark.slow
def test_cli_train_evaluate_generate(tmp_path, capsys):
    """An MoE run from the command line: router statistics in log.csv and an expert-load heat map; `evaluate`
    scores the very split the run was scored on (its run record's data settings) and says which."""
    config = tiny_config_file(tmp_path, "tfm_decoder")
    output = tmp_path / "run"
    common = ["--max-files", "40", "--vocab-size", "300", "--max-length", "32", "--batch-size", "4", "--use-cpu"]
    main(
        [
            "train",
            "--task",
            "causal-lm",
            "--model",
            config,
            "--output-dir",
            str(output),
            "--max-steps",
            "4",
            "--logging-steps",
            "2",
            "--max-eval-samples",
            "6",
            "--set",
            "num_experts=4",
            *common,
        ]
    )
    # the summary and the run record name the variant as compare does, not the config it varies
    assert f"| causal-lm | {config}:num_experts=4 |" in capsys.readouterr().out
    assert [step for step, _ in logged(output / "log.csv", "router/layers.1/max_load")] == [2, 4]
    assert (output / "expert_load.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((output / "model" / "hf_tfm_run.json").read_text())
    assert record["model"] == f"{config}:num_experts=4"
    trained = {r["metric"]: r["value"] for r in record["results"]}

    main(["evaluate", str(output / "model")])
    scores = json.loads(capsys.readouterr().out)
    assert scores["task"] == "causal-lm" and scores["metrics"]["perplexity"] > 1
    assert scores["metrics"]["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    assert scores["scored_on"]["max_files"] == 40 and scores["scored_on"]["max_eval_samples"] == 6
    assert scores["scored_on"]["rows"] == 6 and scores["scored_on"]["data"] == "python-stdlib-docstrings"
    main(["evaluate", str(output / "model"), "--max-length", "16"])  # an option given replaces the recorded one
    assert json.loads(capsys.readouterr().out)["scored_on"]["max_length"] == 16
    with pytest.raises(SystemExit, match="--max-files 1: the embedded causal-lm data .* raise --max-files"):
        main(["evaluate", str(output / "model"), "--max-files", "1"])
    main(["generate", str(output / "model"), "Return the", "--max-new-tokens", "5"])
    assert capsys.readouterr().out.startswith("Return the -> ")


def test_resume_of_a_finished_run_trains_no_further(tmp_path):
    """Resuming from a checkpoint already at max_steps takes no step (Trainer would take one more), and keeps the
    untrained model's scores in its record, as the uninterrupted run has them."""
    first = train(tiny_spec(tmp_path, "causal-lm", max_steps=4, save_steps=2))
    again = train(tiny_spec(tmp_path, "causal-lm", max_steps=4, save_steps=2, resume=True))
    assert again["description"].startswith("4 optimizer steps")
    assert max(step for step, _ in logged(again["log"], "loss")) == 4
    assert again["before_training"] == first["before_training"] != []
    assert [r["metric"] for r in again["results"]] == [r["metric"] for r in first["results"]]
    assert [r["value"] for r in again["results"]] == pytest.approx([r["value"] for r in first["results"]], rel=1e-5)


@pytest.mark.slow
def test_a_seq2seq_run_resumes_exactly(tmp_path):
    """An encoder-decoder holds its one token table under three names (the body's and both stacks'), saved once: a
    run resumed from its step-4 checkpoint takes steps 5 and 6 again (and saves checkpoint-6 again) with the
    uninterrupted run's losses."""
    first = train(tiny_spec(tmp_path, "seq2seq", max_steps=6, save_steps=2))
    last = Path(first["model_dir"]).parent / "checkpoints" / "checkpoint-6"
    shutil.rmtree(last)
    again = train(tiny_spec(tmp_path, "seq2seq", max_steps=6, save_steps=2, resume=True))
    assert last.is_dir()
    assert logged(again["log"], "loss") == logged(first["log"], "loss")


def test_a_diverged_run_stops_at_the_first_non_finite_loss(tmp_path, monkeypatch):
    """A NaN put into the weights after step 3 makes the loss of step 4 NaN: the run stops there, saying so and
    naming the last good checkpoint, saves nothing after it, and log.csv holds the true value."""
    from transformers import TrainerCallback

    from hf_tfm.training import run

    class Poison(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3:
                with torch.no_grad():
                    next(model.parameters()).fill_(float("nan"))

    build = run.make_trainer

    def poisoned(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.add_callback(Poison())
        return trainer

    monkeypatch.setattr(run, "make_trainer", poisoned)
    spec = tiny_spec(tmp_path, "causal-lm", max_steps=6, save_steps=2, eval_steps=6)
    with pytest.raises(ValueError, match=r"diverged: the loss was nan at step 4; .*checkpoint-2 \(--resume"):
        train(spec)
    output = Path(spec.output_dir)
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert not (output / "model").exists()
    rows = [(row["step"], row["value"]) for row in read_log(output / "log.csv") if row["name"] == "loss"]
    assert [step for step, _ in rows] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(value)) for _, value in rows[:3]) and torch.isnan(torch.tensor(rows[3][1]))


def test_generate_fills_masks_with_a_masked_lm(tmp_path, capsys):
    result = train(tiny_spec(tmp_path, "masked-lm", max_steps=2))
    capsys.readouterr()
    main(["generate", result["model_dir"], "Return the [MASK] of items."])
    assert capsys.readouterr().out.startswith("Return the [MASK] of items. -> ")
    with pytest.raises(SystemExit, match="has none"):
        main(["generate", result["model_dir"], "no mask here"])


@pytest.mark.slow
def test_fine_tune_a_checkpoint_for_another_task(tmp_path):
    """A masked-LM checkpoint fine-tunes for classification: its weights and tokenizer carry over."""
    pretrained = train(tiny_spec(tmp_path, "masked-lm", max_steps=2))
    result = train(tiny_spec(tmp_path, "sequence-classification", model=pretrained["model_dir"], max_steps=2))
    tuned = json.loads((Path(result["model_dir"]) / "config.json").read_text())
    assert tuned["architectures"] == ["TfmEncoderForSequenceClassification"]
    assert len(tuned["id2label"]) == 8
    assert (
        AutoTokenizer.from_pretrained(result["model_dir"]).get_vocab()
        == AutoTokenizer.from_pretrained(pretrained["model_dir"]).get_vocab()
    )


@pytest.mark.slow
def test_local_files_replace_the_embedded_data(tmp_path):
    rows = [{"question": f"what is {i} plus one", "answer": str(i + 1)} for i in range(40)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    result = train(
        tiny_spec(
            tmp_path,
            "seq2seq",
            data=str(tmp_path / "pairs.jsonl"),
            columns={"source": "question", "target": "answer"},
            max_steps=2,
        )
    )
    assert result["dataset"] == str(tmp_path / "pairs.jsonl")
    (tmp_path / "labels.csv").write_text(
        "sentence,label\n" + "".join(f"good text {i},pos\nbad text {i},neg\n" for i in range(20))
    )
    result = train(
        tiny_spec(
            tmp_path,
            "sequence-classification",
            data=str(tmp_path / "labels.csv"),
            columns={"text": "sentence"},
            max_steps=2,
        )
    )
    assert json.loads((Path(result["model_dir"]) / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}


# ------------------------------------------------------------------------- faults: nothing lost

KILLING_RUN = """
import os, signal, sys
from transformers import TrainerCallback
from hf_tfm.training import run

class Kill(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == int(os.environ["KILL_AT_STEP"]):
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: as a crash or an OOM kill

build = run.make_trainer
run.make_trainer = lambda *a, **k: (lambda t: (t.add_callback(Kill()), t)[1])(build(*a, **k))
run.train(run.RunSpec(**{spec}))
"""


def _spec_fields(tmp_path, output) -> dict:
    return {
        "task": "causal-lm",
        "model": tiny_config_file(
            tmp_path / "configs", "tfm_decoder", hidden_dropout=0.1
        ),  # dropout: RNG state must resume too
        "output_dir": str(output),
        "max_files": 40,
        "vocab_size": 300,
        "max_length": 32,
        "max_steps": 10,
        "batch_size": 4,
        "save_steps": 2,
        "eval_steps": 5,
        "logging_steps": 1,
        "max_eval_samples": 8,
        "use_cpu": True,
        "keep_checkpoints": 3,
    }


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path):
    """Killed at step 7 with SIGKILL, the run resumes from its newest good checkpoint and logs, from there on, the
    same losses as a run never interrupted. Checkpoint 6 is then damaged and a half-written checkpoint-8 left
    behind: resuming passes over both (saying why) and goes back to checkpoint 4, with the same outcome."""
    reference = train(RunSpec(**_spec_fields(tmp_path, tmp_path / "reference")))
    expected = dict(logged(reference["log"], "loss"))

    output = tmp_path / "killed"
    fields = _spec_fields(tmp_path, output)
    env = {**os.environ, "KILL_AT_STEP": "7", "HF_HUB_OFFLINE": "1"}
    killed = subprocess.run(
        [sys.executable, "-c", KILLING_RUN.format(spec=repr(fields))],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [step for step, _ in logged(output / "log.csv", "loss")] == list(
        range(1, 7)
    )  # killed before logging step 7
    assert not (output / "model").exists()

    (output / "checkpoints" / "checkpoint-6" / "model.safetensors").write_bytes(b"half")  # damaged after its save
    (output / "checkpoints" / "checkpoint-8").mkdir()  # a save that never finished
    (output / "checkpoints" / "checkpoint-8" / "config.json").write_text("{")

    resumed = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from hf_tfm.training import run; run.train(run.RunSpec(**{{**{fields!r}, 'resume': True}}))",
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "passing over" in resumed.stdout and "checkpoint-8 has no hf_tfm_manifest.json" in resumed.stdout
    assert "checkpoint-6/model.safetensors does not match its manifest" in resumed.stdout
    losses = dict(logged(output / "log.csv", "loss"))
    assert sorted(losses) == sorted(expected)
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, rel=1e-6, abs=1e-7), step
    resumed_record = json.loads((output / "model" / "hf_tfm_run.json").read_text())
    assert resumed_record["before_training"] == reference["before_training"] != []
    resumed_model = AutoModelForCausalLM.from_pretrained(output / "model")
    reference_model = AutoModelForCausalLM.from_pretrained(reference["model_dir"])
    for (name, a), b in zip(resumed_model.state_dict().items(), reference_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_without_a_good_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(tiny_spec(tmp_path, "causal-lm", resume=True))


def test_a_second_run_does_not_clobber_the_first(tmp_path):
    train(tiny_spec(tmp_path, "causal-lm", max_steps=2, save_steps=2))
    with pytest.raises(FileExistsError, match="--resume to continue it or --overwrite"):
        train(tiny_spec(tmp_path, "causal-lm", max_steps=2))


def test_a_failed_save_keeps_the_previous_model(tmp_path):
    destination = tmp_path / "model"
    replace_folder(lambda folder: (folder / "weights").write_text("good"), destination)

    def failing(folder):
        (folder / "weights").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_folder(failing, destination)
    assert (destination / "weights").read_text() == "good"
    verify(destination)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging folder left behind


def test_a_corrupted_model_fails_at_load_naming_the_file(tmp_path):
    result = train(tiny_spec(tmp_path, "causal-lm", max_steps=2))
    weights = Path(result["model_dir"]) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(SystemExit, match=r"model.safetensors has \d+ bytes, \d+ saved .*hf-tfm verify"):
        main(["evaluate", result["model_dir"]])
    with pytest.raises(CorruptCheckpoint):
        verify(result["model_dir"])
    with pytest.raises(SystemExit, match="model.safetensors does not match its manifest"):
        main(["verify", result["model_dir"]])


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "missing column",
            r"has no column 'text', which task causal-lm needs \(columns: body\); rename with --column text=",
        ),
        ("empty dataset", r"data file .*d.csv holds no rows; nothing to train on"),
        (
            "unknown preset",
            r"unknown model 'gpt5-huge': not a folder or a config.json file, and no preset .*: .*llama-1.3m",
        ),
        ("unwritable output", r"output directory .* is not writable"),
        ("wrong paradigm", r"task masked-lm needs a AutoModelForMaskedLM head, which model_type 'tfm_decoder'"),
        ("tokenizer too large", r"the tokenizer has \d+ tokens but .* has vocab_size=50"),
        ("unknown column mapping", r"--column label=x: task causal-lm reads only text"),
        ("missing file", r"data file .*nope.jsonl not found"),
        (
            "misspelled --set field",
            r"--set num_expert: TfmDecoderConfig has no field 'num_expert'; did you mean 'num_e",
        ),
        ("--set value of the wrong type", r"^error: --set hidden_size=abc: Field 'hidden_size' expected int, got str"),
        ("too few files for a validation split", r"--max-files 1: the embedded causal-lm data .* 0 validation rows"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, case, message):
    args = [
        "train",
        "--task",
        "causal-lm",
        "--model",
        tiny_config_file(tmp_path, "tfm_decoder"),
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "2",
        "--max-files",
        "40",
        "--vocab-size",
        "300",
        "--use-cpu",
    ]
    if case == "missing column":
        args += ["--data", _write(tmp_path / "d.jsonl", '{"body": "some text"}\n' * 10)]
    elif case == "empty dataset":
        args += ["--data", _write(tmp_path / "d.csv", "text\n")]
    elif case == "unknown preset":
        args[4] = "gpt5-huge"
    elif case == "unwritable output":
        args[6] = _write(tmp_path / "a-file", "") + "/out"
    elif case == "wrong paradigm":
        args[2] = "masked-lm"
    elif case == "tokenizer too large":
        torch.manual_seed(0)
        TfmDecoderForCausalLM(
            AutoConfig.for_model(**json.loads(Path(args[4]).read_text()), vocab_size=50)
        ).save_pretrained(tmp_path / "small")
        train_byte_level_bpe(["some text to learn from"] * 10, vocab_size=300).save_pretrained(tmp_path / "tokenizer")
        args[4] = str(tmp_path / "small")
        args += ["--tokenizer", str(tmp_path / "tokenizer")]
    elif case == "unknown column mapping":
        args += ["--column", "label=x"]
    elif case == "missing file":
        args += ["--data", str(tmp_path / "nope.jsonl")]
    elif case == "misspelled --set field":
        args += ["--set", "num_expert=8"]
    elif case == "--set value of the wrong type":
        args += ["--set", "hidden_size=abc"]
    elif case == "too few files for a validation split":
        args[args.index("--max-files") + 1] = "1"
    with pytest.raises(SystemExit, match=message) as exit_:
        main(args)
    assert "\n" not in str(exit_.value.code), "one line"
    assert not (tmp_path / "out" / "checkpoints").exists(), "nothing trained"


COMMAND_NAMES = sorted(EXAMPLES)  # one entry per command (tests/test_cli.py holds the two in step)


def test_help_of_every_command_has_examples(capsys):
    for command in COMMAND_NAMES:
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        assert "examples:\n  hf-tfm " + command in capsys.readouterr().out


@pytest.mark.slow
def test_main_job_smoke(tmp_path, capsys):
    """The main job at 1% of its steps on 40 stdlib files: five models saved, and beside the causal and masked LMs
    transformers' GPT2LMHeadModel and BertForMaskedLM of their size, a summary table and a loss-curve PNG. Each run's
    header says its position and its model's actual name or folder; a second demo into the same folder is refused
    (naming --overwrite) instead of wiping the first, and with --overwrite prints the same scores (bit-reproducible on
    one machine)."""
    results = run_main_job(str(tmp_path), scale=0.01, max_files=40, max_eval_samples=8)
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("== run ")]
    assert len(headers) == len(TASKS) and headers[1].startswith(f"== run 2 of {len(TASKS)}: {TASKS[1]}, ")
    masked = next(r for r in results if r["task"] == "masked-lm")
    assert headers[3] == f"== run 4 of {len(TASKS)}: {TASKS[3]}, {masked['model_dir']} =="
    with pytest.raises(FileExistsError, match="holds an earlier demo run .*pass --overwrite"):
        run_main_job(str(tmp_path), scale=0.01, max_files=40, max_eval_samples=8)
    scores = (tmp_path / "summary.md").read_text().split("\n\n")[0]  # the scores' table; the times' follows
    run_main_job(str(tmp_path), scale=0.01, max_files=40, max_eval_samples=8, overwrite=True)
    assert (tmp_path / "summary.md").read_text().split("\n\n")[0] == scores  # a second run reproduces every score
    assert [r["task"] for r in results] == [TASKS[0], TASKS[0], TASKS[1], *TASKS[1:]]
    assert [r.get("reference") for r in results] == [
        None,
        "GPT2LMHeadModel",
        None,
        "BertForMaskedLM",
        None,
        None,
        None,
    ]
    summary = (tmp_path / "summary.md").read_text()
    assert all(f"| {task} |" in summary for task in TASKS)
    assert "| causal-lm | GPT2LMHeadModel (transformers), " in summary
    assert "| masked-lm | BertForMaskedLM (transformers), " in summary
    assert (tmp_path / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    for result in results:
        verify(result["model_dir"])
    assert results[0]["samples"][0].startswith("Return the -> ")


def test_evaluation_scores_the_task_loss_without_the_router_losses(tmp_path):
    """An MoE model's loss adds its weighted router losses (as transformers' MoE models' does); a run's validation
    loss and perplexity are the task's alone, and the weights are back once the evaluation is done."""
    from datasets import Dataset
    from transformers import TrainingArguments

    from hf_tfm import TfmConfig
    from hf_tfm.training.run import RunTrainer

    config = TfmConfig(model_type="tfm_decoder", **TINY, vocab_size=50, num_experts=4, router_aux_loss_coef=1.0)
    model = TfmDecoderForCausalLM(config).eval()
    ids = torch.randint(3, 50, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = model(input_ids=ids, labels=ids)
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, use_cpu=True, report_to=[])
    trainer = RunTrainer(model=model, args=args, eval_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
    scored = trainer.evaluate()["eval_loss"]
    assert scored == pytest.approx((outputs.loss - outputs.aux_loss).item(), rel=1e-5)
    assert outputs.loss.item() > scored + 0.5 and config.router_aux_loss_coef == 1.0
