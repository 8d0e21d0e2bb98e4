"""Shared fixtures: tiny shapes, offline, deterministic."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny tensors: intra-op threads only add synchronisation, and under `pytest -n 2` they oversubscribe the two cores
# (a tiny training step measured up to 4x slower with two threads). Subprocesses inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from hf_tfm import TfmDecoderConfig, TfmDecoderForCausalLM

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

VOCAB = 97


def tiny_config(config_class=TfmDecoderConfig, **overrides):
    """A config (decoder by default) small enough that a forward pass costs milliseconds on one CPU core."""
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    fields.update(overrides)
    return config_class(**fields)


def tiny_model(seed: int = 0, **overrides) -> TfmDecoderForCausalLM:
    torch.manual_seed(seed)
    return TfmDecoderForCausalLM(tiny_config(**overrides)).eval()


def perturb(model, scale: float = 0.1):
    """Add noise to every tensor a checkpoint holds (norm weights, biases, BART's final_logits_bias; not computed
    buffers such as RoPE's inv_freq), so that a dropped, swapped or transposed tensor changes the outputs well
    beyond tolerance instead of hiding behind a near-zero or all-ones default init."""
    torch.manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():  # shares storage with the model
            if tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor) * scale)
    return model.eval()


def assert_same_state_dict(actual: dict, expected: dict) -> None:
    """Converting there and back must restore every key and every tensor bit for bit."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


POSITION_TYPES = ["learned", "sinusoidal", "rope", "alibi", "relative_bias", "none"]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
