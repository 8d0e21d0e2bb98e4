"""Exact parity between converted hf_tfm models and the transformers reference classes (GPT-2, Llama), fp32."""

from functools import partial

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict, tiny_config, tiny_model
from support.families import tiny_reference
from transformers import GPT2Config, LlamaConfig

from hf_tfm import TfmEncoderConfig
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

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
    return tiny_reference("gpt2", **overrides)


def llama(rope_parameters=None, tie_word_embeddings=False):
    rope = {"rope_parameters": rope_parameters} if rope_parameters else {}
    return tiny_reference("llama", tie_word_embeddings=tie_word_embeddings, **rope)


# (id, reference factory, to_tfm, back to reference)
REFERENCES = [
    pytest.param(gpt2, to_tfm, partial(from_tfm, name="gpt2"), id="gpt2-tied"),
    pytest.param(lambda: gpt2(tie_word_embeddings=False), to_tfm, partial(from_tfm, name="gpt2"), id="gpt2-untied"),
    pytest.param(llama, to_tfm, partial(from_tfm, name="llama"), id="llama-default-untied"),
    pytest.param(
        lambda: llama(tie_word_embeddings=True), to_tfm, partial(from_tfm, name="llama"), id="llama-default-tied"
    ),
    pytest.param(lambda: llama(LINEAR), to_tfm, partial(from_tfm, name="llama"), id="llama-linear"),
    pytest.param(lambda: llama(LLAMA3, True), to_tfm, partial(from_tfm, name="llama"), id="llama-llama3-tied"),
    pytest.param(lambda: llama(YARN), to_tfm, partial(from_tfm, name="llama"), id="llama-yarn"),
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
        (
            partial(from_tfm, name="gpt2"),
            lambda: tiny_model(position_embedding_type="rope"),
            "position_embedding_type",
        ),
        (partial(from_tfm, name="gpt2"), lambda: tiny_model(num_key_value_heads=2), "num_key_value_heads"),
        (partial(from_tfm, name="gpt2"), lambda: tiny_model(norm_type="rmsnorm"), "norm_type"),
        (
            partial(from_tfm, name="gpt2"),
            lambda: tiny_model(attention_bias=False),
            "attention_bias",
        ),  # a falsy bad value is named too
        (
            partial(from_tfm, name="llama"),
            lambda: tiny_model(position_embedding_type="rope", ffn_type="glu", attention_bias=False, mlp_bias=False),
            "norm_type",
        ),
        (
            partial(from_tfm, name="llama"),
            lambda: tiny_model(norm_type="rmsnorm", ffn_type="glu"),
            "position_embedding_type",
        ),
        (to_tfm, lambda: gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (to_tfm, lambda: gpt2(scale_attn_weights=False), "scale_attn_weights"),
    ],
)
def test_inexpressible_config_raises(convert, make_source, field):
    """A config the target architecture cannot express raises ValueError naming the offending field."""
    with pytest.raises(ValueError, match=field):
        convert(make_source())


LLAMA_SHAPED = dict(
    position_embedding_type="rope", norm_type="rmsnorm", ffn_type="glu", attention_bias=False, mlp_bias=False
)
PARTIAL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}


@pytest.mark.parametrize(
    "family, fields, field",
    [
        ("llama", dict(qk_norm="per_head"), "qk_norm"),
        ("llama", dict(sliding_window=4), "sliding_window"),
        (
            "llama",
            dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
            "layer_types",
        ),
        ("llama", dict(attention_out_bias=True), "attention_out_bias"),
        ("llama", dict(norm_position="sandwich"), "norm_position"),
        ("llama", dict(rmsnorm_unit_offset=True), "rmsnorm_unit_offset"),
        ("llama", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
        ("llama", dict(query_pre_attn_scalar=16.0), "query_pre_attn_scalar"),
        ("llama", dict(nope_layers=[1]), "nope_layers"),
        (
            "llama",
            dict(rope_parameters=PARTIAL_ROPE),
            "rope_parameters",
        ),  # Llama rotates every feature
        ("gpt2", dict(parallel_residual=True), "parallel_residual"),
        ("gpt2", dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
        ("gpt2", dict(first_layer_attn_norm=False), "first_layer_attn_norm"),
    ],
)
def test_new_block_options_are_refused_without_a_list(family, fields, field):
    """Options TfmConfig gained after these converters were written are refused by name: the round trip compares
    every field, and no converter lists them."""
    shape = LLAMA_SHAPED if family == "llama" else {}
    config_from_tfm(tiny_config(**shape), family)  # the baseline converts
    with pytest.raises(ValueError, match=rf"\b{field}="):
        config_from_tfm(tiny_config(**{**shape, **fields}), family)


def test_fields_the_model_never_reads_do_not_block_conversion():
    """A dense model's router settings, LayerNorm's bias under RMSNorm, the default attention scale written out and
    a window no layer uses change nothing the model computes: they are not compared (the decision in
    convert_common.unread_fields)."""
    unread = dict(router_aux_loss_coef=0.5, num_experts_per_tok=4, norm_topk_prob=False, capacity_factor=1.25)
    unread |= dict(norm_bias=False, attention_multiplier=8**-0.5, sliding_window=4, layer_types=["full_attention"] * 2)
    llama = config_from_tfm(tiny_config(**LLAMA_SHAPED, **unread), "llama")
    assert llama.num_attention_heads == 4 and not hasattr(llama, "router_aux_loss_coef")
    with pytest.raises(ValueError, match="num_experts=4"):  # experts themselves are read
        config_from_tfm(tiny_config(**LLAMA_SHAPED, **unread, num_experts=4), "llama")


def test_a_config_of_another_paradigm_is_refused():
    """An encoder with GPT-2's every field would still attend both ways: the paradigm is checked first, by name."""
    with pytest.raises(ValueError, match=r"model_type='tfm_encoder', but GPT2Config converts 'tfm_decoder' models"):
        config_from_tfm(tiny_config(TfmEncoderConfig, type_vocab_size=0), "gpt2")


# what transformers 4.x wrote into every config.json; transformers 5 keeps these as attributes nothing reads
LEGACY_KEYS = dict(
    is_decoder=False, add_cross_attention=False, output_past=True, torchscript=False, use_bfloat16=False,
    pruned_heads={}, tie_encoder_decoder=False, _num_labels=1, gradient_checkpointing=False,
)  # fmt: skip
GPT2_SMALL = dict(
    activation_function="gelu_new", attn_pdrop=0.1, bos_token_id=50256, embd_pdrop=0.1, eos_token_id=50256,
    initializer_range=0.02, layer_norm_epsilon=1e-05, model_type="gpt2", n_ctx=1024, n_embd=768, n_head=12,
    n_layer=12, n_positions=1024, resid_pdrop=0.1, summary_activation=None, summary_first_dropout=0.1,
    summary_proj_to_labels=True, summary_type="cls_index", summary_use_proj=True, vocab_size=50257,
    task_specific_params={"text-generation": {"do_sample": True, "max_length": 50}},
)  # fmt: skip
LLAMA_2 = dict(
    bos_token_id=1, eos_token_id=2, hidden_act="silu", hidden_size=4096, initializer_range=0.02,
    intermediate_size=11008, max_position_embeddings=4096, model_type="llama", num_attention_heads=32,
    num_hidden_layers=32, num_key_value_heads=32, pretraining_tp=1, rms_norm_eps=1e-05, rope_scaling=None,
    tie_word_embeddings=False, vocab_size=32000,
)  # fmt: skip


@pytest.mark.parametrize(
    "config_class, fields, to_tfm, back",
    [
        (GPT2Config, GPT2_SMALL, config_to_tfm, partial(config_from_tfm, name="gpt2")),
        (LlamaConfig, LLAMA_2, config_to_tfm, partial(config_from_tfm, name="llama")),
    ],
    ids=["gpt2", "llama-2"],
)
def test_published_configs_convert_both_ways(config_class, fields, to_tfm, back):
    """The config.json of gpt2 and Llama-2-7B as published (old keys included) converts both ways: keys the
    reference never reads are named as such, not refused."""
    config = config_class.from_dict({**fields, **LEGACY_KEYS})
    converted = back(to_tfm(config))
    assert converted.to_dict()["vocab_size"] == fields["vocab_size"]
