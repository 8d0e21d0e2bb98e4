"""What each attention backend, serving engine and parallel plan can run: every rule "X cannot run option Y" in one
place, two tables; then the parallel plans themselves (how transformers' tensor, expert and pipeline parallelism shard
a model, from the config's fields), the layout check before anything is sharded, and the one reduction hf_tfm runs
over data-parallel ranks (the routers' expert loads), with the model methods that use them (`TfmParallelMixin`).

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

import torch
from transformers.configuration_utils import PreTrainedConfig
from transformers.distributed import DistributedConfig

from .compat import TOKEN_DISPATCH, vllm_mla_disabled
from .configuration_tfm_rules import ATTENTION_BIAS_POSITIONS

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
        "alibi and relative_bias add a bias to the attention scores, which this backend cannot take; use eager, "
        "sdpa or flex_attention, or position_embedding_type='rope'",
    ),
    Rule(
        everything_but("eager", "sdpa"),
        "position_embedding_type",
        lambda config: config.position_embedding_type == "disentangled",
        "disentangled attention adds its position scores through the mask, which eager and sdpa take; use one of them",
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
        "word_embed_proj_dim",
        lambda config: config.word_embed_proj_dim is not None,
        "vLLM's Transformers backend builds its LM head hidden_size wide, and the projected table's head is narrower; "
        "run the model with transformers",
    ),
    Rule(
        vllm,
        "layer_sharing",
        lambda config: bool(config.layer_sharing),
        "vLLM's Transformers backend is unproved with blocks shared across depth (its pipeline stages split "
        "`layers` by depth); run the model with transformers",
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
    Rule(vllm, "moe_ffn_type", moe_for_vllm(lambda c: c.moe_ffn_type != "glu"), "vLLM's experts are gated (glu)"),
    *[
        Rule(
            vllm,
            field,
            moe_for_vllm(lambda c, field=field: getattr(c, field) is not None),
            "vLLM's experts are dropless; use None",
        )
        for field in ("capacity_factor", "expert_capacity")
    ],
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


def experts_refusal(config, implementation: str) -> str | None:
    """Why the experts backend `implementation` cannot run the experts of `config`, naming the field; None when it
    can, or without experts. Only the eager loop drops out inside each expert (`activation_dropout`, Switch
    Transformer's): a fused backend would train without it. torch's grouped matmul (`"grouped_mm"`, transformers'
    default) needs rows of a multiple of 16 bytes, so widths a multiple of 8 in a 16-bit dtype (a float32 model cast
    to bf16 later too)."""
    if not config.has_moe_layers() or implementation == "eager":
        return None
    if config.activation_dropout > 0:
        return (
            f"activation_dropout={config.activation_dropout} cannot run with experts_implementation="
            f"{implementation!r}: only the 'eager' experts drop out inside each expert; use 'eager', or "
            "activation_dropout=0 to serve or evaluate with a fused backend"
        )
    if implementation != "grouped_mm":
        return None
    for field in ("hidden_size", "moe_intermediate_size"):
        width = getattr(config, field)
        if width % 8:
            return (
                f"{field}={width} cannot run with experts_implementation='grouped_mm': torch's grouped matmul needs "
                "rows of a multiple of 16 bytes (widths a multiple of 8 in bf16); use 'batched_mm' or 'eager', or a "
                "width that is a multiple of 8"
            )
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
# accelerate's context-parallel hooks drop every self-attention's mask and ask sdpa for plain causal attention
CONTEXT_CAUSAL = "context parallelism drops the attention mask and attends causally through sdpa"
PARALLEL_RULES = (
    ParallelRule(
        ("tensor",), "attention_sinks", lambda config: config.attention_sinks, f"a sink per head: {UNSHARDED}"
    ),
    ParallelRule(("tensor", "expert"), "router_bias", lambda config: config.router_bias, UNSHARDED),
    ParallelRule(("tensor", "expert"), "expert_mlp_bias", lambda config: config.expert_mlp_bias, UNSHARDED),
    ParallelRule(
        ("tensor", "expert"),
        "moe_ffn_type",
        lambda config: config.moe_ffn_type != "glu",
        f"ungated experts: {UNSHARDED}",
    ),
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
    ParallelRule(
        ("context",),
        "model_type",
        lambda config: config.is_encoder_decoder or not config.is_decoder,
        f"{CONTEXT_CAUSAL}, and a bidirectional stack would attend causally",
    ),
    ParallelRule(
        ("context",),
        "position_embedding_type",
        lambda config: config.position_embedding_type in ATTENTION_BIAS_POSITIONS,
        f"{CONTEXT_CAUSAL}, and the position bias the mask carries would be lost",
    ),
    ParallelRule(
        ("context",),
        "layer_types",
        lambda config: any(kind != "full_attention" for kind in config.layer_types or ()),
        f"{CONTEXT_CAUSAL}, and a sliding window would widen to the whole past",
    ),
    ParallelRule(
        ("context",),
        "attention_sinks",
        lambda config: config.attention_sinks,
        f"{CONTEXT_CAUSAL}, which adds no sinks",
    ),
    ParallelRule(
        ("context",),
        "attn_logit_softcapping",
        lambda config: config.attn_logit_softcapping is not None,
        f"{CONTEXT_CAUSAL}, which caps no scores",
    ),
)


def parallel_refusal(config, plans: set[str]) -> tuple[str, str] | None:
    """(field, why) where one of the parallel `plans` in use ("tensor", "expert", "pipeline", "context") would compute
    `config` wrongly, else None."""
    for rule in PARALLEL_RULES:
        if plans.intersection(rule.plans) and rule.refuses(config):
            return rule.field, f"{rule.field}={getattr(config, rule.field)!r}: {rule.instead}"
    return None


# ------------------------------------------------------------------------------------------- the parallel plans


# Every `config` here is an hf_tfm config (configuration_tfm.TfmConfig), annotated as its transformers base class.

# transformers shards a model by module name: the base model's plans (`tp_plan`, `ep_plan`, `pp_plan`, which
# transformers' own models copy from their config's class attributes) map its modules to parallel styles, each head
# class adds its own (`_tp_plan`), and `from_pretrained(path, tp_plan="auto")` (or
# `distributed_config=DistributedConfig(tp_size=N, ep_size=M)`) applies them. Only transformers' styles are used;
# what a block may shard depends on the options the config picks.


def joins_qkv(config: PreTrainedConfig, cross_attention: bool) -> bool:
    """Whether an attention holds its q, k and v as one `qkv_proj`: `fused_qkv_proj` joins a self-attention's; a
    cross-attention's keys and values read another stack's states, so its three stay apart."""
    return config.fused_qkv_proj and not cross_attention


def gathered_attention(config: PreTrainedConfig, cross_attention: bool) -> bool:
    """Whether an attention must see every head on every rank: a QK-norm over the whole projection (OLMo2) needs all
    of it, an additive position bias (ALiBi, T5's relative bias, DeBERTa's position scores) is computed for all heads
    of a self-attention, and one q/k/v matrix (`fused_qkv_proj`) split by columns would give a rank rows of the three
    mixed."""
    position_bias = config.position_embedding_type in ATTENTION_BIAS_POSITIONS and not cross_attention
    return config.qk_norm == "projection" or position_bias or joins_qkv(config, cross_attention)


def attention_tp_plan(config: PreTrainedConfig, prefix: str, cross_attention: bool) -> dict[str, str]:
    """One attention's rules. Sharded (Llama's plan): each rank projects whole query and key/value heads (`colwise`),
    attends over them, and adds its part of the output projection (`rowwise`). Gathered (OLMo2's and Phi-3's plans):
    the projections' weights are sharded but their outputs gathered, every rank runs all heads, and the output
    projection takes its slice of the replicated input (`rowwise_split_input`)."""
    projections = ("qkv_proj",) if joins_qkv(config, cross_attention) else ("q_proj", "k_proj", "v_proj")
    if gathered_attention(config, cross_attention):
        styles = dict.fromkeys(projections, "colwise_gather_output")
        styles["o_proj"] = "rowwise_split_input"
    else:
        styles = dict.fromkeys(projections, "colwise") | {"o_proj": "rowwise"}
        if config.qk_norm == "per_head":  # replicated weights that see only this rank's heads: gradients summed
            styles |= dict.fromkeys(("q_norm", "k_norm"), "replicated_with_grad_allreduce")
    return {f"{prefix}.{name}": style for name, style in styles.items()}


def feed_forward_tp_plan(prefix: str, gated: bool) -> dict[str, str]:
    """A feed-forward's rules: the inner width sharded (up and gate `colwise`, down `rowwise`), as Llama's MLP."""
    styles = {"gate_proj": "colwise"} if gated else {}
    styles |= {"up_proj": "colwise", "down_proj": "rowwise"}
    return {f"{prefix}.{name}": style for name, style in styles.items()}


def stack_tp_plan(config: PreTrainedConfig, depth: int, cross_attention: bool) -> dict[str, str]:
    """The rules of one stack's blocks, named from the stack. Norms, routers and position tables stay replicated;
    the routed experts shard their inner width (Mixtral's plan), the shared expert as a gated MLP."""
    plan = attention_tp_plan(config, "layers.*.self_attn", cross_attention=False)
    if cross_attention:
        plan |= attention_tp_plan(config, "layers.*.cross_attn", cross_attention=True)
    moe_layers = [config.is_moe_layer(i, decoder=cross_attention) for i in range(depth)]
    if not all(moe_layers):
        plan |= feed_forward_tp_plan("layers.*.mlp", gated=config.ffn_type == "glu")
    if any(moe_layers):
        plan |= {
            "layers.*.mlp.experts.gate_up_proj": "packed_colwise",  # [E, 2I, H]: gate and up rows split alike
            "layers.*.mlp.experts.down_proj": "rowwise",  # [E, H, I]
            "layers.*.mlp.experts": "moe_tp_experts",  # local weights in, partial outputs summed
        }
        if config.shared_expert_intermediate_size:
            plan |= feed_forward_tp_plan("layers.*.mlp.shared_expert", gated=True)
    return plan


def tensor_parallel_plan(config: PreTrainedConfig) -> dict[str, str]:
    """The base model's tensor-parallel plan: the token table split over the vocabulary (as the tied LM heads are),
    then each stack's blocks."""
    plan = {"shared" if config.is_encoder_decoder else "embed_tokens": "embedding_rowwise"}
    for prefix, depth, cross_attention in config.stacks():
        plan |= {prefix + name: style for name, style in stack_tp_plan(config, depth, cross_attention).items()}
    return plan


def expert_parallel_plan(config: PreTrainedConfig) -> dict[str, str] | None:
    """The base model's expert-parallel plan: whole experts per rank (Mixtral's plan), None without MoE layers."""
    if not config.has_moe_layers():
        return None
    plan = EXPERT_PARALLEL_PLAN if TOKEN_DISPATCH else ROUTER_MASKING_EXPERT_PARALLEL_PLAN
    return {prefix + name: style for prefix, _, _ in config.stacks() for name, style in plan.items()}


# transformers >= 5.21 (compat.TOKEN_DISPATCH): each token is sent to the rank of its experts, beside the
# tensor-parallel plan of the other layers
EXPERT_PARALLEL_PLAN = {
    "layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
    "layers.*.mlp.experts.down_proj": "grouped_gemm",
    "layers.*.mlp.experts": "ep_dispatch_experts",
}
# transformers 5.17-5.20 (`DistributedConfig(enable_expert_parallel=True)`, instead of the tensor-parallel plan):
# every rank runs the whole batch through its own experts, the router's choices of other ranks' experts masked
ROUTER_MASKING_EXPERT_PARALLEL_PLAN = {
    "layers.*.mlp.router": "ep_router",
    "layers.*.mlp.experts.gate_up_proj": "grouped_gemm",
    "layers.*.mlp.experts.down_proj": "grouped_gemm",
    "layers.*.mlp.experts": "moe_tp_experts",
}


def pipeline_parallel_plan(config: PreTrainedConfig) -> dict | None:
    """transformers' pipeline plan (Llama's), where its pipeline computes this model exactly."""
    if parallel_refusal(config, {"pipeline"}):
        return None
    plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
    }
    return plan | ({"norm": (["hidden_states"], ["hidden_states"])} if config.final_norm else {})


def check_parallel_layout(config: PreTrainedConfig, distributed_config: DistributedConfig) -> None:
    """Refuse, naming the field, a layout (`DistributedConfig`'s sizes, known only when a model is distributed)
    that the plans would shard wrongly: a rank must hold whole heads and equal slices of each width."""
    tp, pp = distributed_config.tp_size or 1, distributed_config.pp_size or 1
    ep = getattr(distributed_config, "ep_size", None) or (tp if distributed_config.enable_expert_parallel else 1)
    if ep > 1 and not TOKEN_DISPATCH:  # transformers 5.17-5.20 apply the expert plan instead of the tensor one
        tp = 1
    divisible = {}  # field -> the parallel size its value must divide by
    moe_layers = [config.is_moe_layer(i, decoder) for _, depth, decoder in config.stacks() for i in range(depth)]
    if tp > 1:
        attentions = [False, True] if any(cross for _, _, cross in config.stacks()) else [False]  # cross or not
        if not all(gathered_attention(config, cross_attention) for cross_attention in attentions):
            divisible.update(num_attention_heads=tp, num_key_value_heads=tp)
        if not all(moe_layers):
            divisible["intermediate_size"] = tp
        if any(moe_layers) and ep == 1:  # expert parallelism keeps every expert whole
            divisible["moe_intermediate_size"] = tp
        if any(moe_layers) and config.shared_expert_intermediate_size:
            divisible["shared_expert_intermediate_size"] = tp
    if ep > 1:
        divisible["num_experts"] = ep
    plans = {plan for plan, size in (("tensor", tp), ("expert", ep), ("pipeline", pp)) if size > 1}
    if refusal := parallel_refusal(config, plans):  # the capabilities table's parallel rules
        field, why = refusal
        raise ValueError(f"Invalid `{field}` for tp_size={tp}, ep_size={ep}, pp_size={pp}: {why}")
    for field, size in divisible.items():
        if getattr(config, field) % size:
            raise ValueError(
                f"Invalid `{field}`: {getattr(config, field)} does not split into {size} equal parts, one per rank "
                f"of {type(distributed_config).__name__}({distributed_config.to_dict()})"
            )


def sum_over_data_parallel_ranks(model: torch.nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the ranks that train `model` on different batches. A model sharded at load time
    (`from_pretrained(..., distributed_config=...)`) names them in its device mesh (the "dp_replicate" and "fsdp"
    dimensions: tensor-parallel ranks share a batch, pipeline stages hold different layers); under DDP or a
    `fully_shard` of one's own, every process is a data-parallel replica. One process returns `tensor` as it is."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return tensor
    mesh_manager = getattr(model, "_mesh_manager", None)  # set by transformers' distributed loading
    if mesh_manager is None:
        if torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(tensor)
        return tensor
    from torch.distributed.tensor import DTensor, Partial

    mesh = mesh_manager.get_mesh(("dp_replicate", "fsdp"))
    if mesh.size() == 1:
        return tensor
    return DTensor.from_local(tensor, mesh, [Partial()] * mesh.ndim).full_tensor()


class TfmParallelMixin:
    """What an hf_tfm model adds to transformers' parallelism (a base of TfmPreTrainedModel, before PreTrainedModel):
    whether context parallelism computes it, the layout check before sharding, and the routers' bias update, summed
    over data-parallel ranks. The plans are the config's (`base_model_tp_plan`...), which transformers copies onto the
    base model."""

    @property
    def supports_context_parallel(self) -> bool:
        # transformers' answer reads the layer types only; accelerate's hooks also drop the position bias a mask
        # carries and make every self-attention causal, so only a causal decoder of plain full attention stays itself
        return super().supports_context_parallel and parallel_refusal(self.config, {"context"}) is None

    @classmethod
    def maybe_distribute_model(cls, model, distributed_config, *args, **kwargs):
        # the parallel sizes are known only now: a layout the config's plans would shard wrongly is refused by field
        if distributed_config is not None:
            check_parallel_layout(model.config, distributed_config)
        return super().maybe_distribute_model(model, distributed_config, *args, **kwargs)

    @torch.no_grad()
    def update_router_biases(self) -> None:
        """Auxiliary-loss-free balancing: after an optimizer step, move every router's expert bias against the load
        it saw since the last call (`RouterBiasCallback` does this under Trainer). Under data parallelism the loads
        are summed over the data-parallel ranks first, so every replica moves its biases alike: every rank must
        call this after the same optimizer step."""
        # the routers that balance without an auxiliary loss (modeling_tfm_moe.TfmRouter)
        routers = [module for module in self.modules() if getattr(module, "balancing", False)]
        if not routers:
            return
        loads = sum_over_data_parallel_ranks(self, torch.stack([router.tokens_per_expert for router in routers]))
        for router, load in zip(routers, loads):
            router.tokens_per_expert.copy_(load)
            router.update_bias(self.config.router_bias_update_rate)
