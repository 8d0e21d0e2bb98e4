"""The load-balancing loss does its job in training: the experiment of benchmarks/moe_balance.py, run in CI."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from moe_balance import final_max_load  # noqa: E402


@pytest.mark.slow
def test_aux_loss_keeps_expert_load_within_twice_uniform(tmp_path):
    """300 Trainer steps of a tiny 8-expert top-2 decoder on the stdlib corpus: with router_aux_loss_coef=0.05 every
    layer's busiest expert carries at most 2x the uniform load; with 0 the load is allowed to collapse (and here
    does, further than with the loss on)."""
    balanced, _ = final_max_load(0.05, output_dir=str(tmp_path / "aux"))
    unbalanced, _ = final_max_load(0.0, output_dir=str(tmp_path / "no-aux"))
    assert all(load <= 2.0 for load in balanced.values()), balanced
    assert max(balanced.values()) < max(unbalanced.values()), (balanced, unbalanced)
