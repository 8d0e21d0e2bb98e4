"""hf_tfm models under transformers.Trainer: training learns, and gradient accumulation is exact."""

import pytest
import torch
from conftest import tiny_config, tiny_model
from support.trainer import ListDataset, accumulation_run, logged_losses, training_args
from transformers import Trainer

from hf_tfm import TfmEncoderConfig, TfmEncoderForSequenceClassification, TfmEncoderForTokenClassification
from hf_tfm.training.callbacks import RouterBiasCallback


def test_trainer_lowers_loss(tmp_path):
    """About 30 Trainer steps on a repeated pattern cut the logged training loss by more than half."""
    pattern = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10] * 2)
    data = ListDataset([{"input_ids": pattern, "labels": pattern.clone()} for _ in range(16)])
    args = training_args(tmp_path, per_device_train_batch_size=4, max_steps=30, learning_rate=1e-2, warmup_steps=0)
    trainer = Trainer(model=tiny_model().train(), args=args, train_dataset=data)
    trainer.train()
    losses = logged_losses(trainer)
    assert len(losses) == 30
    assert losses[-1] < 0.5 * losses[0], losses


def test_gradient_accumulation_matches_full_batch(tmp_path):
    """Batch 2 x 4 accumulation steps equals batch 8 in one step, although micro-batches hold different token counts.

    This holds only if the loss is normalized by Trainer's num_items_in_batch: a forward that takes **kwargs gets it
    from Trainer, which then no longer divides the loss by the accumulation steps itself."""
    torch.manual_seed(0)
    rows = []
    for valid in [6, 5, 2, 6, 4, 3, 6, 2]:  # real labels per row: micro-batches of 2 hold 9, 6, 5 and 6 targets
        ids = torch.randint(3, 97, (6,))
        labels = ids.clone()
        labels[valid:] = -100
        rows.append({"input_ids": ids, "labels": labels})
    targets = [int((r["labels"][1:] != -100).sum()) for r in rows]
    micro_counts = {targets[k] + targets[k + 1] for k in range(0, 8, 2)}
    assert len(micro_counts) > 1, "the data must give micro-batches different target counts"
    data = ListDataset(rows)

    accumulated, accumulated_loss = accumulation_run(tmp_path, data, batch_size=2, accumulation=4)
    full, full_loss = accumulation_run(tmp_path, data, batch_size=8, accumulation=1)
    start = tiny_model(seed=1)

    moved = False
    for (name, p_acc), p_full, p_start in zip(accumulated.named_parameters(), full.parameters(), start.parameters()):
        torch.testing.assert_close(p_acc, p_full, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        moved |= not torch.allclose(p_full, p_start, atol=1e-4)
    assert moved, "the optimizer step should change the parameters"
    assert len(accumulated_loss) == len(full_loss) == 1
    assert accumulated_loss[0] == pytest.approx(full_loss[0], rel=1e-5)


def encoder_head(head_class, seed=1, **overrides):
    torch.manual_seed(seed)
    return head_class(tiny_config(TfmEncoderConfig, num_labels=3, **overrides))


@pytest.mark.parametrize(
    "head_class, label_counts",
    [
        # token labels with -100: micro-batches hold 7, 3, 9 and 4 labelled tokens; exact via num_items_in_batch
        (TfmEncoderForTokenClassification, [6, 1, 2, 1, 6, 3, 2, 2]),
        # one label per row: micro-batches are equal, so Trainer's 1/accumulation scaling is exact
        (TfmEncoderForSequenceClassification, None),
    ],
)
def test_gradient_accumulation_encoder_heads(tmp_path, head_class, label_counts):
    """Accumulation 2 x 4 equals batch 8 for the encoder classification heads (each with its own loss scaling)."""
    torch.manual_seed(0)
    rows = []
    for row in range(8):
        ids = torch.randint(3, 97, (6,))
        if label_counts is None:
            labels = torch.tensor(row % 3)
        else:
            labels = torch.randint(0, 3, (6,))
            labels[label_counts[row] :] = -100
        rows.append({"input_ids": ids, "labels": labels})
    data = ListDataset(rows)
    make = lambda: encoder_head(head_class)  # noqa: E731
    accumulated, accumulated_loss = accumulation_run(tmp_path, data, 2, 4, make_model=make)
    full, full_loss = accumulation_run(tmp_path, data, 8, 1, make_model=make)
    for (name, p_acc), p_full in zip(accumulated.named_parameters(), full.parameters()):
        torch.testing.assert_close(p_acc, p_full, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert not torch.allclose(full.classifier.weight, make().classifier.weight, atol=1e-4)
    assert accumulated_loss[0] == pytest.approx(full_loss[0], rel=1e-5)


def test_router_bias_callback_balances_under_trainer(tmp_path):
    """With auxiliary-loss-free balancing, RouterBiasCallback moves every router's expert bias after optimizer
    steps; without the callback the biases stay at zero."""
    pattern = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10])
    data = ListDataset([{"input_ids": pattern, "labels": pattern.clone()} for _ in range(8)])
    args = training_args(tmp_path, per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3)
    biases = {}
    for name, callbacks in (("with", [RouterBiasCallback()]), ("without", [])):
        model = tiny_model(num_experts=4, router_bias_update_rate=0.01, router_aux_loss_coef=0.0).train()
        Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
        biases[name] = torch.stack([layer.mlp.router.expert_bias for layer in model.model.layers])
    assert biases["with"].abs().sum() > 0
    assert (biases["with"].abs() <= 3 * 0.01 + 1e-6).all()  # at most one step of `rate` per optimizer step
    assert torch.equal(biases["without"], torch.zeros_like(biases["without"]))
