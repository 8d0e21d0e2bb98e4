"""Encoder-only models: exact BERT parity, bidirectionality, padding, every head and its loss, Auto classes,
pipelines, bad input and remote-code loading. Tiny shapes, fp32, CPU."""

import json
from functools import partial

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import VOCAB, assert_same_state_dict, perturb, tiny_config
from support.families import tiny_reference
from support.minilm import minilm_dir
from support.processes import run_without_hf_tfm
from transformers import AutoTokenizer, BertForMaskedLM, BertModel, pipeline

from hf_tfm import (
    TfmEncoderConfig,
    TfmEncoderForMaskedLM,
    TfmEncoderForPreTraining,
    TfmEncoderForQuestionAnswering,
    TfmEncoderForSequenceClassification,
    TfmEncoderForTokenClassification,
    TfmEncoderModel,
)
from hf_tfm.convert import from_tfm, to_tfm

ATOL = 1e-4
PAD = 0
ENCODER_POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative_bias", "none"]
# TfmEncoderConfig fields that make it BERT-shaped (the rest of BERT matches the defaults)
BERT_SHAPED = dict(norm_position="post", embedding_norm=True, final_norm=False, layer_norm_eps=1e-12)
AUTO_CLASSES = {
    "AutoModel": TfmEncoderModel,
    "AutoModelForMaskedLM": TfmEncoderForMaskedLM,
    "AutoModelForSequenceClassification": TfmEncoderForSequenceClassification,
    "AutoModelForTokenClassification": TfmEncoderForTokenClassification,
    "AutoModelForQuestionAnswering": TfmEncoderForQuestionAnswering,
    "AutoModelForPreTraining": TfmEncoderForPreTraining,
}


def encoder_config(**overrides) -> TfmEncoderConfig:
    return tiny_config(TfmEncoderConfig, **overrides)


def encoder(cls=TfmEncoderModel, **overrides):
    """A tiny encoder with noise on every weight, so that each one visibly moves the outputs."""
    return perturb(cls(encoder_config(**overrides)))


def bert(cls=BertModel, add_pooling_layer=True, **overrides):
    kwargs = {"add_pooling_layer": add_pooling_layer} if cls is BertModel else {}
    return tiny_reference("bert", cls, kwargs, **overrides)


def untied_bert_mlm():
    """An untied BertForMaskedLM keeps two MLM biases; make them agree, as a tied checkpoint's do."""
    model = bert(BertForMaskedLM, tie_word_embeddings=False)
    with torch.no_grad():
        model.cls.predictions.bias.copy_(model.cls.predictions.decoder.bias)
    return model


def padded_batch(type_vocab_size: int = 2):
    """Two rows, the second right-padded by 4, with two segments per row."""
    torch.manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (2, 10))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    input_ids[1, 6:] = PAD
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = type_vocab_size - 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def outputs_as_tensors(output) -> list[torch.Tensor]:
    """Every tensor a model output holds, nested tuples (hidden states) flattened."""
    tensors = []
    for value in output.to_tuple():
        tensors.extend(value if isinstance(value, tuple) else [value])
    return tensors


# ------------------------------------------------------------------------------------------------ BERT parity

BERTS = [
    pytest.param(bert, id="model"),
    pytest.param(lambda: bert(add_pooling_layer=False), id="model-no-pooler"),
    pytest.param(lambda: bert(hidden_act="relu", type_vocab_size=3, layer_norm_eps=1e-6), id="model-relu-3types"),
    pytest.param(lambda: bert(BertForMaskedLM), id="mlm-tied"),
    pytest.param(untied_bert_mlm, id="mlm-untied"),
]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("make_bert", BERTS)
def test_bert_outputs_match(make_bert, attn):
    """Converted BERTs give the reference hidden states, pooler output and MLM logits on a right-padded batch."""
    ref = make_bert()
    ours = to_tfm(ref)
    assert type(ours) is (TfmEncoderForMaskedLM if isinstance(ref, BertForMaskedLM) else TfmEncoderModel)
    ref.set_attn_implementation(attn)
    ours.set_attn_implementation(attn)
    batch = padded_batch(ref.config.type_vocab_size)
    with torch.no_grad():
        expected = ref(**batch, output_hidden_states=True)
        actual = ours(**batch, output_hidden_states=True)
    expected, actual = outputs_as_tensors(expected), outputs_as_tensors(actual)
    assert len(actual) == len(expected)
    assert expected[0].abs().max() > 100 * ATOL  # the comparison is not vacuous
    for want, got in zip(expected, actual):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("make_bert", BERTS)
def test_bert_round_trip_restores_state_dict(make_bert):
    """BERT -> hf_tfm -> BERT reproduces the state dict exactly: same keys (pooler, both MLM biases), equal tensors."""
    ref = make_bert()
    expected = ref.state_dict()
    back = from_tfm(to_tfm(ref), "bert")
    assert type(back) is type(ref)
    assert_same_state_dict(back.state_dict(), expected)
    if ref.config.tie_word_embeddings and isinstance(ref, BertForMaskedLM):
        assert back.cls.predictions.decoder.weight is back.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("cls", [TfmEncoderModel, TfmEncoderForMaskedLM])
def test_bert_shaped_tfm_converts_to_bert(cls):
    """A natively built BERT-shaped hf_tfm encoder converts to transformers' BERT with the same outputs."""
    ours = encoder(cls, **BERT_SHAPED)
    ref = from_tfm(ours, "bert")
    batch = padded_batch()
    with torch.no_grad():
        expected, actual = outputs_as_tensors(ref(**batch)), outputs_as_tensors(ours(**batch))
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "convert, make_source, field",
    [
        (to_tfm, lambda: bert(is_decoder=True), "is_decoder"),
        (to_tfm, lambda: bert(is_decoder=True, add_cross_attention=True), "add_cross_attention"),
        (to_tfm, lambda: bert(position_embedding_type="relative_key"), "position_embedding_type"),
        (to_tfm, lambda: bert(BertForMaskedLM, tie_word_embeddings=False), "cls.predictions.bias"),
        (
            partial(from_tfm, name="bert"),
            lambda: encoder(**{**BERT_SHAPED, "position_embedding_type": "rope"}),
            "position_embedding_type",
        ),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "norm_position": "pre"}), "norm_position"),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "final_norm": True}), "final_norm"),
        (
            partial(from_tfm, name="bert"),
            lambda: encoder(**{**BERT_SHAPED, "embedding_norm": False}),
            "embedding_norm",
        ),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "norm_type": "rmsnorm"}), "norm_type"),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "ffn_type": "glu"}), "ffn_type"),
        (
            partial(from_tfm, name="bert"),
            lambda: encoder(**{**BERT_SHAPED, "attention_bias": False}),
            "attention_bias",
        ),
        (
            partial(from_tfm, name="bert"),
            lambda: encoder(**{**BERT_SHAPED, "num_key_value_heads": 2}),
            "num_key_value_heads",
        ),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "head_dim": 16}), "head_dim"),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "type_vocab_size": 0}), "type_vocab_size"),
        (
            partial(from_tfm, name="bert"),
            lambda: encoder(**{**BERT_SHAPED, "attention_multiplier": 1.0}),
            "attention_multiplier",
        ),
        (partial(from_tfm, name="bert"), lambda: encoder(**{**BERT_SHAPED, "position_offset": 2}), "position_offset"),
    ],
)
def test_inexpressible_bert_config_raises(convert, make_source, field):
    """A config the other side cannot express exactly raises ValueError naming the offending field."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        convert(make_source())


# ------------------------------------------------------------------------------------------- encoder behaviour


@pytest.mark.parametrize("position", ENCODER_POSITIONS)
def test_attention_is_bidirectional(position):
    """Changing the last token changes the first position's output: nothing is causally masked."""
    model = encoder(position_embedding_type=position)
    input_ids = padded_batch()["input_ids"][:1]
    changed = input_ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(input_ids).last_hidden_state, model(changed).last_hidden_state
    assert (after[0, 0] - before[0, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("position", ENCODER_POSITIONS)
def test_right_padding_invariance(position, attn):
    """Each row of a right-padded batch gets, at its real tokens, the hidden states it gets alone."""
    model = encoder(position_embedding_type=position)
    model.set_attn_implementation(attn)
    batch = padded_batch()
    with torch.no_grad():
        batched = model(**batch).last_hidden_state
        for row in range(2):
            length = int(batch["attention_mask"][row].sum())
            alone = model(
                input_ids=batch["input_ids"][row : row + 1, :length],
                token_type_ids=batch["token_type_ids"][row : row + 1, :length],
            ).last_hidden_state
            torch.testing.assert_close(batched[row, :length], alone[0], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------------- heads


def test_masked_lm_head_loss():
    """MLM logits are [batch, length, vocab] and the loss is cross-entropy over the unmasked (-100) labels."""
    model = encoder(TfmEncoderForMaskedLM)
    batch = padded_batch()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 2] = batch["input_ids"][:, 2]
    labels[0, 7] = batch["input_ids"][0, 7]
    out = model(**batch, labels=labels)
    assert out.logits.shape == (2, 10, VOCAB)
    kept = labels != -100
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[kept], labels[kept]))


@pytest.mark.parametrize(
    "problem_type, num_labels, labels, torch_loss",
    [
        ("single_label_classification", 3, torch.tensor([2, 0]), lambda lg, lb: F.cross_entropy(lg, lb)),
        (
            "multi_label_classification",
            3,
            torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
            lambda lg, lb: F.binary_cross_entropy_with_logits(lg, lb),
        ),
        ("regression", 1, torch.tensor([0.5, -1.5]), lambda lg, lb: F.mse_loss(lg.squeeze(-1), lb)),
    ],
    ids=["single_label", "multi_label", "regression"],
)
def test_sequence_classification_head_loss(problem_type, num_labels, labels, torch_loss):
    """Sequence logits are [batch, num_labels]; `problem_type` picks the matching torch loss."""
    model = encoder(TfmEncoderForSequenceClassification, num_labels=num_labels, problem_type=problem_type)
    out = model(**padded_batch(), labels=labels)
    assert out.logits.shape == (2, num_labels)
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, torch_loss(out.logits, labels))


def test_token_classification_head_loss():
    """Token logits are [batch, length, num_labels]; labels of -100 (here the padding) are left out of the loss."""
    model = encoder(TfmEncoderForTokenClassification, num_labels=5)
    batch = padded_batch()
    labels = torch.randint(0, 5, batch["input_ids"].shape).masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels)
    assert out.logits.shape == (2, 10, 5)
    kept = labels != -100
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[kept], labels[kept]))


def test_question_answering_head_loss():
    """QA gives start and end logits per token; the loss is the mean of the start and end cross-entropies.
    (transformers 5 removed the `question-answering` pipeline, see test_question_answering_pipeline_is_removed.)"""
    model = encoder(TfmEncoderForQuestionAnswering)
    start, end = torch.tensor([1, 3]), torch.tensor([4, 5])
    out = model(**padded_batch(), start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (2, 10)
    expected = (F.cross_entropy(out.start_logits, start) + F.cross_entropy(out.end_logits, end)) / 2
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, expected)


# ------------------------------------------------------------------------------------------- Auto + save/load

AUTO_CASES = [(auto, "learned") for auto in AUTO_CLASSES] + [
    ("AutoModelForMaskedLM", position) for position in ENCODER_POSITIONS if position != "learned"
]


@pytest.mark.parametrize("auto, position", AUTO_CASES)
def test_auto_class_builds_and_reloads(tmp_path, auto, position):
    """Each Auto class builds the matching encoder from a TfmEncoderConfig and reloads it with identical outputs."""
    auto_class = getattr(transformers, auto)
    torch.manual_seed(0)
    model = perturb(auto_class.from_config(encoder_config(position_embedding_type=position)))
    assert type(model) is AUTO_CLASSES[auto]
    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is AUTO_CLASSES[auto]
    batch = padded_batch()
    with torch.no_grad():
        expected, actual = outputs_as_tensors(model(**batch)), outputs_as_tensors(loaded(**batch))
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_saved_config_auto_map_lists_every_encoder_class(tmp_path):
    """config.json's auto_map names the config and every encoder Auto class, so any of them loads the folder."""
    encoder(TfmEncoderForMaskedLM).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_tfm.TfmEncoderConfig",
        **{auto: f"modeling_tfm.{cls.__name__}" for auto, cls in AUTO_CLASSES.items()},
    }


# ------------------------------------------------------------------------------------------------- pipelines


@pytest.fixture(scope="module")
def pipeline_folders(tmp_path_factory):
    """Tiny encoders with MiniLM's WordPiece tokenizer, one folder per head the pipelines use."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    labels = {
        TfmEncoderForMaskedLM: None,
        TfmEncoderForSequenceClassification: ["NEGATIVE", "POSITIVE"],
        TfmEncoderForTokenClassification: ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    }
    folders = {}
    for cls, names in labels.items():
        extra = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}} if names else {}
        torch.manual_seed(0)
        model = cls(encoder_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **extra)).eval()
        folders[cls] = tmp_path_factory.mktemp(cls.__name__)
        model.save_pretrained(folders[cls])
        tokenizer.save_pretrained(folders[cls])
    return folders, tokenizer


def test_fill_mask_pipeline(pipeline_folders):
    """fill-mask returns the top-k candidates, best first, each filled into the sentence."""
    folders, tokenizer = pipeline_folders
    fill = pipeline("fill-mask", model=str(folders[TfmEncoderForMaskedLM]))
    results = fill(f"The capital of France is {tokenizer.mask_token}.", top_k=3)
    assert len(results) == 3
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    for result in results:
        assert 0 <= result["score"] <= 1 and 0 <= result["token"] < len(tokenizer)
        assert result["token_str"] == tokenizer.decode([result["token"]])
        assert tokenizer.mask_token not in result["sequence"]


def test_text_classification_pipeline(pipeline_folders):
    """text-classification returns one of the configured labels with a probability; all scores sum to 1."""
    folders, _ = pipeline_folders
    classify = pipeline("text-classification", model=str(folders[TfmEncoderForSequenceClassification]))
    [best] = classify("What a wonderful day.")
    assert best["label"] in {"NEGATIVE", "POSITIVE"} and 0.5 <= best["score"] <= 1
    every = classify("What a wonderful day.", top_k=None)
    assert {r["label"] for r in every} == {"NEGATIVE", "POSITIVE"}
    assert sum(r["score"] for r in every) == pytest.approx(1.0)


def test_token_classification_pipeline(pipeline_folders):
    """token-classification tags every word piece with a configured label and character offsets into the text."""
    folders, tokenizer = pipeline_folders
    tag = pipeline("token-classification", model=str(folders[TfmEncoderForTokenClassification]), ignore_labels=[])
    text = "Alice moved to Paris"
    entities = tag(text)
    assert len(entities) == len(tokenizer.tokenize(text))
    for entity in entities:
        assert entity["entity"] in {"O", "B-PER", "I-PER", "B-LOC", "I-LOC"} and 0 <= entity["score"] <= 1
        assert text[entity["start"] : entity["end"]].lower() == entity["word"].removeprefix("##")


def test_feature_extraction_pipeline(pipeline_folders):
    """feature-extraction returns one hidden_size vector per token, [CLS] and [SEP] included."""
    folders, tokenizer = pipeline_folders
    extract = pipeline("feature-extraction", model=str(folders[TfmEncoderForMaskedLM]))
    features = torch.tensor(extract("Hello world, this is hf_tfm."))
    assert features.shape == (1, len(tokenizer("Hello world, this is hf_tfm.").input_ids), 32)
    assert torch.isfinite(features).all()


def test_question_answering_pipeline_is_removed(pipeline_folders):
    """transformers 5 removed the question-answering pipeline (QA is tested through the model's head instead)."""
    folders, _ = pipeline_folders
    with pytest.raises(KeyError, match="question-answering"):  # "has been removed" (5.23+), "Unknown task" before
        pipeline("question-answering", model=str(folders[TfmEncoderForMaskedLM]))


# ------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "overrides, make_kwargs, field",
    [
        ({}, lambda b: {**b, "attention_mask": b["attention_mask"][:, :-1]}, "attention_mask"),
        ({}, lambda b: {**b, "labels": b["input_ids"][:, :-1]}, "labels"),
        ({}, lambda b: {**b, "input_ids": b["input_ids"].masked_fill(b["input_ids"] == PAD, VOCAB)}, "input_ids"),
        ({}, lambda b: {**b, "input_ids": b["input_ids"].masked_fill(b["input_ids"] == PAD, -1)}, "input_ids"),
        ({"type_vocab_size": 0}, lambda b: b, "token_type_ids"),
        ({}, lambda b: {**b, "token_type_ids": b["token_type_ids"] * 2}, "token_type_ids"),
    ],
    ids=["mask-shape", "labels-length", "id-too-big", "id-negative", "types-without-table", "type-id-too-big"],
)
def test_bad_input_raises_naming_it(overrides, make_kwargs, field):
    """Malformed input raises ValueError naming the offending argument, not an IndexError deep in an embedding."""
    model = encoder(TfmEncoderForMaskedLM, **overrides)
    with pytest.raises(ValueError, match=field):
        model(**make_kwargs(padded_batch()))


# ---------------------------------------------------------------------------------------------- remote code


@pytest.mark.slow
def test_masked_lm_loads_with_trust_remote_code_without_package(tmp_path):
    """A saved TfmEncoderForMaskedLM folder loads with only torch + transformers and gives identical logits."""
    batch = padded_batch()
    expected = {}
    for position in ENCODER_POSITIONS:
        model = encoder(TfmEncoderForMaskedLM, position_embedding_type=position)
        model.save_pretrained(tmp_path / position)
        with torch.no_grad():
            expected[position] = model(**batch).logits
    torch.save({"expected": expected, "batch": batch}, tmp_path / "expected.pt")
    result = run_without_hf_tfm(
        """
        import torch
        from transformers import AutoModelForMaskedLM
        data = torch.load("expected.pt")
        for name, want in data["expected"].items():
            model = AutoModelForMaskedLM.from_pretrained(name, trust_remote_code=True).eval()
            assert type(model).__name__ == "TfmEncoderForMaskedLM", type(model)
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            with torch.no_grad():
                logits = model(**data["batch"]).logits
            torch.testing.assert_close(logits, want, rtol=0, atol=0)
        print("loaded", len(data["expected"]))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded {len(ENCODER_POSITIONS)}" in result.stdout
