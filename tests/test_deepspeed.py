"""DeepSpeed ZeRO-2 and ZeRO-3 on its CPU accelerator, two processes over gloo: hf_tfm models train as one process does
on the global batch and as the reference classes do under the same engine, load partitioned (`HfDeepSpeedConfig` +
`from_pretrained`, i.e. `zero.Init`), save their gathered weights, resize their embeddings, and train under Trainer.

One launch, `DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node 2 tests/support/deepspeed_worker.py OUT` (the
worker's docstring says what it runs), writes OUT/results.json; every test reads it.

Tolerances: relative 1e-6 on every loss (measured: at most 3.0e-7 against one process, 2.1e-7 against the reference
class, 0.0 under ZeRO-3); the gathered weights reload exactly.
"""

from pathlib import Path

import pytest
from support.processes import launch_workers

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deepspeed")]

pytest.importorskip("deepspeed", reason="deepspeed is in the test extras: pip install .[test]")

WORKER = Path(__file__).resolve().parent / "support" / "deepspeed_worker.py"
RTOL = 1e-6
STAGES = ["zero2", "zero3"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return launch_workers(WORKER, tmp_path_factory.mktemp("deepspeed"), timeout=900, DS_ACCELERATOR="cpu")


def assert_same_losses(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected) == 4
    assert actual == pytest.approx(expected, rel=RTOL, abs=0)


@pytest.mark.parametrize("stage", STAGES)
def test_dense_model_trains_as_one_process_and_as_the_reference_class(results, stage):
    run = results[stage]["dense"]
    assert run["zero3_init"] == (stage == "zero3")  # ZeRO-3: partitioned as the weights were created
    assert_same_losses(run["losses"], run["one_process"])
    assert_same_losses(run["losses"], run["reference_class"])


@pytest.mark.parametrize("stage", STAGES)
def test_moe_model_trains_as_the_reference_class_with_per_rank_balancing(results, stage):
    """Mixtral balances each rank's tokens; so does a converted model (router_aux_loss_scope="local")."""
    run = results[stage]["moe_local"]
    assert_same_losses(run["losses"], run["reference_class"])


@pytest.mark.parametrize("stage", STAGES)
def test_moe_model_with_global_balancing_trains_as_one_process(results, stage):
    run = results[stage]["moe_global"]
    assert_same_losses(run["losses"], run["one_process"])
    assert run["losses"] != pytest.approx(results[stage]["moe_local"]["losses"], rel=1e-5)  # the scope matters


def test_a_rank_whose_tokens_skip_experts_finishes_because_the_moe_block_is_a_zero3_leaf(results):
    run = results["skipped_experts"]
    assert run["leaf_modules"] == ["model.layers.0.mlp", "model.layers.1.mlp"]  # TfmMoE._z3_leaf
    reached_by_rank_0, reached_by_rank_1 = run["most_experts_reached_per_rank"]
    assert reached_by_rank_0 < 8 == reached_by_rank_1
    assert len(run["losses"]) == 4


def test_zero3_gathers_weights_that_reload_exactly_and_resizes_embeddings(results):
    run = results["zero3_saved_and_resized"]
    assert run["saved_parameters"] and run["saved_difference"] == 0.0
    assert run["resized_shape"] == [104, 32] and run["resized_vocab_size"] == 104
    assert run["old_rows_kept"] and run["resized_loss_finite"]


def test_trainer_trains_under_zero3_as_one_process(results):
    """`TrainingArguments(deepspeed=...)` with both processes counted: the losses Trainer logs are one process's."""
    run = results["trainer"]
    assert run["num_processes"] == 2 and run["distributed_type"] == "DistributedType.DEEPSPEED"
    assert run["zero3_init"]
    assert_same_losses(run["losses"], run["one_process"])
