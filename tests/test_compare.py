"""`hf-tfm compare`: hf_tfm models, an MoE variant and transformers' own GPT2LMHeadModel / BertForMaskedLM trained on
the same data, tokenizer, batches and budget, parameters matched; a second call reads the finished runs back; bad
input named. Tiny budgets: these check the comparison, not the models."""

import json

import pytest
import torch

import hf_tfm.training.run as run_module
from hf_tfm.presets import preset_path
from hf_tfm.training import memory
from hf_tfm.training.compare import compare
from hf_tfm_cli.spec import RunSpec

BUDGET = dict(max_steps=3, batch_size=2, max_length=32, max_files=60, max_eval_samples=16, use_cpu=True)
MOE_VARIANT = "llama-1.3m:num_experts=4,num_experts_per_tok=2"


@pytest.fixture
def recorded_batches(monkeypatch):
    """The input ids of every training step of every run, by run folder."""
    batches = {}
    make_trainer = run_module.make_trainer

    def recording(spec, model, *args, **kwargs):
        trainer = make_trainer(spec, model, *args, **kwargs)
        seen = batches.setdefault(spec.output_dir, [])
        model.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append(kwargs["input_ids"].tolist()) if module.training else None,
            with_kwargs=True,
        )
        return trainer

    monkeypatch.setattr(run_module, "make_trainer", recording)
    return batches


@pytest.mark.slow
def test_causal_lm_compare_matches_parameters_and_batches_and_resumes(tmp_path, recorded_batches, monkeypatch):
    spec = RunSpec(task="causal-lm", **BUDGET)
    record = compare(spec, ["llama-1.3m", MOE_VARIANT, "gpt2"], [0, 1], tmp_path)
    rows = {row["label"]: row for row in record["models"]}
    dense, moe, gpt2 = rows["llama-1.3m"], rows[MOE_VARIANT], rows["gpt2"]
    assert gpt2["reference"] and not dense["reference"]
    assert abs(gpt2["parameters"] - dense["active_parameters"]) <= 0.05 * dense["active_parameters"]
    assert moe["active_parameters"] < moe["parameters"]  # two of four experts per token
    config = json.loads((tmp_path / "configs" / "gpt2.json").read_text())
    llama = json.loads((preset_path("llama-1.3m") / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["resid_pdrop"] == 0.0
    assert config["vocab_size"] > config["eos_token_id"] and config["eos_token_id"] is not None  # not GPT-2's 50256
    assert (config["n_embd"], config["n_layer"]) == (llama["hidden_size"], llama["num_hidden_layers"])
    for row in record["models"]:
        assert set(row["metrics"]) >= {"loss", "perplexity"} and len(row["metrics"]["loss"]["values"]) == 2
    # every model saw the same batches, seed for seed (6 runs: 3 models x 2 seeds, 3 steps each)
    assert len(recorded_batches) == 6
    for seed in (0, 1):
        runs = [batches for folder, batches in recorded_batches.items() if folder.endswith(f"seed-{seed}")]
        assert len(runs) == 3 and len(runs[0]) == 3 and runs[0] == runs[1] == runs[2]
    seeds = [batches for folder, batches in recorded_batches.items() if "gpt2" in folder]
    assert seeds[0] != seeds[1]
    assert {path.name for path in tmp_path.iterdir()} >= {"compare.json", "compare.md", "compare.png", "tokenizer"}
    assert "gpt2 (transformers)" in (tmp_path / "compare.md").read_text()
    if memory.STATUS.is_file():  # Linux: the resident set's high-water mark, reset as each run's training begins
        assert all(row["peak_memory_bytes"] >= 0 for row in record["models"])  # a tiny run may add none
        assert "process resident set" in (tmp_path / "compare.md").read_text()

    def no_training(spec):
        raise AssertionError(f"{spec.output_dir} trained again")

    monkeypatch.setattr("hf_tfm.training.compare.train", no_training)
    again = compare(spec, ["llama-1.3m", MOE_VARIANT, "gpt2"], [0, 1], tmp_path)
    assert [row["metrics"] for row in again["models"]] == [row["metrics"] for row in record["models"]]


@pytest.mark.slow
def test_masked_lm_compare_sizes_bert_to_the_first_model(tmp_path):
    record = compare(RunSpec(task="masked-lm", **BUDGET), ["bert-1.4m", "bert"], [0], tmp_path)
    ours, bert = record["models"]
    assert abs(bert["parameters"] - ours["parameters"]) <= 0.05 * ours["parameters"]
    assert json.loads((tmp_path / "configs" / "bert.json").read_text())["model_type"] == "bert"


@pytest.mark.slow
def test_seq2seq_compare_sizes_t5_and_bart(tmp_path):
    record = compare(RunSpec(task="seq2seq", **BUDGET), ["t5-1.9m", "t5", "bart"], [0], tmp_path)
    ours, t5, bart = record["models"]
    for reference in (t5, bart):
        assert abs(reference["parameters"] - ours["parameters"]) <= 0.05 * ours["parameters"]
    assert json.loads((tmp_path / "configs" / "t5.json").read_text())["dropout_rate"] == 0.0


@pytest.mark.parametrize(
    "task, models, message",
    [
        ("causal-lm", ["llama-1.3m", "gpt3"], "unknown model 'gpt3'.*or a reference: gpt2, bert, t5, bart"),
        ("masked-lm", ["bert-1.4m", "gpt2"], "reference 'gpt2' trains causal-lm, not masked-lm"),
        ("causal-lm", ["gpt2"], "needs an hf_tfm model"),
        ("causal-lm", ["llama-1.3m", "llama-1.3m"], "names a model twice"),
        ("causal-lm", ["llama-1.3m:num_experts"], "expected NAME:field=value"),
    ],
)
def test_bad_input_is_named(tmp_path, task, models, message):
    with pytest.raises(ValueError, match=message):
        compare(RunSpec(task=task, **BUDGET), models, [0], tmp_path)


def test_a_budget_without_an_evaluation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--eval-steps 5 is more than --max-steps 3"):
        compare(RunSpec(task="causal-lm", **BUDGET, eval_steps=5), ["llama-1.3m", "gpt2"], [0], tmp_path)


def test_peak_memory_counts_what_the_block_holds():
    with memory.peak_memory(torch.device("cpu")) as peak:
        held = torch.ones(64, 2**20, dtype=torch.uint8)  # 64 MiB, touched
        del held
    if memory.STATUS.is_file():
        assert peak["bytes"] >= 60 * 2**20 and peak["measure"] == "process resident set, high-water"
    else:
        assert peak == {}


def test_a_reference_that_cannot_be_matched_names_what_to_change(tmp_path):
    """ALBERT shares one block over its layers: BERT at its width and depth holds more even with the narrowest
    feed-forward."""
    with pytest.raises(ValueError, match="cannot hold .* intermediate_size"):
        compare(RunSpec(task="masked-lm", **BUDGET), ["albert-0.5m", "bert"], [0], tmp_path)
