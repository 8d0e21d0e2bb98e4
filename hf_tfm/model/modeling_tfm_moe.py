"""Mixture of Experts: the router, the fused routed experts (run by transformers' experts backends), the MoE layer
with an optional shared expert, and the router losses (load balancing, z-loss)."""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.integrations.moe import use_experts_implementation

from .configuration_tfm import TfmConfig
from .modeling_tfm_layers import TfmGLU, make_dropout


class TfmRouter(nn.Module):
    """Scores every expert for every token and picks the top-k. An optional per-expert bias (auxiliary-loss-free
    balancing, DeepSeek-V3) shifts which experts are chosen but not the weights they get; an optional capacity drops
    the assignments an expert cannot take (weight 0, so the token keeps only its other experts)."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.scoring_func, self.norm_topk_prob = config.scoring_func, config.norm_topk_prob
        self.jitter_noise, self.capacity_factor = config.router_jitter_noise, config.capacity_factor
        self.expert_capacity = config.expert_capacity
        self.in_float32 = "router_in_float32" in config.numerics
        self.weights_in_model_dtype = "router_weights_in_model_dtype" in config.numerics
        self.scores_in_model_dtype = "router_scores_in_model_dtype" in config.numerics
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.empty(self.num_experts)) if config.router_bias else None  # GPT-OSS
        self.balancing = config.router_bias_update_rate > 0
        self.choice_bias = self.balancing or config.router_choice_bias
        if self.choice_bias:
            self.expert_bias = nn.Buffer(torch.zeros(self.num_experts))  # learned state: saved with the model
        if self.balancing:
            self.tokens_per_expert = nn.Buffer(torch.zeros(self.num_experts), persistent=False)
        self.groups, self.topk_groups = config.num_expert_groups, config.topk_expert_groups
        self.group_score = config.expert_group_score
        self.scaling = config.routed_scaling_factor

    def forward(
        self, hidden_states: torch.Tensor, sequences: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[tokens, hidden] (`sequences` sequences of equal length, one after the other) -> router logits [tokens,
        experts], top-k weights and indices [tokens, k]."""
        model_dtype, weight, bias = hidden_states.dtype, self.weight, self.bias
        if self.in_float32:  # DeepSeek-V3 and Switch score in float32 whatever the model's dtype
            hidden_states, weight = hidden_states.float(), weight.float()
            bias = None if bias is None else bias.float()
        router_logits = nn.functional.linear(hidden_states, weight, bias)
        top_k_weights, top_k_index = self.top_k_experts(router_logits, model_dtype)
        if self.scaling != 1.0:
            top_k_weights = top_k_weights * self.scaling
        if self.capacity_factor is not None or self.expert_capacity is not None:
            top_k_weights = torch.where(self.within_capacity(top_k_index, sequences), top_k_weights, 0.0)
        if self.weights_in_model_dtype:  # Qwen2-MoE, Qwen3-MoE, GPT-OSS: the weights scale the experts rounded
            top_k_weights = top_k_weights.to(model_dtype)
        if self.balancing and self.training:
            with torch.no_grad():  # not bincount, which reads the largest id to size its output (a device sync)
                picks = top_k_index.flatten()
                self.tokens_per_expert.index_add_(0, picks, torch.ones_like(picks, dtype=self.tokens_per_expert.dtype))
        return router_logits, top_k_weights, top_k_index

    def jittered(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`hidden_states` times uniform noise in [1 - jitter, 1 + jitter], drawn in the dtype the router scores in
        (float32 with `router_in_float32`, as Switch draws it)."""
        dtype = torch.float32 if self.in_float32 else hidden_states.dtype
        noise = torch.empty(hidden_states.shape, dtype=dtype, device=hidden_states.device)
        return hidden_states * noise.uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)

    def top_k_experts(
        self, router_logits: torch.Tensor, model_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's k experts and their weights, by the scoring function."""
        if self.scoring_func == "top_k_softmax":  # GPT-OSS: the k best logits, weighted by their own softmax
            top_k_logits, top_k_index = torch.topk(router_logits, self.top_k, dim=-1)
            return torch.softmax(top_k_logits, dim=-1, dtype=top_k_logits.dtype), top_k_index
        if self.scoring_func == "softmax":
            scores = torch.softmax(router_logits.float(), dim=-1)
        else:
            scores = torch.sigmoid(router_logits.float())
        if self.scores_in_model_dtype:  # Switch: chosen and weighted by probabilities rounded to the model's dtype
            scores = scores.to(model_dtype)
        if not self.choice_bias and self.groups == 1:  # the weights are the scores topk picks
            top_k_weights, top_k_index = torch.topk(scores, self.top_k, dim=-1)
        else:  # picked by biased or group-limited scores, weighted by the scores themselves
            choice = scores + self.expert_bias if self.choice_bias else scores
            if self.groups > 1:
                choice = self.within_best_groups(choice)
            top_k_index = torch.topk(choice, self.top_k, dim=-1).indices
            top_k_weights = scores.gather(-1, top_k_index)
        if self.norm_topk_prob:
            top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        return top_k_weights, top_k_index

    def within_best_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """`choice` with -inf outside each token's best `topk_groups` groups of experts, a group scored by the sum of
        its two best choice scores (DeepSeek-V3) or by its best one (DeepSeek-V2)."""
        grouped = choice.view(choice.shape[0], self.groups, -1)
        if self.group_score == "max":
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        best = group_scores.topk(self.topk_groups, dim=-1).indices
        kept = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).view_as(choice)

    def within_capacity(self, top_k_index: torch.Tensor, sequences: int) -> torch.Tensor:
        """True where an assignment fits its expert's capacity, False where it overflows: first come, first served in
        token order, each token's first choice before its second, within each sequence (`expert_capacity` tokens per
        expert) or within the whole batch (`capacity_factor`)."""
        groups = 1 if self.expert_capacity is None else sequences
        tokens = top_k_index.shape[0] // groups
        capacity = self.expert_capacity or math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)
        in_order = top_k_index.reshape(groups, tokens, self.top_k).transpose(1, 2).reshape(groups, -1)
        one_hot = nn.functional.one_hot(in_order, self.num_experts)
        position = (one_hot.cumsum(dim=1) * one_hot).sum(dim=-1) - 1
        return (position < capacity).reshape(groups, self.top_k, tokens).transpose(1, 2).reshape(-1, self.top_k)

    @torch.no_grad()
    def update_bias(self, rate: float) -> None:
        """Move each expert's bias against its load since the last update (under-loaded up, over-loaded down)."""
        load = self.tokens_per_expert  # no load (nothing routed) moves nothing: sign(0) = 0, without a device sync
        self.expert_bias += rate * torch.sign(load.mean() - load)
        load.zero_()


@use_experts_implementation
class TfmExperts(nn.Module):
    """All experts' weights in fused tensors, so transformers' experts backends (`experts_implementation`: eager,
    batched_mm, grouped_mm...) run them. Gated experts (`moe_ffn_type="glu"`) hold `gate_up_proj [E, 2I, H]` and
    call `_apply_gate` for the activation (Mixtral's layout); plain ones (`"mlp"`) hold `up_proj [E, I, H]` and apply
    `act_fn` (transformers' `has_gate=False` layout: Switch Transformer); both `down_proj [E, H, I]`. Optional biases
    (`gate_up_proj_bias` or `up_proj_bias`, `down_proj_bias`: GPT-OSS). This eager forward is the reference the
    backends replace."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_experts = config.num_experts
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        gated = config.moe_ffn_type == "glu"
        up_rows = 2 * inner if gated else inner
        self.gate_up_proj = self.up_proj = self.gate_up_proj_bias = self.up_proj_bias = self.down_proj_bias = None
        up = nn.Parameter(torch.empty(experts, up_rows, hidden))
        up_bias = nn.Parameter(torch.empty(experts, up_rows)) if config.expert_mlp_bias else None
        if gated:
            self.gate_up_proj, self.gate_up_proj_bias = up, up_bias
        else:
            self.up_proj, self.up_proj_bias = up, up_bias
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inner))
        if config.expert_mlp_bias:
            self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))
        self.act_fn = ACT2FN[config.hidden_act]
        self.activation_dropout = make_dropout(config.activation_dropout)  # each expert's, as Switch's drop out
        self.swiglu_limit, self.swiglu_alpha = config.swiglu_limit, config.swiglu_alpha

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`act(gate) * up`, or GPT-OSS's clamped SwiGLU where `swiglu_limit` is set."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.swiglu_limit is None:
            return self.act_fn(gate) * up
        gate = gate.clamp(min=None, max=self.swiglu_limit)
        up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.swiglu_alpha))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        output = torch.zeros_like(hidden_states)
        up_proj, up_proj_bias = (
            (self.gate_up_proj, self.gate_up_proj_bias) if self.has_gate else (self.up_proj, self.up_proj_bias)
        )
        with torch.no_grad():
            # under expert parallelism `num_experts` counts this rank's experts, and index `num_experts` marks a route
            # to another rank's (weight 0): skipped, as Mixtral's experts do. Any other assignment of weight 0 (a
            # token over its expert's capacity) is skipped too, as Switch's experts never see it: each expert then
            # multiplies the rows the reference's does, rounded alike
            kept_index = top_k_index.masked_fill(top_k_weights == 0, self.num_experts)
            routed = nn.functional.one_hot(kept_index, num_classes=self.num_experts + 1).permute(2, 1, 0)  # [E+1,k,T]
            hit = torch.greater(routed[: self.num_experts].sum(dim=(-1, -2)), 0).nonzero()
        for expert in hit:
            expert = expert[0]
            slot, token = torch.where(routed[expert])
            up_bias = None if up_proj_bias is None else up_proj_bias[expert]
            down_bias = None if self.down_proj_bias is None else self.down_proj_bias[expert]
            projected = nn.functional.linear(hidden_states[token], up_proj[expert], up_bias)
            inner = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
            inner = self.activation_dropout(inner)
            expert_out = nn.functional.linear(inner, self.down_proj[expert], down_bias)
            output.index_add_(0, token, (expert_out * top_k_weights[token, slot, None]).to(output.dtype))
        return output


class TfmMoE(nn.Module):
    """A sparse feed-forward layer: a router, fused routed experts, and an optional always-on shared expert."""

    # DeepSpeed ZeRO-3 gathers a leaf module's parameters all at once when it is entered, instead of per submodule
    # as each is called: a rank whose tokens skip what another rank's reach must not wait on a gather that never comes
    _z3_leaf = True

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.router = TfmRouter(config)
        self.experts = TfmExperts(config)
        # transformers' experts backends read has_bias and has_gate, which their decorator fixes per class: set per
        # model here
        self.experts.has_bias = config.expert_mlp_bias
        self.experts.has_gate = config.moe_ffn_type == "glu"
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per forward
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size > 0:
            self.shared_expert = TfmGLU(config, config.shared_expert_intermediate_size)
            if config.shared_expert_gate:
                self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        tokens = router_input = hidden_states.reshape(-1, shape[-1])
        if self.training and self.router.jitter_noise > 0:
            # the router and the experts see the jittered tokens, as Mixtral's do (and Switch's, in float32)
            router_input = self.router.jittered(tokens)
            tokens = router_input.to(tokens.dtype)
        _, top_k_weights, top_k_index = self.router(router_input, sequences=shape[0])
        output = self.experts(tokens, top_k_index, top_k_weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(tokens)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            output = output + shared
        return output.reshape(shape)


# -------------------------------------------------------------------------------------------------- router losses


def summed_over_ranks(sum_over_ranks: Callable, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor summed over the data-parallel ranks (`sum_over_ranks` sums a detached tensor in place) in value;
    in gradient, this rank's own part times the number of ranks, which the ranks' gradient averaging (DDP, FSDP,
    ZeRO) turns into the sum's gradient. One collective for all of them."""
    local = torch.cat([tensor.reshape(-1).float() for tensor in tensors])
    summed = sum_over_ranks(torch.cat([local.detach(), local.new_ones(1)]))  # the ones count the ranks
    ranks = summed[-1]
    parts = (summed[:-1] + ranks * (local - local.detach())).split([tensor.numel() for tensor in tensors])
    return tuple(part.reshape(tensor.shape) for part, tensor in zip(parts, tensors))


def load_balancing_loss(
    router_logits: tuple[torch.Tensor, ...],
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
    sum_over_ranks: Callable | None = None,
) -> torch.Tensor:
    """Switch Transformer's (Mixtral's) auxiliary loss over every MoE layer: `num_experts` times the sum over experts
    of (share of top-k assignments it got) x (mean router probability it got), counting real tokens only when a
    [batch, length] `attention_mask` is given. The same value as transformers' Mixtral `load_balancing_loss_func`
    (tests/test_compat.py), owned here so no other model's module is imported; index_add_, so no device sync. With
    `sum_over_ranks`, the shares and means are the global batch's: every data-parallel rank's tokens counted."""
    device = router_logits[0].device
    probabilities = torch.softmax(torch.cat([logits.to(device) for logits in router_logits]), dim=-1)
    _, chosen = torch.topk(probabilities, top_k, dim=-1)
    rows = probabilities.shape[0]
    if attention_mask is None:
        weights = torch.ones(rows, dtype=torch.float32, device=device)
    else:
        weights = attention_mask.reshape(-1).to(device, torch.float32).repeat(len(router_logits))
    assignments = torch.zeros(num_experts, dtype=torch.float32, device=device)
    assignments.index_add_(0, chosen.reshape(-1), weights.repeat_interleave(top_k))
    probability_sums = (probabilities.float() * weights[:, None]).sum(dim=0)
    total = weights.sum()
    if sum_over_ranks is not None:
        assignments, probability_sums, total = summed_over_ranks(sum_over_ranks, assignments, probability_sums, total)
    return torch.sum((assignments / total) * (probability_sums / total)) * num_experts


def router_z_loss(
    router_logits: tuple[torch.Tensor, ...],
    attention_mask: torch.Tensor | None,
    sum_over_ranks: Callable | None = None,
) -> torch.Tensor:
    """ST-MoE's z-loss: the mean squared log-sum-exp of the router logits over real tokens, summed over layers; over
    every data-parallel rank's tokens with `sum_over_ranks`."""
    weights = None if attention_mask is None else attention_mask.reshape(-1).float()
    if sum_over_ranks is not None:
        if weights is None:
            weights = torch.ones(router_logits[0].shape[0], device=router_logits[0].device)
        layer_sums = torch.stack([(torch.logsumexp(x.float(), dim=-1) ** 2 * weights).sum() for x in router_logits])
        layer_sums, tokens = summed_over_ranks(sum_over_ranks, layer_sums, weights.sum())
        return (layer_sums / tokens).sum()
    z_loss = 0.0
    for logits in router_logits:
        squared = torch.logsumexp(logits.float(), dim=-1) ** 2
        z_loss = z_loss + (squared.mean() if weights is None else (squared * weights).sum() / weights.sum())
    return z_loss


def switch_router_losses(
    router_logits: tuple[torch.Tensor, ...], num_experts: int, sequences: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Switch Transformer's (load-balancing loss, z-loss) over one stack, as transformers' SwitchTransformers
    computes them: each MoE layer's logits ([tokens, experts] of `sequences` equal sequences) joined along each
    sequence; the load-balancing loss per sequence (`num_experts` squared times the mean over sequences and experts
    of the share of tokens whose best expert it is, times its mean probability); the z-loss the mean squared
    log-sum-exp over every token. Padding counts, as there."""
    logits = torch.cat([layer.reshape(sequences, -1, layer.shape[-1]) for layer in router_logits], dim=1).float()
    squared = torch.logsumexp(logits, dim=-1) ** 2
    z_loss = squared.sum() / squared.numel()
    best = nn.functional.one_hot(logits.argmax(dim=-1), num_experts).float()
    probabilities = torch.softmax(logits, dim=-1)
    aux = torch.mean(best.mean(dim=1) * probabilities.mean(dim=1)) * num_experts**2
    return aux, z_loss


def router_losses(
    config: TfmConfig, router_logits, attention_mask, sequences: int, sum_over_ranks: Callable | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the weighted sum of the router losses to add to the task loss, the load-balancing loss to report), averaged
    as `router_loss_style` says: Mixtral's over the tokens a 2D padding mask marks real (4D masks prepared for
    generation count every token), over every data-parallel rank's with `sum_over_ranks`, the z-loss computed only
    when it has a weight, so that a model trained without it does not pay for it; or Switch Transformer's over
    `sequences` sequences."""
    if config.router_loss_style == "switch":
        aux, z_loss = switch_router_losses(router_logits, config.num_experts, sequences)
        return config.router_aux_loss_coef * aux + config.router_z_loss_coef * z_loss, aux
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    aux = load_balancing_loss(router_logits, config.num_experts, config.num_experts_per_tok, mask, sum_over_ranks)
    weighted = config.router_aux_loss_coef * aux
    if config.router_z_loss_coef > 0:
        weighted = weighted + config.router_z_loss_coef * router_z_loss(router_logits, mask, sum_over_ranks)
    return weighted, aux
