"""RouterStatsCallback under transformers.Trainer: per-layer router load and entropy in the logs, a heat map."""

import math

import pytest
import torch
from conftest import tiny_model
from support.trainer import ListDataset, training_args
from transformers import Trainer

from hf_tfm.training.callbacks import RouterStatsCallback

EXPERTS = 4
LAYERS = ["layers.0", "layers.1"]  # tiny_model: 2 layers, every one MoE when num_experts > 0


def random_rows(count=16, length=8):
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        ids = torch.randint(3, 97, (length,), generator=generator)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return ListDataset(rows)


def train_with_stats(tmp_path, model, **overrides):
    """8 steps of batch 2, logging every 2 steps: 4 training logs."""
    callback = RouterStatsCallback()
    fields = {"per_device_train_batch_size": 2, "max_steps": 8, "logging_steps": 2, "learning_rate": 1e-3}
    fields.update(overrides)
    trainer = Trainer(
        model=model.train(), args=training_args(tmp_path, **fields), train_dataset=random_rows(), callbacks=[callback]
    )
    trainer.train()
    return trainer, callback


def router_logs(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if any(key.startswith("router/") for key in entry)]


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    model = tiny_model(num_experts=EXPERTS)
    trainer, callback = train_with_stats(tmp_path_factory.mktemp("moe"), model)
    return model, trainer, callback


def test_router_stats_logged_for_every_moe_layer(moe_run):
    """Each training log holds max_load >= 1 (1 = balanced, at most E) and entropy in [0, ln E] per MoE layer, and
    the history keeps one [layers, experts] load-fraction table per log, consistent with the logged max_load."""
    _, trainer, callback = moe_run
    logs = router_logs(trainer)
    assert [entry["step"] for entry in logs] == [2, 4, 6, 8]
    assert all("loss" in entry for entry in logs)  # merged into the Trainer's own training logs
    assert callback.layer_names == LAYERS
    assert [entry["step"] for entry in callback.history] == [2, 4, 6, 8]
    for entry, kept in zip(logs, callback.history):
        assert kept["load"].shape == (len(LAYERS), EXPERTS)
        torch.testing.assert_close(kept["load"].sum(dim=-1), torch.ones(len(LAYERS)))
        for row, layer in enumerate(LAYERS):
            max_load, entropy = entry[f"router/{layer}/max_load"], entry[f"router/{layer}/entropy"]
            assert 1.0 <= max_load <= EXPERTS
            assert max_load == pytest.approx(kept["load"][row].max().item() * EXPERTS)
            assert 0.0 <= entropy <= math.log(EXPERTS) + 1e-6


def test_save_heatmap_writes_png(moe_run, tmp_path):
    _, _, callback = moe_run
    path = tmp_path / "router_load.png"
    callback.save_heatmap(path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_hooks_removed_after_training(moe_run):
    model, _, callback = moe_run
    routers = [module for name, module in model.named_modules() if name.endswith(".router")]
    assert len(routers) == len(LAYERS)
    for router in routers:  # transformers' own output-capturing hook may stay; ours must not
        assert not [hook for hook in router._forward_hooks.values() if "RouterStatsCallback" in hook.__qualname__]
    assert callback._handles == []


def test_hooks_count_only_training_forwards_without_graphs():
    """Evaluation forwards are not load; training forwards count top_k assignments per token, outside autograd."""
    model = tiny_model(num_experts=EXPERTS)
    callback = RouterStatsCallback()
    callback.on_train_begin(None, None, None, model=model)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    model.eval()(ids)
    assert all(stats["tokens"] == 0 for stats in callback._stats.values())
    model.train()(ids, labels=ids)
    for stats in callback._stats.values():
        assert stats["tokens"] == 5
        assert stats["counts"].sum() == 5 * model.config.num_experts_per_tok
        assert not stats["counts"].requires_grad and not stats["entropy"].requires_grad
    callback.on_train_end(None, None, None)


def test_collapsed_router_logs_full_load(tmp_path):
    """Top-1 routing with expert 0 always chosen puts all load on it: max_load is exactly E. Zero router weights
    make every token's softmax uniform, so the entropy is ln E, the top of its range."""
    model = tiny_model(num_experts=EXPERTS, num_experts_per_tok=1, router_bias_update_rate=0.01)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.router.weight.zero_()
            layer.mlp.router.expert_bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))  # selection only, weights unchanged
    # learning_rate 0 keeps the router weights at zero; without RouterBiasCallback the bias stays as set.
    trainer, callback = train_with_stats(tmp_path, model, learning_rate=0.0)
    logs = router_logs(trainer)
    assert len(logs) == 4
    for entry in logs:
        for layer in LAYERS:
            assert entry[f"router/{layer}/max_load"] == EXPERTS
            assert entry[f"router/{layer}/entropy"] == pytest.approx(math.log(EXPERTS), abs=1e-5)
    assert all(torch.equal(kept["load"][:, 0], torch.ones(len(LAYERS))) for kept in callback.history)


def test_dense_model_logs_nothing(tmp_path):
    trainer, callback = train_with_stats(tmp_path, tiny_model(num_experts=0))
    assert any("loss" in entry for entry in trainer.state.log_history)
    assert router_logs(trainer) == []
    assert callback.history == [] and callback.layer_names == []
    with pytest.raises(ValueError, match="no router statistics"):
        callback.save_heatmap(tmp_path / "none.png")
