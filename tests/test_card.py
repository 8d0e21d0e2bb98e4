"""Model cards: metadata that huggingface_hub parses back, numbers that are the model's own."""

import pytest
from huggingface_hub import ModelCard

from hf_tfm import (
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
)

from hf_tfm.hub.card import Measurement, write_model_card
from conftest import tiny_model


def test_card_round_trips_and_counts_parameters(tmp_path):
    model = tiny_model(position_embedding_type="rope", num_key_value_heads=2)
    write_model_card(
        tmp_path,
        model,
        results=[Measurement("validation", "perplexity", 12.5)],
        dataset="python-stdlib-docstrings",
        training="3 steps.",
    )
    card = ModelCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"hf_tfm", "tfm_decoder", "decoder-only", "rope"} <= set(data["tags"])
    [result] = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("perplexity", 12.5, "validation")
    total = model.num_parameters()
    assert f"| parameters (total / active per token) | {total:,} / {total:,} |" in card.text  # dense: all active
    assert "| attention heads / kv heads | 4 / 2 (head_dim 8) |" in card.text
    assert 'trust_remote_code=True' in card.text


@pytest.mark.parametrize(
    "config_class, model_class, tag, layers",
    [
        (TfmEncoderConfig, TfmEncoderForMaskedLM, "fill-mask", "2"),
        (TfmEncoderDecoderConfig, TfmEncoderDecoderForConditionalGeneration, "text2text-generation", "2 encoder + 3 decoder"),
    ],
)
def test_card_for_each_paradigm(tmp_path, config_class, model_class, tag, layers):
    fields = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if config_class is TfmEncoderDecoderConfig:
        fields["decoder_layers"] = 3
    model = model_class(config_class(**fields))
    write_model_card(tmp_path, model, results=[], dataset="d", training="none")
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.pipeline_tag == tag
    assert f"| layers | {layers} |" in card.text
    assert f"| parameters (total / active per token) | {model.num_parameters():,} / " in card.text


def test_card_counts_active_parameters_of_moe(tmp_path):
    """An MoE card reports experts / top-k, and active parameters = total less the experts a token skips."""
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, ffn_type="glu")
    write_model_card(tmp_path, model, results=[], dataset="d", training="none")
    text = ModelCard.load(tmp_path / "README.md").text
    per_expert = 3 * 32 * 16  # gate, up and down projections of one expert (hidden 32, width 16)
    active = model.num_parameters() - model.config.num_hidden_layers * (4 - 2) * per_expert  # 2 idle experts a layer
    assert "| experts / top-k | 4 / top-2 |" in text
    assert f"| parameters (total / active per token) | {model.num_parameters():,} / {active:,} |" in text
