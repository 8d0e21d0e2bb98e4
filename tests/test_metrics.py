"""The `evaluate` metric modules shipped in hf_tfm.training.metrics: values, invalid inputs, offline loading."""

import multiprocessing
import socket

import evaluate
import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer
from sklearn.metrics import accuracy_score, f1_score
from transformers import EvalPrediction

from hf_tfm.training.metrics import (
    METRIC_NAMES,
    METRICS_DIR,
    classification_metrics,
    generation_metrics,
    load_metric,
    metric_path,
)


@pytest.fixture(scope="module")
def metrics():
    return {name: load_metric(name) for name in METRIC_NAMES}


def test_shipped_layout():
    assert METRIC_NAMES == ("accuracy", "exact_match", "f1", "rouge", "sacrebleu")
    for name in METRIC_NAMES:
        script = METRICS_DIR / name / f"{name}.py"
        assert script.is_file() and metric_path(name) == script.parent
        assert not (METRICS_DIR / name / "__init__.py").exists()
        source = script.read_text()
        assert "evaluate.Metric" in source and "from evaluate import" not in source
        assert "Apache License" in source
        # shared code comes from the installed package by absolute import: evaluate copies only the script itself
        assert "from hf_tfm.training.metrics import shared\n" in source and "from ." not in source


def test_documented_examples_run(metrics):
    """The Examples in each module's inputs description (what `help(metric.compute)` shows) give what they say."""
    import doctest

    import hf_tfm.training.metrics

    for name, metric in metrics.items():
        test = doctest.DocTestParser().get_doctest(metric.inputs_description, {"hf_tfm": hf_tfm}, name, None, 0)
        assert test.examples, name
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        assert runner.summarize(verbose=False).failed == 0, name


def test_modules(metrics):
    for name, metric in metrics.items():
        assert isinstance(metric, evaluate.Metric)
        assert metric.name == name
        assert metric.description and metric.citation and metric.inputs_description and metric.features


@pytest.mark.parametrize("name", ["acuracy", "bleu", "glue", "", "../accuracy"])
def test_unknown_metric(name):
    with pytest.raises(ValueError, match="unknown metric") as error:
        load_metric(name)
    for known in METRIC_NAMES:
        assert known in str(error.value)


def _no_network(*args, **kwargs):
    raise AssertionError("a metric tried to open a network connection")


def test_loads_offline_without_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    monkeypatch.setattr(socket, "create_connection", _no_network)
    monkeypatch.setattr(socket, "getaddrinfo", _no_network)
    for name in METRIC_NAMES:
        assert load_metric(name).name == name
    assert load_metric("accuracy").compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}
    # The plain evaluate call on the folder works too (what a user with the path would do).
    assert evaluate.load(str(metric_path("f1"))).compute(predictions=[1, 0], references=[1, 1]) == {
        "f1": pytest.approx(2 / 3)
    }


def _load_all(barrier, failures):
    try:
        barrier.wait(timeout=30)
        for name in METRIC_NAMES:
            load_metric(name)
        assert load_metric("exact_match").compute(predictions=["a"], references=["a"]) == {"exact_match": 1.0}
    except BaseException as error:
        failures.put(repr(error))
        raise


def test_concurrent_loading_into_a_fresh_cache(monkeypatch, tmp_path):
    """Several processes (pytest-xdist workers, ranks) copy the same scripts into evaluate's modules cache at once."""
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path)
    context = multiprocessing.get_context("fork")
    barrier, failures = context.Barrier(4), context.Queue()
    workers = [context.Process(target=_load_all, args=(barrier, failures)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * 4, failures.get(timeout=1)
    for name in METRIC_NAMES:
        (copy,) = (tmp_path / "evaluate_modules" / "metrics" / name).glob(f"*/{name}.py")
        assert copy.read_text() == (METRICS_DIR / name / f"{name}.py").read_text()


def test_nothing_written_to_the_metrics_cache(metrics, tmp_path):
    metric = load_metric("accuracy", cache_dir=str(tmp_path))
    metric.add_batch(predictions=[0, 1], references=[0, 0])
    assert metric.compute(predictions=[1], references=[1]) == {"accuracy": pytest.approx(2 / 3)}
    assert not list(tmp_path.rglob("*.arrow"))
    on_disk = load_metric("accuracy", cache_dir=str(tmp_path), keep_in_memory=False)
    assert on_disk.compute(predictions=[0, 1], references=[0, 0]) == {"accuracy": 0.5}


# accuracy -----------------------------------------------------------------------------------------------------------


def test_accuracy_by_hand(metrics):
    accuracy = metrics["accuracy"]
    assert accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2]) == {"accuracy": 0.5}
    assert accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], normalize=False) == {"accuracy": 2}
    weighted = accuracy.compute(predictions=[0, 1, 2, 0], references=[0, 1, 1, 2], sample_weight=[0.5, 2, 0.7, 0.8])
    assert weighted["accuracy"] == pytest.approx(2.5 / 4.0)
    count = accuracy.compute(predictions=[0, 1, 2], references=[0, 1, 1], sample_weight=[0.5, 2, 7], normalize=False)
    assert count["accuracy"] == pytest.approx(2.5)
    assert accuracy.compute(predictions=[3], references=[3]) == {"accuracy": 1.0}


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_against_sklearn(metrics, seed):
    rng = np.random.default_rng(seed)
    predictions, references = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    weights = rng.random(200)
    accuracy = metrics["accuracy"]
    for kwargs in (
        {},
        {"normalize": False},
        {"sample_weight": weights},
        {"sample_weight": weights, "normalize": False},
    ):
        result = accuracy.compute(predictions=predictions, references=references, **kwargs)["accuracy"]
        assert result == pytest.approx(accuracy_score(references, predictions, **kwargs)), kwargs


def test_accuracy_invalid(metrics):
    accuracy = metrics["accuracy"]
    with pytest.raises(ValueError):
        accuracy.compute(predictions=[0, 1], references=[0])
    with pytest.raises(ValueError):
        accuracy.compute(predictions=[], references=[])
    with pytest.raises(ValueError, match="sample_weight"):
        accuracy.compute(predictions=[0, 1], references=[0, 1], sample_weight=[1.0])
    with pytest.raises(ValueError, match="sample_weight"):
        accuracy.compute(predictions=[0, 1], references=[0, 1], sample_weight=[1.0, -1.0])
    with pytest.raises(ValueError):
        accuracy.compute(predictions=["a", "b"], references=[0, 1])


# f1 -----------------------------------------------------------------------------------------------------------------


def test_f1_by_hand(metrics):
    f1 = metrics["f1"]
    # binary: TP=1, FP=1, FN=0 -> 2 / (2 + 1) = 2/3
    assert f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["f1"] == pytest.approx(2 / 3)
    # pos_label=0: TP=2, FP=0, FN=1 -> 4/5
    assert f1.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0], pos_label=0)["f1"] == pytest.approx(0.8)
    # 3 classes. class 0: TP=2 FP=1 FN=0 -> 4/5; class 1: TP=0 FP=2 FN=2 -> 0; class 2: TP=0 FP=1 FN=2 -> 0
    predictions, references = [0, 2, 1, 0, 0, 1], [0, 1, 2, 0, 1, 2]
    assert f1.compute(predictions=predictions, references=references, average="macro")["f1"] == pytest.approx(0.8 / 3)
    # micro: TP=2, FP=4, FN=4 -> 4 / 12
    assert f1.compute(predictions=predictions, references=references, average="micro")["f1"] == pytest.approx(1 / 3)
    # weighted by support (2, 2, 2): same as macro here
    assert f1.compute(predictions=predictions, references=references, average="weighted")["f1"] == pytest.approx(
        0.8 / 3
    )
    per_class = f1.compute(predictions=predictions, references=references, average=None)["f1"]
    assert per_class == pytest.approx([0.8, 0.0, 0.0])
    # labels subset and an absent label: [2, 0, 7] -> [0, 0.8, 0 (zero_division)]
    subset = f1.compute(predictions=predictions, references=references, average=None, labels=[2, 0, 7])["f1"]
    assert subset == pytest.approx([0.0, 0.8, 0.0])
    # nothing positive anywhere: zero_division
    assert f1.compute(predictions=[0, 0], references=[0, 0])["f1"] == 0.0
    assert f1.compute(predictions=[0, 0], references=[0, 0], zero_division=1.0)["f1"] == 1.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("average", ["micro", "macro", "weighted", None])
def test_f1_against_sklearn_multiclass(metrics, seed, average):
    rng = np.random.default_rng(seed)
    predictions, references = rng.integers(0, 6, 300), rng.integers(0, 5, 300)
    weights = rng.random(300)
    for kwargs in ({}, {"labels": [4, 1, 3]}, {"sample_weight": weights}, {"labels": [0, 2, 9]}):
        expected = f1_score(references, predictions, average=average, zero_division=0.0, **kwargs)
        result = metrics["f1"].compute(predictions=predictions, references=references, average=average, **kwargs)
        assert np.allclose(result["f1"], expected), kwargs


@pytest.mark.parametrize("seed", range(3))
def test_f1_against_sklearn_binary(metrics, seed):
    rng = np.random.default_rng(seed)
    predictions, references = rng.integers(0, 2, 100), rng.integers(0, 2, 100)
    weights = rng.random(100)
    for kwargs in ({}, {"pos_label": 0}, {"sample_weight": weights}):
        expected = f1_score(references, predictions, **kwargs)
        result = metrics["f1"].compute(predictions=predictions, references=references, **kwargs)["f1"]
        assert result == pytest.approx(expected), kwargs


def test_f1_invalid(metrics):
    f1 = metrics["f1"]
    with pytest.raises(ValueError, match="multiclass"):
        f1.compute(predictions=[0, 1, 2], references=[0, 1, 1])
    with pytest.raises(ValueError, match="pos_label"):
        f1.compute(predictions=[0, 2], references=[2, 0])
    with pytest.raises(ValueError, match="average"):
        f1.compute(predictions=[0, 1], references=[0, 1], average="samples")
    with pytest.raises(ValueError):
        f1.compute(predictions=[0, 1], references=[0])
    with pytest.raises(ValueError, match="sample_weight"):
        f1.compute(predictions=[0, 1], references=[0, 1], sample_weight=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="sample_weight"):
        f1.compute(predictions=[0, 1], references=[0, 1], sample_weight=[1.0, -2.0])
    with pytest.raises(ValueError, match="labels"):  # scikit-learn alone returns nan
        f1.compute(predictions=[0, 1], references=[0, 1], average="macro", labels=[])


# exact_match --------------------------------------------------------------------------------------------------------


def test_exact_match_by_hand(metrics):
    exact_match = metrics["exact_match"]
    predictions, references = ["Paris", "rome ", "Berlin!", "cat 2"], ["Paris", "Rome", "berlin", "cat 3"]
    assert exact_match.compute(predictions=predictions, references=references) == {"exact_match": 0.25}
    assert exact_match.compute(predictions=predictions, references=references, ignore_case=True)["exact_match"] == 0.25
    both = exact_match.compute(predictions=predictions, references=references, ignore_case=True, strip=True)
    assert both == {"exact_match": 0.5}
    three = exact_match.compute(
        predictions=predictions, references=references, ignore_case=True, strip=True, ignore_punctuation=True
    )
    assert three == {"exact_match": 0.75}
    all_four = exact_match.compute(
        predictions=predictions,
        references=references,
        ignore_case=True,
        strip=True,
        ignore_punctuation=True,
        ignore_numbers=True,
    )
    assert all_four == {"exact_match": 1.0}
    regexes = exact_match.compute(predictions=["the cat"], references=["a cat"], regexes_to_ignore=["the ", "a "])
    assert regexes == {"exact_match": 1.0}
    # Unicode: casefold and Unicode punctuation
    assert exact_match.compute(predictions=["STRASSE"], references=["straße"], ignore_case=True)["exact_match"] == 1.0
    unicode_punctuation = exact_match.compute(
        predictions=["«oui» ¿no?"], references=["oui no"], ignore_punctuation=True
    )
    assert unicode_punctuation == {"exact_match": 1.0}
    assert exact_match.compute(predictions=["a  b\n"], references=["a b"], strip=True) == {"exact_match": 1.0}


def test_exact_match_invalid(metrics):
    exact_match = metrics["exact_match"]
    with pytest.raises(ValueError):
        exact_match.compute(predictions=["a", "b"], references=["a"])
    with pytest.raises(ValueError):
        exact_match.compute(predictions=[], references=[])
    with pytest.raises(ValueError):
        exact_match.compute(predictions=[1, 2], references=["1", "2"])


# sacrebleu ----------------------------------------------------------------------------------------------------------

HYPOTHESES = ["the cat sat on the mat", "a quick brown fox jumped over the dog", "hello there general kenobi"]
REFERENCES = [
    ["the cat sat on a mat", "there is a cat on the mat"],
    ["the quick brown fox jumps over the lazy dog", "a fast brown fox leaps over a dog"],
    ["hello there general kenobi", "hi general kenobi"],
]


def test_sacrebleu_against_sacrebleu(metrics):
    streams = [list(stream) for stream in zip(*REFERENCES)]
    result = metrics["sacrebleu"].compute(predictions=HYPOTHESES, references=REFERENCES)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, streams)
    assert result["score"] == pytest.approx(expected.score)
    assert result["counts"] == expected.counts and result["totals"] == expected.totals
    assert result["precisions"] == pytest.approx(expected.precisions)
    assert (result["bp"], result["sys_len"], result["ref_len"]) == (expected.bp, expected.sys_len, expected.ref_len)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, streams).score)
    assert result["signature"].startswith("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp")

    options = {"lowercase": True, "tokenize": "char", "smooth_method": "floor", "smooth_value": 0.2}
    lowered = metrics["sacrebleu"].compute(predictions=HYPOTHESES, references=REFERENCES, **options)
    assert lowered["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, streams, **options).score)


def test_sacrebleu_by_hand(metrics):
    perfect = metrics["sacrebleu"].compute(
        predictions=["the cat sat on the mat"], references=["the cat sat on the mat"]
    )
    assert perfect["score"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    assert perfect["counts"] == [6, 5, 4, 3] and perfect["bp"] == 1.0
    nothing = metrics["sacrebleu"].compute(predictions=["x y z w"], references=["a b c d"])
    assert nothing["score"] == 0.0
    single = [refs[0] for refs in REFERENCES]
    as_strings = metrics["sacrebleu"].compute(predictions=HYPOTHESES, references=single)
    as_lists = metrics["sacrebleu"].compute(predictions=HYPOTHESES, references=[[ref] for ref in single])
    assert as_strings == as_lists


def test_sacrebleu_invalid(metrics):
    with pytest.raises(ValueError, match="same number"):
        metrics["sacrebleu"].compute(predictions=["a", "b"], references=[["a", "b"], ["b"]])
    with pytest.raises(ValueError):
        metrics["sacrebleu"].compute(predictions=["a", "b"], references=[["a"]])
    with pytest.raises(ValueError):
        metrics["sacrebleu"].compute(predictions=[], references=[])
    with pytest.raises(TypeError, match="smoothing"):  # a misspelled option of sacrebleu's BLEU, named
        metrics["sacrebleu"].compute(predictions=["a"], references=["a"], smoothing="exp")


# rouge --------------------------------------------------------------------------------------------------------------


def test_rouge_by_hand(metrics):
    # 3 shared unigrams; P = 3/3, R = 3/4 -> F = 6/7. Bigrams: 2 shared; P = 2/2, R = 2/3 -> F = 4/5.
    result = metrics["rouge"].compute(predictions=["the cat sat"], references=["the cat sat down"])
    assert result == pytest.approx({"rouge1": 6 / 7, "rouge2": 0.8, "rougeL": 6 / 7, "rougeLsum": 6 / 7})
    only = metrics["rouge"].compute(predictions=["the cat sat"], references=["the cat sat down"], rouge_types="rouge1")
    assert only == pytest.approx({"rouge1": 6 / 7})
    per_example = metrics["rouge"].compute(
        predictions=["a b", "c d"], references=["a b", "x y"], rouge_types=["rouge1"], use_aggregator=False
    )
    assert per_example == {"rouge1": [1.0, 0.0]}


def test_rouge_against_rouge_score(metrics):
    predictions = ["the cat was found under the bed\nit slept", "the quick fox", "Hello World"]
    references = ["the cat was under the bed\nit was asleep", "a quick brown fox jumps", "hello world"]
    types = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    for use_stemmer in (False, True):
        scorer = rouge_scorer.RougeScorer(types, use_stemmer=use_stemmer)
        scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
        expected = {t: float(np.mean([s[t].fmeasure for s in scores])) for t in types}
        result = metrics["rouge"].compute(predictions=predictions, references=references, use_stemmer=use_stemmer)
        assert result == pytest.approx(expected)
    # several references: the best one per prediction, as rouge_score's score_multi
    multi = [[references[0], predictions[0]], [references[1]], ["x", references[2]]]
    scorer = rouge_scorer.RougeScorer(types)
    expected = {
        t: float(np.mean([scorer.score_multi(refs, pred)[t].fmeasure for pred, refs in zip(predictions, multi)]))
        for t in types
    }
    assert metrics["rouge"].compute(predictions=predictions, references=multi) == pytest.approx(expected)


def test_rouge_custom_tokenizer(metrics):
    """rouge_score's default tokenizer keeps [a-z0-9] only: non-Latin text needs a tokenizer."""
    predictions, references = ["東 京 タ ワ ー"], ["東 京 タ ワ"]
    default = metrics["rouge"].compute(predictions=predictions, references=references, rouge_types=["rouge1"])
    assert default == {"rouge1": 0.0}
    split = metrics["rouge"].compute(
        predictions=predictions, references=references, rouge_types=["rouge1"], tokenizer=str.split
    )
    assert split["rouge1"] == pytest.approx(8 / 9)


def test_rouge_invalid(metrics):
    with pytest.raises(ValueError, match="ROUGE type"):
        metrics["rouge"].compute(predictions=["a"], references=["a"], rouge_types=["rougeX"])
    with pytest.raises(ValueError):
        metrics["rouge"].compute(predictions=["a", "b"], references=["a"])
    with pytest.raises(ValueError):
        metrics["rouge"].compute(predictions=["a"], references=["a"], rouge_types=[])


# helpers for Trainer.compute_metrics --------------------------------------------------------------------------------


def test_classification_metrics_sequences():
    logits = np.array([[2.0, 0.1, 0.0], [0.0, 1.0, 0.5], [0.3, 0.2, 0.9], [1.0, 0.0, 0.0]])
    labels = np.array([0, 1, 1, 2])  # predictions 0, 1, 2, 0
    result = classification_metrics(EvalPrediction(predictions=logits, label_ids=labels))
    assert result["accuracy"] == pytest.approx(0.5)
    assert result["f1"] == pytest.approx(f1_score(labels, [0, 1, 2, 0], average="macro"))
    # a tuple of outputs (logits first) and predictions already reduced to ids
    assert classification_metrics(EvalPrediction(predictions=(logits, np.zeros(3)), label_ids=labels)) == result
    ids = np.array([0, 1, 2, 0])
    assert classification_metrics(EvalPrediction(predictions=ids, label_ids=labels)) == result


def test_classification_metrics_tokens():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 7, 5))
    labels = rng.integers(0, 5, (4, 7))
    labels[:, 0] = -100  # [CLS]
    labels[1, 4:] = -100  # padding
    labels[2, 2] = -100  # a word's second sub-token
    keep = labels != -100
    predictions = logits.argmax(-1)[keep]
    result = classification_metrics(EvalPrediction(predictions=logits, label_ids=labels))
    assert result["accuracy"] == pytest.approx(accuracy_score(labels[keep], predictions))
    assert result["f1"] == pytest.approx(f1_score(labels[keep], predictions, average="macro"))
    with pytest.raises(ValueError, match="-100"):
        classification_metrics(EvalPrediction(predictions=logits, label_ids=np.full((4, 7), -100)))


def test_generation_metrics():
    from hf_tfm.training.tokenizers import train_unigram

    texts = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the sea"] * 20
    tokenizer = train_unigram(texts, vocab_size=60)
    labels = tokenizer(texts[:3], padding=True, return_tensors="np")["input_ids"]
    labels = np.where(labels == tokenizer.pad_token_id, -100, labels)
    predictions = tokenizer(["the cat sat on the mat", "a dog ran", "birds"], padding=True, return_tensors="np")
    result = generation_metrics(EvalPrediction(predictions=predictions["input_ids"], label_ids=labels), tokenizer)
    assert set(result) == {"bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum", "exact_match"}
    assert result["exact_match"] == pytest.approx(1 / 3)
    expected = sacrebleu.corpus_bleu(["the cat sat on the mat", "a dog ran", "birds"], [texts[:3]])
    assert result["bleu"] == pytest.approx(expected.score)
