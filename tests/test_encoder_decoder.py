"""hf_tfm encoder-decoders: causality, caching, labels and loss, save/load, and bad input, for every position
scheme."""

import pytest
import torch
import torch.nn.functional as F
from conftest import POSITION_TYPES, VOCAB, seq2seq
from safetensors import safe_open
from support.processes import run_without_hf_tfm
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.models.bart.modeling_bart import shift_tokens_right

from hf_tfm import TfmEncoderDecoderForConditionalGeneration

ATOL = 1e-4
PAD, START = 0, 1
GREEDY = dict(do_sample=False, max_new_tokens=6, min_new_tokens=6)  # min_new_tokens: no early EOS, fixed shapes


def encoder_batch(seed: int = 2):
    """Two source rows, the second right-padded by 3, and the padding mask."""
    torch.manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    input_ids[1, 6:] = PAD
    return input_ids, attention_mask


def decoder_ids(length: int = 7, seed: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, length))
    ids[:, 0] = START
    return ids


def logits(model, **kwargs) -> torch.Tensor:
    input_ids, attention_mask = encoder_batch()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits


# ------------------------------------------------------------------------------------------- causality and caching


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_decoder_causality(position):
    """Changing decoder token t leaves the decoder logits before t unchanged (and changes those at t)."""
    model = seq2seq(position_embedding_type=position)
    before = decoder_ids()
    after = before.clone()
    after[:, 4] = (after[:, 4] + 1 - 3) % (VOCAB - 3) + 3
    old, new = logits(model, decoder_input_ids=before), logits(model, decoder_input_ids=after)
    torch.testing.assert_close(new[:, :4], old[:, :4], atol=ATOL, rtol=0)
    assert (new[:, 4] - old[:, 4]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_encoder_output_independent_of_decoder(position):
    """The encoder output depends on the source only: any decoder input gives the encoder's own output."""
    model = seq2seq(position_embedding_type=position)
    input_ids, attention_mask = encoder_batch()
    with torch.no_grad():
        alone = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for decoder_input_ids in (decoder_ids(3, seed=4), decoder_ids(7, seed=5)):
            out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
            torch.testing.assert_close(out.encoder_last_hidden_state, alone, atol=0, rtol=0)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_generate_cache_matches_no_cache(position):
    """Greedy generate gives the same tokens with and without the cache."""
    model = seq2seq(position_embedding_type=position)
    input_ids, attention_mask = encoder_batch()
    cached = model.generate(input_ids, attention_mask=attention_mask, use_cache=True, **GREEDY)
    uncached = model.generate(input_ids, attention_mask=attention_mask, use_cache=False, **GREEDY)
    assert torch.equal(cached, uncached)
    assert len(cached.unique()) > 3  # not a degenerate repetition of one token


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_static_cache_matches_dynamic(position):
    """Greedy generate with a static cache gives the tokens of the default dynamic cache."""
    model = seq2seq(position_embedding_type=position)
    input_ids, attention_mask = encoder_batch()
    dynamic = model.generate(input_ids, attention_mask=attention_mask, **GREEDY)
    static = model.generate(input_ids, attention_mask=attention_mask, cache_implementation="static", **GREEDY)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("position", POSITION_TYPES)
def test_step_decode_matches_full_forward(position):
    """One-token decode steps with an EncoderDecoderCache reproduce the full forward; cross-attention keys and values
    are projected once (first step), cached at the encoder length, and never grow."""
    model = seq2seq(position_embedding_type=position)
    input_ids, attention_mask = encoder_batch()
    decoder_input_ids = decoder_ids()
    projections = []
    for layer in model.model.decoder.layers:
        layer.cross_attn.k_proj.register_forward_hook(lambda *_: projections.append(1))
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        projections.clear()
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
        steps = []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                past_key_values=cache,
                use_cache=True,
            )
            steps.append(out.logits)
            for layer in range(model.config.decoder_layers):
                assert cache.is_updated[layer]
                assert cache.cross_attention_cache.get_seq_length(layer) == input_ids.shape[1]
    assert len(projections) == model.config.decoder_layers
    assert cache.self_attention_cache.get_seq_length() == decoder_input_ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------- labels and loss


def labels_with_ignored(length: int = 6) -> torch.Tensor:
    labels = decoder_ids(length, seed=6)
    labels[0, 4:] = -100
    labels[1, 2:] = -100
    return labels


def test_labels_shift_into_decoder_inputs_and_plain_loss():
    """labels alone give decoder_input_ids = shift_tokens_right(labels) and the plain (unshifted) cross-entropy of
    the returned logits with -100 ignored."""
    model = seq2seq()
    labels = labels_with_ignored()
    input_ids, attention_mask = encoder_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    shifted = shift_tokens_right(labels, PAD, START)
    assert shifted[0, 0] == START and (shifted != -100).all()
    torch.testing.assert_close(out.logits, logits(model, decoder_input_ids=shifted), atol=0, rtol=0)
    expected = F.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_loss_with_num_items_in_batch_is_sum_over_items():
    """With Trainer's num_items_in_batch the loss is the summed token loss divided by it (exact grad accumulation)."""
    model = seq2seq()
    labels = labels_with_ignored()
    input_ids, attention_mask = encoder_batch()
    num_items = torch.tensor(11)  # the whole accumulated batch's count, not this micro-batch's 6
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=num_items)
    summed = F.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(out.loss, summed / num_items)


# ----------------------------------------------------------------------------------------------------- save/load

VARIANTS = {position: {"position_embedding_type": position} for position in POSITION_TYPES}
VARIANTS["learned-untied"] = {"position_embedding_type": "learned", "tie_word_embeddings": False}
VARIANTS["relative_bias-untied"] = {"position_embedding_type": "relative_bias", "tie_word_embeddings": False}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_auto_from_pretrained_identical_logits(tmp_path, variant):
    """AutoModelForSeq2SeqLM reloads identical logits and keeps one token table shared by both stacks (and the tied
    LM head)."""
    model = seq2seq(**VARIANTS[variant])
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as saved:  # the table once, under the body's name
        assert {key for key in saved.keys() if "embed_tokens" in key or "shared" in key} == {"model.shared.weight"}
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    loaded.eval()
    assert type(loaded) is TfmEncoderDecoderForConditionalGeneration
    decoder_input_ids = decoder_ids()
    expected = logits(model, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(logits(loaded, decoder_input_ids=decoder_input_ids), expected, atol=0, rtol=0)
    shared = loaded.model.shared
    assert loaded.model.encoder.embed_tokens is shared and loaded.model.decoder.embed_tokens is shared
    assert (loaded.lm_head.weight is shared.weight) == model.config.tie_word_embeddings


@pytest.mark.slow
def test_trust_remote_code_without_package(tmp_path):
    """Saved folders load with only torch + transformers: identical logits and greedy tokens for every variant."""
    input_ids, attention_mask = encoder_batch()
    decoder_input_ids = decoder_ids()
    expected = {}
    for name, overrides in VARIANTS.items():
        model = seq2seq(**overrides)
        model.save_pretrained(tmp_path / name)
        tokens = model.generate(input_ids, attention_mask=attention_mask, **GREEDY)
        expected[name] = {"logits": logits(model, decoder_input_ids=decoder_input_ids), "tokens": tokens}
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}
    torch.save({"expected": expected, "inputs": inputs, "greedy": GREEDY}, tmp_path / "expected.pt")
    result = run_without_hf_tfm(
        """
        import torch
        from transformers import AutoModelForSeq2SeqLM
        data = torch.load("expected.pt")
        inputs = data["inputs"]
        for name, want in data["expected"].items():
            model = AutoModelForSeq2SeqLM.from_pretrained(name, trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            with torch.no_grad():
                logits = model(**inputs).logits
            torch.testing.assert_close(logits, want["logits"], rtol=0, atol=0)
            source = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            out = model.generate(**source, **data["greedy"], return_dict_in_generate=True)
            assert torch.equal(out.sequences, want["tokens"]), name
            # the cache went back to the model at every step (transformers 5.24 renamed its keyword)
            cache = (out["cache"] if "cache" in out else out["past_key_values"]).self_attention_cache
            assert cache.get_seq_length() == out.sequences.shape[1] - 1, (name, cache.get_seq_length())
        print("loaded", len(data["expected"]))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded {len(VARIANTS)}" in result.stdout


# ----------------------------------------------------------------------------------------------------- bad input


def out_of_range(ids: torch.Tensor, value: int) -> torch.Tensor:
    ids = ids.clone()
    ids[0, 1] = value
    return ids


SOURCE, SOURCE_MASK = encoder_batch()
TARGET = decoder_ids()
# case -> (what replaces the good inputs, what the error must say)
BAD_INPUTS = {
    "no-decoder-input": (dict(decoder_input_ids=None), r"decoder_input_ids.*labels"),
    "labels-length": (dict(labels=TARGET[:, :-1]), "labels"),
    "mask-shape": (dict(attention_mask=SOURCE_MASK[:, :-1]), "attention_mask"),
    "encoder-id": (dict(input_ids=out_of_range(SOURCE, VOCAB)), rf"^input_ids .*id {VOCAB}\b"),
    "decoder-id": (dict(decoder_input_ids=out_of_range(TARGET, VOCAB)), rf"decoder_input_ids .*id {VOCAB}\b"),
    "decoder-negative-id": (dict(decoder_input_ids=out_of_range(TARGET, -1)), r"decoder_input_ids .*id -1\b"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_named(case):
    """Bad input raises ValueError naming the offending argument (and id), not an index error deep inside."""
    replace, match = BAD_INPUTS[case]
    good = dict(input_ids=SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=TARGET)
    with pytest.raises(ValueError, match=match):
        seq2seq()(**{**good, **replace})


def test_labels_without_decoder_start_token_id_are_refused():
    """Labels cannot be shifted into decoder inputs without decoder_start_token_id: the error names the field."""
    model = seq2seq(decoder_start_token_id=None)
    input_ids, attention_mask = encoder_batch()
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels_with_ignored())


def test_a_config_change_the_model_cannot_honour_fails_at_save(tmp_path):
    """A sliding window set on a built encoder-decoder's config (as transformers' eager-vs-sdpa tests set it) cannot
    change the model: the save refuses it by name and writes nothing, so no checkpoint exists that its own loader
    would refuse; a model built from that config is refused where it is built."""
    model = seq2seq()
    model.config.sliding_window = 2
    with pytest.raises(Exception, match="sliding_window") as error:
        model.save_pretrained(tmp_path / "model")
    assert "single-stack" in str(error.value)
    assert not (tmp_path / "model").exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="sliding_window"):
        TfmEncoderDecoderForConditionalGeneration(model.config)


def test_the_one_token_table_is_declared_tied_as_t5_and_bart_declare_it(tmp_path):
    """The body's table under its three names is in `_tied_weights_keys`, which transformers' tie machinery reads
    (`all_tied_weights_keys`, as for T5Model and BartModel); a reload holds one tensor under the three names."""
    model = seq2seq()
    expected = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
    assert model.model._tied_weights_keys == expected
    assert {f"model.{key}": f"model.{value}" for key, value in expected.items()}.items() <= (
        model.all_tied_weights_keys.items()
    )
    model.save_pretrained(tmp_path / "model")
    loaded = TfmEncoderDecoderForConditionalGeneration.from_pretrained(tmp_path / "model")
    shared = loaded.model.shared.weight
    assert loaded.model.encoder.embed_tokens.weight is shared and loaded.model.decoder.embed_tokens.weight is shared
