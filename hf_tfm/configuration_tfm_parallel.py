"""Parallelism plans of an hf_tfm model: how transformers' tensor, expert and pipeline parallelism shard it
(`from_pretrained(path, tp_plan="auto")` or `distributed_config=DistributedConfig(...)`), computed from the config's
fields when the model is built, and the layouts those plans would shard wrongly, refused by field before anything is
sharded; the one reduction hf_tfm itself runs over data-parallel ranks (the routers' expert loads); and the model
methods that use them (`TfmParallelMixin`).
"""

import torch
from transformers.configuration_utils import PreTrainedConfig
from transformers.distributed import DistributedConfig

from .capabilities import parallel_refusal
from .compat import TOKEN_DISPATCH

# Every `config` here is an hf_tfm config (configuration_tfm.TfmConfig), annotated as its transformers base class.

# transformers shards a model by module name: the base model's plans (`tp_plan`, `ep_plan`, `pp_plan`, which
# transformers' own models copy from their config's class attributes) map its modules to parallel styles, each head
# class adds its own (`_tp_plan`), and `from_pretrained(path, tp_plan="auto")` (or
# `distributed_config=DistributedConfig(tp_size=N, ep_size=M)`) applies them. Only transformers' styles are used;
# what a block may shard depends on the options the config picks.


def gathered_attention(config: PreTrainedConfig, cross_attention: bool) -> bool:
    """Whether an attention must see every head on every rank: a QK-norm over the whole projection (OLMo2) needs all
    of it, an additive position bias (ALiBi, T5's relative bias) is computed for all heads of a self-attention, and
    one q/k/v matrix (`fused_qkv_proj`) split by columns would give a rank rows of the three mixed."""
    position_bias = config.position_embedding_type in ("alibi", "relative_bias") and not cross_attention
    return config.qk_norm == "projection" or position_bias or config.joins_qkv(cross_attention)


def attention_tp_plan(config: PreTrainedConfig, prefix: str, cross_attention: bool) -> dict[str, str]:
    """One attention's rules. Sharded (Llama's plan): each rank projects whole query and key/value heads (`colwise`),
    attends over them, and adds its part of the output projection (`rowwise`). Gathered (OLMo2's and Phi-3's plans):
    the projections' weights are sharded but their outputs gathered, every rank runs all heads, and the output
    projection takes its slice of the replicated input (`rowwise_split_input`)."""
    projections = ("qkv_proj",) if config.joins_qkv(cross_attention) else ("q_proj", "k_proj", "v_proj")
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
    moe_layers = [config.is_moe_layer(i) for i in range(depth)]
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
    moe_layers = [config.is_moe_layer(i) for _, depth, _ in config.stacks() for i in range(depth)]
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
    the plans computed from the config, the layout check before sharding, and the routers' bias update, summed over
    data-parallel ranks."""

    def init_parallel_plans(self) -> None:
        # transformers' own models copy fixed class-level plans from their config here; hf_tfm's follow the config's
        # fields (which attentions gather their heads, which layers hold experts), so a base model computes them as it
        # is built. Rules assigned to the config (`config.base_model_tp_plan = {...}`) stay on top.
        super().init_parallel_plans()
        if self.base_model is self:
            config = self.config
            self._tp_plan = {**tensor_parallel_plan(config), **self._tp_plan}
            self._ep_plan = {**(expert_parallel_plan(config) or {}), **self._ep_plan}
            self._pp_plan = {**(pipeline_parallel_plan(config) or {}), **self._pp_plan}

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
        # the routers that balance without an auxiliary loss (modeling_tfm_layers.TfmRouter: not imported, because the
        # layers import the config, which imports this module)
        routers = [module for module in self.modules() if getattr(module, "balancing", False)]
        if not routers:
            return
        loads = sum_over_data_parallel_ranks(self, torch.stack([router.tokens_per_expert for router in routers]))
        for router, load in zip(routers, loads):
            router.tokens_per_expert.copy_(load)
            router.update_bias(self.config.router_bias_update_rate)
