"""Shared fixtures: tiny shapes, offline, deterministic."""

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny tensors: intra-op threads only add synchronisation, and under `pytest -n 2` they oversubscribe the two cores
# (a tiny training step measured up to 4x slower with two threads). Subprocesses inherit this too.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from hf_tfm import (
    TfmDecoderConfig,
    TfmDecoderForCausalLM,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
)
from hf_tfm.convert.record import TINY_VOCAB

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

VOCAB = TINY_VOCAB  # the family records' tiny size (hf_tfm.convert.record)


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


def seq2seq(seed: int = 0, **overrides) -> TfmEncoderDecoderForConditionalGeneration:
    """A 2-layer encoder, 3-layer decoder model; a wide init so that greedy decoding does not just repeat a token."""
    fields = dict(decoder_layers=3, initializer_range=0.5, bos_token_id=1, decoder_start_token_id=1)
    torch.manual_seed(seed)
    config = tiny_config(TfmEncoderDecoderConfig, **{**fields, **overrides})
    return TfmEncoderDecoderForConditionalGeneration(config).eval()


def padded_inputs(model) -> dict:
    """A batch of two rows of 7 tokens, the second left-padded by 2, plus 4 decoder tokens for an encoder-decoder."""
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    extra = {"decoder_input_ids": ids[:, :4]} if model.config.is_encoder_decoder else {}
    return dict(input_ids=ids, attention_mask=mask, **extra)


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


def realigned(model):
    """from_pretrained leaves tensors as views into the memory-mapped safetensors file, often only 8-byte aligned,
    and CPU matmul kernels then take another (equally valid) vector path: a logit's last bits may differ (~1e-7)
    although every weight is identical. Copy the tensors into fresh, aligned memory, so that comparing logits
    exactly tests the model rather than the allocator (callers first check the state dicts are bit-identical)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:  # tied parameters appear once and stay tied
            tensor.data = tensor.data.clone()
    return model


@functools.cache
def flex_attention_compiles() -> str | None:
    """None when torch's compiler can build flex_attention on this machine, else why not. Asked of torch alone (no
    hf_tfm code), so a test skips only where the backend itself is unavailable; an error that hf_tfm's code raises
    while being traced still fails it."""
    from torch.nn.attention.flex_attention import flex_attention

    try:
        query = torch.randn(1, 1, 16, 8)
        torch.compile(flex_attention)(query, query, query)
    except Exception as error:  # noqa: BLE001  (any failure of the compiler means the backend is unavailable)
        return f"{type(error).__name__}: {error}".splitlines()[0][:300]
    return None


def require_flex_attention() -> None:
    reason = flex_attention_compiles()
    if reason is not None:
        pytest.skip(f"flex_attention cannot be compiled by this torch build: {reason}")


POSITION_TYPES = ["learned", "sinusoidal", "rope", "alibi", "relative_bias", "none"]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
