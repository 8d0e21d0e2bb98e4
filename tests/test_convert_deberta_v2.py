"""What is particular to DeBERTa-v2 (the proofs every family owes, on `DebertaV2ForMaskedLM` at the tiny shape, are in
tests/test_convert_families.py): disentangled attention as hf_tfm's position scheme `"disentangled"` (log-bucketed
relative distances, content-to-position and position-to-content scores, the table normed and projected by shared or
separate projections) in every variant both ways, training with it, and what hf_tfm refuses."""

import pytest
import torch
import transformers
from conftest import VOCAB, assert_same_state_dict
from support.families import tiny_reference
from support.parity_harness import (
    assert_checkpointing_keeps_gradients,
    assert_gradients_match,
    main_output,
    masked_lm_batch,
    source_batch,
)
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderForMaskedLM
from hf_tfm.convert import from_tfm, to_tfm
from hf_tfm.model.modeling_tfm_positions import log_bucket_position


def deberta(class_name: str = "DebertaV2ForMaskedLM", **overrides):
    return tiny_reference("deberta-v2", model_class=getattr(transformers, class_name), **overrides)


def assert_same_outputs(reference, ours, **inputs) -> None:
    input_ids, attention_mask = source_batch()
    real = attention_mask.bool()  # a padded position's output is noise (DeBERTa also masks padded queries)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, **inputs)
    torch.testing.assert_close(
        main_output(ours, **inputs)[real], main_output(reference, **inputs)[real], atol=1e-4, rtol=0
    )


# DeBERTa scales its scores by the position terms named, with relative attention or without
PLAIN_ATTENTION = dict(pos_att_type=None, norm_rel_ebd="none")
VARIANTS = {
    "v3": {},  # the tiny model: shared projections, both terms, a normed table
    "own-projections": dict(share_att_key=False),
    "c2p-only": dict(pos_att_type=["c2p"], share_att_key=False),
    "p2c-only": dict(pos_att_type=["p2c"]),
    "unnormed-table": dict(norm_rel_ebd="none"),
    "token-types": dict(type_vocab_size=2),
    "short-reach": dict(position_buckets=4, max_relative_positions=6),
    "absolute-positions": dict(relative_attention=False, position_biased_input=True, **PLAIN_ATTENTION),
    "no-positions": dict(relative_attention=False, position_biased_input=False, **PLAIN_ATTENTION),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("class_name", ["DebertaV2ForMaskedLM", "DebertaV2Model"])
def test_every_variant_converts_exactly(class_name, variant):
    reference = deberta(class_name, **VARIANTS[variant])
    ours = to_tfm(reference)
    expected_scheme = {"absolute-positions": "learned", "no-positions": "none"}.get(variant, "disentangled")
    assert ours.config.position_embedding_type == expected_scheme
    assert_same_outputs(reference, ours)
    if variant == "token-types":
        token_type_ids = torch.randint(0, 2, source_batch()[0].shape, generator=torch.Generator().manual_seed(3))
        assert_same_outputs(reference, ours, token_type_ids=token_type_ids)
    back = from_tfm(ours, "deberta-v2")
    assert type(back) is type(reference)
    assert_same_state_dict(back.state_dict(), reference.state_dict())


def test_the_buckets_are_debertas():
    """Distances out to past the table's reach, bucketed as transformers' make_log_bucket_position does."""
    distances = torch.arange(-300, 301)[None, :]
    for buckets, max_distance in ((8, 64), (256, 512), (4, 6)):
        expected = make_log_bucket_position(distances, buckets, max_distance).long()
        torch.testing.assert_close(log_bucket_position(distances, buckets, max_distance), expected, atol=0, rtol=0)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_both_backends_give_the_reference_scores(implementation):
    reference = deberta()
    ours = to_tfm(reference)
    ours.set_attn_implementation(implementation)
    assert_same_outputs(reference, ours)


@pytest.mark.parametrize("variant", ["v3", "own-projections"])
def test_disentangled_attention_trains_as_the_reference(variant):
    """The masked-LM loss and every gradient, dropout off: the relative-position table's and its norm's included."""
    reference = deberta(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **VARIANTS[variant])
    ours = to_tfm(reference)
    reference.train(), ours.train()
    expected, actual = reference(**masked_lm_batch()), ours(**masked_lm_batch())
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)
    expected.loss.backward(), actual.loss.backward()
    assert_gradients_match(reference, ours, "deberta-v2")
    assert ours.model.position_bias.rel_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_trains_the_table(reentrant):
    """The table reaches every block as an input, so reentrant checkpointing gives it its gradient too."""
    ours = to_tfm(deberta(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    assert_checkpointing_keeps_gradients(ours, reentrant)


def test_the_scheme_saves_and_loads(tmp_path):
    ours = to_tfm(deberta())
    ours.save_pretrained(tmp_path)
    loaded = TfmEncoderForMaskedLM.from_pretrained(tmp_path)
    loaded.set_attn_implementation(ours.config._attn_implementation)
    assert_same_state_dict(loaded.state_dict(), ours.state_dict())
    input_ids, _ = source_batch()
    torch.testing.assert_close(
        main_output(loaded, input_ids=input_ids), main_output(ours, input_ids=input_ids), atol=0, rtol=0
    )


def disentangled(**overrides) -> dict:
    return (
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            num_attention_heads=4,
            num_hidden_layers=1,
            position_embedding_type="disentangled",
            relative_attention_num_buckets=8,
            relative_attention_max_distance=64,
        )
        | overrides
    )


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(pos_att_type=["c2p", "p2p"]), "Invalid `pos_att_type`: .* must name one or both"),
        (dict(pos_att_type=[]), "Invalid `pos_att_type`"),
        (dict(relative_attention_max_distance=5), "Invalid `relative_attention_max_distance`: 5 must exceed"),
        (dict(num_key_value_heads=2), "Invalid `num_key_value_heads`: 2 is not available with disentangled"),
        (dict(fused_qkv_proj=True), "Invalid `fused_qkv_proj`"),
        (dict(qk_norm="per_head"), "Invalid `qk_norm`"),
    ],
)
def test_what_disentangled_attention_cannot_hold_is_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        TfmEncoderConfig(**disentangled(**overrides))


def test_disentangled_attention_is_for_encoders_on_eager_and_sdpa():
    with pytest.raises(ValueError, match="Invalid `position_embedding_type`: 'disentangled' is built for encoders"):
        TfmDecoderConfig(**disentangled())
    with pytest.raises(ValueError, match="disentangled attention adds its position scores through the mask"):
        TfmEncoderForMaskedLM(TfmEncoderConfig(**disentangled())).set_attn_implementation("flex_attention")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(conv_kernel_size=3), "conv_kernel_size=3 asks for its convolution"),
        (dict(embedding_size=16), "embedding_size=16 asks for its embeddings projected"),
        (dict(position_biased_input=True), "position_biased_input=True asks for absolute positions"),
        (dict(position_buckets=-1), "position_buckets=-1 asks for relative positions without buckets"),
        (dict(relative_attention=False), r"pos_att_type=\['p2c', 'c2p'\] asks for attention scores scaled"),
        (
            dict(relative_attention=False, pos_att_type=None),
            "norm_rel_ebd='layer_norm' asks for a norm of a relative-position table",
        ),
    ],
)
def test_what_hf_tfm_does_not_build_is_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        to_tfm(deberta(**overrides))


def test_the_other_masked_lm_head_and_other_schemes_are_refused():
    with pytest.raises(ValueError, match="legacy=False"):
        to_tfm(deberta(legacy=False))
    rope = TfmEncoderForMaskedLM(
        TfmEncoderConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_attention_heads=4,
            num_hidden_layers=1,
            position_embedding_type="rope",
        )
    )
    with pytest.raises(ValueError, match="position_embedding_type='rope' to DebertaV2Config"):
        from_tfm(rope, "deberta-v2")
