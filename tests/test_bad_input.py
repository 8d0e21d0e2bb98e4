"""Bad input to every paradigm is an error naming the argument and the shape or value it wanted, never a torch error
from deep inside; a batch without any target to score gives a zero loss, not NaN."""

import pytest
import torch
from conftest import VOCAB, tiny_config, tiny_model

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
    TfmEncoderForQuestionAnswering,
    TfmEncoderForSequenceClassification,
    TfmEncoderForTokenClassification,
)

HIDDEN = 32  # tiny_config's hidden_size
IDS = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
MASK = torch.ones_like(IDS)


def encoder():
    torch.manual_seed(0)
    return TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig)).eval()


def seq2seq(**overrides):
    torch.manual_seed(0)
    config = tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=1, **overrides)
    return TfmEncoderDecoderForConditionalGeneration(config).eval()


# ------------------------------------------------------------------------------------------ shapes and positions

# case -> (model factory, inputs, what the error must say)
BAD_INPUTS = {
    "1d-input-ids": (tiny_model, dict(input_ids=IDS[0]), r"^input_ids has shape \(6,\), expected \(batch, sequence"),
    "empty-input-ids": (tiny_model, dict(input_ids=IDS[:, :0]), r"^input_ids has shape \(2, 0\): an empty sequence"),
    "empty-embeds": (tiny_model, dict(inputs_embeds=torch.zeros(2, 0, HIDDEN)), r"^inputs_embeds .*empty sequence"),
    "embeds-width": (
        tiny_model,
        dict(inputs_embeds=torch.zeros(2, 6, HIDDEN + 1)),
        rf"^inputs_embeds has shape \(2, 6, {HIDDEN + 1}\), expected \(batch, sequence length, hidden_size={HIDDEN}\)",
    ),
    "embeds-2d": (tiny_model, dict(inputs_embeds=torch.zeros(6, HIDDEN)), r"^inputs_embeds has shape \(6, 32\)"),
    "1d-mask": (tiny_model, dict(input_ids=IDS, attention_mask=MASK[0]), r"^attention_mask has shape \(6,\), expect"),
    "float-3d-mask": (
        tiny_model,
        dict(input_ids=IDS, attention_mask=torch.ones(2, 6, 6)),
        r"^attention_mask has shape \(2, 6, 6\), expected \(2, 6\) .*or a prepared 4D mask",
    ),
    "1d-position-ids": (tiny_model, dict(input_ids=IDS, position_ids=torch.arange(6)), r"^position_ids has shape"),
    "negative-position": (
        tiny_model,
        dict(input_ids=IDS, position_ids=torch.arange(6).unsqueeze(0) - 1),
        r"^position_ids contains position -1: positions must be >= 0",
    ),
    "position-beyond-table": (
        tiny_model,
        dict(input_ids=IDS, position_ids=torch.arange(6).unsqueeze(0) + 60),
        r"^position_ids reach position 65, beyond the learned position table \(max_position_embeddings=64\)",
    ),
    "encoder-1d-input-ids": (encoder, dict(input_ids=IDS[0]), r"^input_ids has shape \(6,\)"),
    "encoder-empty": (encoder, dict(input_ids=IDS[:, :0]), r"^input_ids has shape \(2, 0\): an empty sequence"),
    "encoder-float-3d-mask": (encoder, dict(input_ids=IDS, attention_mask=torch.ones(2, 6, 6)), "^attention_mask"),
    "seq2seq-1d-input-ids": (seq2seq, dict(input_ids=IDS[0], decoder_input_ids=IDS), r"^input_ids has shape \(6,\)"),
    "seq2seq-1d-decoder-ids": (
        seq2seq,
        dict(input_ids=IDS, decoder_input_ids=IDS[0]),
        r"^decoder_input_ids has shape \(6,\), expected \(batch, sequence length\)",
    ),
    "seq2seq-empty-decoder-ids": (
        seq2seq,
        dict(input_ids=IDS, decoder_input_ids=IDS[:, :0]),
        r"^decoder_input_ids has shape \(2, 0\): an empty sequence",
    ),
    "seq2seq-decoder-embeds-width": (
        seq2seq,
        dict(input_ids=IDS, decoder_inputs_embeds=torch.zeros(2, 6, HIDDEN - 1)),
        rf"^decoder_inputs_embeds has shape \(2, 6, {HIDDEN - 1}\), expected .*hidden_size={HIDDEN}",
    ),
    "seq2seq-1d-decoder-mask": (
        seq2seq,
        dict(input_ids=IDS, decoder_input_ids=IDS, decoder_attention_mask=MASK[0]),
        r"^decoder_attention_mask has shape \(6,\)",
    ),
    "seq2seq-negative-decoder-position": (
        seq2seq,
        dict(input_ids=IDS, decoder_input_ids=IDS, decoder_position_ids=torch.arange(6).unsqueeze(0) - 2),
        r"^decoder_position_ids contains position -2",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_named(case):
    """Wrong shapes, empty sequences and positions outside the table raise ValueError naming the argument as the
    caller spelled it (`decoder_...` for an encoder-decoder's decoder) and the expected shape or range."""
    make, inputs, match = BAD_INPUTS[case]
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        make()(**inputs)


@pytest.mark.parametrize("position", ["alibi", "learned"])
def test_prepared_4d_mask_still_accepted(position):
    """A 4D mask (transformers' prepared format, True = attend) is passed on, and gives the 2D mask's logits."""
    model = tiny_model(position_embedding_type=position)
    mask = MASK.clone()
    mask[1, :2] = 0
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    prepared = causal[None, None] & mask.bool()[:, None, None, :]
    with torch.no_grad():
        expected = model(IDS, attention_mask=mask).logits
        actual = model(IDS, attention_mask=prepared).logits
    real = mask.bool()
    torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------- batches without targets

PAD_ONLY = torch.full((2, 6), -100)
HEADS = {
    "causal-lm": (TfmDecoderForCausalLM, None, dict(labels=PAD_ONLY)),
    "decoder-sequence-classification": (TfmDecoderForSequenceClassification, None, dict(labels=PAD_ONLY[:, 0])),
    "masked-lm": (TfmEncoderForMaskedLM, TfmEncoderConfig, dict(labels=PAD_ONLY)),
    "token-classification": (TfmEncoderForTokenClassification, TfmEncoderConfig, dict(labels=PAD_ONLY)),
    "encoder-sequence-classification": (
        TfmEncoderForSequenceClassification,
        TfmEncoderConfig,
        dict(labels=PAD_ONLY[:, 0]),
    ),
    "question-answering": (
        TfmEncoderForQuestionAnswering,
        TfmEncoderConfig,
        dict(start_positions=torch.tensor([6, 9]), end_positions=torch.tensor([7, 9])),  # beyond the 6 tokens
    ),
    "seq2seq": (
        TfmEncoderDecoderForConditionalGeneration,
        TfmEncoderDecoderConfig,
        dict(labels=PAD_ONLY, decoder_input_ids=IDS),
    ),
}


@pytest.mark.parametrize("num_items_in_batch", [None, 0], ids=["mean", "num-items-0"])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_no_targets_give_zero_loss_and_zero_gradients(name, num_items_in_batch):
    """Every label ignored (-100, or every answer position beyond the input): the loss is 0, not transformers' NaN,
    and backward runs and gives every parameter a zero gradient (so such a batch leaves training unchanged)."""
    model_class, config_class, targets = HEADS[name]
    torch.manual_seed(0)
    config = tiny_config(**({} if config_class is None else {"config_class": config_class}), num_labels=3)
    if config_class is TfmEncoderDecoderConfig:
        config.decoder_start_token_id = 1
    model = model_class(config).train()
    kwargs = {} if num_items_in_batch is None else dict(num_items_in_batch=torch.tensor(num_items_in_batch))
    if name.endswith("sequence-classification") or name == "question-answering":
        kwargs = {}  # these heads take no num_items_in_batch (Trainer scales them itself)
    loss = model(input_ids=IDS, **targets, **kwargs).loss
    assert loss.item() == 0.0
    loss.backward()
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    assert grads and all(torch.equal(grad, torch.zeros_like(grad)) for grad in grads)


def test_some_targets_keep_the_usual_loss():
    """One scored label among ignored ones: the loss is that token's cross-entropy, as before."""
    model = tiny_model()
    labels = PAD_ONLY.clone()
    labels[1, 4] = 7
    with torch.no_grad():
        out = model(IDS, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[1, 3], torch.tensor(7))
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_items_in_batch", [None, 0], ids=["mean", "num-items-0"])
def test_no_targets_moe_loss_is_finite(num_items_in_batch):
    """An MoE model on a batch without targets: the task part is 0 and the router losses stay finite (alone under
    mean reduction; scaled by the batch's share of targets, 0, under num_items_in_batch)."""
    model = tiny_model(num_experts=4, router_aux_loss_coef=0.1).train()
    kwargs = {} if num_items_in_batch is None else dict(num_items_in_batch=torch.tensor(num_items_in_batch))
    out = model(IDS, labels=PAD_ONLY, **kwargs)
    expected = 0.1 * out.aux_loss if num_items_in_batch is None else torch.tensor(0.0)
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)
    out.loss.backward()
    assert all(param.grad.isfinite().all() for param in model.parameters() if param.grad is not None)
