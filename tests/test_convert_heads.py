"""The decoder families' classification heads convert exactly both ways: every `<Family>ForSequenceClassification`
(reward models and classifiers: the last non-padding token's score) and the Llama-shaped families'
`<Family>ForTokenClassification` become hf_tfm's heads of the same task layer (`score`), with the reference's
logits and loss on left- and right-padded batches, the labels' names and the problem type carried in the config, and
the same state dict back."""

import pytest
import torch
import transformers
from support.families import tiny_reference
from support.parity_harness import PAD, padded_batch

from hf_tfm.convert import from_tfm, to_tfm
from hf_tfm.convert.families import FAMILIES

HEADS = [
    pytest.param(record.name, reference, id=reference)
    for record in FAMILIES.values()
    for reference, ours in record.classes.items()
    if ours in ("TfmDecoderForSequenceClassification", "TfmDecoderForTokenClassification")
]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def classifier(name: str, reference: str, **overrides):
    """`name`'s tiny `reference` head with three named labels and a padding id (a batch's rows end at their last
    non-padding token). hf_tfm adds an MoE body's router losses to every loss with labels, the generic heads never:
    a zero coefficient keeps the two losses comparable."""
    config = transformers.AutoConfig.for_model(name)
    router = {"router_aux_loss_coef": 0.0} if hasattr(config, "router_aux_loss_coef") else {}
    fields = dict(id2label=LABELS, label2id={label: i for i, label in LABELS.items()}, pad_token_id=PAD)
    return tiny_reference(name, model_class=getattr(transformers, reference), **(fields | router | overrides))


def targets(reference: str, input_ids, attention_mask, problem_type: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(4)
    if reference.endswith("ForTokenClassification"):
        return torch.randint(0, len(LABELS), input_ids.shape, generator=generator).masked_fill(
            attention_mask == 0, -100
        )
    if problem_type == "regression":
        return torch.randn(input_ids.shape[0], generator=generator)
    if problem_type == "multi_label_classification":
        return (torch.rand(input_ids.shape[0], len(LABELS), generator=generator) > 0.5).float()
    return torch.tensor([2, 0])


def assert_scores_as_reference(ref, ours, reference: str, problem_type: str = "single_label_classification") -> None:
    for left in (False, True):
        input_ids, attention_mask, _ = padded_batch(9, left=left)
        labels = targets(reference, input_ids, attention_mask, problem_type)
        with torch.no_grad():
            expected = ref(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            actual = ours(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        assert expected.logits.abs().max() > 1e-3  # the comparison below is not vacuous
        torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name, reference", HEADS)
def test_head_converts_exactly_both_ways(name, reference):
    ref = classifier(name, reference)
    ours = to_tfm(ref)
    assert type(ours).__name__ == FAMILIES[name].classes[reference]
    assert ours.config.id2label == LABELS and ours.config.num_labels == len(LABELS)
    assert_scores_as_reference(ref, ours, reference)
    back = from_tfm(ours, name)
    assert type(back) is type(ref) and back.config.id2label == LABELS
    assert list(back.state_dict()) == list(ref.state_dict())
    assert all(torch.equal(back.state_dict()[key], tensor) for key, tensor in ref.state_dict().items())


@pytest.mark.parametrize("problem_type, num_labels", [("regression", 1), ("multi_label_classification", 3)])
def test_sequence_classifier_problem_types_convert(problem_type, num_labels):
    """The problem type picks the loss (mean squared error, binary cross-entropy per label): it goes across too."""
    labels = {i: LABELS[i] for i in range(num_labels)}
    overrides = dict(id2label=labels, label2id={label: i for i, label in labels.items()}, problem_type=problem_type)
    ref = classifier("llama", "LlamaForSequenceClassification", **overrides)
    ours = to_tfm(ref)
    assert ours.config.problem_type == problem_type and ours.config.num_labels == num_labels
    assert_scores_as_reference(ref, ours, "LlamaForSequenceClassification", problem_type)
    assert from_tfm(ours, "llama").config.problem_type == problem_type
