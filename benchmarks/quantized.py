"""torchao int8 quantisation of hf_tfm against full precision and against the reference class quantised the same way:
weights memory, batch-1 decode tokens/s and how far the logits move. GPT-2-, Llama- and Mixtral-shaped pairs of
hundreds of MB in fp32 (random weights: the reference built, hf_tfm converted from it exactly), CPU.

    python -m benchmarks.quantized    # -> benchmarks/results/quantized-cpu-<date>.json (~6 min, 2 cores)
    python -m benchmarks.quantized --linear    # one Linear at batch 1, fp32 against int8 weight-only, bias or not

Each model is saved, then loaded with `from_pretrained(..., quantization_config=TorchAoConfig(...))` as a user would:
int8 weight-only (`Int8WeightOnlyConfig`) and int8 dynamic activation (`Int8DynamicActivationInt8WeightConfig`).
transformers quantises `nn.Linear` weights only; hf_tfm quantises its MoE experts' 3D weights too
(hf_tfm.quantization), and the Mixtral reference gets the same done to it here
(`finish_torchao_loading`: quantised experts, run eager), so both sides hold the same int8 weights. GPT-2's reference
keeps its projections in `Conv1D`, which torchao does not touch: it stays full precision under either configuration,
as a user loading it would get.

Decode: greedy, `--new-tokens` tokens after a 16-token prompt, dynamic cache; every model of a pair in one process,
alternating order over `--repeats` rounds; median tokens/s and the spread ((slowest - fastest) / median).
Quality: the largest logit difference from the same model in fp32 over a 128-token sequence, and the share of positions
whose top-1 token is unchanged (random weights: there is no text to score perplexity on).
"""

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    TorchAoConfig,
)

from benchmarks.measure import alternating_medians
from benchmarks.record import header, write
from hf_tfm import TfmDecoderForCausalLM
from hf_tfm.convert import to_tfm
from hf_tfm.quantization import finish_torchao_loading, is_quantized

PAIRS = {
    "gpt2": (GPT2LMHeadModel, GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257), to_tfm),
    "llama": (
        LlamaForCausalLM,
        LlamaConfig(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            vocab_size=32000,
        ),
        to_tfm,
    ),
    "mixtral": (
        MixtralForCausalLM,
        MixtralConfig(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_local_experts=8,
            vocab_size=32000,
        ),
        to_tfm,
    ),
}


def configs() -> dict:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    dynamic = Int8DynamicActivationInt8WeightConfig
    return {"fp32": None, "int8-weight-only": Int8WeightOnlyConfig, "int8-dynamic": dynamic}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer, a shared (tied) tensor once; a torchao tensor counts its inner tensors."""
    total, seen = 0, set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if is_quantized(tensor):
            names, _ = tensor.__tensor_flatten__()
            total += sum(getattr(tensor, name).nbytes for name in names)
        else:
            total += tensor.nbytes
    return total


def load(model_class, folder: Path, config) -> torch.nn.Module:
    if config is None:
        return model_class.from_pretrained(folder).eval()
    model = model_class.from_pretrained(folder, quantization_config=TorchAoConfig(config())).eval()
    if model_class is not TfmDecoderForCausalLM:  # the reference, quantised as hf_tfm's from_pretrained does it
        finish_torchao_loading(model)
    return model


def decode_work(model, prompt: torch.Tensor, new_tokens: int):
    """Greedy batch-1 generate() of exactly `new_tokens`, under no_grad as generate() itself runs: torchao's tensor
    subclasses cannot be viewed under `torch.inference_mode()` (pytorch/pytorch#170419), which the experts' per-expert
    indexing does."""
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)


def quality(model, fp32, ids: torch.Tensor) -> dict:
    with torch.no_grad():
        quantized, exact = model(ids).logits, fp32(ids).logits
    return {
        "max_logit_diff": round((quantized - exact).abs().max().item(), 4),
        "top1_agreement": round((quantized.argmax(-1) == exact.argmax(-1)).float().mean().item(), 4),
    }


def run_pair(name: str, folder: Path, new_tokens: int, repeats: int) -> dict:
    reference_class, reference_config, convert = PAIRS[name]
    torch.manual_seed(0)
    reference = reference_class(reference_config).eval()
    reference.save_pretrained(folder / "reference")
    convert(reference).save_pretrained(folder / "hf_tfm")
    del reference
    models = {
        (side, quant): load(model_class, folder / side, config)
        for side, model_class in (("reference", reference_class), ("hf_tfm", TfmDecoderForCausalLM))
        for quant, config in configs().items()
    }
    for model in models.values():
        model.generation_config.eos_token_id = None  # every run decodes all the tokens
    prompt = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    work = {key: decode_work(model, prompt, new_tokens) for key, model in models.items()}
    seconds = alternating_medians(work, warmup=1, repeats=repeats, device=torch.device("cpu"))
    ids = torch.randint(3, 1000, (1, 128), generator=torch.Generator().manual_seed(2))
    rows = {}
    for (side, quant), model in models.items():
        timing = seconds[(side, quant)]
        row = {
            "weights_MB": round(weight_bytes(model) / 2**20, 1),
            "decode_tokens_per_s": round(new_tokens / timing["median_s"], 2),
            "decode_spread": round((timing["max_s"] - timing["min_s"]) / timing["median_s"], 3),
        }
        if quant != "fp32":
            row.update(quality(model, models[(side, "fp32")], ids))
        rows[f"{side} {quant}"] = row
    for quant in configs():
        with torch.no_grad():
            difference = (models[("hf_tfm", quant)](ids).logits - models[("reference", quant)](ids).logits).abs()
        rows[f"hf_tfm {quant}"]["max_logit_diff_vs_reference_same_config"] = round(difference.max().item(), 6)
        ours, theirs = rows[f"hf_tfm {quant}"], rows[f"reference {quant}"]
        ours["decode_speed_vs_reference"] = round(ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"], 3)
    return {"reference": reference_class.__name__, "rows": rows}


def linear_probe(repeats: int = 2000) -> dict:
    """Microseconds per batch-1 call of one Linear of GPT-2's widths, fp32 against torchao int8 weight-only, with and
    without a bias: where int8 decode is slower than fp32, this shows which layers pay."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    rows = {}
    for bias in (False, True):
        for inputs, outputs in ((768, 768), (768, 3072), (3072, 768)):
            torch.manual_seed(0)
            fp32 = torch.nn.Linear(inputs, outputs, bias=bias)
            int8 = torch.nn.Linear(inputs, outputs, bias=bias)
            int8.load_state_dict(fp32.state_dict())
            quantize_(int8, Int8WeightOnlyConfig())
            x = torch.randn(1, 1, inputs)
            work = {}
            for name, layer in (("fp32", fp32), ("int8", int8)):
                work[name] = lambda layer=layer, x=x: [layer(x) for _ in range(repeats)]
            with torch.no_grad():
                seconds = alternating_medians(work, warmup=1, repeats=5, device=torch.device("cpu"))
            rows[f"{inputs}->{outputs} bias={bias}"] = {
                f"{name}_us": round(timing["median_s"] / repeats * 1e6, 1) for name, timing in seconds.items()
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--linear", action="store_true", help="only the one-Linear probe (linear_probe)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.linear:
        record = header("cpu", "python -m benchmarks.quantized --linear", torch.device("cpu"))
        record["linear_us"] = linear_probe()
        print(record["linear_us"])
        write(record, "quantized-linear-cpu", args.output)
        return
    command = "python -m benchmarks.quantized " + " ".join(f"--pairs {' '.join(args.pairs)}".split())
    record = header("cpu", command, torch.device("cpu"))
    record.update(new_tokens=args.new_tokens, repeats=args.repeats, pairs={})
    for name in args.pairs:
        with tempfile.TemporaryDirectory() as folder:
            record["pairs"][name] = run_pair(name, Path(folder), args.new_tokens, args.repeats)
        print(name, record["pairs"][name])
    write(record, "quantized-cpu", args.output)


if __name__ == "__main__":
    main()
