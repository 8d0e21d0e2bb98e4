"""Building blocks shared by every hf_tfm paradigm: norms, position schemes, attention and feed-forward.

Each block is written once here; the paradigms in `modeling_tfm.py` only compose them. Attention runs through
transformers' attention interface (eager, sdpa, flex, flash), so every backend the library ships is available.
"""

import copy
import math
from collections.abc import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.integrations.moe import use_experts_implementation
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

from .configuration_tfm import TfmConfig
from .modeling_tfm_loss import compute_dtype


class TfmRMSNorm(nn.Module):
    """RMSNorm computed in float32, exactly as Llama's (and T5's) so converted checkpoints match bit for bit: cast to
    the input's dtype, then scaled. With `scale_in_float32` scaled, then cast (OLMo 2, GPT-OSS); with `unit_offset`
    scaled in float32 by `1 + weight`, starting at weight 0 (Gemma)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False, scale_in_float32: bool = False):
        super().__init__()
        self.unit_offset = unit_offset
        self.scale_in_float32 = scale_in_float32
        self.weight = nn.Parameter(torch.zeros(hidden_size) if unit_offset else torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        in_float32 = hidden_states.to(torch.float32)
        variance = in_float32.pow(2).mean(-1, keepdim=True)
        # a 16-bit input without gradients is scaled itself, as T5's norm does: the same values (it widens exactly in
        # the product) with 2 bytes an element read instead of 4, and the float32 copy freed after the variance. With
        # gradients the copy is scaled, as Llama's: the input's gradient then sums both paths in float32, rounded once
        scaled = hidden_states if hidden_states.dtype.itemsize == 2 and not torch.is_grad_enabled() else in_float32
        hidden_states = scaled * torch.rsqrt(variance + self.variance_epsilon)
        if self.unit_offset:  # Gemma scales in float32, then casts (Llama casts, then scales)
            return (hidden_states * (1.0 + self.weight.float())).to(input_dtype)
        if self.scale_in_float32:  # OLMo 2 and GPT-OSS: the float32 states scaled, then cast
            return (self.weight * hidden_states).to(input_dtype)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        offset = ", unit_offset=True" if self.unit_offset else ""
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}{offset}"


def make_norm(config: TfmConfig, width: int | None = None) -> nn.Module:
    """The config's norm over `width` features (`hidden_size` by default)."""
    width = width or config.hidden_size
    if config.norm_type == "rmsnorm":
        return TfmRMSNorm(
            width,
            eps=config.layer_norm_eps,
            unit_offset=config.rmsnorm_unit_offset,
            scale_in_float32=config.rmsnorm_scale_in_float32,
        )
    return nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)


# ----------------------------------------------------------------------------------------------- position schemes


class TfmRotaryEmbedding(nn.Module):
    """RoPE with every transformers scaling type, for one layer type's parameters (`layer_type` picks them when the
    config nests them per layer type). Follows `LlamaRotaryEmbedding` so that `PreTrainedModel._init_weights`
    recomputes `inv_freq` after meta-device loading (the class name and `original_inv_freq` are what it looks for,
    and it reads `module.config.rope_parameters`: for a nested config this module keeps a copy holding its own
    layer type's dict)."""

    def __init__(self, config: TfmConfig, device=None, layer_type: str | None = None):
        super().__init__()
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        if layer_type is not None and config.nested_rope():
            config = copy.copy(config)
            config.rope_parameters = dict(config.rope_parameters[layer_type])
        self.config = config
        self.tables_in_float32 = config.rope_tables_in_float32
        self.rope_type = config.rope_parameters["rope_type"]
        rope_init_fn: Callable = self.compute_default_rope_parameters
        if self.rope_type != "default":
            rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = rope_init_fn(config, device)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config: TfmConfig, device=None, **kwargs) -> tuple[torch.Tensor, float]:
        base = config.rope_parameters["rope_theta"]
        dim = int(config.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (
            base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim)
        )
        return inv_freq, 1.0

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        if self.tables_in_float32:  # OLMo 2 keeps them in float32
            return cos, sin
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(query, key, cos, sin, in_float32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's `apply_rotary_pos_emb`, the same operations in the same order (tests/test_compat.py), on [B, H, L, D]
    queries and keys with [B, L, R] tables: the first R features of each head rotate, the rest pass through (partial
    rotary, as GPT-NeoX and Phi-3 apply it). `in_float32` (ModernBERT) or float32 tables (OLMo 2) rotate in float32,
    and the result is cast back to the inputs' dtype."""
    dtype = query.dtype
    if in_float32:
        query, key = query.float(), key.float()
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotary = cos.shape[-1]
    partial = rotary < query.shape[-1]
    query_rot, key_rot = (query[..., :rotary], key[..., :rotary]) if partial else (query, key)
    query_rot = (query_rot * cos) + (rotate_half(query_rot) * sin)
    key_rot = (key_rot * cos) + (rotate_half(key_rot) * sin)
    if partial:
        query_rot = torch.cat((query_rot, query[..., rotary:]), dim=-1)
        key_rot = torch.cat((key_rot, key[..., rotary:]), dim=-1)
    return query_rot.to(dtype), key_rot.to(dtype)


def rotate_interleaved(query, key, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's `apply_rotary_pos_emb_interleave`, the same operations in the same order: the rotary features come
    in pairs `(x0, x1), (x2, x3)...`, each rotated by one frequency, and leave as two halves."""
    cos, sin = cos[..., : cos.shape[-1] // 2].unsqueeze(1), sin[..., : sin.shape[-1] // 2].unsqueeze(1)
    q1, q2, k1, k2 = query[..., 0::2], query[..., 1::2], key[..., 0::2], key[..., 1::2]
    return (
        torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1),
        torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1),
    )


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos table of 'Attention Is All You Need': sin on even features, cos on odd ones."""
    position = torch.arange(num_positions, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: dim // 2])
    return table


class TfmSinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal absolute positions. The table is a computed buffer, rebuilt in `_init_weights`."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_positions, self.dim = config.max_position_embeddings, config.hidden_size
        self.table = nn.Buffer(sinusoidal_table(self.num_positions, self.dim), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al.); non-powers of two interleave the next power's slopes, as in BLOOM."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra_base ** (2 * i + 1) for i in range(num_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float)


class TfmAlibiBias(nn.Module):
    """ALiBi: a per-head linear penalty on query-key distance, added to attention scores. Distances use token
    positions (not cache slots), so left padding does not shift them."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.slopes = nn.Buffer(alibi_slopes(self.num_heads), persistent=False)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """[B, q] and [B, kv] positions (B = 1 for positions every row shares) -> additive bias [B, heads, q, kv] in
        float32."""
        distance = (query_positions[:, :, None] - key_positions[:, None, :]).abs().float()
        return -self.slopes[None, :, None, None] * distance[:, None]


class TfmRelativePositionBias(nn.Module):
    """T5's relative position bias: query-key offsets bucketed (exact when near, logarithmic when far) and a
    learned scalar per bucket and head. Bidirectional buckets for encoders, one-sided for causal decoders."""

    def __init__(self, config: TfmConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.relative_attention_bias = nn.Embedding(self.num_buckets, config.num_attention_heads)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """[B, q] and [B, kv] positions (B = 1 for positions every row shares) -> additive bias [B, heads, q, kv] in
        float32, contiguous: the embedding gives heads innermost, and a mask made from it would keep that layout,
        whose last dimension's stride (heads) keeps sdpa on a GPU off its fused kernels (they need stride 1)."""
        relative_position = key_positions[:, None, :] - query_positions[:, :, None]
        buckets = relative_position_bucket(relative_position, self.bidirectional, self.num_buckets, self.max_distance)
        bias = self.relative_attention_bias(buckets).permute(0, 3, 1, 2)
        return bias.to(torch.float32, memory_format=torch.contiguous_format)


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucket of each key-minus-query offset (`T5Attention._relative_position_bucket`, the same operations;
    tests/test_compat.py): half the buckets count small offsets exactly, the rest grow logarithmically up to
    `max_distance`; bidirectional buckets split by the offset's sign, causal ones see only the past."""
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


def key_positions_for_bias(position_ids: torch.Tensor, past_length, kv_length: int) -> torch.Tensor:
    """Token position of every key slot [B, kv] (B as `position_ids`' rows), for the biases that depend on query-key
    distance. Without cached keys, the keys are the queries' own tokens. With a cache, slot j holds the token `newest
    slot - j` places before the newest one, so positions count back from the newest token's position id, not from the
    slot: a left-padded row (whose pads are not counted) gets its own positions in a dynamic and a static cache alike,
    and a static cache's not yet filled slots (masked anyway) continue past it."""
    length = position_ids.shape[-1]
    if kv_length == length:
        return position_ids
    newest_slot = past_length + length - 1
    return torch.arange(kv_length, device=position_ids.device) - (newest_slot - position_ids[:, -1:])


def merge_position_bias(attention_mask, position_bias: torch.Tensor, dtype: torch.dtype):
    """Fold an additive bias [B, H, q, kv] into the mask the eager/sdpa backends take: a float mask whose masked
    entries stay at the dtype's minimum (never -inf, so a fully padded row cannot produce NaN)."""
    min_value = torch.finfo(dtype).min
    bias = position_bias.to(dtype)
    if attention_mask is None:
        return bias
    if attention_mask.shape[0] > 1 and attention_mask.stride(0) == 0:
        attention_mask = attention_mask[:1]  # one row expanded over the batch (causal, no padding): merged once
    if attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros_like(attention_mask, dtype=dtype).masked_fill(~attention_mask, min_value)
    attention_mask = attention_mask[..., : bias.shape[-1]]
    return (attention_mask.to(dtype) + bias).clamp(min=min_value)


# ------------------------------------------------------------------------------------------------------ attention


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv heads, L, D] -> [B, kv heads * n_rep, L, D], each key/value head serving its group of query heads."""
    if n_rep == 1:
        return hidden_states
    batch, heads, length, dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None].expand(batch, heads, n_rep, length, dim)
    return hidden_states.reshape(batch, heads * n_rep, length, dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager backend: Llama's (Gemma 2's, with `softcap`; GPT-OSS's, with the per-head sink logits `s_aux`,
    transformers' name for them), the same operations in the same order so converted models match bit for bit
    (tests/test_compat.py)."""
    if scaling is None:
        scaling = module.head_dim**-0.5
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    if s_aux is None:
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    else:  # the sink joins the softmax as one more key, then its share is dropped
        sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
        combined = torch.cat([attn_weights, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values  # GPT-OSS's guard against overflow
        attn_weights = nn.functional.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(value.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def qkv_widths(config: TfmConfig) -> list[int]:
    """The widths of a self-attention's query, key and value projections: the rows each holds in a fused
    `qkv_proj` (`fused_qkv_proj`), stacked in that order."""
    return [heads * config.head_dim for heads in (config.num_attention_heads, *[config.num_key_value_heads] * 2)]


def attention_scale(config: TfmConfig) -> float:
    if config.attention_multiplier is not None:
        return config.attention_multiplier
    if config.query_pre_attn_scalar is not None:
        return config.query_pre_attn_scalar**-0.5
    return config.head_dim**-0.5


# a weight that is a plain tensor: a Parameter, or a fake one while torch traces the model without values (FakeTensor,
# the form benchmarks/trace.py counts a step in); not a tensor subclass that quantises or shards it
PLAIN_WEIGHTS = (nn.Parameter, FakeTensor)


def reads_its_weight(layer: nn.Module) -> bool:
    """A plain nn.Linear whose weight can be read directly: not a LoRA wrapper, a quantised or sharded weight
    (a tensor subclass), nor a layer whose hooks gather or move its weight when it is called (DeepSpeed ZeRO-3,
    accelerate's offloading) or watch its calls."""
    return (
        type(layer) is nn.Linear
        and type(layer.weight) in PLAIN_WEIGHTS
        and not layer._forward_pre_hooks
        and not layer._forward_hooks
        and "_hf_hook" not in layer.__dict__
    )


def joint_projections(hidden_states: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """Each layer's output on the same input (attention's q/k/v, a GLU's gate/up). In a training step under autocast
    to another dtype than the weights' (fp32 weights, bf16 matmuls), one matmul over the layers' concatenated weights,
    as GPT-2's `c_attn` is: one cast and one read of the input, one input-gradient matmul instead of one per layer and
    the sum of their results. Otherwise each layer on its own: without gradients (a decode step would copy the
    weights at every token); with the weights already in the matmul's dtype (bf16 weights, or fp32 without
    autocast), where the joined weight, saved for backward, would be a copy of them that the separate layers do not
    hold (they save the parameters themselves; with a cast, each side saves one cast copy); for a layer that must be
    called (`reads_its_weight`). The parameters stay the layers' own: state dicts, PEFT targets and parallel plans
    see them."""
    joined = torch.is_grad_enabled() and compute_dtype(hidden_states) != layers[0].weight.dtype
    if not joined or not all(reads_its_weight(layer) for layer in layers):
        return [layer(hidden_states) for layer in layers]
    weight = torch.cat([layer.weight for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return nn.functional.linear(hidden_states, weight, bias).split([layer.out_features for layer in layers], dim=-1)


class AttentionModule(nn.Module):
    """Every hf_tfm attention (standard and latent) returns (output, weights): what `output_attentions` records."""


class TfmAttention(AttentionModule):
    """Multi-head attention with MHA/GQA/MQA, optional RoPE (full or partial), optional QK-norm, optional additive
    position bias (ALiBi, relative), an optional sliding window and score soft-capping, and any transformers
    attention backend. `is_causal` is set explicitly: sdpa reads it when the mask is skipped. As cross-attention it
    reads keys and values from the encoder output, computed once per generation and then reused from the
    `EncoderDecoderCache` (the BART pattern)."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool = True, is_cross_attention: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal and not is_cross_attention
        self.is_cross_attention = is_cross_attention
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.scaling = attention_scale(config)
        self.attention_dropout = config.attention_dropout
        sliding = config.layer_type(layer_idx) == "sliding_attention" and not is_cross_attention
        # flash attention reads a window w as w - 1 tokens on each side; a bidirectional mask keeps |q - k| <= w
        self.sliding_window = (config.sliding_window + (not self.is_causal)) if sliding else None
        self.softcap = config.attn_logit_softcapping
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if config.attention_sinks else None
        self.rope_in_float32 = config.rope_in_float32
        bias = config.attention_bias
        # q, k and v rows: one `qkv_proj` (fused_qkv_proj, self-attention only) or a layer each
        self.qkv_widths = qkv_widths(config)
        self.qkv_proj = self.q_proj = self.k_proj = self.v_proj = None
        if config.joins_qkv(is_cross_attention):
            self.qkv_proj = nn.Linear(config.hidden_size, sum(self.qkv_widths), bias=bias)
        else:
            self.q_proj = nn.Linear(config.hidden_size, self.qkv_widths[0], bias=bias)
            self.k_proj = nn.Linear(config.hidden_size, self.qkv_widths[1], bias=bias)
            self.v_proj = nn.Linear(config.hidden_size, self.qkv_widths[2], bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_out_bias)
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per call
        self.q_norm = self.k_norm = None
        self.qk_norm_per_head = config.qk_norm == "per_head"
        if config.qk_norm == "per_head":
            self.q_norm, self.k_norm = make_norm(config, self.head_dim), make_norm(config, self.head_dim)
        elif config.qk_norm == "projection":
            self.q_norm = make_norm(config, self.num_heads * self.head_dim)
            self.k_norm = make_norm(config, self.num_key_value_heads * self.head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
        cache: Cache | None = None,
        key_value_states: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        if self.is_cross_attention:
            query_states = self.heads(self.q_proj(hidden_states), self.q_norm)
            key_states, value_states = self.cross_key_values(key_value_states, cache)
        else:
            if self.qkv_proj is not None:
                query, key, value = self.qkv_proj(hidden_states).split(self.qkv_widths, dim=-1)
            else:
                query, key, value = joint_projections(hidden_states, [self.q_proj, self.k_proj, self.v_proj])
            query_states, key_states = self.heads(query, self.q_norm), self.heads(key, self.k_norm)
            value_states = self.heads(value, None)
            if position_embeddings is not None:
                cos, sin = position_embeddings
                query_states, key_states = apply_rotary(query_states, key_states, cos, sin, self.rope_in_float32)
            if isinstance(cache, EncoderDecoderCache):
                cache = cache.self_attention_cache
            if cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
            elif position_embeddings is not None and value._base is not None and value._base is query._base:
                # a value that views the joint q/k/v output (qkv_proj, joint_projections) would keep all of it
                # alive for backward, where RoPE made new query and key tensors: a copy of the value alone lets it
                # go, as a cache's copy does
                value_states = value_states.contiguous()

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window  # the mask already has it; flash attention reads this
        if self.softcap is not None:
            kwargs["softcap"] = self.softcap
        if position_bias is not None:  # flex adds it to the scores (eager's and sdpa's mask already holds it)
            kwargs["position_bias"] = position_bias
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            # the sink logits (None without sinks) named in the call, as GPT-OSS does: vLLM's Transformers backend
            # reads this keyword from the source to give its own attention the sinks
            s_aux=self.sinks,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    def heads(self, projected: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """[B, L, heads * head_dim] -> [B, heads, L, head_dim], through the QK-norm if any (over the whole
        projection before the split into heads, or over each head after it)."""
        if norm is not None and not self.qk_norm_per_head:
            projected = norm(projected)
        heads = projected.view(*projected.shape[:-1], -1, self.head_dim)
        if norm is not None and self.qk_norm_per_head:
            heads = norm(heads)
        return heads.transpose(1, 2)

    def cross_key_values(self, encoder_states, cache: EncoderDecoderCache | None):
        """Cross-attention's keys and values from the encoder's output: computed at the first step of a generation,
        read from the cache at the others."""
        if cache is not None and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            return layer.keys, layer.values
        key_states = self.heads(self.k_proj(encoder_states), self.k_norm)
        value_states = self.heads(self.v_proj(encoder_states), None)
        if cache is not None:
            key_states, value_states = cache.cross_attention_cache.update(key_states, value_states, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return key_states, value_states


def yarn_mscale(scale: float, mscale: float) -> float:
    """YaRN's attention-temperature factor (DeepSeek's `yarn_get_mscale`)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def latent_attention_scale(config: TfmConfig) -> float:
    """Latent attention's score scale: `(qk_nope_head_dim + head_dim) ** -0.5`, times YaRN's `mscale_all_dim`
    factor squared under a scaled RoPE (DeepSeek's `yarn_apply_mscale`); `attention_multiplier` if set."""
    if config.attention_multiplier is not None:
        return config.attention_multiplier
    scale = (config.qk_nope_head_dim + config.head_dim) ** -0.5
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        scale = scale * yarn_mscale(rope["factor"], rope["mscale_all_dim"]) ** 2
    return scale


class TfmLatentAttention(AttentionModule):
    """Multi-head latent attention (DeepSeek-V2/V3, `kv_lora_rank`): queries through an optional normed bottleneck;
    keys and values expanded per head from one normed latent per token, plus one rotary key part shared by every
    head. The cache holds the latent and the rotary key, as transformers' DeepSeek does, and each step expands the
    whole cache again; values may be narrower than keys. Any transformers attention backend runs it."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool = True):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal, self.is_cross_attention = is_causal, False
        self.num_heads, self.num_key_value_groups = config.num_attention_heads, 1
        self.nope_dim, self.rope_dim, self.value_dim = config.qk_nope_head_dim, config.head_dim, config.v_head_dim
        self.head_dim = self.nope_dim + self.rope_dim
        self.latent_dim = config.kv_lora_rank
        self.scaling = latent_attention_scale(config)
        self.attention_dropout = config.attention_dropout
        self.interleaved = config.rope_interleave
        hidden, heads, bias = config.hidden_size, self.num_heads, config.attention_bias
        # DeepSeek's latent norms keep RMSNorm's default epsilon, whatever the model's
        self.q_proj = self.q_a_proj = self.q_a_norm = self.q_b_proj = None
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=bias)
            self.q_a_norm = TfmRMSNorm(config.q_lora_rank, eps=1e-6)
            self.q_b_proj = nn.Linear(config.q_lora_rank, heads * self.head_dim, bias=False)
        self.kv_a_proj = nn.Linear(hidden, self.latent_dim + self.rope_dim, bias=bias)
        self.kv_a_norm = TfmRMSNorm(self.latent_dim, eps=1e-6)
        self.kv_b_proj = nn.Linear(self.latent_dim, heads * (self.nope_dim + self.value_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.value_dim, hidden, bias=config.attention_out_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
        cache: Cache | None = None,
        key_value_states: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length = hidden_states.shape[:-1]
        if self.q_proj is not None:
            query = self.q_proj(hidden_states)
        else:
            query = self.q_b_proj(self.q_a_norm(self.q_a_proj(hidden_states)))
        query = query.view(batch, length, -1, self.head_dim).transpose(1, 2)
        query_pass, query_rot = torch.split(query, [self.nope_dim, self.rope_dim], dim=-1)
        # projected in a statement of its own, as DeepSeek does: vLLM's Transformers backend merges the q_a and kv_a
        # projections into one only when nothing between them writes a view of their input
        compressed = self.kv_a_proj(hidden_states)
        latent, key_rot = torch.split(compressed, [self.latent_dim, self.rope_dim], dim=-1)
        latent = self.kv_a_norm(latent).view(batch, 1, length, self.latent_dim)  # one "head": any cache holds it
        key_rot = key_rot.view(batch, 1, length, self.rope_dim)
        cos, sin = position_embeddings
        query_rot, key_rot = (rotate_interleaved if self.interleaved else apply_rotary)(query_rot, key_rot, cos, sin)
        if cache is not None:
            latent, key_rot = cache.update(latent, key_rot, self.layer_idx)
        query_states = torch.cat((query_pass, query_rot), dim=-1)
        key_states, value_states = self._expand(latent, key_rot)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(attn_output.reshape(batch, length, -1).contiguous()), attn_weights

    def _expand(self, latent: torch.Tensor, key_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 1, L, latent] and [B, 1, L, rope] -> keys [B, heads, L, nope + rope] and values [B, heads, L, value]."""
        batch, _, length, _ = latent.shape
        expanded = self.kv_b_proj(latent).view(batch, length, -1, self.nope_dim + self.value_dim).transpose(1, 2)
        key_pass, value_states = torch.split(expanded, [self.nope_dim, self.value_dim], dim=-1)
        key_states = torch.cat((key_pass, key_rot.expand(-1, key_pass.shape[1], -1, -1)), dim=-1)
        return key_states, value_states


# ------------------------------------------------------------------------------------------------- feed-forward


class TfmFeedForward(nn.Module):
    """Two-layer MLP (`down(act(up(x)))`) or gated GLU (`down(act(gate(x)) * up(x))`: SwiGLU, GeGLU...)."""

    def __init__(self, config: TfmConfig, intermediate_size: int | None = None, gated: bool | None = None):
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        inner = intermediate_size or config.intermediate_size
        self.gated = config.ffn_type == "glu" if gated is None else gated
        if self.gated:
            self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.down_proj(self.act_fn(self.up_proj(hidden_states)))
        gate, up = joint_projections(hidden_states, [self.gate_proj, self.up_proj])
        return self.down_proj(self.act_fn(gate) * up)


class TfmPooler(nn.Module):
    """BERT's pooler: dense + tanh on the first token, the sentence vector for sequence-level heads."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


class TfmMaskedLMHead(nn.Module):
    """BERT's MLM head: dense, activation and norm, then the (tied) vocabulary projection with its own bias."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = make_norm(config)
        self.decoder = nn.Linear(config.hidden_size, config.padded_vocab_size())
        self.config = config  # the model's own: resize_token_embeddings changes its vocab_size

    def transform(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Everything before the vocabulary projection."""
        return self.norm(self.act_fn(self.dense(hidden_states)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # the real tokens' logits only, without the padding rows of the table (pad_vocab_size_to_multiple_of)
        return self.decoder(self.transform(hidden_states))[..., : self.config.vocab_size]


def freeze_lm_head_bias(config: TfmConfig, head: nn.Module | None) -> None:
    """`lm_head_bias` is BART's `final_logits_bias`, a buffer its reference never trains: frozen, as there (a masked
    LM head's own bias, BERT's, trains). Called when the head is built and after loading (transformers makes every
    loaded floating parameter trainable)."""
    if getattr(config, "lm_head_bias", False) and isinstance(head, nn.Linear) and head.bias is not None:
        head.bias.requires_grad_(False)


# --------------------------------------------------------------------------------------------- mixture of experts


class TfmRouter(nn.Module):
    """Scores every expert for every token and picks the top-k. An optional per-expert bias (auxiliary-loss-free
    balancing, DeepSeek-V3) shifts which experts are chosen but not the weights they get; an optional capacity
    drops the assignments an expert cannot take (weight 0, so the token keeps only its other experts)."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.scoring_func, self.norm_topk_prob = config.scoring_func, config.norm_topk_prob
        self.jitter_noise, self.capacity_factor = config.router_jitter_noise, config.capacity_factor
        self.in_float32 = config.router_in_float32
        self.weights_in_model_dtype = config.router_weights_in_model_dtype
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.empty(self.num_experts)) if config.router_bias else None  # GPT-OSS
        self.balancing = config.router_bias_update_rate > 0
        self.choice_bias = self.balancing or config.router_choice_bias
        if self.choice_bias:
            self.expert_bias = nn.Buffer(torch.zeros(self.num_experts))  # learned state: saved with the model
        if self.balancing:
            self.tokens_per_expert = nn.Buffer(torch.zeros(self.num_experts), persistent=False)
        self.groups, self.topk_groups = config.num_expert_groups, config.topk_expert_groups
        self.scaling = config.routed_scaling_factor

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[tokens, hidden] -> router logits [tokens, experts], top-k weights and indices [tokens, k]."""
        if self.training and self.jitter_noise > 0:
            noise = torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
            hidden_states = hidden_states * noise
        if self.in_float32:  # DeepSeek-V3 scores in float32 whatever the model's dtype
            bias = None if self.bias is None else self.bias.float()
            router_logits = nn.functional.linear(hidden_states.float(), self.weight.float(), bias)
        else:
            router_logits = nn.functional.linear(hidden_states, self.weight, self.bias)
        top_k_weights, top_k_index = self.top_k_experts(router_logits)
        if self.scaling != 1.0:
            top_k_weights = top_k_weights * self.scaling
        if self.capacity_factor is not None:
            top_k_weights = top_k_weights * self.within_capacity(top_k_index)
        if self.weights_in_model_dtype:  # Qwen2-MoE, Qwen3-MoE, GPT-OSS: the weights scale the experts rounded
            top_k_weights = top_k_weights.to(router_logits.dtype)
        if self.balancing and self.training:
            with torch.no_grad():  # not bincount, which reads the largest id to size its output (a device sync)
                picks = top_k_index.flatten()
                self.tokens_per_expert.index_add_(0, picks, torch.ones_like(picks, dtype=self.tokens_per_expert.dtype))
        return router_logits, top_k_weights, top_k_index

    def top_k_experts(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's k experts and their weights, by the scoring function."""
        if self.scoring_func == "top_k_softmax":  # GPT-OSS: the k best logits, weighted by their own softmax
            top_k_logits, top_k_index = torch.topk(router_logits, self.top_k, dim=-1)
            return torch.softmax(top_k_logits, dim=-1, dtype=top_k_logits.dtype), top_k_index
        if self.scoring_func == "softmax":
            scores = torch.softmax(router_logits.float(), dim=-1)
        else:
            scores = torch.sigmoid(router_logits.float())
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
        its two best choice scores (DeepSeek-V3's group-limited routing)."""
        grouped = choice.view(choice.shape[0], self.groups, -1)
        best = grouped.topk(2, dim=-1).values.sum(dim=-1).topk(self.topk_groups, dim=-1).indices
        kept = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).view_as(choice)

    def within_capacity(self, top_k_index: torch.Tensor) -> torch.Tensor:
        """1 where an assignment fits its expert's capacity, 0 where it overflows (first come, first served in
        token order, each token's first choice before its second)."""
        tokens = top_k_index.shape[0]
        capacity = math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)
        one_hot = nn.functional.one_hot(top_k_index.t().reshape(-1), self.num_experts)  # choice-major order
        position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1
        return (position < capacity).reshape(self.top_k, tokens).t().to(torch.float32)

    @torch.no_grad()
    def update_bias(self, rate: float) -> None:
        """Move each expert's bias against its load since the last update (under-loaded up, over-loaded down)."""
        load = self.tokens_per_expert  # no load (nothing routed) moves nothing: sign(0) = 0, without a device sync
        self.expert_bias += rate * torch.sign(load.mean() - load)
        load.zero_()


@use_experts_implementation
class TfmExperts(nn.Module):
    """All experts' GLU weights in two fused tensors (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`, Mixtral's
    layout), with optional biases (`gate_up_proj_bias [E, 2I]`, `down_proj_bias [E, H]`: GPT-OSS), so transformers'
    experts backends (`experts_implementation`: eager, batched_mm, grouped_mm...) run them; they call `_apply_gate`
    for the activation. This eager forward is the reference the backends replace."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_experts = config.num_experts
        experts, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(experts, hidden, inner))
        self.gate_up_proj_bias = self.down_proj_bias = None
        if config.expert_mlp_bias:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * inner))
            self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))
        self.act_fn = ACT2FN[config.hidden_act]
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
        with torch.no_grad():
            # under expert parallelism `num_experts` counts this rank's experts, and index `num_experts` marks a
            # route to another rank's (weight 0): skipped, as Mixtral's experts do
            routed = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)  # [E+1,k,T]
            hit = torch.greater(routed[: self.num_experts].sum(dim=(-1, -2)), 0).nonzero()
        for expert in hit:
            expert = expert[0]
            slot, token = torch.where(routed[expert])
            up_bias, down_bias = _row(self.gate_up_proj_bias, expert), _row(self.down_proj_bias, expert)
            gate_up = nn.functional.linear(hidden_states[token], self.gate_up_proj[expert], up_bias)
            expert_out = nn.functional.linear(self._apply_gate(gate_up), self.down_proj[expert], down_bias)
            output.index_add_(0, token, (expert_out * top_k_weights[token, slot, None]).to(output.dtype))
        return output


def _row(bias: torch.Tensor | None, expert: torch.Tensor) -> torch.Tensor | None:
    return None if bias is None else bias[expert]


class TfmMoE(nn.Module):
    """A sparse feed-forward layer: a router, fused routed experts, and an optional always-on shared expert."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.router = TfmRouter(config)
        self.experts = TfmExperts(config)
        # transformers' experts backends read has_bias, which their decorator fixes per class: set per model here
        self.experts.has_bias = config.expert_mlp_bias
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per forward
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size > 0:
            self.shared_expert = TfmFeedForward(config, config.shared_expert_intermediate_size, gated=True)
            self.shared_expert_gate = (
                nn.Linear(config.hidden_size, 1, bias=False) if config.shared_expert_gate else None
            )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])
        _, top_k_weights, top_k_index = self.router(tokens)
        output = self.experts(tokens, top_k_index, top_k_weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(tokens)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            output = output + shared
        return output.reshape(shape)
