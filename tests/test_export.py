"""Shipping without PyTorch modeling code: torch.export through transformers' static-cache wrapper (the ExecuTorch
path) and ONNX (hf_tfm.export.onnx) run by onnxruntime, each proved against hf_tfm's own outputs."""

import numpy as np
import pytest
import torch
from conftest import perturb, tiny_config
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

from hf_tfm import (
    TfmDecoderForCausalLM,
    TfmEncoderConfig,
    TfmEncoderDecoderConfig,
    TfmEncoderDecoderForConditionalGeneration,
    TfmEncoderForMaskedLM,
    TfmEncoderForQuestionAnswering,
    TfmEncoderForSequenceClassification,
    TfmEncoderModel,
)
from hf_tfm.export.onnx import OnnxGreedy, export_onnx

onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras: pip install '.[test]'")

DECODERS = {
    "dense": dict(position_embedding_type="rope", num_key_value_heads=2),
    "moe": dict(position_embedding_type="rope", num_experts=4, num_experts_per_tok=2, hidden_act="silu"),
    # GPT-2's layout: learned positions, one q/k/v matrix (fused_qkv_proj)
    "fused-qkv": dict(position_embedding_type="learned", fused_qkv_proj=True),
}


def decoder(**overrides) -> TfmDecoderForCausalLM:
    torch.manual_seed(0)
    return perturb(TfmDecoderForCausalLM(tiny_config(**overrides)), scale=0.5)


def left_padded(batch: int = 2, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(3, 97, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, : length // 3] = 0
    return ids, mask


# ------------------------------------------------------------------------------------------------- torch.export


@pytest.mark.parametrize("kind", DECODERS)
def test_torch_export_with_static_cache_generates_the_same_tokens(kind):
    model = decoder(**DECODERS[kind])
    model.generation_config.cache_implementation = "static"
    exportable = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=32)
    program = exportable.export(input_ids=torch.tensor([[5]]), cache_position=torch.tensor([0]))
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    # the ExecuTorch runner's loop: one module, the cache in its buffers, one token per call. (transformers'
    # TorchExportableModuleWithStaticCache.generate calls program.module() at every step, which starts each step
    # from the buffers as exported, an empty cache: its tokens diverge for transformers' own Llama as well.)
    runner, tokens = program.module(), prompt
    for position in range(prompt.shape[1]):
        logits = runner(input_ids=prompt[:, position : position + 1], cache_position=torch.tensor([position]))
    for _ in range(10):
        token = logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, token], dim=-1)
        logits = runner(input_ids=token, cache_position=torch.tensor([tokens.shape[1] - 1]))
    expected = model.generate(prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(tokens, expected)
    assert len(set(expected[0, 5:].tolist())) > 1  # not a constant continuation that any bug would also give


# --------------------------------------------------------------------------------------------------------- ONNX


def assert_close_on_real_tokens(actual, expected, mask):
    real = mask.bool()
    torch.testing.assert_close(torch.from_numpy(actual)[real], expected[real], rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.slow
def test_onnx_decoder_with_cache_generates_the_same_tokens(tmp_path, kind):
    """Dynamic batch, length and cache length; left-padded prompts; the loop feeds back present as past."""
    model = decoder(**DECODERS[kind])
    export_onnx(model, tmp_path)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    for batch, length in [(2, 6), (3, 9)]:
        ids, mask = left_padded(batch, length)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        past = OnnxGreedy(tmp_path)._empty_past(batch)
        logits = session.run(
            ["logits"],
            {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": positions.numpy(), **past},
        )[0]
        with torch.no_grad():
            expected = model(ids, attention_mask=mask, position_ids=positions).logits
        assert_close_on_real_tokens(logits, expected, mask)
        tokens = OnnxGreedy(tmp_path).generate(ids, mask, max_new_tokens=8)
        assert torch.equal(tokens, model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize(
    "head",
    [TfmEncoderForMaskedLM, TfmEncoderForSequenceClassification, TfmEncoderForQuestionAnswering, TfmEncoderModel],
)
@pytest.mark.slow
def test_onnx_encoder_matches_on_padded_batches(tmp_path, head):
    torch.manual_seed(0)
    model = perturb(head(tiny_config(TfmEncoderConfig, position_embedding_type="relative_bias")), scale=0.5)
    export_onnx(model, tmp_path)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    names = [output.name for output in session.get_outputs()]
    assert names == {"TfmEncoderModel": ["last_hidden_state", "pooler_output"]}.get(
        head.__name__, ["start_logits", "end_logits"] if "Question" in head.__name__ else ["logits"]
    )
    for batch, length in [(2, 6), (4, 11)]:
        ids, mask = left_padded(batch, length)
        actual = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            expected = model(ids, attention_mask=mask)
        for name, value in zip(names, actual):
            if expected[name].dim() == 2 and name != "start_logits" and name != "end_logits":  # one row each
                torch.testing.assert_close(torch.from_numpy(value), expected[name], rtol=0, atol=1e-4)
            else:
                assert_close_on_real_tokens(value, expected[name], mask)


@pytest.mark.slow
def test_onnx_encoder_decoder_with_cache_generates_the_same_tokens(tmp_path):
    torch.manual_seed(0)
    config = tiny_config(TfmEncoderDecoderConfig, decoder_start_token_id=0, position_embedding_type="relative_bias")
    model = perturb(TfmEncoderDecoderForConditionalGeneration(config), scale=0.5)
    export_onnx(model, tmp_path)
    for batch, length in [(2, 6), (3, 9)]:
        ids, mask = left_padded(batch, length)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        assert torch.equal(OnnxGreedy(tmp_path).generate(ids, mask, max_new_tokens=8), expected)
        assert len(set(expected[0, 1:].tolist())) > 1
    encoder = onnxruntime.InferenceSession(str(tmp_path / "encoder.onnx"))
    hidden = encoder.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        expected_hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close_on_real_tokens(hidden, expected_hidden, mask)


@pytest.mark.slow
def test_onnx_export_keeps_the_models_attention_backend_and_training_mode(tmp_path):
    model = decoder(**DECODERS["dense"]).train()
    model.set_attn_implementation("sdpa")
    export_onnx(model, tmp_path)
    assert (model.config._attn_implementation, model.training) == ("sdpa", True)


# --------------------------------------------------------------------------------------------------------- GGUF


def test_gguf_written_from_a_converted_model_reads_back_and_loads_exactly(tmp_path, monkeypatch):
    """The gguf package reads back every tensor and the metadata llama.cpp needs; transformers' GGUF loader (which
    undoes llama.cpp's Q/K row order) gives hf_tfm's logits exactly. Without that row order it would not."""
    gguf = pytest.importorskip("gguf", reason="gguf is in the export extras")
    from transformers import LlamaForCausalLM

    import hf_tfm
    from hf_tfm.export import gguf as gguf_export

    torch.manual_seed(0)
    model = perturb(TfmDecoderForCausalLM(hf_tfm.preset_config("llama-1.3m")), scale=0.05)
    gguf_export.write_llama_gguf(model, tmp_path / "model.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    config = model.config
    assert len(reader.tensors) == 2 + 9 * config.num_hidden_layers  # tied: no output.weight
    fields = {name: field.parts[-1] for name, field in reader.fields.items()}
    assert fields["general.architecture"].tobytes() == b"llama"
    assert int(fields["llama.block_count"][0]) == config.num_hidden_layers
    assert int(fields["llama.attention.head_count_kv"][0]) == config.num_key_value_heads
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert np.array_equal(np.asarray(embedding.data), model.model.embed_tokens.weight.detach().numpy())
    ids = torch.randint(3, config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf")
        assert torch.equal(loaded(ids).logits, expected)
        monkeypatch.setattr(gguf_export, "llama_cpp_rows", lambda weight, heads: weight)  # negative control
        gguf_export.write_llama_gguf(model, tmp_path / "unpermuted.gguf")
        unpermuted = LlamaForCausalLM.from_pretrained(tmp_path, gguf_file="unpermuted.gguf")
        assert (unpermuted(ids).logits - expected).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_gguf_carries_the_tokenizer_llama_cpp_reads(tmp_path, kind):
    """With the model's tokenizer the file names llama.cpp's vocabulary type and holds every token in id order with
    its special ids (llama.cpp refuses a file without `tokenizer.ggml.model`); transformers' GGUF tokenizer reader
    rebuilds a tokenizer from it that splits text as the original does (BPE: from the merges)."""
    gguf = pytest.importorskip("gguf", reason="gguf is in the export extras")
    import hf_tfm
    from hf_tfm.export import gguf as gguf_export
    from hf_tfm.training.tokenizers import train_tokenizer

    texts = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine", "hello world"] * 30
    tokenizer = train_tokenizer(texts, kind, vocab_size=300)
    config = hf_tfm.preset_config("llama-1.3m")
    config.vocab_size = 320  # a table larger than the tokenizer's vocabulary: placeholder tokens fill it
    model = TfmDecoderForCausalLM(config)
    gguf_export.write_llama_gguf(model, tmp_path / "model.gguf", tokenizer=tokenizer)
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    field = reader.fields["tokenizer.ggml.model"]
    assert (
        bytes(field.parts[field.data[0]]).decode()
        == gguf_export.VOCABULARIES[{"bpe": "BPE", "wordpiece": "WordPiece", "unigram": "Unigram"}[kind]]
    )
    tokens = reader.fields["tokenizer.ggml.tokens"]
    listed = [bytes(tokens.parts[index]).decode() for index in tokens.data]
    assert len(listed) == 320
    vocabulary = tokenizer.get_vocab()
    assert all(listed[index] == token for token, index in vocabulary.items())
    keys = gguf.Keys.Tokenizer
    for name, key in (("eos", keys.EOS_ID), ("pad", keys.PAD_ID), ("unk", keys.UNK_ID)):
        token_id = getattr(tokenizer, f"{name}_token_id")
        if token_id is not None:
            field = reader.fields[key]
            assert int(field.parts[field.data[0]][0]) == token_id, name
    if kind == "bpe":
        from transformers import AutoTokenizer

        rebuilt = AutoTokenizer.from_pretrained(tmp_path, gguf_file="model.gguf")
        text = "the lazy fox saves time"
        assert rebuilt(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_gguf_without_a_tokenizer_names_the_none_vocabulary(tmp_path):
    gguf = pytest.importorskip("gguf", reason="gguf is in the export extras")
    import hf_tfm
    from hf_tfm.export import gguf as gguf_export

    gguf_export.write_llama_gguf(TfmDecoderForCausalLM(hf_tfm.preset_config("llama-1.3m")), tmp_path / "m.gguf")
    field = gguf.GGUFReader(str(tmp_path / "m.gguf")).fields["tokenizer.ggml.model"]
    assert bytes(field.parts[field.data[0]]).decode() == "none"
