"""How long `from_pretrained` of a local folder takes, hf_tfm against `LlamaForCausalLM` on the same weights, and that
a load writes nothing.

    python -m benchmarks.load_time                  # a 1 GB Llama (254M parameters, float32), 7 loads a side
    python -m benchmarks.load_time --size small     # seconds: the smoke check tests/test_benchmarks.py runs

The reference model is built once and saved; hf_tfm's conversion of it is saved beside it (`to_tfm`, then
`save_pretrained`, as a user saves it). The two folders are then loaded in alternation, reference first, each load
timed with `time.perf_counter` around `from_pretrained` alone, and the medians compared: alternation spreads the page
cache's and the machine's drift over both sides. Every file under the folder that holds both saves (names, sizes,
modification times) is listed before the first load and after the last: any difference is a write by a load.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_tfm.convert import to_tfm

from .record import header, write

# 1.02 GB of float32 weights: 254M parameters, untied head
SIZES = {
    "1gb": dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "small": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, modification time in ns) of every file under `folder`, folders included (a created one shows)."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")
    }


def timed_load(load, folder: Path) -> float:
    start = time.perf_counter()
    model = load(folder)
    seconds = time.perf_counter() - start
    del model
    return seconds


def load_times(size: str = "1gb", repeats: int = 7) -> dict:
    torch.manual_seed(0)
    config = LlamaConfig(**SIZES[size])
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        reference = LlamaForCausalLM(config)
        parameters = sum(p.numel() for p in reference.parameters())
        reference.save_pretrained(root / "llama")
        to_tfm(reference).save_pretrained(root / "hf_tfm")
        del reference
        weights = {
            side: sum(p.stat().st_size for p in (root / side).glob("*.safetensors")) for side in ("llama", "hf_tfm")
        }
        before = listing(root)
        sides = {
            "llama": lambda folder: LlamaForCausalLM.from_pretrained(folder),
            "hf_tfm": lambda folder: AutoModelForCausalLM.from_pretrained(folder),
        }
        seconds = {side: [] for side in sides}
        for _ in range(repeats):
            for side, load in sides.items():
                seconds[side].append(timed_load(load, root / side))
        after = listing(root)
    written = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    medians = {side: statistics.median(times) for side, times in seconds.items()}
    return {
        "parameters": parameters,
        "weight_bytes": weights,
        "seconds": seconds,
        "median_seconds": medians,
        "ratio": medians["hf_tfm"] / medians["llama"],
        "spread": {side: [min(times), max(times)] for side, times in seconds.items()},
        "files_changed_by_loads": written,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="1gb")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", type=Path, default=None, help="the results file (default: benchmarks/results/)")
    args = parser.parse_args()
    command = f"python -m benchmarks.load_time --size {args.size} --repeats {args.repeats}"
    result = load_times(args.size, args.repeats)
    med = result["median_seconds"]
    print(
        f"{result['parameters'] / 1e6:.0f}M parameters: hf_tfm {med['hf_tfm']:.3f} s, LlamaForCausalLM "
        f"{med['llama']:.3f} s (medians of {args.repeats}): {result['ratio']:.2f}x; files changed by the loads: "
        f"{result['files_changed_by_loads'] or 'none'}"
    )
    if args.size == "1gb":
        write({**header("cpu", command, torch.device("cpu")), **result}, "load-time-cpu", args.output)


if __name__ == "__main__":
    main()
