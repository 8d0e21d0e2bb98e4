"""The `hf-tfm` command, the main job, the presets and the embedded corpus."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict
from test_minilm import minilm_dir
from test_t5_bart_parity import bart, t5
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    GPT2Config,
    GPT2LMHeadModel,
)

from hf_tfm import TfmDecoderForCausalLM, preset_names
from hf_tfm.cli import main
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm_cli import EXAMPLES, TASKS, RunSpec, build_parser, spec_from_args
from hf_tfm_cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]


def test_convert_command_round_trip(tmp_path):
    """`hf-tfm convert` turns a GPT-2 folder into hf_tfm and back without changing a weight or a logit."""
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2)
    ).eval()
    gpt2.save_pretrained(tmp_path / "gpt2")
    main(["convert", str(tmp_path / "gpt2"), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", "gpt2"])
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "tfm").eval()
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert isinstance(ours, TfmDecoderForCausalLM) and isinstance(back, GPT2LMHeadModel)
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, gpt2(ids).logits, rtol=0, atol=1e-5)
    original, restored = gpt2.state_dict(), back.state_dict()
    assert original.keys() == restored.keys()
    assert all(torch.equal(original[k], restored[k]) for k in original)


@pytest.mark.parametrize("reference", ["minilm", "t5", "bart"])
def test_convert_command_other_paradigms(tmp_path, reference):
    """`hf-tfm convert` picks the right head from the folder's architectures and round-trips BERT, T5 and BART."""
    if reference == "minilm":  # the real pretrained BertModel folder, tokenizer included
        source, to = minilm_dir(), "bert"
    else:
        model = {"t5": t5, "bart": bart}[reference]()
        model.save_pretrained(tmp_path / reference)
        source, to = tmp_path / reference, reference
    original = (
        AutoModel.from_pretrained(source) if reference == "minilm" else AutoModelForSeq2SeqLM.from_pretrained(source)
    )
    main(["convert", str(source), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", to])
    back = (
        AutoModel.from_pretrained(tmp_path / "back")
        if reference == "minilm"
        else AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "back")
    )
    assert type(back) is type(original)
    assert_same_state_dict(back.state_dict(), original.state_dict())
    if reference == "minilm":
        assert (tmp_path / "tfm" / "tokenizer.json").is_file()  # the tokenizer travels with the weights


def test_convert_command_names_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="config.json not found"):
        main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")])
    TfmDecoderForCausalLM(
        AutoConfig.for_model(
            "tfm_decoder", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4
        )
    ).save_pretrained(tmp_path / "tfm")
    with pytest.raises(SystemExit, match="no converter for model_type='tfm_decoder' with --to None"):
        main(["convert", str(tmp_path / "tfm"), str(tmp_path / "out")])


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in (REPO / "configs").iterdir() if (p / "config.json").is_file())
)
def test_presets_load_and_build(preset):
    """Every preset builds its paradigm's generative or masked-LM head, and is shipped inside the package."""
    config = AutoConfig.from_pretrained(REPO / "configs" / preset)
    head = {
        "tfm_decoder": AutoModelForCausalLM,
        "tfm_encoder": AutoModelForMaskedLM,
        "tfm_encoder_decoder": AutoModelForSeq2SeqLM,
    }
    with torch.device("meta"):
        model = head[config.model_type].from_config(config)
    assert type(model).__name__ == config.auto_classes[head[config.model_type].__name__]
    assert preset in preset_names()
    if preset == "gpt2-124m":  # GPT-2 small's shape, tied head: 124,439,808 parameters
        assert model.num_parameters() == 124_439_808


def test_corpus_is_deterministic_and_split_by_file():
    first, second = stdlib_docstrings(max_files=80), stdlib_docstrings(max_files=80)
    assert first == second
    assert first["train"] and first["validation"]
    assert not set(first["train"]) & set(first["validation"])


# ------------------------------------------------------------------------- the parser: torch-free, derived, checked

HEAVY = ("torch", "transformers", "datasets", "evaluate", "hf_tfm")
ENTRY_POINT_PROBE = """
import importlib, sys
module, function = sys.argv[1].split(":")
try:
    getattr(importlib.import_module(module), function)(sys.argv[2:])
except SystemExit as exit_:
    print("exit", exit_.code)
print("imported:", sorted(name for name in {heavy} if name in sys.modules))
"""


def _declared_entry_point() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["hf-tfm"]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["train", "--task", "lm", "--max-steps", "-1"]])
def test_entry_point_answers_without_importing_torch(argv):
    """`hf-tfm --help` and argument errors never import torch, transformers, datasets or hf_tfm (seconds each)."""
    probe = ENTRY_POINT_PROBE.format(heavy=HEAVY)
    command = [sys.executable, "-c", probe, _declared_entry_point(), *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120, check=True)
    assert "imported: []" in done.stdout, done.stdout[-500:]
    assert ("exit 0" if "--help" in argv else "exit 2") in done.stdout


@pytest.mark.parametrize("module", ["hf_tfm_cli", "hf_tfm.cli"])  # hf_tfm.cli: `accelerate launch -m hf_tfm.cli ...`
def test_python_m_runs_the_cli(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "train", "--help"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0 and "examples:\n  hf-tfm train" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--task", "seq2seq", "--max-steps", "-1"], "argument --max-steps: must be an integer >= 1, got -1"),
        (["train", "--task", "seq2seq", "--max-steps", "0"], "argument --max-steps: must be an integer >= 1, got 0"),
        (["train", "--task", "seq2seq", "--max-length", "0"], "argument --max-length: must be an integer >= 2, got 0"),
        (
            ["train", "--task", "seq2seq", "--gradient-accumulation-steps", "0"],
            "argument --gradient-accumulation-steps: must be an integer >= 1, got 0",
        ),
        (["train", "--task", "seq2seq", "--warmup-ratio", "2"], r"--warmup-ratio: must be a number in \[0, 1\]"),
        (["train", "--task", "seq2seq", "--learning-rate", "nan"], "argument --learning-rate: must be a number >= 0"),
        (["train", "--task", "seq2seq", "--batch-size", "x"], "--batch-size: must be an integer >= 1, got 'x'"),
        (["evaluate", "m", "--max-files", "0"], "argument --max-files: must be an integer >= 1, got 0"),
        (["generate", "m", "p", "--num-beams", "0"], "argument --num-beams: must be an integer >= 1, got 0"),
        (["generate", "m", "p", "--top-p", "0"], r"argument --top-p: must be a number in \(0, 1\], got 0"),
        (["upcycle", "a", "b", "--num-experts", "0"], "argument --num-experts: must be an integer >= 2, got 0"),
        (["demo", "--scale", "0"], "argument --scale: must be a number > 0, got 0"),
    ],
)
def test_numbers_out_of_range_are_one_line_errors(capsys, argv, message):
    """Each bound is checked by the argument's own type, before anything is imported or run."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(argv)
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err.strip().splitlines()[-1])


def test_run_spec_checks_the_same_bounds():
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1, got 0"):
        RunSpec(task="causal-lm", max_steps=0)
    with pytest.raises(ValueError, match="unknown task 'lm'"):
        RunSpec(task="lm")


def test_train_parser_is_derived_from_run_spec():
    """Every RunSpec field on the command line has an option whose default is the field's default."""
    args = build_parser().parse_args(["train", "--task", "seq2seq"])
    assert spec_from_args(args) == RunSpec(task="seq2seq")
    args = build_parser().parse_args(
        [
            "train",
            "--task",
            "seq2seq",
            "--column",
            "source=q",
            "--set",
            "num_experts=4",
            "--set",
            "norm_type=rmsnorm",
            "--report-to",
            "tensorboard",
            "--bf16",
        ]
    )
    spec = spec_from_args(args)
    assert spec.columns == {"source": "q"} and spec.report_to == ["tensorboard"] and spec.bf16
    assert spec.config_overrides == {"num_experts": 4, "norm_type": "rmsnorm"}


def test_cli_tasks_are_the_training_tasks():
    from hf_tfm.training import tasks

    assert tuple(tasks.TASKS) == TASKS


def _example_lines(epilog: str) -> list[list[str]]:
    """Each example command of an epilog as argv for the hf-tfm parser (`accelerate launch ... -m hf_tfm.cli` too)."""
    commands = []
    for line in epilog.splitlines()[1:]:
        words = shlex.split(line, comments=True)
        if words[:1] == ["hf-tfm"]:
            commands.append(words[1:])
        elif "hf_tfm.cli" in words:
            commands.append(words[words.index("hf_tfm.cli") + 1 :])
    return commands


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_help_examples_parse_and_name_existing_paths(command):
    """Every example in a `--help` parses, and every repository path or preset it names exists."""
    epilog = EXAMPLES[command]
    examples = _example_lines(epilog)
    assert examples, f"{command} --help shows no example"
    for argv in examples:
        build_parser().parse_args(argv)  # an example that does not parse exits here
        if "--model" in argv and "/" not in argv[argv.index("--model") + 1]:
            assert argv[argv.index("--model") + 1] in preset_names(), argv
    shipped = {"configs", "examples", "benchmarks", "docs", "model_cards", "hf_tfm", "hf_tfm_cli", "tests"}
    for word in shlex.split(epilog, comments=True):  # runs/... are outputs, path/to/... placeholders
        if "/" in word and word.split("/")[0] in shipped:
            assert (REPO / word).exists(), f"{command} --help names {word}, which does not exist"
