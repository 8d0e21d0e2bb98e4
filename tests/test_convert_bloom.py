"""What is particular to BLOOM (the proofs every family owes are in tests/test_convert_families.py): ALiBi slopes for a
head count that is not a power of two, BLOOM's sliced output projections (`slow_but_exact`), training gradients, and
the residual placement hf_tfm does not build, refused by name."""

import pytest
import torch
from conftest import VOCAB
from support.families import tiny_reference
from support.parity_harness import assert_gradients_match

from hf_tfm.convert import to_tfm


def batch():
    generator = torch.Generator().manual_seed(4)
    input_ids = torch.randint(3, VOCAB, (2, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding: BLOOM counts ALiBi positions over real tokens
    return input_ids, attention_mask


@pytest.mark.parametrize(
    "overrides",
    [{"n_head": 8, "hidden_size": 48}, {"n_head": 6, "hidden_size": 48}, {"pretraining_tp": 2}],
    ids=["eight-heads", "six-heads", "pretraining-tp-alone"],
)
def test_logits_match(overrides):
    """Six heads take BLOOM's interleaved slopes of the next power of two; pretraining_tp without slow_but_exact is
    never read."""
    reference = tiny_reference("bloom", **overrides)
    ours = to_tfm(reference)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        actual = ours(input_ids=input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    assert expected.abs().max() > 1e-2
    torch.testing.assert_close(actual[real], expected[real], atol=1e-4, rtol=0)


def test_training_gradients_match():
    """The loss and every weight's gradient in training mode (dropout 0), left padding included."""
    reference = tiny_reference("bloom")
    ours = to_tfm(reference)
    input_ids, attention_mask = batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[1, 3] = -100  # the first real token would be scored from a padded position's output: noise, either side
    reference.train(), ours.train()
    expected = reference(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    actual = ours(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "bloom")


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
        # BLOOM then sums its output projections in slices and leaves out their biases
        ({"pretraining_tp": 2, "slow_but_exact": True}, "slow_but_exact"),
    ],
    ids=["residual-after-the-norm", "sliced-projections"],
)
def test_what_hf_tfm_does_not_build_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        to_tfm(tiny_reference("bloom", **overrides))
