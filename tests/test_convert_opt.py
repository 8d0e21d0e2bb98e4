"""What is particular to OPT (the proofs every family owes are in tests/test_convert_families.py): positions counted
over the attention mask's real tokens (left padding, with and without a cache), the post-norm variant, the bias-free
variant, training gradients, and what hf_tfm does not build yet, refused by name."""

import pytest
import torch
from conftest import VOCAB
from support.families import tiny_reference
from support.parity_harness import assert_gradients_match

from hf_tfm.compat import CACHE_NAME
from hf_tfm.convert import from_tfm, to_tfm


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


def test_training_gradients_match():
    reference = tiny_reference("opt")
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


@pytest.mark.parametrize(
    "overrides, field",
    [({"word_embed_proj_dim": 16}, "word_embed_proj_dim"), ({"layer_norm_elementwise_affine": False},
                                                             "layer_norm_elementwise_affine")],
    ids=["projected-embeddings", "norms-without-weights"],
)  # fmt: skip
def test_what_hf_tfm_does_not_build_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        to_tfm(tiny_reference("opt", **overrides))
