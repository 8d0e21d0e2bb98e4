"""TfmConfig validation, derived defaults, serialization, RoPE scaling, and the warnings and errors for keys and
model types a config.json gets wrong."""

import json
import logging
import re
import subprocess
import sys

import pytest
import torch
from conftest import POSITION_TYPES, VOCAB, tiny_config, tiny_model
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, GenerationConfig

import hf_tfm  # noqa: F401  (registers the tfm model types with the Auto classes)
from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmDecoderForSequenceClassification,
    TfmDecoderModel,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForTokenClassification,
    TfmEncoderModel,
    capabilities,
)

ROPE = dict(position_embedding_type="rope")
LINEAR_SCALING = {"rope_type": "linear", "factor": 2.0}

INVALID = [
    ("hidden_size", dict(hidden_size=30)),  # 30 % 4 heads != 0, no head_dim
    ("num_key_value_heads", dict(num_key_value_heads=3)),
    ("position_embedding_type", dict(position_embedding_type="absolute")),
    ("norm_type", dict(norm_type="batchnorm")),
    ("norm_position", dict(norm_position="middle")),
    ("ffn_type", dict(ffn_type="moe")),
    ("hidden_act", dict(hidden_act="not_an_activation")),
    *[
        (field, {field: value})
        for field in ("embedding_dropout", "hidden_dropout", "attention_dropout")
        for value in (-0.1, 1.0)
    ],
    ("rope_parameters", dict(position_embedding_type="learned", rope_parameters=LINEAR_SCALING)),
    ("rope_parameters", dict(position_embedding_type="alibi", rope_parameters=LINEAR_SCALING)),
    ("rope_parameters", dict(rope_scaling={"type": "linear", "factor": 2.0})),  # legacy kwarg name
    ("rope_parameters", dict(ROPE, rope_parameters={"rope_type": "bogus", "rope_theta": 10000.0})),
    ("head_dim", dict(ROPE, head_dim=5)),
    ("head_dim", dict(ROPE, hidden_size=20)),  # derived head_dim 5
    *[
        (field, {field: 0})
        for field in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        )
    ],
    *[
        (field, {field: -1})
        for field in ("num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")
    ],
    # issue 13's block options
    # 3 entries for 2 layers (a list saying the same of every layer follows the depth instead)
    ("layer_types", dict(layer_types=["full_attention", "sliding_attention", "full_attention"], sliding_window=4)),
    ("layer_types", dict(layer_types=["full_attention", "local"], sliding_window=4)),
    ("sliding_window", dict(layer_types=["full_attention", "sliding_attention"])),
    ("sliding_window", dict(sliding_window=0)),
    ("layer_types", dict(position_embedding_type="alibi", sliding_window=4)),
    ("qk_norm", dict(qk_norm="per_layer")),
    ("attn_logit_softcapping", dict(attn_logit_softcapping=0.0)),
    ("final_logit_softcapping", dict(final_logit_softcapping=-1.0)),
    ("query_pre_attn_scalar", dict(query_pre_attn_scalar=16, attention_multiplier=0.5)),
    ("parallel_residual", dict(parallel_residual=True, norm_position="post")),
    ("first_layer_attn_norm", dict(first_layer_attn_norm=False, norm_position="output")),
    ("nope_layers", dict(ROPE, nope_layers=[2])),
    ("nope_layers", dict(nope_layers=[0])),  # learned positions: nothing to leave out
    ("rope_parameters", dict(ROPE, rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.4})),  # 3 of 8 dims
    ("rope_parameters", dict(ROPE, rope_parameters={"full_attention": {"rope_theta": 1e4}}, sliding_window=4)),
    ("position_ids_from_padding", dict(position_ids_from_padding=True, pad_token_id=None)),
    (
        "position_ids_from_attention_mask",
        dict(position_ids_from_attention_mask=True, position_ids_from_padding=True, pad_token_id=0),
    ),
    ("numerics", dict(numerics=["scale_queries_as_projected"], fused_qkv_proj=True)),
]


@pytest.mark.parametrize("field, overrides", INVALID, ids=[f"{f}-{o}" for f, o in INVALID])
def test_invalid_config_raises_naming_field(field, overrides):
    """An invalid value or combination raises ValueError at construction, and the message names the field."""
    with pytest.raises(ValueError, match=re.escape(field)):
        tiny_config(**overrides)


@pytest.mark.parametrize("kv_heads, expected_kv", [(None, 4), (2, 2), (1, 1)], ids=["mha", "gqa", "mqa"])
def test_head_defaults_are_derived(kv_heads, expected_kv):
    """num_key_value_heads defaults to MHA, head_dim to hidden/heads, intermediate_size to 4*hidden; the model
    follows."""
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


def test_a_whole_number_takes_a_numeric_fields_place(tmp_path):
    """`hidden_dropout=0` (an int, as a hand-written config.json says it) is taken as transformers' configs take their
    dropouts, and a config.json with integers loads to the same model as one with floats."""
    written = dict(embedding_dropout=0, hidden_dropout=0, attention_dropout=0, initializer_range=1, layer_norm_eps=1)
    config = tiny_config(**written)
    assert {field: getattr(config, field) for field in written} == written
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {field: saved[field] for field in written} == written
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    torch.manual_seed(0)
    as_floats = AutoModelForCausalLM.from_config(
        tiny_config(**{field: float(value) for field, value in written.items()})
    )
    ids = torch.randint(0, VOCAB, (2, 6))
    torch.testing.assert_close(model(ids).logits, as_floats(ids).logits, rtol=0, atol=0)


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
    assert (encoder.model_type, encoder.is_decoder, encoder.type_vocab_size, encoder.use_pooler) == (
        "tfm_encoder",
        False,
        2,
        True,
    )
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


# ------------------------------------------------------------------------------------------ unknown keys warn

UNKNOWN_KEY_WARNING = "is not a config field"


def test_misspelled_keyword_warns_with_nearest_field(caplog):
    """A misspelled keyword argument is named with the nearest real field (transformers would keep it silently)."""
    with caplog.at_level(logging.WARNING):
        config = TfmDecoderConfig(num_expert=8, hidden_size=32, num_attention_heads=4)
    assert config.num_experts == 0  # the typo really does leave the model dense: hence the warning
    assert "TfmDecoderConfig: 'num_expert' is not a config field; did you mean 'num_experts'?" in caplog.text


def test_unknown_key_in_config_json_warns_with_nearest_field(tmp_path, caplog):
    """A misspelled key in config.json is named, with the folder and the nearest real field."""
    tiny_config().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(path.read_text().replace('"position_embedding_type"', '"position_embeding_type"'))
    with caplog.at_level(logging.WARNING):
        AutoConfig.from_pretrained(tmp_path)
    assert f"TfmDecoderConfig (from {tmp_path}): 'position_embeding_type' is not a config field; " in caplog.text
    assert "did you mean 'position_embedding_type'?" in caplog.text


@pytest.mark.parametrize("paradigm", ["decoder", "encoder", "encoder-decoder"])
def test_clean_round_trip_warns_nothing(paradigm, tmp_path, caplog):
    """Saving and loading a model of each paradigm (with labels, RoPE scaling, MoE, generation settings) through the
    Auto classes passes every key transformers itself writes without an unknown-key warning."""
    common = dict(ROPE, rope_parameters=LINEAR_SCALING, num_experts=2, id2label={0: "no", 1: "yes"})
    with caplog.at_level(logging.WARNING):
        if paradigm == "decoder":
            model = TfmDecoderForSequenceClassification(tiny_config(**common))
        elif paradigm == "encoder":
            model = TfmEncoderForTokenClassification(tiny_config(TfmEncoderConfig, **common))
        else:
            model = TfmEncoderDecoderForConditionalGeneration(
                tiny_config(TfmEncoderDecoderConfig, **common, decoder_start_token_id=1)
            )
            model.generation_config = GenerationConfig(decoder_start_token_id=1, max_new_tokens=3)
        type(model.config).from_dict(model.config.to_dict())  # as upcycle rebuilds a config
        model.save_pretrained(tmp_path)
        AutoConfig.from_pretrained(tmp_path)
        AutoModel.from_pretrained(tmp_path)
        type(model).from_pretrained(tmp_path, num_labels=2)
    assert UNKNOWN_KEY_WARNING not in caplog.text


# --------------------------------------------------------------------------------------- config.json mistakes

# case -> (how the folder is loaded, model_type written, what the error must say)
CONFIG_JSON_MISTAKES = {
    "misspelled-model-type": (
        lambda path: AutoConfig.from_pretrained(path, trust_remote_code=True),
        "tfm_decodr",
        r"config\.json has model_type 'tfm_decodr': the valid hf_tfm model types are 'tfm_decoder', 'tfm_encoder', "
        r"'tfm_encoder_decoder'; TfmDecoderConfig reads 'tfm_decoder' \(it is not one of them\)",
    ),
    "misspelled-model-type-model-class": (
        lambda path: TfmDecoderForCausalLM.from_pretrained(path),
        "tfm_decodr",
        r"config\.json has model_type 'tfm_decodr'",
    ),
    "other-paradigm": (
        lambda path: TfmEncoderConfig.from_pretrained(path),
        "tfm_decoder",
        r"config\.json has model_type 'tfm_decoder': .*TfmEncoderConfig reads 'tfm_encoder' "
        r"\(TfmDecoderConfig reads it\)",
    ),
}


@pytest.mark.parametrize("case", CONFIG_JSON_MISTAKES)
def test_config_json_mistake_is_named(case, tmp_path):
    """A misspelled model_type, or another paradigm's, in a saved hf_tfm folder is a ValueError naming model_type and
    the valid choices when hf_tfm's config class reads it (a warning in transformers), also as remote code."""
    load, model_type, match = CONFIG_JSON_MISTAKES[case]
    tiny_model().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["model_type"] = model_type
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        load(tmp_path)


@pytest.mark.slow
def test_importing_hf_tfm_changes_nothing_of_transformers():
    """`import hf_tfm` registers the Auto classes and nothing else: every Auto class's from_pretrained is still
    transformers' own function (checked in a fresh interpreter, before and after the import)."""
    script = """
import transformers
names = [n for n in dir(transformers) if n.startswith("AutoModel") or n in ("AutoConfig", "AutoTokenizer")]
before = {n: getattr(getattr(transformers, n), "from_pretrained", None) for n in names}
import hf_tfm
changed = [n for n in names if getattr(getattr(transformers, n), "from_pretrained", None) != before[n]]
print("changed", changed)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "changed []" in result.stdout


def test_other_folders_keep_transformers_messages(tmp_path):
    """A folder whose auto_map does not name hf_tfm's config classes gets transformers' own message unchanged."""
    config = json.loads(tiny_config().to_json_string())
    config.update(model_type="not_a_model", auto_map={"AutoConfig": "configuration_other.OtherConfig"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        AutoConfig.from_pretrained(tmp_path, trust_remote_code=False)


# ---------------------------------------------------------------------------------- backends and serving engines


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(position_embedding_type="alibi"), "position_embedding_type='alibi'"),
        (dict(position_embedding_type="relative_bias"), "position_embedding_type='relative_bias'"),
        (dict(num_experts=4, num_experts_per_tok=2), "hidden_act='gelu'"),
        (dict(num_experts=4, num_experts_per_tok=2, hidden_act="silu", scoring_func="sigmoid"), "scoring_func"),
        (dict(num_experts=4, num_experts_per_tok=2, hidden_act="silu", capacity_factor=1.5), "capacity_factor"),
        (dict(num_experts=4, num_experts_per_tok=2, hidden_act="silu", router_bias_update_rate=0.01), "router_bias"),
        (
            dict(num_experts=4, num_experts_per_tok=2, hidden_act="silu", shared_expert_intermediate_size=32),
            "shared_expert_intermediate_size",
        ),
    ],
)
def test_what_vllm_cannot_express_is_named(overrides, field):
    assert field in capabilities.backend_refusal(tiny_config(**overrides), "vllm")


def test_what_vllm_can_express_passes():
    expressible = (
        dict(),
        dict(num_experts=4, num_experts_per_tok=2, hidden_act="silu"),
        dict(sliding_window=4),
        dict(attention_sinks=True),
    )
    for overrides in expressible:
        assert capabilities.backend_refusal(tiny_config(position_embedding_type="rope", **overrides), "vllm") is None
    assert capabilities.backend_refusal(tiny_config(TfmEncoderDecoderConfig), "vllm").startswith("model_type")
    for implementation in ("eager", "sdpa", "flex_attention", None):
        assert capabilities.backend_refusal(tiny_config(position_embedding_type="alibi"), implementation) is None


def test_a_backend_that_cannot_add_a_bias_is_refused_when_the_model_is_built():
    """Not at the first forward (a serving engine would already be serving): when the model is built or loaded."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register("engine_without_bias", ALL_ATTENTION_FUNCTIONS["sdpa"])
    refused = "position_embedding_type='alibi' cannot run with attn_implementation='engine_without_bias'"
    with pytest.raises(ValueError, match=refused):
        AutoModelForCausalLM.from_config(
            tiny_config(position_embedding_type="alibi"), attn_implementation="engine_without_bias"
        )
    model = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="engine_without_bias")
    assert model.config._attn_implementation == "engine_without_bias"
    # switched to after it was built: refused by the same table, and the model keeps the backend it had
    alibi = AutoModelForCausalLM.from_config(tiny_config(position_embedding_type="alibi"), attn_implementation="eager")
    with pytest.raises(ValueError, match=refused):
        alibi.set_attn_implementation("engine_without_bias")
    assert alibi.config._attn_implementation == "eager"


def test_every_position_scheme_builds_its_module():
    """Every scheme the config accepts builds its part of the stack's three position parts (`make_positions`), and
    the others change nothing; "none" builds none, "disentangled" (an encoder's) two: the distances every layer reads
    and the relative-position table."""
    from hf_tfm.model.configuration_tfm_rules import POSITION_EMBEDDING_TYPES
    from hf_tfm.model.modeling_tfm_layers import Absent
    from hf_tfm.model.modeling_tfm_positions import NoAttentionBias, NoRotaryEmbedding

    unused = (Absent, NoRotaryEmbedding, NoAttentionBias)
    for scheme in POSITION_EMBEDDING_TYPES:
        if scheme == "disentangled":
            stack = TfmEncoderModel(tiny_config(TfmEncoderConfig, position_embedding_type=scheme))
        else:
            stack = TfmDecoderModel(tiny_config(position_embedding_type=scheme))
        parts = (stack.embed_positions, stack.rotary_emb, stack.position_bias)
        used = [type(part).__name__ for part, kind in zip(parts, unused) if not isinstance(part, kind)]
        assert len(used) == {"none": 0, "disentangled": 2}.get(scheme, 1), (scheme, used)


def test_latent_attention_is_served_by_vllm_only_as_full_attention(monkeypatch):
    """vLLM sizes an MLA cache only for DeepSeek's model types (compat.vllm_mla_disabled): without VLLM_MLA_DISABLE=1
    a latent-attention model is refused at load, naming the field and the setting that serves it."""
    latent = dict(position_embedding_type="rope", kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8, head_dim=4)
    monkeypatch.delenv("VLLM_MLA_DISABLE", raising=False)
    refusal = capabilities.backend_refusal(tiny_config(**latent), "vllm")
    assert "kv_lora_rank=16" in refusal and "VLLM_MLA_DISABLE=1" in refusal
    monkeypatch.setenv("VLLM_MLA_DISABLE", "1")
    assert capabilities.backend_refusal(tiny_config(**latent), "vllm") is None


def test_a_sequence_classifier_is_refused_by_vllm_by_name():
    """vLLM's pooling runner would apply its own pooler and classifier: a saved sequence-classification head is
    refused when vLLM builds it (from config.architectures), naming the architecture; a causal LM is not."""
    classifier = tiny_config(TfmEncoderConfig, architectures=["TfmEncoderForSequenceClassification"])
    assert "TfmEncoderForSequenceClassification" in capabilities.backend_refusal(classifier, "vllm")
    assert "pooler" in capabilities.backend_refusal(classifier, "vllm")
    assert capabilities.backend_refusal(tiny_config(architectures=["TfmDecoderForSequenceClassification"]), "vllm")
    assert capabilities.backend_refusal(tiny_config(architectures=["TfmDecoderForCausalLM"]), "vllm") is None
    assert capabilities.backend_refusal(classifier, "sdpa") is None
