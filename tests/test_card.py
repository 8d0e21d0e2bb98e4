"""Model cards: metadata that huggingface_hub parses back and the Hub accepts, numbers that are the model's own (and
evaluation results only where a run recorded them)."""

import json

import pytest
import torch
from conftest import tiny_config, tiny_model
from huggingface_hub import ModelCard, ModelCardData
from support.hub_server import metadata_errors
from support.run_record import RECORD

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForSequenceClassification,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
    TfmEncoderForSequenceClassification,
    TfmEncoderForTokenClassification,
)
from hf_tfm.hub.card import (
    RUN_RECORD,
    Measurement,
    RunRecordError,
    active_parameters,
    refresh_card,
    write_card_from_run,
    write_model_card,
)


def check_metadata(card: ModelCard) -> dict:
    """The card's YAML parses back into ModelCardData and passes the Hub's metadata checks
    (tests/support/hub_server.py)."""
    data = card.data.to_dict()
    assert metadata_errors(data) == []
    assert ModelCardData(**data).to_dict() == data
    return data


def saved(tmp_path, model, record=None, name="model"):
    folder = tmp_path / name
    model.save_pretrained(folder)
    if record is not None:
        (folder / RUN_RECORD).write_text(json.dumps(record))
    return folder


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
    data = check_metadata(card)
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"hf_tfm", "tfm_decoder", "decoder-only", "rope"} <= set(data["tags"])
    assert "moe" not in data["tags"]
    [result] = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("perplexity", 12.5, "validation")
    total = model.num_parameters()
    assert f"| parameters (total / active per token) | {total:,} / {total:,} |" in card.text  # dense: all active
    assert "| attention heads / kv heads | 4 / 2 (head_dim 8) |" in card.text
    assert "trust_remote_code=True" in card.text and "3 steps." in card.text


@pytest.mark.parametrize(
    ("config_class", "model_class", "tag", "layers"),
    [
        (TfmEncoderConfig, TfmEncoderForMaskedLM, "fill-mask", "2"),
        (
            TfmEncoderDecoderConfig,
            TfmEncoderDecoderForConditionalGeneration,
            "text2text-generation",
            "2 encoder + 3 decoder",
        ),
    ],
)
def test_card_for_each_paradigm(tmp_path, config_class, model_class, tag, layers):
    fields = {
        "vocab_size": 97,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
    }
    if config_class is TfmEncoderDecoderConfig:
        fields["decoder_layers"] = 3
    model = model_class(config_class(**fields))
    write_model_card(tmp_path, model, results=[], dataset="d", training="none")
    card = ModelCard.load(tmp_path / "README.md")
    assert check_metadata(card)["pipeline_tag"] == tag
    assert f"| layers | {layers} |" in card.text
    assert f"| parameters (total / active per token) | {model.num_parameters():,} / " in card.text


def test_card_counts_active_parameters_of_moe(tmp_path):
    """An MoE card reports experts / top-k, and active parameters = total less the experts a token skips."""
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, ffn_type="glu")
    write_model_card(tmp_path, model, results=[], dataset="d", training="none")
    card = ModelCard.load(tmp_path / "README.md")
    per_expert = 3 * 32 * 16  # gate, up and down projections of one expert (hidden 32, width 16)
    active = model.num_parameters() - model.config.num_hidden_layers * (4 - 2) * per_expert  # 2 idle experts a layer
    assert active == active_parameters(model)
    assert "| experts / top-k | 4 / top-2 |" in card.text and "| MoE layers | 2 of 2 |" in card.text
    assert f"| parameters (total / active per token) | {model.num_parameters():,} / {active:,} |" in card.text
    assert {"moe", "mixture-of-experts"} <= set(check_metadata(card)["tags"])


def test_card_names_each_layer_types_rope(tmp_path):
    """RoPE nested per layer type (ModernBERT's and Gemma's local and global theta): the card shows both (a saved
    model of this kind used to get no card at all, KeyError 'rope_type')."""
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    layer_types = ["sliding_attention", "full_attention"]
    model = tiny_model(position_embedding_type="rope", sliding_window=4, layer_types=layer_types, rope_parameters=rope)
    card = ModelCard.load(saved(tmp_path, model) / "README.md")
    assert "full_attention: default, theta 160000; sliding_attention: default, theta 10000" in card.text


def test_refresh_card_from_the_run_record(tmp_path):
    """`hf-tfm card FOLDER`: the model is loaded from the folder, the run record fills data, arguments, model-index
    (exactly its numbers) and baselines."""
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    folder = saved(tmp_path, model, RECORD)
    card = refresh_card(folder, repo_id="test-user/tiny-moe")
    assert ModelCard.load(folder / "README.md").content == card.content
    data = check_metadata(card)
    assert data["datasets"] == ["python-stdlib-docstrings"] and data["pipeline_tag"] == "text-generation"
    assert {"moe", "mixture-of-experts", "custom_code"} <= set(data["tags"])
    [entry] = data["model-index"]
    assert entry["name"] == "test-user/tiny-moe"
    measured = [(r.dataset_split, r.metric_type, r.metric_value) for r in card.data.eval_results]
    assert measured == [(r["split"], r["metric"], r["value"]) for r in RECORD["results"]]
    assert f"{model.num_parameters():,} / {active_parameters(model):,}" in card.text
    assert "| uniform over the vocabulary | perplexity | 292 |" in card.text  # baselines: in the text only
    assert "| learning_rate | 0.003 |" in card.text and "| max_steps | 600 |" in card.text
    assert "600 optimizer steps of `Trainer`." in card.text
    assert 'AutoModelForCausalLM.from_pretrained("test-user/tiny-moe", trust_remote_code=True)' in card.text
    # no tokenizer was saved in the folder: the snippets say so and use token ids
    assert "AutoTokenizer" not in card.text and "This repository has no tokenizer" in card.text
    assert "model.generate(torch.tensor([[1, 2, 3]])" in card.text


def test_refresh_card_without_run_record(tmp_path):
    """No run record: the card says no evaluation was recorded, and carries no model-index or datasets; a second
    refresh keeps the repo id and license the first one was given."""
    folder = saved(tmp_path, tiny_model())
    card = refresh_card(folder, repo_id="test-user/plain", license="mit")
    data = check_metadata(card)
    assert "model-index" not in data and "datasets" not in data and card.data.eval_results is None
    assert "No evaluation was recorded for this model." in card.text
    assert "The training data was not recorded." in card.text and "its quality is unknown" in card.text
    again = refresh_card(folder)
    assert again.data.license == "mit" and again.data.model_name == "test-user/plain"
    assert again.content == card.content


@pytest.mark.parametrize(
    ("build", "task", "tag", "auto_class"),
    [
        (
            lambda: TfmEncoderForSequenceClassification(tiny_config(TfmEncoderConfig, num_labels=3)),
            "sequence-classification",
            "text-classification",
            "AutoModelForSequenceClassification",
        ),
        (
            lambda: TfmEncoderForSequenceClassification(tiny_config(TfmEncoderConfig, num_labels=3)),
            None,
            "text-classification",
            "AutoModelForSequenceClassification",
        ),
        (
            lambda: TfmEncoderForTokenClassification(tiny_config(TfmEncoderConfig, num_labels=5)),
            "token-classification",
            "token-classification",
            "AutoModelForTokenClassification",
        ),
        (
            lambda: TfmDecoderForSequenceClassification(tiny_config(TfmDecoderConfig, num_labels=2)),
            None,
            "text-classification",
            "AutoModelForSequenceClassification",
        ),
        (
            lambda: TfmEncoderForMaskedLM(tiny_config(TfmEncoderConfig)),
            "masked-lm",
            "fill-mask",
            "AutoModelForMaskedLM",
        ),
        (
            lambda: TfmEncoderDecoderForConditionalGeneration(tiny_config(TfmEncoderDecoderConfig)),
            "seq2seq",
            "text2text-generation",
            "AutoModelForSeq2SeqLM",
        ),
    ],
    ids=[
        "encoder-seq-cls",
        "encoder-seq-cls-no-task",
        "encoder-token-cls",
        "decoder-seq-cls-no-task",
        "masked-lm",
        "seq2seq",
    ],
)
def test_pipeline_tag_and_auto_class_follow_task_and_head(tmp_path, build, task, tag, auto_class):
    """The pipeline tag follows the recorded task, else the head in `architectures`; the load snippet uses the
    Auto class of that head, and the folder loads back as that head."""
    torch.manual_seed(0)
    model = build().eval()
    record = {"task": task, "results": []} if task else None
    card = refresh_card(saved(tmp_path, model, record))
    assert check_metadata(card)["pipeline_tag"] == tag
    assert f'{auto_class}.from_pretrained("model", trust_remote_code=True)' in card.text
    assert f"| head | {type(model).__name__} |" in card.text
    generative = auto_class in ("AutoModelForSeq2SeqLM",)
    assert ("model.generate(" in card.text) == generative


def test_card_with_a_tokenizer_shows_it(tmp_path):
    from hf_tfm.training.tokenizers import train_byte_level_bpe

    tokenizer = train_byte_level_bpe(["return the number of items"] * 10, vocab_size=300)
    model = tiny_model(vocab_size=len(tokenizer))
    folder = saved(tmp_path, model, RECORD)
    tokenizer.save_pretrained(folder)
    card = write_card_from_run(folder, model, repo_id="u/m")
    assert 'AutoTokenizer.from_pretrained("u/m", trust_remote_code=True)' in card.text
    assert 'tokenizer = AutoTokenizer.from_pretrained("u/m")\n' in card.text  # the hf_tfm-installed snippet


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        (json.dumps({"task": "image-generation"}), "unknown task 'image-generation'"),
        (json.dumps({"results": [{"split": "validation", "metric": "loss", "value": "low"}]}), "finite number"),
        (json.dumps({"results": [{"metric": "loss", "value": 1.0}]}), "needs string 'split' and 'metric'"),
        (json.dumps(["not", "an", "object"]), "expected a JSON object"),
    ],
)
def test_malformed_run_record_is_an_error_naming_the_file(tmp_path, content, message):
    folder = saved(tmp_path, tiny_model())
    card = (folder / "README.md").read_text()  # the one save_pretrained wrote
    (folder / RUN_RECORD).write_text(content)
    with pytest.raises(RunRecordError, match=message) as error:
        refresh_card(folder)
    assert str(folder / RUN_RECORD) in str(error.value)
    assert (folder / "README.md").read_text() == card  # left as it was


def test_refresh_card_of_a_folder_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a saved model folder") as error:
        refresh_card(tmp_path)
    assert str(tmp_path) in str(error.value)
