"""The `hf-tfm` command, the main job, the presets and the embedded corpus."""

from pathlib import Path

import pytest
import torch
from conftest import VOCAB, assert_same_state_dict
from test_minilm import minilm_dir
from test_t5_bart_parity import bart, t5
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    GPT2Config,
    GPT2LMHeadModel,
)

from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.cli import main
from hf_tfm.training.corpus import stdlib_docstrings
from hf_tfm.training.run import presets

REPO = Path(__file__).resolve().parents[1]


def test_convert_command_round_trip(tmp_path):
    """`hf-tfm convert` turns a GPT-2 folder into hf_tfm and back without changing a weight or a logit."""
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2)).eval()
    gpt2.save_pretrained(tmp_path / "gpt2")
    main(["convert", str(tmp_path / "gpt2"), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", "gpt2"])
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "tfm").eval()
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert isinstance(ours, TfmDecoderForCausalLM) and isinstance(back, GPT2LMHeadModel)
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, gpt2(ids).logits, rtol=0, atol=1e-5)
    original, restored = gpt2.state_dict(), back.state_dict()
    assert original.keys() == restored.keys()
    assert all(torch.equal(original[k], restored[k]) for k in original)


@pytest.mark.parametrize("reference", ["minilm", "t5", "bart"])
def test_convert_command_other_paradigms(tmp_path, reference):
    """`hf-tfm convert` picks the right head from the folder's architectures and round-trips BERT, T5 and BART."""
    if reference == "minilm":  # the real pretrained BertModel folder, tokenizer included
        source, to = minilm_dir(), "bert"
    else:
        model = {"t5": t5, "bart": bart}[reference]()
        model.save_pretrained(tmp_path / reference)
        source, to = tmp_path / reference, reference
    original = AutoModel.from_pretrained(source) if reference == "minilm" else AutoModelForSeq2SeqLM.from_pretrained(source)
    main(["convert", str(source), str(tmp_path / "tfm")])
    main(["convert", str(tmp_path / "tfm"), str(tmp_path / "back"), "--to", to])
    back = AutoModel.from_pretrained(tmp_path / "back") if reference == "minilm" else AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "back")
    assert type(back) is type(original)
    assert_same_state_dict(back.state_dict(), original.state_dict())
    if reference == "minilm":
        assert (tmp_path / "tfm" / "tokenizer.json").is_file()  # the tokenizer travels with the weights


def test_convert_command_names_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="config.json not found"):
        main(["convert", str(tmp_path / "missing"), str(tmp_path / "out")])
    TfmDecoderForCausalLM(AutoConfig.for_model("tfm_decoder", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)).save_pretrained(tmp_path / "tfm")
    with pytest.raises(SystemExit, match="no converter for model_type='tfm_decoder' with --to None"):
        main(["convert", str(tmp_path / "tfm"), str(tmp_path / "out")])


@pytest.mark.parametrize("preset", sorted(p.name for p in (REPO / "configs").iterdir() if (p / "config.json").is_file()))
def test_presets_load_and_build(preset):
    """Every preset builds its paradigm's generative or masked-LM head, and is shipped inside the package."""
    config = AutoConfig.from_pretrained(REPO / "configs" / preset)
    head = {"tfm_decoder": AutoModelForCausalLM, "tfm_encoder": AutoModelForMaskedLM, "tfm_encoder_decoder": AutoModelForSeq2SeqLM}
    with torch.device("meta"):
        model = head[config.model_type].from_config(config)
    assert type(model).__name__ == config.auto_classes[head[config.model_type].__name__]
    assert preset in presets()
    if preset == "gpt2-124m":  # GPT-2 small's shape, tied head: 124,439,808 parameters
        assert model.num_parameters() == 124_439_808


def test_corpus_is_deterministic_and_split_by_file():
    first, second = stdlib_docstrings(max_files=80), stdlib_docstrings(max_files=80)
    assert first == second
    assert first["train"] and first["validation"]
    assert not set(first["train"]) & set(first["validation"])
