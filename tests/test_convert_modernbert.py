"""ModernBertForMaskedLM / ModernBertModel <-> hf_tfm, exact both ways: alternating global and local attention whose
bidirectional window is shorter than the test sequence, one RoPE theta per layer type, fused Wqkv and Wi split and
fused back, no attention norm in layer 0, embedding and final norms, the MLM head, with every bias off (as published)
or on."""

from functools import partial

import pytest
import torch
from conftest import perturb, tiny_config
from support.families import tiny_reference, tiny_reference_config
from support.parity_harness import ATOL, assert_logits_match, assert_round_trip, padded_batch
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    ModernBertForMaskedLM,
    ModernBertModel,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from hf_tfm import TfmEncoderConfig, TfmEncoderForMaskedLM, TfmEncoderModel
from hf_tfm.convert import config_from_tfm, config_to_tfm, from_tfm, to_tfm

LOCAL_ATTENTION = 4  # a local query sees the keys at most 2 tokens away: fewer than the 9-token test batch
KINDS = ("full_attention", "sliding_attention")
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)


def modernbert_config(**overrides):
    return tiny_reference_config("modernbert", **overrides)


def modernbert(cls=ModernBertForMaskedLM, **overrides):
    return tiny_reference("modernbert", cls, **overrides)


MODELS = [
    pytest.param(ModernBertForMaskedLM, {}, id="mlm"),
    pytest.param(ModernBertForMaskedLM, BIASES, id="mlm-biases"),
    pytest.param(ModernBertForMaskedLM, dict(tie_word_embeddings=False), id="mlm-untied"),
    pytest.param(ModernBertModel, {}, id="model"),
    pytest.param(ModernBertModel, BIASES, id="model-biases"),
]


@pytest.mark.parametrize("cls, overrides", MODELS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_modernbert_logits_match(cls, overrides, attn):
    ref = modernbert(cls, **overrides)
    ours = to_tfm(ref)
    assert ours.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert ours.config.sliding_window == LOCAL_ATTENTION // 2
    assert_logits_match(ref, ours, attn)
    assert_logits_match(ref, from_tfm(ours, "modernbert"), attn)


@pytest.mark.parametrize("cls, overrides", MODELS)
def test_modernbert_round_trip(cls, overrides):
    assert_round_trip(modernbert(cls, **overrides), to_tfm, partial(from_tfm, name="modernbert"))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(layer_types=["full_attention"] * 3), id="window"),
        pytest.param(dict(local_attention=2 * LOCAL_ATTENTION), id="window-size"),
        pytest.param(
            dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10_000.0}}), id="theta"
        ),
    ],
)
def test_each_option_changes_the_reference(overrides):
    """The window and the per-layer-type theta change the reference logits well beyond the tolerance at the test
    shape, so the parity above proves hf_tfm applies them."""
    ref, without = modernbert(), modernbert(**overrides)
    without.load_state_dict(ref.state_dict())
    input_ids = padded_batch()[0][:1]
    with torch.no_grad():
        assert (ref(input_ids).logits - without(input_ids).logits).abs().max() > 100 * ATOL


def _windows_passed(model) -> list:
    """The `sliding_window` each layer passes to the attention function (flash attention builds its window from it;
    eager and sdpa take the window from the mask)."""
    seen = []

    def recording(module, *args, **kwargs):
        seen.append(kwargs.get("sliding_window"))
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("window_recording", recording)
    AttentionMaskInterface.register("window_recording", sdpa_mask)
    model.set_attn_implementation("window_recording")
    with torch.no_grad():
        model(padded_batch()[0])
    return seen


def test_window_passed_to_attention_matches_modernbert():
    """Flash attention reads the window kwarg as w - 1 tokens each side: a bidirectional layer passes w + 1."""
    ref = modernbert(ModernBertModel)
    assert _windows_passed(to_tfm(ref)) == _windows_passed(ref) == [None, 3, 3]


MODERNBERT_SHAPED = dict(
    position_embedding_type="rope",
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    rope_in_float32=True,
    norm_position="pre",
    first_layer_attn_norm=False,
    embedding_norm=True,
    ffn_type="glu",
    attention_bias=False,
    mlp_bias=False,
    norm_bias=False,
    type_vocab_size=0,
    use_pooler=False,
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=2,
)


@pytest.mark.parametrize("cls", [TfmEncoderForMaskedLM, TfmEncoderModel])
def test_modernbert_shaped_tfm_converts(cls):
    """A ModernBERT-shaped hf_tfm model with one flat RoPE dict converts (the dict goes to both layer types)."""
    torch.manual_seed(0)
    ours = perturb(cls(tiny_config(TfmEncoderConfig, **MODERNBERT_SHAPED)))
    ref = from_tfm(ours, "modernbert")
    assert ref.config.local_attention == 4
    assert_logits_match(ref, ours)
    assert to_tfm(ref).config.rope_parameters == ours.config.rope_parameters


def test_hub_config_keys_convert():
    """ModernBERT-base's config.json carries keys that are no ModernBertConfig field (the legacy spellings of
    layer_types and rope_parameters, `position_embedding_type`, ...) and `classifier_pooling`: none reaches the MLM
    model, and they do not block the conversion."""
    hub_keys = dict(
        global_attn_every_n_layers=3,
        global_rope_theta=160_000.0,
        local_rope_theta=10_000.0,
        position_embedding_type="absolute",
        gradient_checkpointing=False,
        layer_norm_eps=1e-5,
        classifier_pooling="mean",
        deterministic_flash_attn=True,
    )
    config = config_to_tfm(modernbert_config(**hub_keys))
    assert config.rope_parameters["full_attention"]["rope_theta"] == 160_000.0


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(classifier_activation="silu"), "classifier_activation"),
        (dict(decoder_bias=False), "decoder_bias"),
        (dict(sparse_prediction=True), "sparse_prediction"),
        (dict(initializer_cutoff_factor=3.0), "initializer_cutoff_factor"),
        (dict(local_attention=5), "local_attention"),  # hf_tfm keeps the half window: 5 would come back as 4
        (
            dict(rope_parameters={kind: {"rope_theta": 1e4, "partial_rotary_factor": 0.5} for kind in KINDS}),
            "partial_rotary_factor",
        ),  # ModernBERT's default RoPE ignores it: hf_tfm would rotate half the features
    ],
)
def test_modernbert_config_hf_tfm_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_to_tfm(modernbert_config(**overrides))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(norm_type="rmsnorm"), "norm_type"),
        (dict(norm_position="post"), "norm_position"),
        (dict(first_layer_attn_norm=True), "first_layer_attn_norm"),
        (dict(num_key_value_heads=2), "num_key_value_heads"),
        (dict(head_dim=16), "head_dim"),
        (dict(hidden_dropout=0.1), "hidden_dropout"),
        # ModernBERT drops out the attention's output at its attention_dropout, and nothing after the feed-forward
        (dict(attention_dropout=0.1), "hidden_dropout"),
        (dict(attention_dropout=0.1, hidden_dropout=0.1), "ffn_dropout"),
        (dict(type_vocab_size=2), "type_vocab_size"),
        (dict(use_pooler=True), "use_pooler"),
        (dict(attention_out_bias=True), "attention_out_bias"),
        (dict(position_embedding_type="learned", rope_parameters=None), "position_embedding_type"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}),
         "rope_parameters"),
    ],
)  # fmt: skip
def test_tfm_config_modernbert_cannot_express_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        config_from_tfm(tiny_config(TfmEncoderConfig, **{**MODERNBERT_SHAPED, **overrides}), "modernbert")


def test_other_models_are_refused():
    with pytest.raises(TypeError, match="ModernBertForMaskedLM, ModernBertModel, .*; got Linear"):
        to_tfm(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="modernbert converts TfmEncoderForMaskedLM or TfmEncoderModel, got Linear"):
        from_tfm(torch.nn.Linear(2, 2), "modernbert")


def test_converted_model_saves_and_loads(tmp_path):
    """The per-layer-type RoPE tables are computed buffers: rebuilt right after from_pretrained's meta-device load."""
    ours = to_tfm(modernbert())
    ours.save_pretrained(tmp_path)
    loaded = TfmEncoderForMaskedLM.from_pretrained(tmp_path).eval()
    input_ids = padded_batch()[0]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids).logits, ours(input_ids).logits)
