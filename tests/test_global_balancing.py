"""Global-batch MoE balancing (`router_aux_loss_scope="global"`): N data-parallel ranks train as one process does on
the global batch, router losses included; and Trainer counts the router losses once at any world size.

One launch, `torchrun --standalone --nproc_per_node 2 tests/support/balancing_worker.py OUT` (the worker's docstring
says what it runs), writes OUT/results.json; the multi-process tests read it. The model is a tiny MoE decoder with
the load-balancing loss (coefficient 0.1) and the z-loss (0.01) on, each rank fed deliberately different tokens.

Tolerances: relative 1e-6 on every loss (measured: below 1.1e-7); parameters after 6 AdamW steps at lr 1e-2,
absolute 1e-4 (measured up to 1.6e-5: Adam moves a weight by about the learning rate however small its gradient, so
the rounding of two half-batch sums against one shows at about lr x its relative rounding). The local scope differs
from one process by 1.2e-3 in the loss and 0.07 in the weights, which is what the tests require to show.
"""

from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from support.processes import launch_workers

from hf_tfm import TfmDecoderForCausalLM, TfmEncoderDecoderConfig, TfmEncoderDecoderForConditionalGeneration
from hf_tfm.model.modeling_tfm_moe import load_balancing_loss, router_z_loss

# one xdist worker runs this module, so its module-scoped fixture runs once
pytestmark = [pytest.mark.xdist_group("global_balancing")]

WORKER = Path(__file__).resolve().parent / "support" / "balancing_worker.py"
LOSS_RTOL, PARAMETER_ATOL = 1e-6, 1e-4
LOCAL_DIFFERS_BY = 1e-4  # the local scope's smallest loss difference the tests require (measured: 1.2e-3)
MOE = dict(num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.1, router_z_loss_coef=0.01)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return launch_workers(WORKER, tmp_path_factory.mktemp("balancing"))


def largest_relative_difference(run: dict) -> float:
    assert len(run["losses"]) == len(run["reference_losses"]) == 6
    return max(abs(a - b) / abs(b) for a, b in zip(run["losses"], run["reference_losses"]))


@pytest.mark.parametrize("launch", ["fsdp", "ddp", "trainer"])
@pytest.mark.slow
def test_global_scope_trains_two_ranks_as_one_process_on_the_global_batch(results, launch):
    run = results[launch]["global"]
    assert largest_relative_difference(run) <= LOSS_RTOL, run
    difference, where = run["final_difference"]
    assert difference <= PARAMETER_ATOL, where


@pytest.mark.parametrize("launch", ["fsdp", "ddp", "trainer"])
@pytest.mark.slow
def test_local_scope_balances_each_ranks_tokens_and_so_trains_differently(results, launch):
    """What a converted model keeps (transformers' MoE models compute it so): each rank balances its own tokens."""
    run = results[launch]["local"]
    assert largest_relative_difference(run) >= LOCAL_DIFFERS_BY, run


@pytest.mark.slow
def test_trainer_counts_the_router_losses_once_at_any_world_size(results):
    """Trainer multiplies every rank's loss by the world size under `average_tokens_across_devices`; hf_tfm's router
    losses take each rank's share of the accumulated batch's tokens, so two ranks with the same rows (where local and
    global balancing agree) train as one process. The ranks' micro-batches hold different numbers of tokens in the
    global case above, so the share is the global batch's, not each rank's."""
    trainer = results["trainer"]
    assert trainer["global"]["distributed_type"] == "DistributedType.MULTI_CPU"  # DDP over gloo
    tokens = trainer["global"]["scored_tokens_per_rank"]
    assert tokens[0] != tokens[1]
    same_rows = trainer["local_same_rows"]
    assert same_rows["scored_tokens_per_rank"][0] == same_rows["scored_tokens_per_rank"][1]
    assert largest_relative_difference(same_rows) <= LOSS_RTOL, same_rows
    assert same_rows["final_difference"][0] <= PARAMETER_ATOL, same_rows["final_difference"]


def batch() -> dict:
    torch.manual_seed(3)
    input_ids = torch.randint(3, 64, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -3:] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": input_ids.masked_fill(attention_mask == 0, -100),
    }


@pytest.mark.parametrize("num_items_in_batch", [None, 11])
def test_one_process_computes_the_same_loss_and_gradients_in_either_scope(num_items_in_batch):
    """One process is its own global batch: both scopes give bit-identical losses and gradients (with Trainer's
    token count too)."""
    kwargs = {} if num_items_in_batch is None else {"num_items_in_batch": torch.tensor(num_items_in_batch)}
    losses, gradients = {}, {}
    for scope in ("local", "global"):
        torch.manual_seed(0)
        model = TfmDecoderForCausalLM(tiny_config(**MOE, router_aux_loss_scope=scope)).train()
        loss = model(**batch(), **kwargs).loss
        loss.backward()
        losses[scope] = loss.detach()
        gradients[scope] = [parameter.grad for parameter in model.parameters()]
    assert torch.equal(losses["local"], losses["global"])
    assert all(torch.equal(a, b) for a, b in zip(gradients["local"], gradients["global"]))


@pytest.mark.parametrize("loss, extra", [(load_balancing_loss, (4, 2)), (router_z_loss, ())], ids=["aux", "z"])
def test_summing_over_ranks_gives_the_global_value_and_twice_this_ranks_part_of_its_gradient(loss, extra):
    """The global losses' arithmetic on one rank of two, the all-reduce stood in for by adding the other rank's sums
    (recorded from its own call): the value is the one-process loss of both ranks' tokens; the gradient on this
    rank's router logits is twice its part of that loss's gradient, which the ranks' gradient averaging halves."""
    torch.manual_seed(0)
    logits = [torch.randn(12, 4, requires_grad=True), torch.randn(12, 4) * 3]  # this rank's, the other rank's
    masks = [torch.ones(2, 6), torch.tensor([[1.0] * 6, [1.0] * 2 + [0.0] * 4])]
    recorded = []
    loss((logits[1],), *extra, masks[1], sum_over_ranks=lambda tensor: recorded.append(tensor.clone()) or tensor)
    two_ranks = loss((logits[0],), *extra, masks[0], sum_over_ranks=lambda tensor: tensor + recorded[0])
    one_process = loss((torch.cat(logits),), *extra, torch.cat(masks))
    torch.testing.assert_close(two_ranks, one_process)
    (gradient,) = torch.autograd.grad(two_ranks, logits[0])
    (expected,) = torch.autograd.grad(one_process, logits[0])
    torch.testing.assert_close(gradient, 2 * expected)


def test_evaluation_counts_this_ranks_tokens_without_a_collective(monkeypatch):
    """Global scope sums over ranks while training only: a forward that another rank does not run (an evaluation on
    rank 0 alone) must not wait for it."""
    import hf_tfm.model.modeling_tfm as modeling

    calls = []
    monkeypatch.setattr(modeling, "sum_over_data_parallel_ranks", lambda model, tensor: calls.append(1) or tensor)
    model = TfmDecoderForCausalLM(tiny_config(**MOE, router_aux_loss_scope="global"))
    model.eval()(**batch())
    assert calls == []
    model.train()(**batch())
    assert calls  # the load-balancing loss and the z-loss


def test_global_scope_needs_mixtral_style_losses():
    config = dict(MOE, router_aux_loss_scope="global", router_loss_style="switch")
    with pytest.raises(ValueError, match="router_aux_loss_scope.*per sequence"):
        TfmEncoderDecoderConfig(**tiny_config(TfmEncoderDecoderConfig, **config).to_dict())
    with pytest.raises(ValueError, match="router_aux_loss_scope.*not one of"):
        tiny_config(**MOE, router_aux_loss_scope="world")
    # the encoder-decoder's two stacks each sum over the ranks
    model = TfmEncoderDecoderForConditionalGeneration(
        tiny_config(TfmEncoderDecoderConfig, **MOE, router_aux_loss_scope="global")
    )
    inputs = batch()
    assert model.train()(**inputs, decoder_input_ids=inputs["input_ids"]).loss.isfinite()
