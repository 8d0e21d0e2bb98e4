"""MoE training-step speed on CPU: hf_tfm MoE vs transformers' MixtralForCausalLM (same weights, via the converter)
and vs a dense hf_tfm model with the same active parameters. Same process, alternating order, median of repeats.

    python benchmarks/moe_cpu.py      # prints ratios, writes benchmarks/results/moe-cpu-<date>.json
"""

import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM

from hf_tfm import TfmDecoderConfig, TfmDecoderForCausalLM
from hf_tfm.convert import to_tfm

SHAPE = dict(vocab_size=4096, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
EXPERTS, TOP_K, EXPERT_WIDTH, BATCH, LENGTH, REPEATS = 8, 2, 256, 8, 128, 12


def train_step_seconds(model, ids) -> float:
    start = time.perf_counter()
    model(ids, labels=ids, output_router_logits=True).loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    torch.manual_seed(0)
    mixtral = MixtralForCausalLM(
        MixtralConfig(**SHAPE, intermediate_size=EXPERT_WIDTH, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K)
    )
    ours = to_tfm(mixtral)
    dense = TfmDecoderForCausalLM(  # same attention, one GLU as wide as the TOP_K active experts together
        TfmDecoderConfig(
            **SHAPE,
            **{
                k: ours.config.to_dict()[k]
                for k in (
                    "position_embedding_type",
                    "norm_type",
                    "ffn_type",
                    "hidden_act",
                    "attention_bias",
                    "tie_word_embeddings",
                )
            },
            mlp_bias=False,
            intermediate_size=TOP_K * EXPERT_WIDTH,
        )
    )
    models = {"mixtral": mixtral, "ours": ours, "dense": dense}
    ids = torch.randint(0, SHAPE["vocab_size"], (BATCH, LENGTH))
    results = {}
    for backend in ("eager", "grouped_mm"):
        for name in ("mixtral", "ours"):
            models[name].set_experts_implementation(backend)
        times = {name: [] for name in models}
        for _name, model in models.items():
            model.train()
            train_step_seconds(model, ids)  # warm-up
        for _ in range(REPEATS):
            for name, model in models.items():
                times[name].append(train_step_seconds(model, ids))
        median = {name: statistics.median(values) for name, values in times.items()}
        results[backend] = {
            "median_train_step_s": median,
            "ours_over_mixtral": median["ours"] / median["mixtral"],
            "ours_moe_over_dense_same_active": median["ours"] / median["dense"],
        }
        print(
            f"{backend:10s} step ms: mixtral {median['mixtral'] * 1e3:.1f}  ours {median['ours'] * 1e3:.1f}  "
            f"dense {median['dense'] * 1e3:.1f}  | ours/mixtral {results[backend]['ours_over_mixtral']:.3f}  "
            f"ours/dense {results[backend]['ours_moe_over_dense_same_active']:.3f}"
        )
    today = datetime.date.today().isoformat()
    record = {
        "command": "python benchmarks/moe_cpu.py",
        "date": today,
        "device": f"cpu ({platform.machine()}, {torch.get_num_threads()} threads), fp32",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "shape": {
            **SHAPE,
            "experts": EXPERTS,
            "top_k": TOP_K,
            "expert_width": EXPERT_WIDTH,
            "batch": BATCH,
            "length": LENGTH,
        },
        "results": results,
    }
    out = Path(__file__).parent / "results" / f"moe-cpu-{today}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
