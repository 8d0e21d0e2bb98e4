"""save_pretrained -> from_pretrained keeps every output, through the Auto classes and through remote code."""

import json
import os

import pytest
import torch
import transformers
from conftest import POSITION_TYPES, tiny_model
from safetensors.torch import load_file, save_file
from support.processes import run_without_hf_tfm
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import hf_tfm
from hf_tfm import TfmDecoderForCausalLM, TfmDecoderForSequenceClassification, TfmDecoderModel

# Each position scheme, plus RoPE scalings whose computed inv_freq differs from the default one.
VARIANTS = {pos: {"position_embedding_type": pos} for pos in POSITION_TYPES}
VARIANTS["rope-yarn"] = {"position_embedding_type": "rope", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
VARIANTS["rope-llama3"] = {
    "position_embedding_type": "rope",
    "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
INPUT = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 3, 4, 5, 6, 7, 8]])
MASK = torch.tensor([[1] * 8, [0, 0] + [1] * 6])


def _logits(model):
    with torch.no_grad():
        return model(INPUT, attention_mask=MASK).logits


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_auto_from_pretrained_identical_logits(tmp_path, variant):
    """Computed buffers (RoPE inv_freq, sinusoidal table, ALiBi slopes) survive meta-device loading."""
    model = tiny_model(**VARIANTS[variant])
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is TfmDecoderForCausalLM
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=0)


def test_saved_folder_is_complete(tmp_path):
    """The folder carries safetensors, the flat code, and auto_map entries for every Auto class."""
    tiny_model().save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {
        "model.safetensors",
        "config.json",
        "configuration_tfm.py",
        "modeling_tfm.py",
        "modeling_tfm_stack.py",
        "modeling_tfm_layers.py",
    } <= files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForCausalLM",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForQuestionAnswering",
    }
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == "TfmDecoderConfig"
    assert type(AutoModel.from_pretrained(tmp_path)) is TfmDecoderModel
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert type(classifier) is TfmDecoderForSequenceClassification


@pytest.mark.slow
def test_trust_remote_code_without_package(tmp_path):
    """A saved folder loads with only torch + transformers: identical logits and greedy tokens for every variant."""
    expected = {}
    for name, overrides in VARIANTS.items():
        model = tiny_model(**overrides)
        model.save_pretrained(tmp_path / name)
        tokens = model.generate(INPUT, attention_mask=MASK, max_new_tokens=5, do_sample=False)
        expected[name] = {"logits": _logits(model), "tokens": tokens}
    torch.save({"expected": expected, "input": INPUT, "mask": MASK}, tmp_path / "expected.pt")
    result = run_without_hf_tfm(
        """
        import torch
        from transformers import AutoModelForCausalLM
        data = torch.load("expected.pt")
        for name, want in data["expected"].items():
            model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            with torch.no_grad():
                logits = model(data["input"], attention_mask=data["mask"]).logits
            torch.testing.assert_close(logits, want["logits"], rtol=0, atol=0)
            out = model.generate(
                data["input"], attention_mask=data["mask"], max_new_tokens=5, do_sample=False,
                return_dict_in_generate=True,
            )
            assert torch.equal(out.sequences, want["tokens"]), name
            # the cache went back to the model at every step (transformers 5.24 renamed its keyword)
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            assert cache.get_seq_length() == out.sequences.shape[1] - 1, (name, cache.get_seq_length())
        # named in the causal-LM table Trainer reads to shift a label-smoothed loss's labels
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        assert type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
        print("loaded", len(data["expected"]))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded {len(VARIANTS)}" in result.stdout


def test_without_trust_remote_code_refuses(tmp_path):
    """Without the package and without trust_remote_code, transformers refuses to execute the folder's code."""
    tiny_model().save_pretrained(tmp_path / "model")
    result = run_without_hf_tfm(
        """
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained("model", trust_remote_code=False)
        except ValueError as error:
            print("refused:", error)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused:" in result.stdout and "trust_remote_code" in result.stdout


def test_text_generation_pipeline(tmp_path):
    """`pipeline("text-generation")` runs a saved decoder + tokenizer folder and continues the prompt greedily."""
    from transformers import pipeline

    from hf_tfm.training.tokenizers import train_byte_level_bpe

    tokenizer = train_byte_level_bpe(["return the number of items in the list"] * 20, vocab_size=300)
    model = tiny_model(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    [result] = generator("return the", max_new_tokens=5, min_new_tokens=5, do_sample=False)
    expected = model.generate(
        **tokenizer("return the", return_tensors="pt"), max_new_tokens=5, min_new_tokens=5, do_sample=False
    )
    assert result["generated_text"] == tokenizer.decode(expected[0], skip_special_tokens=True)


@pytest.mark.parametrize(
    "preset, auto, table",
    [
        ("t5-1.9m", "AutoModelForSeq2SeqLM", "model.shared.weight"),
        ("llama-1.3m", "AutoModelForCausalLM", "model.embed_tokens.weight"),
        ("bert-1.4m", "AutoModelForMaskedLM", "model.embed_tokens.weight"),
    ],
)
def test_a_checkpoint_without_its_tied_table_reports_it_missing_and_initialises_it(tmp_path, preset, auto, table):
    """A checkpoint whose token table is absent (the table every tied name reads): named as missing by a strict
    load, and freshly initialised by a lenient one, as T5 reports and initialises its `shared` (an encoder-decoder's
    table is one module under three names, which transformers' tied-weight marking would otherwise count as
    loaded, leaving it on the meta device)."""
    auto_class = getattr(transformers, auto)
    torch.manual_seed(0)
    auto_class.from_config(hf_tfm.preset_config(preset)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    assert table in tensors
    del tensors[table]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing from the checkpoint"):
        auto_class.from_pretrained(tmp_path)
    model, info = auto_class.from_pretrained(tmp_path, strict=False, output_loading_info=True)
    assert table in info["missing_keys"]
    weight = model.get_input_embeddings().weight
    assert weight.device.type == "cpu" and weight.abs().sum() > 0
    extra = {"decoder_input_ids": torch.tensor([[0, 1]])} if model.config.is_encoder_decoder else {}
    assert torch.isfinite(model(torch.tensor([[5, 6, 7]]), **extra).logits).all()
