"""What is particular to Switch Transformer (the proofs every family owes are in tests/test_convert_families.py):
training with labels gives the reference's loss with its router losses and the same gradient for every weight, with
tokens dropped by the capacity; the layouts hf_tfm cannot express are refused naming the field."""

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import assert_gradients_match

from hf_tfm.convert import config_from_tfm, config_to_tfm, family, from_tfm, to_tfm
from hf_tfm.convert.engine import weights_from_tfm
from hf_tfm.model.modeling_tfm_moe import TfmRouter

RECORD = family("switch_transformers")


def eager(model):
    """`model` running the kernels the reference runs: eager attention (Switch's only), its experts one at a time."""
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    return model


def training_batch():
    generator = torch.Generator().manual_seed(5)
    input_ids = torch.randint(3, VOCAB, (3, 9), generator=generator)
    labels = torch.randint(3, VOCAB, (3, 6), generator=generator)
    labels[0, -2:] = -100
    decoder_input_ids = torch.randint(3, VOCAB, (3, 6), generator=generator)
    return dict(input_ids=input_ids, labels=labels, decoder_input_ids=decoder_input_ids)


def dropped_tokens(model, batch) -> int:
    """How many of the batch's assignments the routers' capacity drops (weight 0)."""
    dropped = []
    hooks = [
        router.register_forward_hook(lambda module, args, output: dropped.append(int((output[1] == 0).sum())))
        for router in model.modules()
        if isinstance(router, TfmRouter)
    ]
    with torch.no_grad():
        model(**batch)
    for hook in hooks:
        hook.remove()
    return sum(dropped)


@pytest.mark.parametrize(
    "aux, z, jitter", [(0.001, 0.001, 0.0), (0.5, 0.2, 0.0), (0.5, 0.2, 0.1)], ids=["default", "large", "jitter"]
)
def test_training_loss_and_gradients_match_with_router_losses(aux, z, jitter):
    """In training mode, hf_tfm's loss (cross-entropy plus Switch's z-loss and load-balancing loss over each stack)
    is the reference's with `output_router_logits=True`, and every weight gets the reference's gradient; the capacity
    drops tokens on the way (a dropped token's expert output is 0 on both sides); with jitter noise, the same seed
    draws the same noise (float32: the reference's experts see the jittered tokens too, as hf_tfm's)."""
    reference = tiny_reference(
        "switch_transformers", router_aux_loss_coef=aux, router_z_loss_coef=z, router_jitter_noise=jitter
    )
    ours = eager(to_tfm(reference))
    batch = training_batch()
    assert dropped_tokens(ours, batch) > 0  # the capacity is in play
    reference.train(), ours.train()
    torch.manual_seed(7)
    expected = reference(**batch, output_router_logits=True)
    torch.manual_seed(7)
    actual = ours(**batch)
    router_part = z * (expected.encoder_z_loss + expected.decoder_z_loss)
    router_part = router_part + aux * (expected.encoder_aux_loss + expected.decoder_aux_loss)
    assert router_part > 1e-3 * expected.loss  # the router losses are in the comparison
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(actual.encoder_aux_loss, expected.encoder_aux_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(actual.decoder_aux_loss, expected.decoder_aux_loss, atol=1e-6, rtol=1e-6)
    expected.loss.backward()
    actual.loss.backward()
    assert_gradients_match(reference, ours, "switch_transformers")
    router = reference.encoder.block[1].layer[1].mlp.router.classifier.weight.grad
    assert router.abs().sum() > 0  # the router learns through its weights and its losses
    if jitter:  # the control: another draw of the noise gives another loss
        torch.manual_seed(8)
        assert (ours(**batch).loss - actual.loss).abs() > 1e-6


def test_the_capacity_drops_the_same_tokens_as_the_reference():
    """With room for one token per expert per sequence, the encoder's last hidden states equal the reference's, and
    differ from a dropless model's: the dropped tokens pass by the residual alone."""
    reference = tiny_reference("switch_transformers", expert_capacity=1)
    ours = eager(to_tfm(reference))
    input_ids = training_batch()["input_ids"]
    with torch.no_grad():
        expected = reference.encoder(input_ids=input_ids).last_hidden_state
        actual = ours.model.encoder(input_ids=input_ids).last_hidden_state
        ours.config.expert_capacity = 64
        dropless = type(ours)(ours.config)
        dropless.load_state_dict(ours.state_dict())
        unlimited = dropless.model.encoder(input_ids=input_ids).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)
    assert (unlimited - expected).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides, named",
    [
        (dict(num_sparse_encoder_layers=2, num_sparse_decoder_layers=2), "num_sparse_encoder_layers=2"),
        (dict(router_dtype="bfloat16"), "router_dtype='bfloat16'"),
    ],
    ids=["every-layer-sparse-with-losses", "bf16-router"],
)
def test_what_hf_tfm_cannot_express_is_refused(overrides, named):
    reference = tiny_reference("switch_transformers", **overrides)
    with pytest.raises(ValueError, match=named):
        to_tfm(reference)


def test_each_stack_keeps_its_own_sparse_layers():
    """4 encoder layers with 2 sparse (1 and 3) and 3 decoder layers with 1 sparse (1): the decoder's list apart, the
    same logits and training loss, and the state dict back."""
    reference = tiny_reference(
        "switch_transformers", num_layers=4, num_decoder_layers=3, num_sparse_encoder_layers=2,
        num_sparse_decoder_layers=1,
    )  # fmt: skip
    ours = eager(to_tfm(reference))
    assert (ours.config.moe_layers, ours.config.decoder_moe_layers) == ([1, 3], [1])
    kinds = [type(layer.mlp).__name__ for layer in (*ours.model.encoder.layers, *ours.model.decoder.layers)]
    assert kinds == ["TfmMLP", "TfmMoE", "TfmMLP", "TfmMoE", "TfmMLP", "TfmMoE", "TfmMLP"]
    batch = training_batch()
    with torch.no_grad():
        expected = reference(**batch, output_router_logits=True)
        actual = ours(**batch)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-6, rtol=1e-6)
    assert_same_state_dict(from_tfm(ours, "switch_transformers").state_dict(), reference.state_dict())


def test_every_layer_sparse_converts_without_router_losses():
    """A stack whose every layer is sparse gets no router losses from transformers; with both coefficients 0 the
    same model converts."""
    reference = tiny_reference(
        "switch_transformers",
        num_sparse_encoder_layers=2,
        num_sparse_decoder_layers=2,
        router_aux_loss_coef=0.0,
        router_z_loss_coef=0.0,
    )
    assert to_tfm(reference).config.moe_layers == [0, 1]


def test_moe_layers_switch_cannot_lay_out_are_refused():
    """Switch makes layer i sparse when i % step == 1: an hf_tfm model with only layer 0 sparse has no Switch form."""
    config = to_tfm(tiny_reference("switch_transformers")).config
    config.moe_layers = [0]
    with pytest.raises(ValueError, match="moe_layers"):
        config_from_tfm(config, "switch_transformers")


def test_sparse_layer_counts_come_back_in_one_form():
    """Several counts give one layout (3 of 8 layers and 4 of 8 both make every other layer sparse: step 8 // 3 =
    8 // 4 = 2): the round trip compares the fewest, so either converts."""
    for count in (3, 4):
        config = tiny_reference_config(
            "switch_transformers", num_layers=8, num_decoder_layers=8, num_sparse_encoder_layers=count,
            num_sparse_decoder_layers=count,
        )  # fmt: skip
        assert config_to_tfm(config).moe_layers == [1, 3, 5, 7]


def seq2seq_losses(model, tmp_path) -> list[float]:
    """The losses Seq2SeqTrainer logs at each of 4 steps training `model` on 8 fixed pairs (batches of 2, shuffled
    by the trainer's seed), the router losses asked of the reference by the collator. SGD: a step moves each weight
    by its gradient, so rounding in the gradients stays rounding (Adam's first steps move a weight whose gradient is
    rounding noise by the full learning rate, either way)."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    generator = torch.Generator().manual_seed(11)
    rows = [
        {"input_ids": torch.randint(3, VOCAB, (9,), generator=generator), "labels": torch.randint(3, VOCAB, (5,),
                                                                                                  generator=generator)}
        for _ in range(8)
    ]  # fmt: skip

    def collate(batch):
        return {key: torch.stack([row[key] for row in batch]) for key in batch[0]} | {"output_router_logits": True}

    arguments = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / type(model).__name__), per_device_train_batch_size=2, max_steps=4, logging_steps=1,
        learning_rate=1e-2, optim="sgd", report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=False,
        seed=0,
    )  # fmt: skip
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=rows, data_collator=collate)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_seq2seq_trainer_logs_the_reference_losses_step_for_step(tmp_path):
    """The same weights trained by Seq2SeqTrainer on the same batches log the same losses (router losses included),
    and end with the same weights."""
    reference = tiny_reference("switch_transformers", router_aux_loss_coef=0.5, router_z_loss_coef=0.2)
    ours = eager(to_tfm(reference))
    expected, actual = seq2seq_losses(reference, tmp_path), seq2seq_losses(ours, tmp_path)
    assert len(expected) == 4 and len(set(expected)) == 4  # four steps, each its own batch
    assert actual == pytest.approx(expected, rel=1e-5)
    state = weights_from_tfm(RECORD.weights, ours.state_dict(), reference, ours.config.num_attention_heads)
    for name, tensor in reference.state_dict().items():
        if name in state:  # the copies of the token table are compared as shared.weight
            torch.testing.assert_close(state[name], tensor, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
