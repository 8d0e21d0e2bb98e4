"""`pad_vocab_size_to_multiple_of`: the token table and the LM head hold padding rows past `vocab_size` (aligned
matmul shapes), and nothing a user reads changes: logits, losses, gradients of the real rows, generate(), saving,
resizing and the converters. The padding rows hold large values here, so a read of one would show."""

import copy
from functools import partial

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict, perturb, tiny_config
from support.families import tiny_reference, untied_bart
from support.parity_harness import assert_generate_matches, assert_logits_match, padded_batch, source_batch

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)
from hf_tfm.convert import config_from_tfm, from_tfm, to_tfm

MULTIPLE = 16
ROWS = 112  # VOCAB = 97 rounded up to a multiple of 16
POISON = 50.0  # the padding rows' every value: a padding logit read anywhere would win every argmax
RTOL, ATOL = 1e-5, 1e-6
SEQ2SEQ = dict(config_class=TfmEncoderDecoderConfig, decoder_start_token_id=0)
HEADS = {
    "causal-tied": (TfmDecoderForCausalLM, {}),
    "causal-untied-bias": (TfmDecoderForCausalLM, dict(tie_word_embeddings=False, lm_head_bias=True)),
    "causal-softcapped": (TfmDecoderForCausalLM, dict(final_logit_softcapping=2.0)),
    "masked": (TfmEncoderForMaskedLM, dict(config_class=TfmEncoderConfig)),
    "seq2seq-t5-rescaled": (
        TfmEncoderDecoderForConditionalGeneration,
        dict(**SEQ2SEQ, scale_lm_head_input=True, position_embedding_type="relative_bias"),
    ),
    "seq2seq-untied-bias": (
        TfmEncoderDecoderForConditionalGeneration,
        dict(**SEQ2SEQ, tie_word_embeddings=False, lm_head_bias=True),
    ),
}
# every table with a row per token (the tied head is the same tensor as its table)
VOCAB_TABLES = {"model.embed_tokens.weight", "model.shared.weight", "lm_head.weight", "lm_head.bias"}
VOCAB_TABLES |= {"lm_head.decoder.weight", "lm_head.decoder.bias"}


def unpadded_model(head: str, **fields):
    model_class, overrides = HEADS[head]
    torch.manual_seed(0)
    return perturb(model_class(tiny_config(**{**overrides, **fields})))


def padded_copy(model):
    """The same model with tables padded to MULTIPLE: the real rows copied, the padding rows POISON."""
    config = copy.deepcopy(model.config)
    config.pad_vocab_size_to_multiple_of = MULTIPLE
    padded = type(model)(config).train(model.training)
    assert padded.get_input_embeddings().weight.shape[0] == ROWS
    target = padded.state_dict()
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if target[key].shape != value.shape:
                target[key].fill_(POISON)
            target[key][tuple(slice(size) for size in value.shape)] = value
    return padded


def batch(head: str) -> dict:
    torch.manual_seed(3)
    input_ids = torch.randint(3, VOCAB, (2, 7))
    labels = input_ids.clone()
    labels[0, :2] = -100
    if head == "masked":
        labels[torch.rand(labels.shape) < 0.5] = -100
    return dict(input_ids=input_ids, labels=labels)


def loss_and_grads(model, inputs):
    model.zero_grad()
    output = model(**inputs)
    output.loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("chunk", [0, 3], ids=["full-logits", "chunked-loss"])
def test_padded_model_trains_like_the_unpadded_one(head, chunk):
    """Same loss and logits, same gradients of every real row, and no gradient at all for the padding rows, on the
    full-logits path and the chunked loss."""
    model = unpadded_model(head, loss_chunk_size=chunk).train()
    padded = padded_copy(model)
    expected, expected_grads = loss_and_grads(model, batch(head))
    actual, actual_grads = loss_and_grads(padded, batch(head))
    torch.testing.assert_close(actual.loss, expected.loss, rtol=RTOL, atol=0)
    if chunk == 0:
        assert actual.logits.shape == (2, 7, VOCAB)
        torch.testing.assert_close(actual.logits, expected.logits, rtol=RTOL, atol=ATOL)
    assert sorted(actual_grads) == sorted(expected_grads)
    for name, grad in expected_grads.items():
        real = actual_grads[name][tuple(slice(size) for size in grad.shape)]
        torch.testing.assert_close(real, grad, rtol=RTOL, atol=ATOL, msg=name)
        if name in VOCAB_TABLES:
            assert actual_grads[name].shape[0] == ROWS, name
            assert torch.count_nonzero(actual_grads[name][VOCAB:]) == 0, name


def test_compiled_graphs_masked_path_with_padding(monkeypatch):
    """Under torch.compile the chunked loss projects every token and masks the unscored ones: padded, the same."""
    model = unpadded_model("causal-untied-bias", loss_chunk_size=3).train()
    padded = padded_copy(model)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    expected, expected_grads = loss_and_grads(model, batch("causal-untied-bias"))
    actual, actual_grads = loss_and_grads(padded, batch("causal-untied-bias"))
    torch.testing.assert_close(actual.loss, expected.loss, rtol=RTOL, atol=0)
    assert "lm_head.bias" not in actual_grads  # lm_head_bias is BART's final_logits_bias: frozen
    torch.testing.assert_close(
        actual_grads["lm_head.weight"][:VOCAB], expected_grads["lm_head.weight"], rtol=RTOL, atol=ATOL
    )
    assert torch.count_nonzero(actual_grads["lm_head.weight"][VOCAB:]) == 0


@pytest.mark.parametrize("head", HEADS)
def test_evaluation_logits_are_the_real_vocabulary(head):
    model = unpadded_model(head).eval()
    padded = padded_copy(model)
    inputs = batch(head)
    with torch.no_grad():
        expected, actual = model(**inputs), padded(**inputs)
    assert actual.logits.shape == expected.logits.shape == (2, 7, VOCAB)
    torch.testing.assert_close(actual.logits, expected.logits, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(actual.loss, expected.loss, rtol=RTOL, atol=0)


@pytest.mark.parametrize("head", ["causal-tied", "causal-untied-bias", "seq2seq-t5-rescaled"])
@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
def test_generate_picks_the_same_tokens(head, num_beams):
    model = unpadded_model(head).eval()
    padded = padded_copy(model)
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(attention_mask=attention_mask, do_sample=False, num_beams=num_beams, max_new_tokens=5)
    kwargs |= dict(output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    expected, actual = model.generate(input_ids, **kwargs), padded.generate(input_ids, **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    assert actual.logits[0].shape[-1] == VOCAB


def test_tables_are_padded_and_inputs_still_checked_against_vocab_size():
    model = TfmDecoderForCausalLM(tiny_config(pad_vocab_size_to_multiple_of=MULTIPLE, tie_word_embeddings=False))
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (ROWS, 32)
    assert model.get_output_embeddings().out_features == model.get_input_embeddings().num_embeddings == ROWS
    assert model.config.vocab_size == VOCAB
    with pytest.raises(ValueError, match=rf"input_ids contains id {VOCAB}, outside the vocabulary \[0, {VOCAB}\)"):
        model(torch.tensor([[3, VOCAB]]))
    tied = TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig, pad_vocab_size_to_multiple_of=MULTIPLE))
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert tied.lm_head.decoder.bias.shape == (ROWS,)
    assert tied.lm_head(torch.zeros(1, 2, 32)).shape == (1, 2, VOCAB)  # the MLM head module itself slices too


@pytest.mark.parametrize(
    "multiple, rows", [(None, VOCAB), (0, VOCAB), (1, VOCAB), (VOCAB, VOCAB), (16, 112), (8, 104)]
)
def test_rows_per_multiple(multiple, rows):
    """None, 0 and 1 pad nothing; a vocabulary already a multiple is not padded."""
    model = TfmDecoderForCausalLM(tiny_config(pad_vocab_size_to_multiple_of=multiple))
    assert model.model.embed_tokens.weight.shape[0] == model.lm_head.weight.shape[0] == rows


@pytest.mark.parametrize("value", [-1, -64])
def test_negative_multiple_refused_by_name(value):
    with pytest.raises(ValueError, match="pad_vocab_size_to_multiple_of"):
        TfmDecoderConfig(vocab_size=VOCAB, pad_vocab_size_to_multiple_of=value)


@pytest.mark.parametrize("value", [2.5, "64", True])
def test_non_integer_multiple_refused_by_name(value):
    with pytest.raises(Exception, match="pad_vocab_size_to_multiple_of"):  # the strict dataclass's type error
        TfmDecoderConfig(vocab_size=VOCAB, pad_vocab_size_to_multiple_of=value)


@pytest.mark.parametrize("head", ["causal-untied-bias", "masked", "seq2seq-t5-rescaled"])
def test_save_and_load_keep_the_padded_tables(tmp_path, head):
    padded = padded_copy(unpadded_model(head).eval())
    padded.save_pretrained(tmp_path)
    loaded = type(padded).from_pretrained(tmp_path).eval()  # strict: every tensor must fit
    assert loaded.config.pad_vocab_size_to_multiple_of == MULTIPLE
    assert_same_state_dict(loaded.state_dict(), padded.state_dict())
    inputs = batch(head)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, padded(**inputs).logits, rtol=0, atol=0)


@pytest.mark.parametrize("head", ["causal-tied", "causal-untied-bias", "masked", "seq2seq-untied-bias"])
def test_resize_token_embeddings_keeps_the_multiple(head):
    """Adding tokens to a padded model: vocab_size counts the tokens, the tables stay a multiple, the old tokens'
    logits are unchanged and the tie holds."""
    padded = padded_copy(unpadded_model(head).eval())
    inputs = batch(head)
    with torch.no_grad():
        before = padded(**inputs).logits
    padded.resize_token_embeddings(VOCAB + 20, mean_resizing=False)
    assert padded.config.vocab_size == VOCAB + 20 and padded.config.pad_vocab_size_to_multiple_of == MULTIPLE
    head_layer, table = padded.get_output_embeddings(), padded.get_input_embeddings()
    assert head_layer.weight.shape[0] == table.weight.shape[0] == 128
    if head_layer.bias is not None:
        assert head_layer.bias.shape == (128,)
    assert (head_layer.weight is table.weight) == padded.config.tie_word_embeddings
    with torch.no_grad():
        after = padded(**inputs).logits
    assert after.shape == (2, 7, VOCAB + 20)
    torch.testing.assert_close(after[..., :VOCAB], before, rtol=0, atol=0)


@pytest.mark.parametrize("head", ["causal-untied-bias", "masked", "seq2seq-untied-bias"])
def test_a_resized_head_keeps_its_weights_through_post_init(head):
    """transformers marks the head it resizes as initialised; the LM head hf_tfm wraps around it keeps the mark, so
    a later `post_init()` (what transformers' own tests call after resizing) does not draw its weights again."""
    model = unpadded_model(head)
    model.resize_token_embeddings(VOCAB + 20)
    resized = model.get_output_embeddings().weight.detach().clone()
    model.post_init()
    torch.testing.assert_close(model.get_output_embeddings().weight, resized, rtol=0, atol=0)


@pytest.mark.parametrize("head", ["causal-tied", "causal-untied-bias", "masked"])
def test_resize_with_pad_to_multiple_of_pads_without_adding_tokens(head):
    """transformers' `pad_to_multiple_of` would count the padding rows as tokens; here it sets the config field."""
    model = unpadded_model(head).eval()
    inputs = batch(head)
    with torch.no_grad():
        expected = model(**inputs).logits
    model.resize_token_embeddings(pad_to_multiple_of=MULTIPLE)
    assert model.config.vocab_size == VOCAB and model.config.pad_vocab_size_to_multiple_of == MULTIPLE
    assert model.get_input_embeddings().weight.shape[0] == model.get_output_embeddings().weight.shape[0] == ROWS
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("argument", "match"),
    [
        (dict(pad_to_multiple_of=-8), "pad_to_multiple_of"),
        (dict(new_num_tokens=0), "new_num_tokens"),
        # a multiple that is no integer: transformers' own refusal, in its words
        (dict(pad_to_multiple_of=8.0), "pad the embedding matrix to a multiple of `8.0`"),
    ],
)
def test_resize_refuses_bad_arguments(argument, match):
    model = unpadded_model("causal-tied")
    with pytest.raises(ValueError, match=match):
        model.resize_token_embeddings(**argument)


# (reference factory, to_tfm, back)
DECODER_REFERENCES = [
    pytest.param(partial(tiny_reference, "gpt2"), to_tfm, partial(from_tfm, name="gpt2"), id="gpt2-tied"),
    pytest.param(partial(tiny_reference, "llama"), to_tfm, partial(from_tfm, name="llama"), id="llama-untied"),
]


@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", DECODER_REFERENCES)
def test_converted_decoder_padded_keeps_parity_and_converts_back(make_ref, to_tfm, from_tfm):
    """A converted reference padded by resize_token_embeddings gives the reference logits and tokens, and converting
    it back drops the padding rows: the reference state dict bit for bit."""
    ref = make_ref()
    ours = to_tfm(ref)
    ours.resize_token_embeddings(pad_to_multiple_of=MULTIPLE)
    assert ours.lm_head.weight.shape[0] == ROWS
    assert_logits_match(ref, ours)
    for num_beams in (1, 3):
        assert_generate_matches(ref, ours, num_beams=num_beams)
    assert_same_state_dict(from_tfm(ours).state_dict(), ref.state_dict())


@pytest.mark.parametrize(
    "make_ref, to_tfm, from_tfm",
    [
        pytest.param(partial(tiny_reference, "t5"), to_tfm, partial(from_tfm, name="t5"), id="t5-tied-rescaled"),
        pytest.param(untied_bart, to_tfm, partial(from_tfm, name="bart"), id="bart-untied-final-logits-bias"),
    ],
)
def test_converted_seq2seq_padded_keeps_parity_and_converts_back(make_ref, to_tfm, from_tfm):
    ref = make_ref()
    ours = to_tfm(ref)
    ours.resize_token_embeddings(pad_to_multiple_of=MULTIPLE)
    assert ours.model.shared.weight.shape[0] == ROWS
    input_ids, attention_mask = source_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :6])
    with torch.no_grad():
        torch.testing.assert_close(ours(**kwargs).logits, ref(**kwargs).logits, atol=1e-4, rtol=0)
    assert_same_state_dict(from_tfm(ours).state_dict(), ref.state_dict())


def test_computation_choices_do_not_block_conversion():
    """The padding and the loss chunking change how an hf_tfm model computes, not what: the way back to a reference
    config, which has neither, takes them."""
    llama_shaped = dict(position_embedding_type="rope", norm_type="rmsnorm", ffn_type="glu", attention_bias=False)
    choices = dict(pad_vocab_size_to_multiple_of=64, loss_chunk_size=0)
    assert config_from_tfm(tiny_config(**llama_shaped, mlp_bias=False, **choices), "llama").vocab_size == VOCAB
    assert config_from_tfm(tiny_config(**choices), "gpt2").vocab_size == VOCAB
