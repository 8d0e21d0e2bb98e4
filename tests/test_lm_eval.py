"""lm-evaluation-harness scores hf_tfm decoders as it scores the transformers class holding the same weights: its
`HFLM` around an hf_tfm model (and around a saved hf_tfm folder, loaded through the Auto classes) gives
LlamaForCausalLM's log-likelihoods, rolling log-likelihoods and greedy continuations, and `simple_evaluate` on a local
YAML multiple-choice task gives the same accuracy."""

import pytest
import torch
from conftest import perturb
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tfm.convert import to_tfm
from hf_tfm.convert.record import TINY_DECODER
from hf_tfm.training.tokenizers import train_tokenizer

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

TEXTS = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine", "hello world"] * 20
CONTEXTS = [("the quick brown", " fox jumps"), ("a stitch in", " time saves nine"), ("hello", " world")]
TASK = """
task: tiny_choices
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
QUESTIONS = [
    {"question": "the quick brown", "choices": [" fox", " dog", " time"], "answer": 0},
    {"question": "a stitch in", "choices": [" nine", " time", " world"], "answer": 1},
    {"question": "hello", "choices": [" world", " fox"], "answer": 0},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size=300)
    special = dict(bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlamaConfig(**dict(TINY_DECODER, vocab_size=320, max_position_embeddings=128, **special))
    torch.manual_seed(0)
    reference = perturb(LlamaForCausalLM(config), scale=0.3)
    ours = to_tfm(reference)
    folder = tmp_path_factory.mktemp("lm-eval") / "tfm"
    ours.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    wrap = dict(tokenizer=tokenizer, batch_size=2, device="cpu")
    return {
        "reference": HFLM(pretrained=reference, **wrap),
        "ours": HFLM(pretrained=ours, **wrap),
        "folder": HFLM(pretrained=str(folder), batch_size=2, device="cpu"),
    }


def requests(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=each, idx=index) for index, each in enumerate(arguments)]


def test_log_likelihoods_equal_the_references(models):
    expected = models["reference"].loglikelihood(requests("loglikelihood", CONTEXTS))
    for name in ("ours", "folder"):
        actual = models[name].loglikelihood(requests("loglikelihood", CONTEXTS))
        assert [greedy for _, greedy in actual] == [greedy for _, greedy in expected], name
        torch.testing.assert_close([v for v, _ in actual], [v for v, _ in expected], rtol=0, atol=1e-4)
    rolling = [(text,) for text in TEXTS[:3]]
    expected = models["reference"].loglikelihood_rolling(requests("loglikelihood_rolling", rolling))
    actual = models["ours"].loglikelihood_rolling(requests("loglikelihood_rolling", rolling))
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)


def test_greedy_continuations_equal_the_references(models):
    until = [(context, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}) for context, _ in CONTEXTS]
    expected = models["reference"].generate_until(requests("generate_until", until))
    assert models["ours"].generate_until(requests("generate_until", until)) == expected


@pytest.mark.slow
def test_a_local_task_scores_the_same(models, tmp_path):
    import json

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(question) + "\n" for question in QUESTIONS))
    (tmp_path / "tiny_choices.yaml").write_text(TASK.format(data=data))
    scores = {}
    for name in ("reference", "ours"):
        results = simple_evaluate(
            model=models[name],
            tasks=["tiny_choices"],
            task_manager=TaskManager(include_path=str(tmp_path)),
            bootstrap_iters=0,
            log_samples=True,
        )
        scores[name] = results["results"]["tiny_choices"]["acc,none"]
        likelihoods = [sample["resps"] for sample in results["samples"]["tiny_choices"]]
        scores[f"{name} responses"] = [[float(r[0][0]) for r in each] for each in likelihoods]
    assert scores["ours"] == scores["reference"]
    torch.testing.assert_close(scores["ours responses"], scores["reference responses"], rtol=0, atol=1e-4)
