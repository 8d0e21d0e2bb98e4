"""The proofs every converted family owes, written once and parametrized over the family registry
(`hf_tfm.convert.families.FAMILIES`), each on the family's tiny reference model (its record's `tiny` config,
`tests/support/families.py`): the reference outputs with every attention backend hf_tfm runs the family on, both
ways; the same greedy and beam tokens (decoders with the dynamic and the static cache); the reference state dict back
bit for bit. A family's own test file (`test_convert_<family>.py`) holds only what is particular to it: its options'
variants, the fields it cannot express, released configs, its own numerics."""

import dataclasses
import typing
from functools import partial

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference
from support.parity_harness import ATOL, assert_converts_exactly, assert_gradients_match, source_batch

from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm
from hf_tfm.convert.families import FAMILIES
from hf_tfm.model.capabilities import backend_refusal

DECODERS = [name for name, record in FAMILIES.items() if record.paradigm == "tfm_decoder"]
ENCODERS = [name for name, record in FAMILIES.items() if record.paradigm == "tfm_encoder"]
ENCODER_DECODERS = [name for name, record in FAMILIES.items() if record.paradigm == "tfm_encoder_decoder"]


def backends(model, reference) -> list[str]:
    """eager, and sdpa where hf_tfm runs the config on it (a soft cap or attention sinks need another kernel) and the
    reference class has it (Switch Transformer has eager attention only)."""
    sdpa = backend_refusal(model.config, "sdpa") is None and reference._supports_sdpa
    return ["eager"] + (["sdpa"] if sdpa else [])


def test_every_family_is_proved_here():
    assert set(DECODERS + ENCODERS + ENCODER_DECODERS) == set(FAMILIES) and len(FAMILIES) >= 21
    assert all(record.tiny for record in FAMILIES.values())


@pytest.mark.parametrize("name", DECODERS)
def test_a_decoder_converts_exactly(name):
    reference = tiny_reference(name)
    ours = assert_converts_exactly(
        reference,
        to_tfm,
        partial(from_tfm, name=name),
        caches=("dynamic", "static"),
        attns=backends(to_tfm(reference), reference),
    )
    assert type(ours).__name__ == "TfmDecoderForCausalLM"


def assert_outputs_match(reference, ours, attn: str, **extra):
    """The logits (a base model's last hidden states) on the real tokens of `source_batch`."""
    for model in (reference, ours):
        model.set_attn_implementation(attn)
    if reference.config.is_encoder_decoder:  # T5's stacks keep config copies of their own
        reference.get_encoder().set_attn_implementation(attn)
        reference.get_decoder().set_attn_implementation(attn)
    input_ids, attention_mask = source_batch()
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask, **extra)
        actual = ours(input_ids=input_ids, attention_mask=attention_mask, **extra)
    expected = expected.logits if "logits" in expected else expected.last_hidden_state
    actual = actual.logits if "logits" in actual else actual.last_hidden_state
    assert expected.abs().max() > 100 * ATOL  # the comparison is not vacuous
    real = attention_mask.bool() if not extra else slice(None)  # a decoder's tokens are all real
    torch.testing.assert_close(actual[real], expected[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ENCODERS)
def test_an_encoder_converts_exactly(name):
    reference = tiny_reference(name)
    ours = to_tfm(reference)
    for attn in backends(ours, reference):
        assert_outputs_match(reference, ours, attn)
    assert_outputs_match(reference, from_tfm(ours, name), "eager")


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_an_encoder_decoder_converts_exactly(name):
    reference = tiny_reference(name)
    ours = to_tfm(reference)
    decoder_input_ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    for attn in backends(ours, reference):
        assert_outputs_match(reference, ours, attn, decoder_input_ids=decoder_input_ids)
    assert_outputs_match(reference, from_tfm(ours, name), "eager", decoder_input_ids=decoder_input_ids)
    input_ids, attention_mask = source_batch()
    for num_beams in (1, 3):
        kwargs = dict(attention_mask=attention_mask, do_sample=False, num_beams=num_beams, max_new_tokens=6)
        assert torch.equal(ours.generate(input_ids, **kwargs), reference.generate(input_ids, **kwargs))


def tied_head(model) -> bool:
    """Whether the model's output embeddings are its token table (False without any: ELECTRA's discriminator)."""
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("name", FAMILIES)
def test_the_round_trip_restores_the_state_dict(name):
    reference = tiny_reference(name)
    expected = reference.state_dict()
    back = from_tfm(to_tfm(reference), name)
    assert type(back) is type(reference)
    assert_same_state_dict(back.state_dict(), expected)
    tied = [tied_head(model) for model in (reference, back)]
    assert tied[0] == tied[1]


def whole_numbers(config_class, config) -> dict:
    """The fields of `config` that hold a whole-number float and that `config_class` types as taking an int too (a
    dropout of 0, as a hand-written config.json says it), as ints."""
    return {
        field.name: int(getattr(config, field.name))
        for field in dataclasses.fields(config_class)
        if {float, int} <= set(typing.get_args(field.type))
        and isinstance(getattr(config, field.name, None), float)
        and getattr(config, field.name).is_integer()
    }


@pytest.mark.parametrize("name", FAMILIES)
def test_whole_numbers_convert_both_ways(name):
    """A reference config with its dropouts written as integers (GPT-2's `attn_pdrop=0`) converts, and an hf_tfm config
    whose numeric fields hold integers converts back to a reference class that takes floats alone (Mixtral's
    `router_jitter_noise`, Gemma 2's soft caps): the same config either way."""
    reference = tiny_reference(name).config
    theirs_class = type(reference)
    integers = whole_numbers(theirs_class, reference)
    theirs = theirs_class(**{**reference.to_diff_dict(), **integers})
    assert config_to_tfm(theirs).to_dict() == config_to_tfm(reference).to_dict()
    ours = config_to_tfm(reference)
    ours_class = type(ours)
    integers = whole_numbers(ours_class, ours)
    assert integers  # every hf_tfm config has a numeric field (a norm epsilon or a dropout of 0)
    with_integers = ours_class(**{**ours.to_diff_dict(), **integers})
    assert config_from_tfm(with_integers, name).to_dict() == config_from_tfm(ours, name).to_dict()


# the token tables, and the position tables a family learns (RoBERTa reads a padding row in its own)
EMBEDDING_TABLES = (
    r"(word_embeddings|embed_tokens|embed_in|wte|tok_embeddings|shared|position_embeddings|embed_positions|wpe)"
    r"\.weight$"
)


# families whose reference computes padded positions otherwise (noise either way): only real positions are scored
PADDED_OUTPUTS_DIFFER = {"deberta-v2": "DeBERTa zeroes padded embeddings and masks padded queries"}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_embedding_tables_train_as_the_references(name):
    """A batch padded with the pad id (as a collator pads it): the embedding tables' gradients equal the reference's,
    the pad rows frozen where the reference freezes them (`padding_idx`: `freeze_pad_embedding`) and trained where it
    does not (GPT-2, GPT-NeoX, BLOOM, T5, Switch). Dropout off, the gradient of a weighted sum of the outputs."""
    reference = tiny_reference(name)
    ours = to_tfm(reference)
    input_ids, attention_mask = source_batch()
    extra = {"decoder_input_ids": input_ids[:, :5]} if reference.config.is_encoder_decoder else {}
    weights = None
    for model in (reference, ours):
        output = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
        logits = output.logits if "logits" in output else output.last_hidden_state
        if weights is None:
            weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(5))
            if name in PADDED_OUTPUTS_DIFFER:
                weights = weights * attention_mask[..., None]
        (logits * weights).sum().backward()
    assert_gradients_match(reference, ours, name, only=EMBEDDING_TABLES)
    assert ours.get_input_embeddings().padding_idx == reference.get_input_embeddings().padding_idx
