"""hf_tfm decoders written as GGUF by `hf_tfm.export.gguf.write_llama_gguf` run in llama.cpp itself (through
llama-cpp-python, built from source): the file opens with the model's tokenizer or without one, llama.cpp's logits
equal hf_tfm's within float32 tolerance with a float32 KV cache, greedy tokens are equal, and stay equal after
llama.cpp's own f16 and q8_0 quantisation. Run by `make test-llama-cpp` in its own venv; not part of `make test`
(building llama.cpp takes about 14 minutes on 2 cores)."""

import llama_cpp
import numpy as np
import pytest
import torch
from conftest import perturb

import hf_tfm
from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.convert import with_fused_qkv
from hf_tfm.export.gguf import write_llama_gguf
from hf_tfm.training.tokenizers import train_tokenizer

GGML_TYPE_F32 = 0  # llama.cpp's cache type for a float32 KV cache
FTYPES = {"f16": 1, "q8_0": 7}  # llama_ftype values
TEXTS = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine", "hello world"] * 30
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = train_tokenizer(TEXTS, "bpe", vocab_size=300)
    config = hf_tfm.preset_config("llama-1.3m")
    config.vocab_size = 320
    torch.manual_seed(0)
    return perturb(TfmDecoderForCausalLM(config), scale=0.05).eval(), tokenizer


def engine(path) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        str(path), n_ctx=64, logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False, seed=0
    )


def llama_cpp_logits(llm: llama_cpp.Llama, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


def greedy(llm: llama_cpp.Llama, ids: list[int]) -> list[int]:
    llm.reset()
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1):
        out.append(token)
        if len(out) == NEW_TOKENS:
            break
    return out


@pytest.mark.parametrize(
    ("with_tokenizer", "fused_qkv"),
    [(True, False), (False, False), (True, True)],
    ids=["tokenizer", "ids-only", "fused-qkv"],
)
def test_llama_cpp_computes_hf_tfms_logits_and_tokens(tmp_path, model_and_tokenizer, with_tokenizer, fused_qkv):
    """fused-qkv: the model stores q/k/v as one qkv_proj (fused_qkv_proj); the GGUF file holds llama.cpp's three."""
    model, tokenizer = model_and_tokenizer
    if fused_qkv:
        model = with_fused_qkv(model, True)
    path = write_llama_gguf(model, tmp_path / "model.gguf", tokenizer=tokenizer if with_tokenizer else None)
    llm = engine(path)
    ids = tokenizer("the lazy fox saves time")["input_ids"]
    if with_tokenizer:
        assert llm.tokenize(b"the lazy fox saves time", add_bos=False, special=False) == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
        reference = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )[0, len(ids) :].tolist()
    difference = np.abs(llama_cpp_logits(llm, ids) - expected).max()
    print(f"llama.cpp f32 logits: max |difference| {difference:.2e}")
    assert difference < 1e-4
    assert greedy(llm, ids) == reference


@pytest.mark.parametrize("ftype", FTYPES)
def test_llama_cpps_own_quantisation_keeps_the_greedy_tokens(tmp_path, model_and_tokenizer, ftype):
    model, tokenizer = model_and_tokenizer
    source = write_llama_gguf(model, tmp_path / "model.gguf", tokenizer=tokenizer)
    target = tmp_path / f"model-{ftype}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params) == 0
    ids = tokenizer("a stitch in time")["input_ids"]
    with torch.no_grad():
        reference = model.generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
        )[0, len(ids) :].tolist()
    assert greedy(engine(target), ids) == reference
