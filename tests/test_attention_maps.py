"""`hf-tfm attention`: the attention maps of a saved model of each paradigm, drawn from eager attention whatever the
folder's backend, equal to the weights transformers' eager path returns; an MoE model's routing beside them; bad
layer/head choices and over-long texts named."""

import pytest
import torch
from PIL import Image

from hf_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig
from hf_tfm.training.attention_maps import MAX_TOKENS, attention_maps, chosen, draw_attention
from hf_tfm.training.tokenizers import train_byte_level_bpe
from hf_tfm_cli.entry import main

TEXT = "Return the number of items in the list."
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
PARADIGMS = {
    "decoder": (TfmDecoderConfig, "AutoModelForCausalLM", {}),
    "encoder": (TfmEncoderConfig, "AutoModelForMaskedLM", {}),
    "encoder-decoder": (TfmEncoderDecoderConfig, "AutoModelForSeq2SeqLM", {"decoder_layers": 3}),
    "moe decoder": (TfmDecoderConfig, "AutoModelForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_level_bpe([TEXT, "Return the sum of the numbers.", "Count the items."] * 4, vocab_size=300)


def saved(folder, tokenizer, paradigm: str) -> str:
    import transformers

    config_class, auto_name, extra = PARADIGMS[paradigm]
    config = config_class(
        **SHAPE,
        **extra,
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        attn_implementation="sdpa",  # saved for another backend: the maps still come from eager
    )
    torch.manual_seed(0)
    getattr(transformers, auto_name).from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("paradigm", PARADIGMS)
def test_every_paradigm_draws_its_maps(tmp_path, tokenizer, paradigm, capsys):
    folder = saved(tmp_path / "model", tokenizer, paradigm)
    main(["attention", folder, "--text", TEXT, "--output-dir", str(tmp_path / "maps")])
    written = sorted(path.name for path in (tmp_path / "maps").iterdir())
    kinds = ["cross", "decoder", "encoder"] if paradigm == "encoder-decoder" else ["self"]
    expected = [f"attention-{kind}.png" for kind in kinds] + (["routing.png"] if paradigm == "moe decoder" else [])
    assert written == sorted(expected)
    assert capsys.readouterr().out.count("wrote ") == len(expected)
    for name in written:
        width, height = Image.open(tmp_path / "maps" / name).size
        assert 300 < width <= 1400 and height > 150  # reads at screen size


@pytest.mark.parametrize("paradigm", PARADIGMS)
def test_the_maps_are_eager_attention_weights(tmp_path, tokenizer, paradigm):
    """Each map is the softmax of its row (sums to 1, causal where the model is) and equals what the model's eager
    forward returns for the same tokens."""
    from hf_tfm.training.checkpoints import load_saved

    model = load_saved(saved(tmp_path / "model", tokenizer, paradigm)).train()
    backend = model.config._attn_implementation
    assert backend != "eager"
    found = attention_maps(model, tokenizer, TEXT)
    assert (model.config._attn_implementation, model.training) == (backend, True)  # the model is given back as it was
    model.set_attn_implementation("eager")
    model.eval()
    length = len(tokenizer(TEXT)["input_ids"])
    for kind, layers in found.maps.items():
        assert len(layers) == (3 if kind in ("decoder", "cross") else 2)
        for weights in layers:
            assert weights.shape == (4, len(found.query_tokens[kind]), len(found.key_tokens[kind]))
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))
            if kind in ("self", "decoder") and paradigm != "encoder":
                assert weights.triu(1).abs().max() == 0  # no query sees a later key
    assert len(found.key_tokens.get("self", found.key_tokens.get("encoder"))) == length
    if paradigm == "decoder":
        ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            reference = model(ids, output_attentions=True).attentions
        for ours, theirs in zip(found.maps["self"], reference):
            torch.testing.assert_close(ours, theirs[0])
    if paradigm == "moe decoder":
        assert sorted(found.routing["self"]) == [0, 1]  # every layer is MoE
        for experts in found.routing["self"].values():
            assert experts.shape == (length, 2) and int(experts.max()) < 4
            assert (experts[:, 0] != experts[:, 1]).all()


def test_a_choice_of_layers_and_heads_is_checked():
    assert chosen(24, None, 6, "layer", spread=True) == [0, 5, 9, 14, 18, 23]
    assert chosen(16, None, 8, "head", spread=False) == list(range(8))
    assert chosen(4, [3, 1], 8, "head", spread=False) == [3, 1]
    with pytest.raises(ValueError, match="layer 2 does not exist: the model has 2"):
        chosen(2, [2], 6, "layer", spread=True)


def test_bad_input_is_named(tmp_path, tokenizer):
    folder = saved(tmp_path / "model", tokenizer, "decoder")
    with pytest.raises(SystemExit, match="head 9 does not exist: the model has 4"):
        main(["attention", folder, "--text", TEXT, "--heads", "9", "--output-dir", str(tmp_path / "maps")])
    with pytest.raises(ValueError, match=f"attention maps read up to {MAX_TOKENS}"):
        draw_attention(folder, "items " * 200, tmp_path / "maps")
    with pytest.raises(SystemExit, match="config.json not found"):
        main(["attention", str(tmp_path), "--text", TEXT])
