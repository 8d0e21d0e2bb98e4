"""The task records (`hf_tfm.training.tasks.TASKS`) that every module reads, and the embedded seq2seq data."""

import subprocess
import sys

import pytest
from conftest import tiny_config

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig, TfmEncoderForQuestionAnswering
from hf_tfm.hub.card import RunRecord, RunRecordError, pipeline_tag_of
from hf_tfm.model.modeling_tfm_loading import AUTO_CLASSES
from hf_tfm.training import data
from hf_tfm.training.corpus import in_validation
from hf_tfm.training.data import arity, embedded_dataset
from hf_tfm.training.tasks import TASKS, baselines, head_for_architecture, task_for_architecture
from hf_tfm.training.tokenizers import TOKENIZER_KINDS
from hf_tfm_cli import TASKS as CLI_TASKS


def test_every_task_record_is_complete_and_agrees_with_the_cli():
    assert tuple(TASKS) == tuple(CLI_TASKS)
    assert set(data.EMBEDDED) == set(TASKS)
    configs = (TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig)
    heads_of_our_models = {auto for config in configs for auto in AUTO_CLASSES[config.model_type]}
    for name, task in TASKS.items():
        assert task.name == name and task.tokenizer in TOKENIZER_KINDS
        assert task.head.auto_class in heads_of_our_models
        assert task_for_architecture(f"Tfm{task.head.suffix}") == name
        assert (task.label_column is not None) == name.endswith("classification")
        assert task.label_column is None or task.label_column in task.columns


def test_model_cards_accept_exactly_the_training_tasks():
    """The card once accepted a `question-answering` run record that no training run can write."""
    for name in TASKS:
        assert RunRecord.from_dict({"task": name}).task == name
    with pytest.raises(RunRecordError, match="unknown task 'question-answering'"):
        RunRecord.from_dict({"task": "question-answering"})


def test_heads_by_architecture_suffix():
    """One table gives the Auto class and pipeline tag of every head, trained by us or not; the longest suffix wins."""
    assert head_for_architecture("GPT2LMHeadModel").auto_class == "AutoModelForCausalLM"
    assert head_for_architecture("TfmEncoderModel").pipeline_tag == "feature-extraction"
    assert head_for_architecture("TfmEncoderForQuestionAnswering").pipeline_tag == "question-answering"
    assert head_for_architecture("SomethingElse") is None
    with pytest.raises(ValueError, match="no training task uses the head 'TfmEncoderForQuestionAnswering'"):
        task_for_architecture("TfmEncoderForQuestionAnswering")


def test_pipeline_tag_of_an_untrained_qa_head():
    model = TfmEncoderForQuestionAnswering(tiny_config(TfmEncoderConfig))
    assert pipeline_tag_of(model) == "question-answering"
    assert pipeline_tag_of(model, "sequence-classification") == "text-classification"


@pytest.mark.slow
def test_model_cards_and_task_records_import_without_datasets_or_evaluate():
    """A core install (no datasets, evaluate, scikit-learn) still writes model cards, which read the task records."""
    code = (
        "import sys\n"
        "for name in ('datasets', 'evaluate', 'sklearn'): sys.modules[name] = None  # importing them fails\n"
        "import hf_tfm.hub.card, hf_tfm.training.tasks\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("signature", "count"),
    [
        ("get(self, key, default=None)", "1 to 2"),
        ("close(self)", "0"),
        ("from_file(cls, path: str, /, mode='r')", "1 to 2"),
        ("replace(self, /, *, name)", "1"),
        ("f(a, b: int = 1, *, c, d=2)", "2 to 4"),
        ("run(*popenargs, input=None, check=False, **kwargs)", "0 or more"),
        ("join(sep, *parts)", "1 or more"),
    ],
)
def test_arity(signature, count):
    assert arity(signature) == count


def test_embedded_seq2seq_pairs_are_split_by_function():
    """Signature -> arity pairs of real stdlib functions; no validation function name appears in training, and the
    baselines include copying the source and always answering the most frequent target."""
    pairs = embedded_dataset("seq2seq", max_files=40)
    train, validation = pairs["train"].to_dict(), pairs["validation"].to_dict()
    assert len(validation["source"]) > 0 and len(train["source"]) > 10 * len(validation["source"])
    train_names, validation_names = ({s.split("(")[0] for s in split["source"]} for split in (train, validation))
    assert not train_names & validation_names
    assert all(in_validation(name) for name in validation_names)
    assert all(arity(s) == t for s, t in zip(train["source"], train["target"]))
    names_of_baselines = {b["name"] for b in baselines("seq2seq", pairs, 512, None)}
    assert "copy the source" in names_of_baselines and any(name.startswith("always ") for name in names_of_baselines)
