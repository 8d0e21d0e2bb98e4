"""A compiled training step, predicted on the CPU (benchmarks/compiled.py): inductor's own count of the bytes its
kernels read and write. hf_tfm's chunked loss, compiled, writes its gradient straight into the matmul's dtype (no
float32 [tokens, vocab] buffer between log_softmax and the cast), and every pair's compiled step is one graph.
Inductor's counts are exact for a given torch, so they hold on a loaded machine; the CPU compiles each case in
seconds."""

import pytest
import torch

from benchmarks import compiled
from benchmarks.measure import training_batch
from benchmarks.pairs import KINDS, PROFILES, build_pair
from hf_tfm.model.modeling_tfm_lm_head import linear_cross_entropy

pytestmark = [pytest.mark.slow]

# the paths of the chunked loss, compiled by inductor with the model (test_compile.py traces every paradigm with
# cheaper backends): a padded (aligned) vocabulary, soft-capped logits sliced short of the padding, the masked LM's
# rows, a bias added after the matmul
PAIRS = ["gpt2", "gemma2", "bert", "bart"]


@pytest.fixture(scope="module", autouse=True)
def counted():
    compiled.count_inductor_bytes()


@pytest.mark.parametrize("name", PAIRS)
def test_a_compiled_training_step_is_one_graph(name):
    spec = PROFILES["smoke"]["pairs"][name]
    _, ours = build_pair(name, spec["config"])
    task, vocab = KINDS[name].task, ours.config.vocab_size
    inputs = training_batch(task, vocab, spec["batch"], spec["length"], spec.get("target_length"), "cpu")
    counts = compiled.compiled_step(ours, inputs, torch.bfloat16)
    assert (counts["graphs"], counts["graph_breaks"]) == (1, 0), counts
    assert counts["gb"] > 0 and counts["kernels"] > 0, counts


def loss_bytes(loss_function) -> float:
    """Inductor's gigabytes for one compiled loss and its backward, under bf16 autocast (a GPU profile's policy)."""
    torch.manual_seed(0)
    hidden = torch.randn(512, 64, requires_grad=True)
    weight = (torch.randn(8000, 64) * 0.02).requires_grad_()
    labels = torch.randint(0, 8000, (512,))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.compile(loss_function)(hidden, weight, labels)
        loss.backward()

    return compiled.inductor_counts(step)["gb"]


def test_the_compiled_chunked_loss_moves_about_the_references_bytes():
    def reference(hidden, weight, labels):  # transformers' head and ForCausalLMLoss: logits, upcast, cross-entropy
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, weight).float(), labels)

    def chunked(hidden, weight, labels):  # in one chunk: the formulation, not the chunking
        return linear_cross_entropy(hidden, weight, None, labels, 512)

    ours, theirs = loss_bytes(chunked), loss_bytes(reference)
    # 1.12x (the weight gradient summed in float32, the aligned copy of the weight); 1.98x while the gradient went
    # through a float32 [tokens, vocab] buffer before its cast. (Each further chunk adds a float32 read and write of
    # the weight gradient: GPT-2's whole compiled step at 4 x 256 tokens, 1.00x the reference's bytes.)
    assert ours <= theirs * 1.25, (ours, theirs)
