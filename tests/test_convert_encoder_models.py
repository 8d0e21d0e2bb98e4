"""The encoder of an encoder-decoder family alone (`T5EncoderModel`, `SwitchTransformersEncoderModel`: the sentence
encoders of GTR and sentence-T5, Switch Transformer's encoder) as hf_tfm's encoder-only `TfmEncoderModel`, both ways:
the family's config seen from its encoder (`hf_tfm.convert.common.encoder_of`), its weights under the family's names
less the body's encoder prefix. Hidden states, the state dict back bit for bit, the Switch encoder's gradients with
tokens past an expert's capacity, and what the way back refuses."""

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict
from support.families import skip_where_the_reference_is_not_its_family, tiny_reference
from support.parity_harness import assert_gradients_match, main_output, source_batch

from hf_tfm import TfmEncoderConfig, TfmEncoderModel
from hf_tfm.convert import from_tfm, to_tfm

ENCODERS = {"t5": "T5EncoderModel", "switch_transformers": "SwitchTransformersEncoderModel"}


def encoder(name: str, **overrides):
    skip_where_the_reference_is_not_its_family(name)
    return tiny_reference(name, model_class=getattr(transformers, ENCODERS[name]), **overrides)


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_an_encoder_alone_converts_exactly(name):
    reference = encoder(name)
    ours = to_tfm(reference)
    assert type(ours) is TfmEncoderModel and not ours.config.is_encoder_decoder
    assert ours.config.type_vocab_size == 0 and ours.pooler is None
    input_ids, attention_mask = source_batch()
    real = attention_mask.bool()
    expected = main_output(reference, input_ids=input_ids, attention_mask=attention_mask)
    actual = main_output(ours, input_ids=input_ids, attention_mask=attention_mask)
    torch.testing.assert_close(actual[real], expected[real], atol=1e-4, rtol=0)
    back = from_tfm(ours, name)
    assert type(back) is type(reference)
    assert_same_state_dict(back.state_dict(), reference.state_dict())


def test_the_switch_encoder_trains_as_the_reference():
    """Every gradient of a weighted sum of the hidden states, router and experts included, in training mode with a
    capacity of 3 tokens per expert that the tests' rows overflow (the dropped tokens pass through unchanged)."""
    reference = encoder("switch_transformers")
    ours = to_tfm(reference)
    reference.train(), ours.train()
    generator = torch.Generator().manual_seed(5)
    input_ids = torch.randint(3, VOCAB, (4, 16), generator=generator)  # enough tokens that every expert is chosen
    weights = torch.randn(4, 16, 32, generator=generator)
    for model in (reference, ours):
        (model(input_ids=input_ids).last_hidden_state * weights).sum().backward()
    assert_gradients_match(reference, ours, "switch_transformers")


def test_what_the_family_cannot_hold_is_refused_on_the_way_back():
    """An encoder with token types (TfmEncoderConfig's default) has no T5 encoder to be: refused by name."""
    ours = to_tfm(encoder("t5"))
    typed = TfmEncoderModel(TfmEncoderConfig(**{**ours.config.to_dict(), "type_vocab_size": 2}))
    with pytest.raises(ValueError, match="type_vocab_size"):
        from_tfm(typed, "t5")
