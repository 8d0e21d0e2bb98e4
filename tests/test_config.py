"""TfmConfig validation, derived defaults, serialization and RoPE scaling."""

import re

import pytest
import torch
from transformers import AutoConfig

import hf_tfm  # noqa: F401  (registers the tfm model types with the Auto classes)
from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig

from conftest import POSITION_TYPES, VOCAB, tiny_config, tiny_model

ROPE = dict(position_embedding_type="rope")
LINEAR_SCALING = {"rope_type": "linear", "factor": 2.0}

INVALID = [
    ("hidden_size", dict(hidden_size=30)),  # 30 % 4 heads != 0, no head_dim
    ("num_key_value_heads", dict(num_key_value_heads=3)),
    ("position_embedding_type", dict(position_embedding_type="absolute")),
    ("norm_type", dict(norm_type="batchnorm")),
    ("norm_position", dict(norm_position="sandwich")),
    ("ffn_type", dict(ffn_type="moe")),
    ("hidden_act", dict(hidden_act="not_an_activation")),
    *[(field, {field: value}) for field in ("embedding_dropout", "hidden_dropout", "attention_dropout") for value in (-0.1, 1.0)],
    ("rope_parameters", dict(position_embedding_type="learned", rope_parameters=LINEAR_SCALING)),
    ("rope_parameters", dict(position_embedding_type="alibi", rope_parameters=LINEAR_SCALING)),
    ("rope_parameters", dict(rope_scaling={"type": "linear", "factor": 2.0})),  # legacy kwarg name
    ("rope_parameters", dict(ROPE, rope_parameters={"rope_type": "bogus", "rope_theta": 10000.0})),
    ("head_dim", dict(ROPE, head_dim=5)),
    ("head_dim", dict(ROPE, hidden_size=20)),  # derived head_dim 5
    *[(field, {field: 0}) for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")],
    *[(field, {field: -1}) for field in ("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")],
]


@pytest.mark.parametrize("field, overrides", INVALID, ids=[f"{f}-{o}" for f, o in INVALID])
def test_invalid_config_raises_naming_field(field, overrides):
    """An invalid value or combination raises ValueError at construction, and the message names the field."""
    with pytest.raises(ValueError, match=re.escape(field)):
        tiny_config(**overrides)


@pytest.mark.parametrize("kv_heads, expected_kv", [(None, 4), (2, 2), (1, 1)], ids=["mha", "gqa", "mqa"])
def test_head_defaults_are_derived(kv_heads, expected_kv):
    """num_key_value_heads defaults to MHA, head_dim to hidden/heads, intermediate_size to 4*hidden; the model follows."""
    config = tiny_config(num_key_value_heads=kv_heads, intermediate_size=None)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (expected_kv, 8, 128)
    attn = hf_tfm.TfmDecoderForCausalLM(config).model.layers[0].self_attn
    assert attn.k_proj.out_features == attn.v_proj.out_features == expected_kv * 8
    assert attn.q_proj.out_features == 4 * 8


def test_explicit_head_dim_decoupled_from_hidden_size():
    """An explicit head_dim need not equal hidden_size / num_attention_heads; the model then runs at that width."""
    model = tiny_model(**ROPE, num_attention_heads=3, num_key_value_heads=1, head_dim=16)
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.o_proj.in_features) == (48, 16, 48)
    logits = model(torch.randint(3, VOCAB, (2, 6))).logits
    assert logits.shape == (2, 6, VOCAB) and logits.isfinite().all()


@pytest.mark.parametrize("position", [p for p in POSITION_TYPES if p != "rope"])
def test_non_rope_config_has_no_rope_parameters(position):
    """A non-RoPE config carries rope_parameters=None (transformers' default RoPE dict is dropped)."""
    assert tiny_config(position_embedding_type=position).rope_parameters is None
    assert tiny_config(**ROPE).rope_parameters["rope_type"] == "default"


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(ROPE, num_key_value_heads=2, rope_parameters=LINEAR_SCALING, norm_type="rmsnorm", ffn_type="glu")],
    ids=["default", "rope-gqa-glu"],
)
def test_config_save_load_round_trip(tmp_path, overrides):
    """config.save_pretrained then AutoConfig.from_pretrained gives the same class and the same to_dict()."""
    config = tiny_config(**overrides)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is TfmDecoderConfig
    original, reloaded = config.to_dict(), loaded.to_dict()
    reloaded.pop("_name_or_path")  # from_pretrained records where it loaded from; not a config value
    original.pop("_name_or_path")
    assert reloaded == original


ROPE_SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}


@pytest.mark.parametrize("rope_type", ROPE_SCALINGS)
def test_rope_scaling_types_run(rope_type):
    """Each RoPE scaling type builds a rotary embedding of that type, and the model's forward gives finite logits."""
    model = tiny_model(**ROPE, rope_parameters=dict(ROPE_SCALINGS[rope_type]))
    assert model.model.rotary_emb.rope_type == rope_type
    logits = model(torch.randint(3, VOCAB, (2, 6))).logits
    assert logits.shape == (2, 6, VOCAB) and logits.isfinite().all()


def test_encoder_and_encoder_decoder_configs():
    """Each paradigm's config carries its own defaults; the decoder depth maps to transformers' decoder view."""
    encoder = TfmEncoderConfig(hidden_size=32, num_attention_heads=4)
    assert (encoder.model_type, encoder.is_decoder, encoder.type_vocab_size, encoder.use_pooler) == ("tfm_encoder", False, 2, True)
    seq2seq = TfmEncoderDecoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, decoder_layers=3)
    assert seq2seq.is_encoder_decoder and seq2seq.get_text_config(decoder=True).num_hidden_layers == 3
    assert TfmEncoderDecoderConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2).decoder_layers == 2


@pytest.mark.parametrize(
    "config_class, field, value",
    [
        (TfmEncoderDecoderConfig, "decoder_layers", 0),
        (TfmEncoderConfig, "position_offset", -1),
        (TfmEncoderConfig, "relative_attention_num_buckets", 0),
        (TfmEncoderConfig, "attention_multiplier", 0.0),
    ],
)
def test_paradigm_config_fields_validated(config_class, field, value):
    with pytest.raises(ValueError, match=field):
        config_class(hidden_size=32, num_attention_heads=4, **{field: value})
