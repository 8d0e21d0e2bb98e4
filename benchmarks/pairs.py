"""The benchmarked pairs: each transformers reference class, and hf_tfm's model holding the same weights (via the
conversion engine), at the shapes of each profile. Which families are paired is their records' `pair`.

A profile is plain data: per pair, the reference config's fields and the batch shape; plus how to time. `cpu` is
sized for the 2-core CI machines (fp32), `gpu` for an H100 (bf16, the shapes named in issue 7), `smoke` for tests.
"""

from dataclasses import dataclass

import torch
import transformers

from hf_tfm.convert import to_tfm
from hf_tfm.convert.families import FAMILIES, PARADIGMS


@dataclass(frozen=True)
class PairKind:
    """A benchmarked pair, read from its family record (`Family.pair`)."""

    reference: str  # the transformers class, as reports name it, with what both sides run: "(eager, grouped_mm)"
    config_class: type
    model_class: type
    task: str  # "causal", "masked" or "seq2seq": what a training step and generation feed the models
    defaults: dict  # config fields every profile sets (T5's decoder starts from pad, as its checkpoints say)
    experts_implementation: str | None  # the MoE experts backend both models run


def _label(reference: str, pair: dict) -> str:
    """The reference class, and the attention and experts backends both sides run where not the defaults."""
    backends = [pair[key] for key in ("attention", "experts_implementation") if key in pair]
    return f"{reference} ({', '.join(backends)})" if backends else reference


# every family whose record has a benchmark pairing, in the registry's order
KINDS = {
    name: PairKind(
        _label(record.reference, record.pair),
        getattr(transformers, record.config_class),
        getattr(transformers, record.reference),
        PARADIGMS[record.paradigm].task,
        record.pair.get("defaults", {}),
        record.pair.get("experts_implementation"),
    )
    for name, record in FAMILIES.items()
    if record.pair is not None
}


def _profile(shapes: dict, **timing) -> dict:
    return {"pairs": shapes, **timing}


_CPU_DECODER = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, vocab_size=8192, max_position_embeddings=512
)
# the MoE issue's CPU shape (benchmarks/moe_cpu.py), which every MoE pair shares
_CPU_MOE = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    num_experts_per_tok=2,
)
# DeepSeek-V3's latent attention at that width: every head's keys expanded from a 64-wide latent, a 16-wide rotary
# part, the first layer dense
_DEEPSEEK_V3_LATENT = dict(
    num_key_value_heads=4,
    kv_lora_rank=64,
    q_lora_rank=96,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=4,
    topk_group=2,
)
_GPU_DECODER = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, vocab_size=32000, max_position_embeddings=2048
)
# Mixtral's GPU shape, which every MoE pair shares
_GPU_MOE = dict(
    _GPU_DECODER, num_hidden_layers=8, num_key_value_heads=4, intermediate_size=2048, num_experts_per_tok=2
)

SMOKE_DECODER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    vocab_size=97,
    max_position_embeddings=64,
)

PROFILES = {
    # 2-core CPU, fp32, eager: small shapes, so that every pair runs in a few minutes
    "cpu": _profile(
        {
            "gpt2": dict(
                config=dict(n_embd=256, n_layer=4, n_head=4, vocab_size=8192, n_positions=512), batch=8, length=128
            ),
            "bert": dict(
                config=dict(
                    hidden_size=256,
                    num_hidden_layers=4,
                    num_attention_heads=4,
                    intermediate_size=1024,
                    vocab_size=8192,
                ),
                batch=8,
                length=128,
            ),
            "llama": dict(
                config=dict(_CPU_DECODER, num_key_value_heads=2, intermediate_size=688), batch=8, length=128
            ),
            "qwen3": dict(
                config=dict(_CPU_DECODER, num_key_value_heads=2, head_dim=64, intermediate_size=688),
                batch=8,
                length=128,
            ),
            # alternating sliding (window 64, half the sequence) and full layers
            "gemma2": dict(
                config=dict(
                    _CPU_DECODER, num_key_value_heads=2, head_dim=64, intermediate_size=688, sliding_window=64
                ),
                batch=8,
                length=128,
            ),
            "mixtral": dict(config=dict(_CPU_MOE, intermediate_size=256, num_local_experts=8), batch=8, length=128),
            "qwen2_moe": dict(
                config=dict(
                    _CPU_MOE,
                    num_experts=8,
                    intermediate_size=256,
                    moe_intermediate_size=256,
                    shared_expert_intermediate_size=256,
                ),
                batch=8,
                length=128,
            ),
            # three sliding layers (window 64, half the sequence) to one full, each kind with its own RoPE base
            "gemma3_text": dict(
                config=dict(
                    _CPU_DECODER,
                    num_key_value_heads=2,
                    head_dim=64,
                    intermediate_size=688,
                    sliding_window=64,
                    layer_types=["sliding_attention"] * 3 + ["full_attention"],
                ),
                batch=8,
                length=128,
            ),
            # alternating sliding (window 64) and full layers
            "gpt_oss": dict(
                config=dict(_CPU_MOE, head_dim=32, intermediate_size=256, num_local_experts=8, sliding_window=64),
                batch=8,
                length=128,
            ),
            "deepseek_v3": dict(
                config=dict(
                    _CPU_MOE,
                    **_DEEPSEEK_V3_LATENT,
                    intermediate_size=256,
                    moe_intermediate_size=256,
                    n_routed_experts=8,
                ),
                batch=8,
                length=128,
            ),
            "t5": dict(
                config=dict(d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4, vocab_size=8192),
                batch=8,
                length=128,
                target_length=32,
            ),
            "bart": dict(
                config=dict(
                    d_model=256,
                    encoder_layers=4,
                    decoder_layers=4,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4,
                    encoder_ffn_dim=1024,
                    decoder_ffn_dim=1024,
                    vocab_size=8192,
                    max_position_embeddings=512,
                ),
                batch=8,
                length=128,
                target_length=32,
            ),
        },
        device="cpu",
        dtype="float32",
        compile=False,
        warmup=2,
        repeats=20,
        generate_warmup=1,
        generate_repeats=9,
        prompt_length=16,
        new_tokens=32,
        generate_batches=[1, 64],
    ),
    # H100, bf16: GPT-2 124M at 16 x 1024, BERT-base at 32 x 512, the MoE issue's shape; eager and compiled
    "gpu": _profile(
        {
            "gpt2": dict(config=dict(), batch=16, length=1024),  # GPT2Config() is GPT-2 124M
            "bert": dict(config=dict(), batch=32, length=512),  # BertConfig() is BERT-base
            "llama": dict(
                config=dict(_GPU_DECODER, num_key_value_heads=4, intermediate_size=2048), batch=16, length=1024
            ),
            "qwen3": dict(
                config=dict(_GPU_DECODER, num_key_value_heads=4, head_dim=64, intermediate_size=2048),
                batch=16,
                length=1024,
            ),
            "gemma2": dict(
                config=dict(
                    _GPU_DECODER, num_key_value_heads=4, head_dim=64, intermediate_size=2048, sliding_window=512
                ),
                batch=16,
                length=1024,
            ),
            # trains with bf16 weights: grouped_mm is not covered by autocast
            "mixtral": dict(
                config=dict(_GPU_MOE, num_local_experts=8),
                batch=16,
                length=1024,
                train_weights="bfloat16",
            ),
            "qwen2_moe": dict(
                config=dict(
                    _GPU_MOE,
                    num_experts=8,
                    moe_intermediate_size=2048,
                    shared_expert_intermediate_size=2048,
                ),
                batch=16,
                length=1024,
                train_weights="bfloat16",
            ),
            "gemma3_text": dict(
                config=dict(
                    _GPU_DECODER, num_key_value_heads=4, head_dim=64, intermediate_size=2048, sliding_window=512
                ),
                batch=16,
                length=1024,
            ),
            "gpt_oss": dict(
                config=dict(_GPU_MOE, head_dim=64, num_local_experts=8, sliding_window=512),
                batch=16,
                length=1024,
                train_weights="bfloat16",
            ),
            "deepseek_v3": dict(
                config=dict(
                    _GPU_MOE,
                    num_key_value_heads=12,
                    kv_lora_rank=256,
                    q_lora_rank=384,
                    qk_rope_head_dim=32,
                    qk_nope_head_dim=64,
                    v_head_dim=64,
                    n_shared_experts=1,
                    first_k_dense_replace=1,
                    n_group=4,
                    topk_group=2,
                    n_routed_experts=8,
                    moe_intermediate_size=2048,
                ),
                batch=16,
                length=1024,
                train_weights="bfloat16",
            ),
            "t5": dict(
                config=dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12),
                batch=16,
                length=512,
                target_length=128,
            ),  # t5-base
            "bart": dict(
                config=dict(
                    d_model=768,
                    encoder_layers=6,
                    decoder_layers=6,
                    encoder_attention_heads=12,
                    decoder_attention_heads=12,
                    encoder_ffn_dim=3072,
                    decoder_ffn_dim=3072,
                ),
                batch=16,
                length=512,
                target_length=128,
            ),  # bart-base
        },
        # static-cache generation auto-compiles on CUDA (CUDA graphs): warm-ups compile and record the graphs
        device="cuda",
        dtype="bfloat16",
        compile=True,
        warmup=3,
        repeats=10,
        generate_warmup=3,
        generate_repeats=3,
        prompt_length=128,
        new_tokens=128,
        generate_batches=[1, 64],
    ),
    # for tests: every code path at a toy shape, in seconds
    "smoke": _profile(
        {
            "gpt2": dict(
                config=dict(n_embd=32, n_layer=2, n_head=4, vocab_size=97, n_positions=64), batch=2, length=8
            ),
            "bert": dict(
                config=dict(
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=64,
                    vocab_size=97,
                    max_position_embeddings=64,
                ),
                batch=2,
                length=8,
            ),
            "llama": dict(config=SMOKE_DECODER, batch=2, length=8),
            "qwen3": dict(
                config=dict(SMOKE_DECODER, head_dim=8),
                batch=2,
                length=8,
            ),
            "gemma2": dict(
                config=dict(SMOKE_DECODER, head_dim=8, sliding_window=4),
                batch=2,
                length=8,
            ),
            "mixtral": dict(
                config=dict(SMOKE_DECODER, num_local_experts=4, num_experts_per_tok=2),
                batch=2,
                length=8,
            ),
            "qwen2_moe": dict(
                config=dict(
                    SMOKE_DECODER,
                    num_experts=4,
                    num_experts_per_tok=2,
                    moe_intermediate_size=32,
                    shared_expert_intermediate_size=32,
                ),
                batch=2,
                length=8,
            ),
            "gemma3_text": dict(
                config=dict(
                    SMOKE_DECODER, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
                ),
                batch=2,
                length=8,
            ),
            "gpt_oss": dict(
                # GPT-OSS's YaRN is set for its own context length: kept, so that YaRN's factor matches it
                config=dict(
                    SMOKE_DECODER,
                    head_dim=8,
                    num_local_experts=4,
                    num_experts_per_tok=2,
                    sliding_window=4,
                    max_position_embeddings=131072,
                ),
                batch=2,
                length=8,
            ),
            "deepseek_v3": dict(
                config=dict(
                    SMOKE_DECODER,
                    num_key_value_heads=4,
                    kv_lora_rank=16,
                    q_lora_rank=24,
                    qk_rope_head_dim=4,
                    qk_nope_head_dim=8,
                    v_head_dim=8,
                    n_routed_experts=4,
                    num_experts_per_tok=2,
                    n_group=2,
                    topk_group=1,
                    moe_intermediate_size=32,
                    n_shared_experts=1,
                    first_k_dense_replace=1,
                ),
                batch=2,
                length=8,
            ),
            "t5": dict(
                config=dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=97),
                batch=2,
                length=8,
                target_length=4,
            ),
            "bart": dict(
                config=dict(
                    d_model=32,
                    encoder_layers=2,
                    decoder_layers=2,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4,
                    encoder_ffn_dim=64,
                    decoder_ffn_dim=64,
                    vocab_size=97,
                    max_position_embeddings=64,
                ),
                batch=2,
                length=8,
                target_length=4,
            ),
        },
        device="cpu",
        dtype="float32",
        compile=False,
        warmup=1,
        repeats=2,
        generate_warmup=1,
        generate_repeats=1,
        prompt_length=4,
        new_tokens=3,
        generate_batches=[1, 2],
    ),
}


def training_dtypes(spec: dict, autocast_dtype: torch.dtype | None) -> tuple[torch.dtype, torch.dtype | None]:
    """A pair's training step's (weights, autocast dtype): float32 weights under `autocast_dtype` (None: no autocast),
    except where the pair trains in its low-precision dtype (`train_weights`), without autocast: grouped_mm is not
    covered by autocast (transformers upcasts the tokens to the fp32 weights, or under compile falls back to a
    loop)."""
    weights = getattr(torch, spec.get("train_weights", "float32"))
    return weights, autocast_dtype if weights == torch.float32 else None


def build_pair(name: str, config_fields: dict, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference model with random weights, and hf_tfm's conversion of it: the same function, the same weights.
    Both are returned in eval mode on the CPU in fp32, running the experts backend the record names."""
    kind = KINDS[name]
    torch.manual_seed(seed)
    reference = kind.model_class(kind.config_class(**kind.defaults, **config_fields))
    ours = to_tfm(reference)
    for model in (reference, ours):
        if kind.experts_implementation is not None:
            model.set_experts_implementation(kind.experts_implementation)
        model.eval()
    return reference, ours


def _experts_share(model: torch.nn.Module) -> float:
    config = model.config
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", 0) or 0
    return config.num_experts_per_tok / experts if experts else 1.0


def _counted(model: torch.nn.Module, active: bool, skip=()) -> float:
    """Parameters of every module not of a `skip` type; a fused experts module (Mixtral's and hf_tfm's class
    names both end in "Experts") counts only the top-k share a token passes through when `active`."""
    share = _experts_share(model) if active else 1.0
    total, seen = 0.0, set()
    for module in model.modules():
        fresh = [p for p in module.parameters(recurse=False) if id(p) not in seen]  # a tied weight counts once
        seen.update(id(p) for p in fresh)
        if isinstance(module, skip):
            continue
        own = sum(p.numel() for p in fresh)
        total += own * share if type(module).__name__.endswith("Experts") else own
    return total


def parameter_count(model: torch.nn.Module, active: bool = True) -> int:
    """Parameters a token passes through: all of them for dense models; for MoE only the top-k experts' share."""
    return round(_counted(model, active))


def train_flops_per_token(model: torch.nn.Module, length: int) -> float:
    """Training flops per token, PaLM/nanoGPT accounting: 6 per matmul parameter a token passes through (embedding
    lookups excluded, the LM head's matmul included even when tied to the embedding), plus attention's
    12 x layers x width x sequence length."""
    matmul = _counted(model, active=True, skip=(torch.nn.Embedding,))
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is embedding.weight:
        matmul += head.weight.numel()
    config = model.config
    return 6 * matmul + 12 * config.num_hidden_layers * config.hidden_size * length
