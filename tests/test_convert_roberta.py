"""RobertaForMaskedLM / RobertaModel <-> hf_tfm, exact both ways: positions counted over the non-padding tokens from
`pad_token_id + 1` (right- and left-padded batches, no position_ids given), one token type, the MLM head with its
gelu, and the pooler."""

from functools import partial

import pytest
import torch
from conftest import VOCAB, perturb, tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import assert_logits_match, assert_round_trip, padded_batch
from transformers import RobertaForMaskedLM, RobertaModel

from hf_tfm import TfmEncoderConfig, TfmEncoderForMaskedLM, TfmEncoderModel
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm


def roberta_config(**overrides):
    return tiny_reference_config("roberta", **overrides)


def roberta(cls=RobertaForMaskedLM, add_pooling_layer=True, **overrides):
    kwargs = {"add_pooling_layer": add_pooling_layer} if cls is RobertaModel else {}
    return tiny_reference("roberta", cls, kwargs, **overrides)


def untied_roberta_mlm():
    """Untied, RoBERTa keeps `lm_head.bias` apart from `lm_head.decoder.bias` (only the latter reaches the logits):
    equal, as training leaves them, they convert."""
    model = roberta(tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.bias.copy_(model.lm_head.decoder.bias)
    return model


MODELS = [
    pytest.param(lambda: roberta(), id="mlm"),
    pytest.param(untied_roberta_mlm, id="mlm-untied"),
    pytest.param(lambda: roberta(RobertaModel), id="model"),
    pytest.param(lambda: roberta(RobertaModel, add_pooling_layer=False, hidden_act="relu", type_vocab_size=2),
                 id="model-no-pooler-relu-2types"),
]  # fmt: skip


@pytest.mark.parametrize("make_roberta", MODELS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_roberta_logits_match(make_roberta, attn):
    """Each model derives its own positions from the padding, as RoBERTa is used."""
    ref = make_roberta()
    ours = to_tfm(ref)
    assert ours.config.position_offset == 1 and ours.config.max_position_embeddings == 39
    assert_logits_match(ref, ours, attn, position_ids=False)
    assert_logits_match(ref, from_tfm(ours, "roberta"), attn, position_ids=False)


@pytest.mark.parametrize("make_roberta", MODELS)
def test_roberta_round_trip(make_roberta):
    assert_round_trip(make_roberta(), to_tfm, partial(from_tfm, name="roberta"))


def test_roberta_base_token_ids_and_inputs():
    """roberta-base's ids (bos 0, pad 1, eos 2: positions start at 2), token_type_ids given, inputs_embeds, and
    explicit position_ids, which RoBERTa reads as table rows and hf_tfm as positions (row = id + offset)."""
    ref = roberta(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=42)
    ours = to_tfm(ref)
    assert ours.config.position_offset == 2 and ours.config.max_position_embeddings == 40
    for left in (False, True):
        input_ids, attention_mask, positions = padded_batch(left=left)
        input_ids[attention_mask == 0] = 1
        real = attention_mask.bool()
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids))
        with torch.no_grad():
            expected = ref(**inputs).logits
            torch.testing.assert_close(ours(**inputs).logits[real], expected[real], atol=1e-4, rtol=0)
            shifted = ref(**inputs, position_ids=positions + 2).logits
            torch.testing.assert_close(ours(**inputs, position_ids=positions).logits[real], shifted[real])
    embeds = ref.roberta.embeddings.word_embeddings(input_ids)
    with torch.no_grad():
        torch.testing.assert_close(ours(inputs_embeds=embeds).logits, ref(inputs_embeds=embeds).logits)


@pytest.mark.parametrize(
    "make_source, field",
    [
        (lambda: roberta_config(is_decoder=True), "is_decoder"),
        (lambda: roberta_config(add_cross_attention=True), "add_cross_attention"),
        (lambda: roberta_config(position_embedding_type="relative_key"), "position_embedding_type"),
        (lambda: roberta_config(pad_token_id=None), "pad_token_id"),
    ],
)
def test_roberta_config_hf_tfm_cannot_express_is_refused(make_source, field):
    with pytest.raises(ValueError, match=field):
        config_to_tfm(make_source())


def test_roberta_classifier_dropout_converts():
    """RoBERTa's classifiers drop out with `classifier_dropout`, else the hidden dropout: hf_tfm's rule too."""
    assert config_to_tfm(roberta_config(classifier_dropout=0.3)).classifier_dropout_probability() == 0.3
    assert config_to_tfm(roberta_config(classifier_dropout=None)).classifier_dropout_probability() == 0.1


def test_roberta_models_hf_tfm_cannot_express_are_refused():
    with pytest.raises(ValueError, match="hidden_act"):  # RoBERTa's MLM head is gelu whatever hidden_act says
        to_tfm(roberta(hidden_act="relu"))
    untied = untied_roberta_mlm()
    with torch.no_grad():
        untied.lm_head.bias.add_(1.0)
    with pytest.raises(ValueError, match="lm_head.bias"):
        to_tfm(untied)


ROBERTA_SHAPED = dict(
    norm_position="post",
    embedding_norm=True,
    final_norm=False,
    position_ids_from_padding=True,
    position_offset=1,
    type_vocab_size=1,
)


@pytest.mark.parametrize("cls", [TfmEncoderForMaskedLM, TfmEncoderModel])
def test_roberta_shaped_tfm_converts(cls):
    torch.manual_seed(0)
    ours = perturb(cls(tiny_config(TfmEncoderConfig, **ROBERTA_SHAPED)))
    ref = from_tfm(ours, "roberta")
    assert ref.config.max_position_embeddings == 64 + 1
    assert_logits_match(ref, ours, position_ids=False)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(norm_position="pre"), "norm_position"),
        (dict(final_norm=True), "final_norm"),
        (dict(position_ids_from_padding=False), "position_ids_from_padding"),
        (dict(position_offset=0), "position_offset"),
        (dict(type_vocab_size=0), "type_vocab_size"),
        (dict(num_key_value_heads=2), "num_key_value_heads"),
        (dict(embedding_dropout=0.2), "embedding_dropout"),
        (dict(ffn_type="glu"), "ffn_type"),
    ],
)
def test_tfm_config_roberta_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(TfmEncoderConfig, **{**ROBERTA_SHAPED, **overrides}), "roberta")


def test_tfm_mlm_roberta_cannot_express_is_refused():
    ours = TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig, **ROBERTA_SHAPED, hidden_act="relu"))
    with pytest.raises(ValueError, match="hidden_act"):
        from_tfm(ours, "roberta")


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_without_attention_mask_match(side):
    """Padding-aware positions are the stack's own, not packed sequences: a padded batch given without its
    attention_mask (every token attends to every other, padding included, as in the reference) gives the reference's
    logits. A restart of the made-up positions at the padding must not be read as the start of another example."""
    reference = roberta().eval()
    ours = to_tfm(reference).eval()
    ids = torch.randint(3, VOCAB, (2, 9))
    pad = reference.config.pad_token_id
    if side == "right":
        ids[0, 6:] = pad
    else:
        ids[0, :3] = pad
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=1e-5)
