"""The proofs every exact converter owes, written once: the reference logits (fp32, atol 1e-4) on an unpadded,
a right-padded and a left-padded batch, the same greedy and beam tokens, and the reference state dict back bit for
bit. A family's test file builds a tiny perturbed reference model and calls these."""

import torch
from conftest import VOCAB, assert_same_state_dict

ATOL = 1e-4
PAD = 0


def padded_batch(length: int = 9, pad_rows: tuple[int, int] = (0, 3), left: bool = True, vocab: int = VOCAB):
    """Two rows, the second padded by `pad_rows[1]` tokens on the left (or right), plus the position ids `generate`
    would build for them. Token ids avoid 0-2 (pad, bos, eos)."""
    torch.manual_seed(2)
    input_ids = torch.randint(3, vocab, (2, length))
    attention_mask = torch.ones_like(input_ids)
    pads = slice(0, pad_rows[1]) if left else slice(length - pad_rows[1], length)
    attention_mask[1, pads] = 0
    input_ids[1, pads] = PAD
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def assert_logits_match(ref, ours, attn: str = "eager", length: int = 9, atol: float = ATOL, position_ids=True):
    """Same logits as the reference with `attn`: one unpadded row, then a right- and a left-padded batch (compared
    on the real tokens). `position_ids=False` lets each model derive its own (encoders such as RoBERTa)."""
    ref.set_attn_implementation(attn)
    ours.set_attn_implementation(attn)
    with torch.no_grad():
        input_ids = padded_batch(length)[0][:1]
        expected, actual = _logits(ref(input_ids)), _logits(ours(input_ids))
        assert expected.abs().max() > 100 * atol  # the comparison below is not vacuous
        torch.testing.assert_close(actual, expected, atol=atol, rtol=0)
        for left in (False, True):
            input_ids, attention_mask, positions = padded_batch(length, left=left)
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask)
            if position_ids:
                kwargs["position_ids"] = positions
            expected, actual = _logits(ref(**kwargs)), _logits(ours(**kwargs))
            real = attention_mask.bool()
            torch.testing.assert_close(actual[real], expected[real], atol=atol, rtol=0)


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def assert_generate_matches(ref, ours, num_beams: int, length: int = 9, max_new_tokens: int = 4):
    """Greedy or beam search on a left-padded batch gives the reference tokens."""
    input_ids, attention_mask, _ = padded_batch(length)
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pad_token_id=PAD,
        do_sample=False,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
    )
    assert torch.equal(ours.generate(**kwargs), ref.generate(**kwargs))


def assert_round_trip(ref, to_tfm, from_tfm):
    """Reference -> hf_tfm -> reference reproduces the original state dict exactly (same keys, equal tensors)."""
    expected = ref.state_dict()
    assert_same_state_dict(from_tfm(to_tfm(ref)).state_dict(), expected)
