"""Task heads convert exactly both ways: every decoder family's `<Family>ForSequenceClassification` (classifiers and
reward models: the last non-padding token's score), the Llama-shaped families' `<Family>ForTokenClassification`, and
BERT's, RoBERTa's and ELECTRA's token-classification and question-answering heads (and BERT's sequence classifier,
over its pooler) become hf_tfm's heads of the same task layer, with the reference's logits and loss on padded
batches, the labels' names and the problem type carried in the config, and the same state dict back."""

import pytest
import torch
import transformers
from support.families import tiny_reference
from support.parity_harness import PAD, padded_batch, source_batch

from hf_tfm.convert import from_tfm, to_tfm
from hf_tfm.convert.families import FAMILIES

TASK_HEADS = (
    "TfmDecoderForSequenceClassification",
    "TfmDecoderForTokenClassification",
    "TfmEncoderForSequenceClassification",
    "TfmEncoderForTokenClassification",
    "TfmEncoderForQuestionAnswering",
)
HEADS = [
    pytest.param(record.name, reference, id=reference)
    for record in FAMILIES.values()
    for reference, ours in record.classes.items()
    if ours in TASK_HEADS
]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def label_fields(labels: dict[int, str]) -> dict:
    return dict(id2label=labels, label2id={label: i for i, label in labels.items()})


def head(name: str, reference: str, **overrides):
    """`name`'s tiny `reference` head with three named labels (question answering: its two, start and end) and a
    padding id (a decoder's rows end at their last non-padding token). hf_tfm adds an MoE body's router losses to
    every loss with labels, the generic heads never: a zero coefficient keeps the two losses comparable."""
    config = transformers.AutoConfig.for_model(name)
    router = {"router_aux_loss_coef": 0.0} if hasattr(config, "router_aux_loss_coef") else {}
    labels = {} if reference.endswith("QuestionAnswering") else label_fields(LABELS)
    fields = labels | router | {"pad_token_id": PAD} | overrides
    return tiny_reference(name, model_class=getattr(transformers, reference), **fields)


def batch(name: str, reference: str, left: bool, problem_type: str) -> dict:
    """A padded batch of two rows (a decoder's padded on either side, an encoder's on the right) with targets."""
    if FAMILIES[name].paradigm == "tfm_decoder":
        input_ids, attention_mask, _ = padded_batch(9, left=left)
    else:
        input_ids, attention_mask = source_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    generator = torch.Generator().manual_seed(4)
    if reference.endswith("QuestionAnswering"):
        return inputs | dict(start_positions=torch.tensor([1, 3]), end_positions=torch.tensor([2, 20]))  # 20: past it
    if reference.endswith("TokenClassification"):
        labels = torch.randint(0, len(LABELS), input_ids.shape, generator=generator)
        return inputs | dict(labels=labels.masked_fill(attention_mask == 0, -100))
    if problem_type == "regression":
        return inputs | dict(labels=torch.randn(2, generator=generator))
    if problem_type == "multi_label_classification":
        return inputs | dict(labels=(torch.rand(2, len(LABELS), generator=generator) > 0.5).float())
    return inputs | dict(labels=torch.tensor([2, 0]))


def assert_scores_as_reference(
    ref, ours, name: str, reference: str, problem_type: str = "single_label_classification"
) -> None:
    fields = ("start_logits", "end_logits") if reference.endswith("QuestionAnswering") else ("logits",)
    for left in (False, True):
        inputs = batch(name, reference, left, problem_type)
        with torch.no_grad():
            expected, actual = ref(**inputs), ours(**inputs)
        for field in fields:
            assert getattr(expected, field).abs().max() > 1e-3  # the comparison below is not vacuous
            torch.testing.assert_close(getattr(actual, field), getattr(expected, field), atol=1e-5, rtol=0)
        torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name, reference", HEADS)
def test_head_converts_exactly_both_ways(name, reference):
    ref = head(name, reference)
    ours = to_tfm(ref)
    assert type(ours).__name__ == FAMILIES[name].classes[reference]
    assert ours.config.id2label == ref.config.id2label and ours.config.num_labels == ref.config.num_labels
    assert_scores_as_reference(ref, ours, name, reference)
    back = from_tfm(ours, name)
    assert type(back) is type(ref) and back.config.id2label == ref.config.id2label
    assert list(back.state_dict()) == list(ref.state_dict())
    assert all(torch.equal(back.state_dict()[key], tensor) for key, tensor in ref.state_dict().items())


@pytest.mark.parametrize(
    "name, reference", [("llama", "LlamaForSequenceClassification"), ("bert", "BertForSequenceClassification")]
)
@pytest.mark.parametrize("problem_type, num_labels", [("regression", 1), ("multi_label_classification", 3)])
def test_sequence_classifier_problem_types_convert(name, reference, problem_type, num_labels):
    """The problem type picks the loss (mean squared error, binary cross-entropy per label): it goes across too."""
    labels = {i: LABELS[i] for i in range(num_labels)}
    ref = head(name, reference, problem_type=problem_type, **label_fields(labels))
    ours = to_tfm(ref)
    assert ours.config.problem_type == problem_type and ours.config.num_labels == num_labels
    assert_scores_as_reference(ref, ours, name, reference, problem_type)
    assert from_tfm(ours, name).config.problem_type == problem_type


@pytest.mark.parametrize("name, reference", [case for case in HEADS if "Classification" in case.values[1]])
def test_classifiers_train_as_the_reference_with_dropout_on(name, reference):
    """Training mode: every dropout of the body at 0.2 and the classifier's own (BERT's, RoBERTa's and ELECTRA's
    `classifier_dropout` set apart from the hidden dropout; the generic token classifier's 0.1, which a Llama-shaped
    config never names) give the same seeded loss and gradients as the reference."""
    from benchmarks.training_parity import dropout_fields, seeded_step

    fields = dropout_fields(name, 0.2)
    if hasattr(transformers.AutoConfig.for_model(name), "classifier_dropout"):
        fields["classifier_dropout"] = 0.35
    ref = head(name, reference, **fields).train()
    ours = to_tfm(ref).train()
    ours.set_attn_implementation(ref.config._attn_implementation)
    inputs = batch(name, reference, left=False, problem_type="single_label_classification")
    for seed in range(2):
        expected, actual = seeded_step(ref, inputs, seed), seeded_step(ours, inputs, seed)
        assert actual[0] == pytest.approx(expected[0], rel=0, abs=1e-5), (name, seed)
        assert actual[1] == pytest.approx(expected[1], rel=1e-5), (name, seed, "gradient norm")
    back = from_tfm(ours, name).config  # the classifier's dropout goes back as the reference wrote it (or left it out)
    assert getattr(back, "classifier_dropout", None) == getattr(ref.config, "classifier_dropout", None)
