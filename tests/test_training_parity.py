"""A converted model trains as its reference does: in training mode, with every dropout its reference's config names
set to 0.2 (embeddings, attention weights, sublayer outputs, inside the feed-forward and each expert, after T5's
final norm, LayerDrop), the same seed gives the same loss and the same gradients, for every family of the registry. MoE
references are asked for their router losses (`output_router_logits=True`), which hf_tfm adds whenever it has labels.

The draws match because hf_tfm applies each dropout where its reference does, in the same order (GPT-NeoX's
attention output before its feed-forward's; T5's inside the feed-forward and after the final norm; Switch
Transformer's inside each expert, which only the eager experts loop does: a model with `activation_dropout` and
experts defaults to it)."""

import pytest
import torch
from support.families import skip_where_the_reference_is_not_its_family, tiny_reference, tiny_reference_config

from benchmarks.training_parity import OWN_PARAMETERS, seeded_step, training_pair
from hf_tfm.convert import to_tfm
from hf_tfm.convert.families import FAMILIES

RATE = 0.2


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_training_mode_loss_and_gradients_equal_the_reference_under_the_same_seed(name):
    """(`python -m benchmarks.training_parity` prints the same comparison over 40 seeds, with the mean losses.)"""
    skip_where_the_reference_is_not_its_family(name)
    reference, ours, extra, inputs = training_pair(name, RATE)
    own = OWN_PARAMETERS.get(name, {})
    assert set(own) <= dict(ours.named_parameters()).keys()
    for seed in range(2):
        expected, actual = seeded_step(reference, inputs, seed, **extra), seeded_step(ours, inputs, seed, own)
        assert actual[0] == pytest.approx(expected[0], rel=0, abs=1e-5), (name, seed)
        assert actual[1] == pytest.approx(expected[1], rel=1e-5), (name, seed, "gradient norm")
    ours.eval()  # the control: without dropout the loss is another one, so the draws above did act
    assert abs(seeded_step(ours, inputs, 0)[0] - expected[0]) > 1e-4


def test_switch_transformer_experts_drop_out_in_the_eager_loop_only():
    """A fused experts backend would skip each expert's inner dropout: with `activation_dropout` the default is the
    eager loop, and a fused backend asked for by name is refused naming the field."""
    ours = to_tfm(tiny_reference("switch_transformers", dropout_rate=RATE))
    assert ours.config.activation_dropout == RATE
    assert set(ours.get_experts_implementation().values()) == {"eager"}
    for backend in ("grouped_mm", "batched_mm"):
        with pytest.raises(ValueError, match="activation_dropout=0.2 cannot run with experts_implementation"):
            ours.set_experts_implementation(backend)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_seq2seq_trainer_logs_the_references_losses_step_for_step(name, tmp_path):
    """Fine-tuning with Seq2SeqTrainer, the reference's default dropouts on (T5's `dropout_rate` 0.1; BART's 0.1 with
    attention and activation dropout set too): 20 steps of AdamW on shuffled batches log the same losses for the
    converted model as for the reference."""
    from support.trainer import ListDataset, logged_losses
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    fields = (
        dict(dropout_rate=0.1) if name == "t5" else dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    )
    generator = torch.Generator().manual_seed(2)
    vocab = tiny_reference_config(name).vocab_size
    rows = [
        {
            "input_ids": torch.randint(3, vocab, (7,), generator=generator),
            "labels": torch.randint(3, vocab, (4,), generator=generator),
        }
        for _ in range(40)
    ]
    losses = {}
    for side in ("reference", "ours"):
        reference = tiny_reference(name, **fields)
        model = reference if side == "reference" else to_tfm(reference)
        args = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / side), report_to=[], disable_tqdm=True, use_cpu=True, save_strategy="no",
            logging_steps=1, seed=0, max_steps=20, per_device_train_batch_size=4, learning_rate=1e-3,
        )  # fmt: skip
        trainer = Seq2SeqTrainer(model=model.train(), args=args, train_dataset=ListDataset(rows))
        trainer.train()
        losses[side] = logged_losses(trainer)
    assert len(losses["ours"]) == 20
    assert losses["ours"][0] == pytest.approx(losses["reference"][0], rel=0, abs=1e-5)
    # rounding apart from the first step on (the two sides sum the same products in other orders), which AdamW's
    # normalised updates carry into later losses (T5: 6.4e-4 at most over 20 steps, BART: within 1e-4); a dropout
    # drawn elsewhere would move every loss by a tenth or more
    assert losses["ours"] == pytest.approx(losses["reference"], rel=0, abs=2e-3)
