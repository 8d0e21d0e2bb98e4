"""2-D parallelism: FSDP2 and tensor parallelism together on a 2 x 2 device mesh, four CPU processes over gloo, train
as one process does on the global batch.

One launch, `torchrun --standalone --nproc_per_node 4 tests/support/mesh_worker.py OUT` (the worker's docstring says
what it runs), writes OUT/results.json; every test reads it. The models load with
`from_pretrained(path, distributed_config=DistributedConfig(fsdp_size=2, tp_size=2))`: a GQA decoder, and an MoE
decoder with a shared expert, the load-balancing loss and the z-loss summed over the data-parallel ranks.

Tolerances: the first step's loss and gradient norm, relative 1e-6 (measured: below 1.1e-7), and its gradients,
absolute 1e-6 (measured 8.9e-8); later steps' losses and norms, relative 1e-5 (measured up to 1.6e-6: they are taken
at parameters that already differ); parameters after 4 clipped AdamW steps at lr 1e-2, absolute 1e-4 (measured
4.5e-5: Adam moves a weight by about the learning rate however small its gradient, so the rounding of sharded sums
shows at about lr x its relative rounding).
"""

from pathlib import Path

import pytest
from support.processes import launch_workers

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two_dimensional")]

WORKER = Path(__file__).resolve().parent / "support" / "mesh_worker.py"
FIRST_STEP_RTOL, RTOL, GRADIENT_ATOL, PARAMETER_ATOL = 1e-6, 1e-5, 1e-6, 1e-4
MODELS = ["gqa_decoder", "moe_decoder"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return launch_workers(WORKER, tmp_path_factory.mktemp("mesh"), processes=4)


@pytest.mark.parametrize("name", MODELS)
def test_the_mesh_shards_every_layer_over_both_dimensions(results, name):
    run = results[name]
    assert results["world_size"] == 4
    assert run["mesh"] == {"shape": [2, 2], "dims": ["fsdp", "tp"]}
    # tensor-parallel slices (Shard on the "tp" dimension) held fully sharded (Shard on "fsdp"); the layers tensor
    # parallelism leaves whole (norms, router) on the fsdp dimension alone
    assert "(Shard(dim=0), Shard(dim=1))" in run["placements"]
    assert "(Shard(dim=0),)" in run["placements"]
    assert all(
        placement.startswith("(Shard(dim=0)") or "_StridedShard" in placement for placement in run["placements"]
    )


@pytest.mark.parametrize("name", MODELS)
def test_two_by_two_mesh_trains_as_one_process_on_the_global_batch(results, name):
    run = results[name]
    assert len(run["losses"]) == len(run["reference_losses"]) == 4
    for ours, reference in [("losses", "reference_losses"), ("gradient_norms", "reference_gradient_norms")]:
        assert run[ours][0] == pytest.approx(run[reference][0], rel=FIRST_STEP_RTOL, abs=0)
        assert run[ours] == pytest.approx(run[reference], rel=RTOL, abs=0)
    assert max(run["gradient_norms"]) > 1.0  # the clipping (max norm 1.0) acted, over both meshes
    difference, where = run["gradients"]
    assert difference <= GRADIENT_ATOL, where
    difference, where = run["parameters"]
    assert difference <= PARAMETER_ATOL, where


def test_trainer_refuses_a_tensor_parallel_mesh_on_the_cpu(results):
    """What a GPU run must show instead: accelerate takes a tensor-parallel layout only on GPU distributed types.
    If this fails because Trainer started, a later accelerate runs it on the CPU: prove it with Trainer here."""
    assert "MULTI_CPU" in results["trainer_refusal"], results["trainer_refusal"]
