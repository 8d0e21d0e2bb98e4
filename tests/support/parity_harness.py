"""The proofs every exact converter owes, written once: the reference logits (fp32, atol 1e-4) on an unpadded,
a right-padded and a left-padded batch, the same greedy and beam tokens, and the reference state dict back bit for
bit. tests/test_convert_families.py runs them on every family's tiny reference model (tests/support/families.py); a
family's own test file runs them on its options' variants."""

import re

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict

from hf_tfm.convert import family
from hf_tfm.convert.engine import weights_from_tfm
from hf_tfm.convert.qkv import split_qkv
from hf_tfm.convert.record import TINY_WINDOW

ATOL = 1e-4
PAD = 0
WINDOW = TINY_WINDOW  # a sliding window shorter than the 9-token test prompts
# an hf_tfm config laid out as a Llama-family decoder, before a family's own fields
LLAMA_SHAPED = dict(
    position_embedding_type="rope", norm_type="rmsnorm", ffn_type="glu", attention_bias=False, mlp_bias=False
)


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


def source_batch():
    """An encoder's or an encoder-decoder's batch: two rows of 9 tokens, the second right-padded by 3, and its mask."""
    input_ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    input_ids[1, 6:] = PAD
    return input_ids, attention_mask


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


def main_output(model, **inputs) -> torch.Tensor:
    """A forward without gradients: the logits of a head, the last hidden states of a base model."""
    with torch.no_grad():
        return _logits(model(**inputs))


def masked_lm_batch() -> dict:
    """`source_batch()` with its real tokens as masked-LM labels."""
    input_ids, attention_mask = source_batch()
    labels = input_ids.masked_fill(~attention_mask.bool(), -100)
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def assert_checkpointing_keeps_gradients(model, reentrant: bool = True) -> None:
    """A masked LM's gradients on `masked_lm_batch()` are the same with gradient checkpointing as without (dropout
    off), every weight's: a tensor a block reads but is not handed (under reentrant checkpointing) would lose its."""
    model.train()
    model(**masked_lm_batch()).loss.backward()
    plain = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model(**masked_lm_batch()).loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, plain[name], atol=1e-6, rtol=0, msg=name)


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


def assert_converts_exactly(
    ref, to_tfm, from_tfm, caches=(None,), max_new_tokens: int = 4, back_attn: str = "eager", attns=("eager", "sdpa")
):
    """`to_tfm(ref)` gives the reference logits with each attention backend of `attns` and its greedy and beam
    tokens (with each cache implementation in `caches`; None keeps the default), and `from_tfm` of it the reference
    logits again. Returns the converted model, for a family's own checks."""
    ours = to_tfm(ref)
    for attn in attns:
        assert_logits_match(ref, ours, attn=attn)
    for cache in caches:
        if cache is not None:
            for model in (ref, ours):
                model.generation_config.cache_implementation = cache
        for num_beams in (1, 3):
            assert_generate_matches(ref, ours, num_beams=num_beams, max_new_tokens=max_new_tokens)
    assert_logits_match(ref, from_tfm(ours), attn=back_attn)
    return ours


def assert_decoding_matches(ref, ours, cache_implementation: str, max_new_tokens: int = 6):
    """Greedy decoding of a left-padded batch with `cache_implementation` gives the reference tokens and every
    step's logits (a sliding window off by a token or two moves the logits while the tokens may still agree)."""
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pad_token_id=PAD,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        cache_implementation=cache_implementation,
        output_logits=True,
        return_dict_in_generate=True,
    )
    expected, actual = ref.generate(**kwargs), ours.generate(**kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(actual.logits), torch.stack(expected.logits), atol=ATOL, rtol=0)


def assert_option_matters(ref, other):
    """`other`, the reference with one option changed, gives logits well beyond the tolerance from `ref`'s at the
    test shape: a parity proof at that shape proves the option is applied."""
    input_ids = padded_batch()[0][:1]
    with torch.no_grad():
        assert (_logits(ref(input_ids)) - _logits(other(input_ids))).abs().max() > 100 * ATOL


def assert_refused_by_name(convert, source, field: str, others=()):
    """`convert(source)` raises a ValueError naming `field`, and none of `others` (as `name=`): the error names the
    field at fault, not every field."""
    with pytest.raises(ValueError, match=field) as error:
        convert(source)
    named = [name for name in others if name != field and f"{name}=" in str(error.value)]
    assert not named, str(error.value)


def moe_layers(model) -> list[bool]:
    """Which of the model's layers are Mixture-of-Experts layers."""
    return [model.config.is_moe_layer(i) for i in range(model.config.num_hidden_layers)]


def assert_router_outputs_match(ref, ours, experts: str, routed_layers: int, aux_loss: bool = True):
    """With labels and `output_router_logits`, under the experts backend `experts`: one router-logits tensor per MoE
    layer, equal on the real tokens, the same logits, the same aux loss (load balancing over the real tokens, shown
    in the loss unless `aux_loss` is False: DeepSeek-V3 adds none) and the same loss."""
    for model in (ref, ours):
        model.set_experts_implementation(experts)
    input_ids, attention_mask, position_ids = padded_batch()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels)
    with torch.no_grad():
        expected = ref(**kwargs, output_router_logits=True)
        actual = ours(**kwargs, output_router_logits=True)
    real = attention_mask.bool()
    torch.testing.assert_close(actual.logits[real], expected.logits[real], atol=ATOL, rtol=0)
    assert len(actual.router_logits) == routed_layers
    references = getattr(expected, "router_logits", None)  # DeepSeek-V3's reports them from transformers 5.19 on
    for mine, theirs in zip(actual.router_logits, references or (), strict=references is not None):
        torch.testing.assert_close(mine[real.reshape(-1)], theirs[real.reshape(-1)], atol=ATOL, rtol=0)
    if aux_loss:
        assert ref.config.router_aux_loss_coef * expected.aux_loss > 100 * ATOL  # the aux term shows in the loss
        torch.testing.assert_close(actual.aux_loss, expected.aux_loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)


def assert_gradients_match(reference, ours, name: str, only: str | None = None) -> None:
    """After a backward pass on both sides: every weight of `reference` (whose name matches the pattern `only`, if
    given) has a gradient, and hf_tfm's gradients, laid out as family `name`'s weights, equal it within 1e-4 of the
    tensor's largest gradient (summed in another order: the chunked loss, fused projections and experts). The 1e-3
    floor is for gradients that are 0 in exact arithmetic (a key bias's): rounding alone."""
    grads = {key: param.grad for key, param in ours.named_parameters(remove_duplicate=False)}
    theirs = weights_from_tfm(
        family(name).weights_for(reference.config, type(reference).__name__),
        split_qkv(grads, ours.config),
        reference,
        ours.config.num_attention_heads,
    )
    for key, param in reference.named_parameters():
        if only is not None and not re.search(only, key):
            continue
        assert param.grad is not None, key
        scale = param.grad.abs().max() + 1e-3
        torch.testing.assert_close(
            theirs[key], param.grad, atol=1e-4 * scale, rtol=0, msg=lambda m, k=key: f"{k}: {m}"
        )
