"""`hf-tfm scaling`: training compute counted by FlopCounterMode equals a hand count (dense and MoE), the power-law fit
recovers known exponents, the compute multiplier reads the fits as defined, a three-size ladder of tiny models runs
end to end (and resumes), bad input is named, and the study in docs/training.md is what its records give."""

import json
import math
import random
from pathlib import Path

import pytest
from support.runs import tiny_config_file

from hf_tfm import TfmDecoderConfig
from hf_tfm.training.run import RunSpec
from hf_tfm.training.scaling import (
    best_learning_rate,
    counted,
    fit_power_law,
    fits,
    flop_batch,
    loss_at,
    multiplier,
    multipliers,
    scale_to,
    scaling,
    training_flops,
)
from hf_tfm_cli.entry import main

VOCAB, BATCH, LENGTH = 300, 4, 32
SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    ffn_type="glu",
    position_embedding_type="rope",
)


def hand_count(config, experts_per_token: int = 0) -> int:
    """Training FLOPs of a pre-norm GLU decoder step: 3 x the forward's matmuls (backward: one for the inputs'
    gradient, one for the weights'), 2 FLOPs per multiply-add. Norms and activations are not matmuls: not counted."""
    tokens, width, head = BATCH * LENGTH, config.hidden_size, config.head_dim
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    projections = width * head * (2 * heads + 2 * groups)  # q and o, k and v
    if experts_per_token:
        feed_forward = experts_per_token * 3 * width * config.moe_intermediate_size + width * config.num_experts
    else:
        feed_forward = 3 * width * config.intermediate_size
    per_layer = 2 * tokens * (projections + feed_forward) + 2 * 2 * BATCH * heads * LENGTH * LENGTH * head
    forward = config.num_hidden_layers * per_layer + 2 * tokens * width * config.vocab_size
    return 3 * forward


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_training_flops_are_the_hand_count(moe):
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48) if moe else {}
    config = TfmDecoderConfig(**SHAPE, **experts, vocab_size=VOCAB, head_dim=16)
    batch = flop_batch("causal-lm", VOCAB, BATCH, LENGTH)
    assert training_flops(config, "causal-lm", batch) == hand_count(config, 2 if moe else 0)
    counts = counted(config, "causal-lm")
    assert counts["non_embedding"] == counts["total"] - VOCAB * 64  # the tied table is the only embedding
    assert (counts["active_non_embedding"] < counts["non_embedding"]) is moe


def test_the_fit_recovers_known_exponents_and_says_when_it_cannot():
    compute = [1e9, 3e9, 1e10, 3e10, 1e11]
    fit = fit_power_law(compute, [2.0 + 50 * c**-0.2 for c in compute])
    assert fit["converged"] and fit["E"] == pytest.approx(2.0, rel=1e-6) and fit["alpha"] == pytest.approx(0.2)
    noisy = random.Random(1)
    fit = fit_power_law(compute, [(2.0 + 50 * c**-0.2) * (1 + noisy.gauss(0, 0.002)) for c in compute])
    assert fit["converged"] and fit["alpha"] == pytest.approx(0.2, rel=0.1) and fit["E"] == pytest.approx(2, rel=0.05)
    assert "E_at_zero" not in fit
    pure = fit_power_law(compute, [50 * c**-0.2 for c in compute])  # no irreducible loss: E at its bound, said
    assert pure["converged"] and pure["E_at_zero"] and pure["alpha"] == pytest.approx(0.2, rel=1e-3)
    flat = fit_power_law(compute, [3.0, 3.1, 3.2, 3.3, 3.4])
    assert not flat["converged"] and "does not fall" in flat["reason"]
    assert "at least 3" in fit_power_law(compute[:2], [3.0, 2.0])["reason"]


def test_the_multiplier_is_the_compute_ratio_at_equal_loss():
    """A model that reaches the reference's loss with a third of its compute has multiplier 3 at every compute."""
    compute = [1e9, 1e10, 1e11, 1e12]
    reference = fit_power_law(compute, [2.0 + 50 * c**-0.2 for c in compute])
    model = fit_power_law(compute, [2.0 + 50 * (3 * c) ** -0.2 for c in compute])
    assert multiplier(model, reference, 1e12) == pytest.approx(3, rel=1e-6)
    assert loss_at(model, 1e12) == pytest.approx(2.0 + 50 * 3e12**-0.2)
    below = {**model, "E": 1.0}  # a loss the reference's fit never reaches
    assert multiplier(below, reference, 1e15) == math.inf


def test_the_best_learning_rate_is_the_lowest_mean_over_seeds():
    assert best_learning_rate({"0.001": [3.0, 3.2], "0.003": [2.9, 3.2], "0.01": [2.8, 3.6]}) == "0.003"


def spec(tmp_path) -> RunSpec:
    return RunSpec(
        task="causal-lm", model="unused", output_dir=str(tmp_path), max_files=40, vocab_size=VOCAB,
        max_length=LENGTH, batch_size=BATCH, max_eval_samples=8, use_cpu=True, logging_steps=5,
    )  # fmt: skip


def test_a_three_size_ladder_runs_end_to_end_and_resumes(tmp_path):
    base = tiny_config_file(tmp_path / "configs", "tfm_decoder")
    told = []
    record = scaling(
        spec(tmp_path), [base, "gpt2"], [10_000, 20_000, 40_000], [1e-2], [0], 0.1, tmp_path / "out",
        progress=lambda done, total, seconds: told.append((done, total)),
    )  # fmt: skip
    assert told[-1] == (6, 6)  # 3 sizes x 2 models x 1 learning rate x 1 seed
    for rung in record["ladder"]:
        ours, gpt2 = (rung["models"][label] for label in (base, "gpt2"))
        assert abs(ours["parameters"]["non_embedding"] - rung["target"]) <= 0.2 * rung["target"]
        assert abs(gpt2["parameters"]["total"] - ours["parameters"]["total"]) <= 0.05 * ours["parameters"]["total"]
        steps = max(10, math.ceil(0.1 * ours["parameters"]["non_embedding"] / (BATCH * LENGTH)))
        assert rung["steps"] == steps and ours["compute"] == ours["flops_per_step"] * steps
        assert list(ours["runs"]) == ["0.01"] and ours["loss"] == ours["runs"]["0.01"][0]
    computes = [rung["models"][base]["compute"] for rung in record["ladder"]]
    assert computes == sorted(computes)
    assert set(record["fits"]) == {base, "gpt2"} and list(record["multipliers"]) == [f"{base} vs gpt2"]
    output = tmp_path / "out"
    assert json.loads((output / "scaling.json").read_text())["ladder"][0]["steps"] == 10
    table = (output / "scaling.md").read_text()
    assert "| model vs reference | compute multiplier |" in table and "gpt2" in table
    assert (output / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    again = scaling(spec(tmp_path), [base, "gpt2"], [10_000, 20_000, 40_000], [1e-2], [0], 0.1, output)
    assert [rung["models"][base]["loss"] for rung in again["ladder"]] == [
        rung["models"][base]["loss"] for rung in record["ladder"]
    ]  # read back, not trained again


def test_the_cli_names_bad_input(tmp_path, capsys):
    base = tiny_config_file(tmp_path / "configs", "tfm_decoder")
    common = ["scaling", "--task", "causal-lm", "--max-files", "40", "--output-dir", str(tmp_path / "out")]
    refused = [  # by the command, once it runs
        (["--models", base, "gpt2", "--sizes", "10K", "20K"], "needs at least 3"),
        (["--models", base, "--sizes", "10K", "20K", "100"], "cannot be scaled to 100 non-embedding parameters"),
        (["--models", "no-such-model", "--sizes", "1K", "2K", "3K"], "unknown model 'no-such-model'"),
    ]
    for arguments, message in refused:
        with pytest.raises(SystemExit, match=message):
            main(common + arguments)
    with pytest.raises(SystemExit, match="scaling compares language models"):
        main(["scaling", "--task", "seq2seq", "--models", base, "--sizes", "1K", "2K", "3K"])
    parsed = [  # by the parser, before anything loads
        (["--models", base, "--sizes", "1K", "2K", "3K", "--learning-rates", "0"], "argument --learning-rates: must"),
        (["--models", base, "--sizes", "1K", "2K", "tiny"], "expected a parameter count such as 200K"),
    ]
    for arguments, message in parsed:
        with pytest.raises(SystemExit):
            main(common + arguments)
        assert message in capsys.readouterr().err


def test_a_model_is_scaled_along_its_own_width_and_depth():
    config = TfmDecoderConfig(**SHAPE, vocab_size=VOCAB, head_dim=16)
    small, large = (scale_to(config, target, "causal-lm", "m") for target in (30_000, 400_000))
    assert small.hidden_size < large.hidden_size and small.num_hidden_layers <= large.num_hidden_layers
    for scaled_config in (small, large):
        assert (
            scaled_config.head_dim == 16 and scaled_config.num_attention_heads == 2 * scaled_config.num_key_value_heads
        )
        assert scaled_config.intermediate_size / scaled_config.hidden_size == pytest.approx(1.5, rel=0.2)


STUDY = Path(__file__).parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize("task", ["causal-lm", "masked-lm"])
def test_the_study_in_the_guide_is_what_its_records_give(task):
    """The fits and multipliers of `make study-scaling`'s records, refitted by this code, are the ones recorded, and
    the guide quotes them: a change to the fit or to the records shows here before the guide goes stale."""
    record = json.loads((STUDY / f"scaling-{task}-cpu-2026-12-07.json").read_text())
    guide = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    refitted = fits(record)
    for label, fit in record["fits"].items():
        assert refitted[label]["alpha"] == pytest.approx(fit["alpha"], rel=1e-9), label
    for key, recorded in multipliers({**record, "fits": refitted}).items():
        assert recorded["multiplier"] == pytest.approx(record["multipliers"][key]["multiplier"], rel=1e-9), key
        low, high = recorded["interval_95"]
        assert f"{recorded['multiplier']:.3g}" in guide and f"{low:.3g} to {high:.3g}" in guide, key
    for rung in record["ladder"]:
        for label, row in rung["models"].items():
            assert f"{row['loss']:.3f}" in guide, (rung["target"], label)
