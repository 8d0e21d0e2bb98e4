"""Exact parity between converted hf_tfm models and the transformers reference classes (GPT-2, Llama), fp32."""

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict, perturb, tiny_model
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hf_tfm.convert_gpt2 import gpt2_to_tfm, tfm_to_gpt2
from hf_tfm.convert_llama import llama_to_tfm, tfm_to_llama

ATOL = 1e-4
PAD = 0
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 10000.0,
}
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}


def gpt2(**overrides):
    fields = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2)
    return perturb(GPT2LMHeadModel(GPT2Config(**{**fields, **overrides})))


def llama(rope_parameters=None, tie_word_embeddings=False):
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=tie_word_embeddings,
        **({"rope_parameters": rope_parameters} if rope_parameters else {}),
    )
    return perturb(LlamaForCausalLM(config))


# (id, reference factory, to_tfm, back to reference)
REFERENCES = [
    pytest.param(gpt2, gpt2_to_tfm, tfm_to_gpt2, id="gpt2-tied"),
    pytest.param(lambda: gpt2(tie_word_embeddings=False), gpt2_to_tfm, tfm_to_gpt2, id="gpt2-untied"),
    pytest.param(llama, llama_to_tfm, tfm_to_llama, id="llama-default-untied"),
    pytest.param(lambda: llama(tie_word_embeddings=True), llama_to_tfm, tfm_to_llama, id="llama-default-tied"),
    pytest.param(lambda: llama(LINEAR), llama_to_tfm, tfm_to_llama, id="llama-linear"),
    pytest.param(lambda: llama(LLAMA3, True), llama_to_tfm, tfm_to_llama, id="llama-llama3-tied"),
    pytest.param(lambda: llama(YARN), llama_to_tfm, tfm_to_llama, id="llama-yarn"),
]


def padded_batch():
    """Two rows, the second left-padded by 3, plus the position ids `generate` would build for them."""
    torch.manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (2, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    input_ids[1, :3] = PAD
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_logits_match_reference(make_ref, to_tfm, from_tfm, attn):
    """Converted models give the reference logits, unpadded and on a left-padded batch, with eager and sdpa."""
    ref = make_ref()
    ours = to_tfm(ref)
    ref.set_attn_implementation(attn)
    ours.set_attn_implementation(attn)
    input_ids, attention_mask, position_ids = padded_batch()
    with torch.no_grad():
        expected, actual = ref(input_ids[:1]).logits, ours(input_ids[:1]).logits
        assert expected.abs().max() > 100 * ATOL  # the comparison below is not vacuous
        torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)

        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        expected, actual = ref(**kwargs).logits, ours(**kwargs).logits
    real = attention_mask.bool()
    torch.testing.assert_close(actual[real], expected[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_generate_matches_reference(make_ref, to_tfm, from_tfm, num_beams):
    """Greedy and beam search on a left-padded batch produce the reference tokens."""
    ref = make_ref()
    ours = to_tfm(ref)
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pad_token_id=PAD,
        do_sample=False,
        num_beams=num_beams,
        max_new_tokens=4,
    )
    expected = ref.generate(**kwargs)
    actual = ours.generate(**kwargs)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("make_ref, to_tfm, from_tfm", REFERENCES)
def test_round_trip_restores_state_dict(make_ref, to_tfm, from_tfm):
    """Reference -> hf_tfm -> reference reproduces the original state dict exactly (same keys, equal tensors)."""
    ref = make_ref()
    expected = ref.state_dict()
    assert_same_state_dict(from_tfm(to_tfm(ref)).state_dict(), expected)


@pytest.mark.parametrize(
    "convert, make_source, field",
    [
        (tfm_to_gpt2, lambda: tiny_model(position_embedding_type="rope"), "position_embedding_type"),
        (tfm_to_gpt2, lambda: tiny_model(num_key_value_heads=2), "num_key_value_heads"),
        (tfm_to_gpt2, lambda: tiny_model(norm_type="rmsnorm"), "norm_type"),
        (tfm_to_gpt2, lambda: tiny_model(attention_bias=False), "attention_bias"),  # a falsy bad value is named too
        (
            tfm_to_llama,
            lambda: tiny_model(position_embedding_type="rope", ffn_type="glu", attention_bias=False, mlp_bias=False),
            "norm_type",
        ),
        (tfm_to_llama, lambda: tiny_model(norm_type="rmsnorm", ffn_type="glu"), "position_embedding_type"),
        (gpt2_to_tfm, lambda: gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (gpt2_to_tfm, lambda: gpt2(scale_attn_weights=False), "scale_attn_weights"),
    ],
)
def test_inexpressible_config_raises(convert, make_source, field):
    """A config the target architecture cannot express raises ValueError naming the offending field."""
    with pytest.raises(ValueError, match=field):
        convert(make_source())
