"""What is particular to ELECTRA (the proofs every family owes, on the discriminator `ElectraForPreTraining`, are in
tests/test_convert_families.py): factorised embeddings (`embedding_size`, a projection to `hidden_size`), the
generator (`ElectraForMaskedLM`, whose head maps back to the table's width) and the base model both ways, the
discriminator's replaced-token loss and gradients, its Auto class, and what hf_tfm refuses."""

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference
from support.parity_harness import assert_gradients_match, main_output, source_batch

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderForMaskedLM, TfmEncoderForPreTraining
from hf_tfm.convert import from_tfm, to_tfm


def electra(class_name: str, **overrides):
    return tiny_reference("electra", model_class=getattr(transformers, class_name), **overrides)


@pytest.mark.parametrize("class_name", ["ElectraForMaskedLM", "ElectraModel"])
def test_the_generator_and_the_base_model_convert_exactly(class_name):
    reference = electra(class_name)
    ours = to_tfm(reference)
    assert type(ours).__name__ == {"ElectraForMaskedLM": "TfmEncoderForMaskedLM"}.get(class_name, "TfmEncoderModel")
    body = getattr(ours, "model", ours)
    assert body.embed_tokens.weight.shape == (VOCAB, 16) and body.embed_proj.weight.shape == (32, 16)
    input_ids, attention_mask = source_batch()
    expected = main_output(reference, input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(
        main_output(ours, input_ids=input_ids, attention_mask=attention_mask)[real], expected[real], atol=1e-4, rtol=0
    )
    back = from_tfm(ours, "electra")
    assert type(back) is type(reference)
    assert_same_state_dict(back.state_dict(), reference.state_dict())


def test_the_generator_head_is_tied_to_the_narrow_table():
    ours = to_tfm(electra("ElectraForMaskedLM"))
    assert ours.lm_head.decoder.weight is ours.model.embed_tokens.weight
    assert ours.lm_head.dense.weight.shape == (16, 32)


def replaced_token_batch():
    input_ids, attention_mask = source_batch()
    labels = torch.randint(0, 2, input_ids.shape, generator=torch.Generator().manual_seed(4))
    return input_ids, attention_mask, labels


@pytest.mark.parametrize("masked", [True, False], ids=["attention-mask", "no-mask"])
def test_the_discriminator_trains_as_the_reference(masked):
    """The replaced-token loss (binary cross-entropy over the real tokens, or every token without a mask) and every
    gradient, dropout off."""
    reference = tiny_reference("electra")
    ours = to_tfm(reference)
    input_ids, attention_mask, labels = replaced_token_batch()
    inputs = dict(input_ids=input_ids, labels=labels, attention_mask=attention_mask if masked else None)
    expected, actual = reference(**inputs), ours(**inputs)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "electra")


def test_the_discriminator_loads_through_its_auto_class(tmp_path):
    ours = to_tfm(tiny_reference("electra"))
    ours.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForPreTraining.from_pretrained(tmp_path)
    assert isinstance(loaded, TfmEncoderForPreTraining)
    loaded.set_attn_implementation(ours.config._attn_implementation)
    input_ids, attention_mask, _ = replaced_token_batch()
    real = attention_mask.bool()  # a padded position's output is noise
    torch.testing.assert_close(
        main_output(loaded, input_ids=input_ids, attention_mask=attention_mask)[real],
        main_output(ours, input_ids=input_ids, attention_mask=attention_mask)[real],
        atol=0,
        rtol=0,
    )


def test_labels_of_another_shape_are_refused():
    ours = to_tfm(tiny_reference("electra"))
    input_ids, attention_mask, labels = replaced_token_batch()
    with pytest.raises(ValueError, match="labels have shape"):
        ours(input_ids=input_ids, attention_mask=attention_mask, labels=labels[:, :-1])


def test_inputs_embeds_are_as_wide_as_the_table():
    ours = to_tfm(tiny_reference("electra"))
    embeds = ours.model.embed_tokens(source_batch()[0])
    torch.testing.assert_close(main_output(ours, inputs_embeds=embeds), main_output(ours, input_ids=source_batch()[0]))
    with pytest.raises(ValueError, match=r"expected \(batch, sequence length, embedding_size=16\)"):
        ours(inputs_embeds=torch.zeros(2, 5, 32))


def test_factorised_embeddings_are_for_encoders():
    """A decoder's tied LM head would need a projection back to the table's width: refused by name. An ELECTRA whose
    embedding_size is hidden_size has no projection, and converts to an hf_tfm encoder without embedding_size (where
    the field set means a projection, as ALBERT's at any width)."""
    with pytest.raises(ValueError, match="embedding_size"):
        TfmDecoderConfig(hidden_size=32, num_attention_heads=4, embedding_size=16)
    reference = electra("ElectraForMaskedLM", embedding_size=32)
    ours = to_tfm(reference)
    assert ours.config.embedding_size is None
    assert not any("embed_proj" in name for name, _ in ours.named_parameters())
    assert_same_state_dict(from_tfm(ours, "electra").state_dict(), reference.state_dict())
    config = TfmEncoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, embedding_size=32)
    assert TfmEncoderForMaskedLM(config).model.embed_proj.weight.shape == (32, 32)


def test_a_generator_without_gelu_is_refused():
    """ELECTRA's generator head always applies gelu; hf_tfm's applies hidden_act."""
    with pytest.raises(ValueError, match="hidden_act"):
        to_tfm(electra("ElectraForMaskedLM", hidden_act="relu"))
    assert type(to_tfm(electra("ElectraForPreTraining", hidden_act="relu"))) is TfmEncoderForPreTraining


def test_a_frozen_pad_row_must_be_a_row_of_the_table():
    with pytest.raises(ValueError, match="pad_token_id"):
        TfmEncoderConfig(
            vocab_size=50, hidden_size=32, num_attention_heads=4, pad_token_id=60, freeze_pad_embedding=True
        )
