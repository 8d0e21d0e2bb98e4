"""What each attention backend, serving engine and parallel plan can run: every rule "X cannot run option Y" in one
place, two tables.

A rule names the config field, says what it refuses and what to use instead. `backend_refusal` (RULES: attention
backends and serving engines) is asked when a model is built or loaded and when its backend is switched
(`TfmPreTrainedModel.get_correct_attn_implementation` and `post_init`); `parallel_refusal` (PARALLEL_RULES: the
tensor-, expert- and pipeline-parallel plans) when a model is distributed (`check_parallel_layout`, before anything is
sharded) and when transformers reads the pipeline plan. So a backend, an engine or a plan refuses the model before it
runs, never with silently different numbers; nothing is checked again inside a forward. What a layout's sizes must
divide (heads, widths, experts) is arithmetic on the sizes, in `check_parallel_layout`.
"""

from collections.abc import Callable
from dataclasses import dataclass

from .compat import vllm_mla_disabled

# the backends that can add a bias to the attention scores: eager and sdpa through the mask, flex through its score
# function; every flash kernel, paged attention and vLLM take none
BIAS_BACKENDS = ("eager", "sdpa", "flex_attention")


def everything_but(*implementations: str) -> Callable[[str], bool]:
    return lambda implementation: implementation not in implementations


def only(*implementations: str) -> Callable[[str], bool]:
    return lambda implementation: implementation in implementations


@dataclass(frozen=True)
class Rule:
    backends: Callable[[str], bool]  # whether the rule refuses this backend
    field: str
    refuses: Callable  # config -> whether its value is refused
    instead: str  # why, and what to use instead

    def message(self, config, implementation: str) -> str:
        value = getattr(config, self.field)
        return f"{self.field}={value!r} cannot run with attn_implementation={implementation!r}: {self.instead}"


def moe_for_vllm(refuses: Callable) -> Callable:
    """A rule on an MoE model that vLLM serves with its fused experts (a dense model's MoE fields are inert)."""
    return lambda config: config.has_moe_layers() and refuses(config)


def sequence_classifiers(config) -> list[str]:
    return [name for name in config.architectures or () if name.endswith("ForSequenceClassification")]


vllm = only("vllm")
RULES = (
    Rule(
        only("sdpa"),
        "attn_logit_softcapping",
        lambda config: config.attn_logit_softcapping is not None,
        "sdpa cannot soft-cap attention scores; use eager, flex_attention or a flash attention kernel that caps",
    ),
    Rule(
        only("sdpa"),
        "attention_sinks",
        lambda config: config.attention_sinks,
        "sdpa cannot add attention sinks; use eager, flex_attention or a flash attention kernel with sinks",
    ),
    Rule(
        everything_but(*BIAS_BACKENDS),
        "position_embedding_type",
        lambda config: config.position_embedding_type in ("alibi", "relative_bias"),
        "it adds a bias to the attention scores, which this backend cannot take; use eager, sdpa or "
        "flex_attention, or position_embedding_type='rope'",
    ),
    # vLLM's Transformers backend: its own paged attention, and its fused MoE in place of the experts
    Rule(
        vllm,
        "model_type",
        lambda config: config.is_encoder_decoder,
        "vLLM serves decoder-only and encoder-only models; use generate()",
    ),
    Rule(
        vllm,
        "architectures",
        lambda config: bool(sequence_classifiers(config)),
        "vLLM's pooling runner scores sequences with a pooler and classifier of its own (it skips the BERT "
        "pooler's dense + tanh and is unproved against hf_tfm's heads), so it would not give this head's logits; "
        "serve the base model for embeddings, or classify with the model",
    ),
    Rule(
        vllm,
        "kv_lora_rank",
        lambda config: config.kv_lora_rank is not None and not vllm_mla_disabled(),
        "latent attention: vLLM sizes its MLA cache only for DeepSeek's own model types, so serving would fail at "
        "the first request; set VLLM_MLA_DISABLE=1 to serve it as full attention over the expanded keys and "
        "values (the same tokens, a larger cache)",
    ),
    Rule(
        vllm, "hidden_act", moe_for_vllm(lambda c: c.hidden_act != "silu"), "vLLM's experts compute SwiGLU; use silu"
    ),
    # top_k_softmax's weights are the renormalised softmax's, which vLLM's router computes
    Rule(vllm, "scoring_func", moe_for_vllm(lambda c: c.scoring_func == "sigmoid"), "vLLM's router uses softmax"),
    Rule(
        vllm,
        "capacity_factor",
        moe_for_vllm(lambda c: c.capacity_factor is not None),
        "vLLM's experts are dropless; use None",
    ),
    Rule(
        vllm,
        "router_bias_update_rate",
        moe_for_vllm(lambda c: c.router_bias_update_rate > 0),
        "vLLM's router adds no expert bias",
    ),
    Rule(
        vllm,
        "shared_expert_intermediate_size",
        moe_for_vllm(lambda c: c.shared_expert_intermediate_size > 0),
        "shared experts are not mapped to vLLM",
    ),
    Rule(vllm, "router_bias", moe_for_vllm(lambda c: c.router_bias), "vLLM's router has no bias"),
    Rule(vllm, "expert_mlp_bias", moe_for_vllm(lambda c: c.expert_mlp_bias), "vLLM's fused experts have no biases"),
    Rule(
        vllm,
        "swiglu_limit",
        moe_for_vllm(lambda c: c.swiglu_limit is not None),
        "vLLM's fused experts compute the plain SwiGLU",
    ),
    Rule(vllm, "router_choice_bias", moe_for_vllm(lambda c: c.router_choice_bias), "vLLM's router adds no bias"),
    Rule(
        vllm,
        "num_expert_groups",
        moe_for_vllm(lambda c: c.num_expert_groups > 1),
        "vLLM's router routes over all experts",
    ),
    Rule(
        vllm,
        "routed_scaling_factor",
        moe_for_vllm(lambda c: c.routed_scaling_factor != 1.0),
        "vLLM's router does not scale",
    ),
)


def backend_refusal(config, implementation: str | None) -> str | None:
    """Why the attention backend `implementation` (or the serving engine behind it) cannot run `config`, naming the
    field and what to use instead; None when it can (and for None, which lets transformers pick)."""
    if implementation is None:
        return None
    for rule in RULES:
        if rule.backends(implementation) and rule.refuses(config):
            return rule.message(config, implementation)
    return None


# ---------------------------------------------------------------------------------------------- parallel plans


@dataclass(frozen=True)
class ParallelRule:
    plans: tuple[str, ...]  # the plans that refuse it: "tensor", "expert", "pipeline"
    field: str
    refuses: Callable  # config -> whether its value is refused
    instead: str


UNSHARDED = "no plan shards it yet; run it unsharded or with data parallelism (FSDP)"
# each stage of transformers' pipeline takes the hidden states of the one before as inputs_embeds
PIPELINE_EMBEDDING = "it would be applied again to the hidden states each later stage receives"
PARALLEL_RULES = (
    ParallelRule(
        ("tensor",), "attention_sinks", lambda config: config.attention_sinks, f"a sink per head: {UNSHARDED}"
    ),
    ParallelRule(("tensor", "expert"), "router_bias", lambda config: config.router_bias, UNSHARDED),
    ParallelRule(("tensor", "expert"), "expert_mlp_bias", lambda config: config.expert_mlp_bias, UNSHARDED),
    ParallelRule(
        ("tensor",),
        "kv_lora_rank",
        lambda config: config.kv_lora_rank is not None,
        f"latent attention's projections: {UNSHARDED}",
    ),
    ParallelRule(
        ("pipeline",),
        "model_type",
        lambda config: config.is_encoder_decoder or not config.is_decoder,
        "transformers pipelines decoder-only causal LMs only",
    ),
    ParallelRule(
        ("pipeline",),
        "position_embedding_type",
        lambda config: config.position_embedding_type in ("learned", "sinusoidal"),
        PIPELINE_EMBEDDING,
    ),
    ParallelRule(
        ("pipeline",), "position_ids_from_padding", lambda config: config.position_ids_from_padding, PIPELINE_EMBEDDING
    ),
    ParallelRule(("pipeline",), "type_vocab_size", lambda config: config.type_vocab_size > 0, PIPELINE_EMBEDDING),
    ParallelRule(("pipeline",), "embedding_norm", lambda config: config.embedding_norm, PIPELINE_EMBEDDING),
    ParallelRule(("pipeline",), "scale_embeddings", lambda config: config.scale_embeddings, PIPELINE_EMBEDDING),
)


def parallel_refusal(config, plans: set[str]) -> tuple[str, str] | None:
    """(field, why) where one of the parallel `plans` in use ("tensor", "expert", "pipeline") would compute `config`
    wrongly, else None."""
    for rule in PARALLEL_RULES:
        if plans.intersection(rule.plans) and rule.refuses(config):
            return rule.field, f"{rule.field}={getattr(config, rule.field)!r}: {rule.instead}"
    return None
