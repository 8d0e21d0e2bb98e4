"""What is particular to OPT (the proofs every family owes are in tests/test_convert_families.py): positions counted
over the attention mask's real tokens (left padding, with and without a cache), the post-norm variant, the bias-free
variant, the projected token table (OPT-350m's `word_embed_proj_dim`), training gradients, and what hf_tfm does not
build, refused by name."""

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference
from support.parity_harness import assert_gradients_match

from hf_tfm import TfmEncoderConfig, TfmEncoderDecoderConfig
from hf_tfm.compat import CACHE_NAME
from hf_tfm.convert import from_tfm, to_tfm

# OPT-350m's layout: a narrower token table projected in and out, LayerNorm after each sublayer
PROJECTED = {"word_embed_proj_dim": 16, "do_layer_norm_before": False}


def padded_batch():
    generator = torch.Generator().manual_seed(6)
    input_ids = torch.randint(3, VOCAB, (2, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :4] = 0
    return input_ids, attention_mask


@pytest.mark.parametrize(
    "overrides",
    [{}, {"do_layer_norm_before": False}, {"_remove_final_layer_norm": True}, {"enable_bias": False}],
    ids=["pre-norm", "post-norm", "no-final-norm", "no-biases"],
)
def test_left_padded_logits_match_without_position_ids(overrides):
    """Without position_ids both sides number each row's real tokens from 0 (the padded row's too)."""
    reference = tiny_reference("opt", **overrides)
    ours = to_tfm(reference)
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        actual = ours(input_ids=input_ids, attention_mask=attention_mask).logits
        unpadded = ours(input_ids=input_ids[1:, 4:]).logits  # the padded row alone, without its padding
    real = attention_mask.bool()
    torch.testing.assert_close(actual[real], expected[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(actual[1, 4:], unpadded[0], atol=1e-5, rtol=0)
    assert type(from_tfm(ours, "opt")) is type(reference)


def test_a_cached_step_counts_on_from_the_mask():
    """A decode step with the cache and the whole mask gives the position OPT gives it."""
    reference = tiny_reference("opt")
    ours = to_tfm(reference)
    input_ids, attention_mask = padded_batch()
    step, step_mask = input_ids[:, -1:], torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
    with torch.no_grad():
        results = []
        for model in (reference, ours):  # the cache under the name the installed transformers gives it
            prefix = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True).get(CACHE_NAME)
            results.append(model(input_ids=step, attention_mask=step_mask, **{CACHE_NAME: prefix}).logits)
    torch.testing.assert_close(results[1], results[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides", [{}, PROJECTED], ids=["opt-125m", "opt-350m"])
def test_training_gradients_match(overrides):
    reference = tiny_reference("opt", **overrides)
    ours = to_tfm(reference)
    input_ids, attention_mask = padded_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[1, 4] = -100  # would be scored from a padded position's output: noise, either side
    reference.train(), ours.train()
    expected = reference(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    actual = ours(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "opt")


@pytest.mark.parametrize("overrides", [PROJECTED, {"word_embed_proj_dim": 48}], ids=["opt-350m", "wider-table"])
def test_the_projected_token_table_converts_exactly(overrides):
    """The tokens projected in before the positions are added and the output projected back before the tied head:
    left-padded logits, a cached decode step, greedy tokens, and the state dict back bit for bit."""
    reference = tiny_reference("opt", **overrides)
    ours = to_tfm(reference)
    width = overrides["word_embed_proj_dim"]
    assert ours.config.word_embed_proj_dim == width and ours.model.project_in.weight.shape == (32, width)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight and ours.lm_head.weight.shape == (VOCAB, width)
    input_ids, attention_mask = padded_batch()
    real = attention_mask.bool()
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        actual = ours(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(actual[real], expected[real], atol=1e-4, rtol=0)
    prompt = input_ids[:1, :6]
    options = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(ours.generate(prompt, **options), reference.generate(prompt, **options))
    back = from_tfm(ours, "opt")
    assert_same_state_dict(back.state_dict(), reference.state_dict())


def test_the_task_heads_read_the_projected_width():
    """A classification head on a projected table's model reads word_embed_proj_dim features, as OPT's does."""
    config = to_tfm(tiny_reference("opt", **PROJECTED)).config
    classifier = transformers.AutoModelForSequenceClassification.from_config(config)
    assert classifier.score.in_features == 16
    input_ids, _ = padded_batch()
    assert classifier(input_ids=input_ids).logits.shape == (2, 2)


def test_a_projected_token_table_is_for_decoder_only_models():
    with pytest.raises(ValueError, match="Invalid `word_embed_proj_dim`: 16 is set: a projected token table is built"):
        TfmEncoderConfig(hidden_size=32, num_attention_heads=4, word_embed_proj_dim=16)
    with pytest.raises(ValueError, match="Invalid `word_embed_proj_dim`"):
        TfmEncoderDecoderConfig(hidden_size=32, num_attention_heads=4, word_embed_proj_dim=16)


def test_vllm_refuses_a_projected_token_table():
    from hf_tfm.model import capabilities

    config = to_tfm(tiny_reference("opt", **PROJECTED)).config
    assert capabilities.backend_refusal(config, "vllm").startswith("word_embed_proj_dim=16 cannot run")
    assert capabilities.backend_refusal(config, "sdpa") is None


def test_norms_without_weights_are_refused():
    with pytest.raises(ValueError, match="layer_norm_elementwise_affine"):
        to_tfm(tiny_reference("opt", layer_norm_elementwise_affine=False))
