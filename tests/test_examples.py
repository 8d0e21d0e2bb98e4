"""The example scripts, end to end at tiny size: each runs in a subprocess as a user runs it (`python examples/x.py`,
from another working directory), must exit 0, print and save its metrics, and leave a folder that reloads with the
right Auto class and tokenizer. Training well is not the point: 3 steps of a 2-layer, 32-wide model on 60
standard-library files (the causal LM: on a local text file); starting the subprocess (importing torch and
transformers) takes most of the ~8 s each.
"""

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

import hf_tfm  # noqa: F401  (registers the tfm model types)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
STEPS = 3
TINY = [
    *("--max-files", "60", "--max-steps", str(STEPS), "--logging-steps", "1", "--batch-size", "4"),
    *("--hidden-size", "32", "--num-layers", "2", "--max-length", "32"),
    *("--vocab-size", "400", "--max-eval-samples", "8"),
]
# one thread per process: on a loaded 2-core machine, torch's default of 2 spinning threads runs ~100x slower
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def run_example(script: str, output_dir: Path, *extra: str) -> str:
    """Run an example from a working directory outside the repository; return what it printed."""
    command = [sys.executable, str(EXAMPLES / script), *TINY, "--output-dir", str(output_dir), *extra]
    result = subprocess.run(
        command, cwd=output_dir.parent, env=ENV, capture_output=True, text=True, check=False, timeout=600
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout


WORDS = ("return", "the", "number", "of", "items", "in", "a", "list", "for", "key", "value", "when", "None", "raise")
CORPUS = "\n".join(" ".join(WORDS[(i * j) % len(WORDS)] for j in range(3, 15)) + "." for i in range(400))

# script, Auto class, model class it must reload as, metrics it must report, extra arguments
CASES = {
    # from a local text file rather than the embedded data; the MoE path covers the dense one as well
    # (test_distributed trains the dense model on the embedded data)
    "causal-lm": (
        "train_causal_lm.py",
        AutoModelForCausalLM,
        "TfmDecoderForCausalLM",
        ["eval_perplexity"],
        ["--num-experts", "4", "--train-file", "corpus.txt"],
    ),
    "masked-lm": ("train_masked_lm.py", AutoModelForMaskedLM, "TfmEncoderForMaskedLM", ["eval_perplexity"], []),
    "seq2seq": (
        "train_seq2seq.py",
        AutoModelForSeq2SeqLM,
        "TfmEncoderDecoderForConditionalGeneration",
        ["eval_exact_match"],
        [],
    ),
    "sequence-classification": (
        "train_sequence_classification.py",
        AutoModelForSequenceClassification,
        "TfmEncoderForSequenceClassification",
        ["eval_accuracy"],
        [],
    ),
    "token-classification": (
        "train_token_classification.py",
        AutoModelForTokenClassification,
        "TfmEncoderForTokenClassification",
        ["eval_accuracy", "eval_f1"],
        [],
    ),
}


@pytest.mark.parametrize("task", list(CASES))
@pytest.mark.slow
def test_example_trains_saves_and_reloads(task, tmp_path):
    script, auto_class, model_class, metric_names, extra = CASES[task]
    output = tmp_path / "out"
    (tmp_path / "corpus.txt").write_text(CORPUS)  # --train-file corpus.txt: relative to the working directory
    printed = run_example(script, output, *extra)

    metrics = json.loads((output / "eval_results.json").read_text())
    for name in ["eval_loss", *metric_names]:
        assert math.isfinite(metrics[name]), (name, metrics)
        assert name in printed  # trainer.log_metrics printed the table
    assert json.loads((output / "train_results.json").read_text())["train_loss"] > 0
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == list(range(1, STEPS + 1))

    model = auto_class.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert type(model).__name__ == model_class
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 2)
    assert model.config.vocab_size == len(tokenizer) <= 400
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None
    inputs = tokenizer(["Return the number of items."], return_tensors="pt")
    with torch.no_grad():
        if task == "seq2seq":
            generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
            assert generated[0, 0] == model.config.decoder_start_token_id == tokenizer.pad_token_id
        else:
            assert torch.isfinite(model(**inputs).logits).all()

    if task == "causal-lm":
        assert model.config.num_experts == 4
        assert (output / "expert_load.png").stat().st_size > 0
        assert any(key.startswith("router/") for key in history[0])
    if task == "masked-lm":
        assert tokenizer.mask_token is not None
    if task == "sequence-classification":
        assert len(model.config.id2label) == 8  # the embedded data's 8 standard-library packages
        assert "argparse" in model.config.label2id
    if task == "token-classification":
        assert model.config.id2label == {0: "O", 1: "PARAM"}


def test_every_script_documents_python_and_accelerate_usage():
    scripts = sorted(EXAMPLES.glob("train_*.py"))
    assert {script.name for script in scripts} == {case[0] for case in CASES.values()}
    for script in scripts:
        doc = ast.get_docstring(ast.parse(script.read_text()))
        assert f"python examples/{script.name}" in doc, script.name
        assert "accelerate launch --config_file configs/accelerate/" in doc, script.name


@pytest.fixture
def common(tmp_path):
    """examples/common.py as a user who copied it out of the repository imports it: presets still load by name."""
    (tmp_path / "common.py").write_text((EXAMPLES / "common.py").read_text())
    sys.path.insert(0, str(tmp_path))
    try:
        import common

        yield common
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("common", None)


def test_model_config_resizes_a_preset_into_a_valid_config(common):
    from argparse import Namespace

    class Tokenizer:
        pad_token_id, bos_token_id, eos_token_id = 1, None, 0

        def __len__(self):
            return 300

    args = Namespace(config="llama-19m", hidden_size=32, num_layers=2, num_heads=None)
    config = common.model_config(args, Tokenizer(), "tfm_decoder")
    assert type(config).__name__ == "TfmDecoderConfig"
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (32, 2, 300)
    assert config.head_dim == 32 // config.num_attention_heads  # the preset's explicit head_dim follows the width
    assert config.intermediate_size % 16 == 0 and config.moe_intermediate_size == config.intermediate_size
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (1, None, 0)
    assert config.rope_parameters["rope_type"] == "default"  # the rest of the preset is kept

    args = Namespace(config="gpt2-124m", hidden_size=32, num_layers=None, num_heads=4)  # 12 heads do not divide 32
    config = common.model_config(args, Tokenizer(), "tfm_decoder")
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 4, 8)

    args = Namespace(config=None, hidden_size=None, num_layers=3, num_heads=None)
    config = common.model_config(args, Tokenizer(), "tfm_encoder_decoder", decoder_start_token_id=1)
    assert (config.num_hidden_layers, config.decoder_layers, config.decoder_start_token_id) == (3, 3, 1)
    assert config.hidden_size == common.SMALL["hidden_size"]
