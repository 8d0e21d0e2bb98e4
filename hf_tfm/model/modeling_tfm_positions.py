"""Position schemes, behind one interface of three parts that every stack holds and calls alike, whatever the scheme:

- `embed_positions(hidden_states, position_ids)`: the embeddings with absolute positions added (learned, sinusoidal);
- `rotary_emb(hidden_states, position_ids)`: RoPE's (cos, sin) (one pair per layer type when their RoPE dicts
  differ), which each attention rotates its queries and keys by (`rotation_for`); for disentangled attention
  (DeBERTa), the bucketed distance between every query and key, which each attention reads its position scores at;
- `position_bias.add_to_masks(masks, position_ids, past_length, inputs_embeds)`: the masks with an additive per-head
  bias on the attention scores (ALiBi, T5's relative bias), or the bias itself for a backend that adds it to the
  scores; for disentangled attention, the relative-position table every layer projects (learned, so handed to each
  block as an input).

A scheme a config does not use is a part that changes nothing (`Absent`, `NoRotaryEmbedding`, `NoAttentionBias`): no
parameters, so state dicts hold exactly the scheme's own weights under their usual names.
"""

import copy
import functools
import math
from collections.abc import Callable

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update

from .configuration_tfm import TfmConfig
from .modeling_tfm_layers import Absent, compute_dtype, make_norm

# ---------------------------------------------------------------------------------------------- absolute positions


class TfmLearnedPositions(nn.Embedding):
    """A learned table of absolute positions, read at `position + position_offset` (BART: 2)."""

    def __init__(self, config: TfmConfig):
        # padding reads row offset - 1 (position -1) when positions are counted over padding: frozen as RoBERTa's
        frozen = (
            config.position_offset - 1 if config.freeze_pad_embedding and config.position_ids_from_padding else None
        )
        rows = config.max_position_embeddings + config.position_offset
        super().__init__(rows, config.embedding_width(), padding_idx=frozen)
        self.offset = config.position_offset

    def forward(self, hidden_states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        positions = position_ids + self.offset if self.offset else position_ids
        return hidden_states + super().forward(positions).to(hidden_states.dtype)


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """The fixed sin/cos table of 'Attention Is All You Need': sin on even features, cos on odd ones."""
    position = torch.arange(num_positions, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: dim // 2])
    return table


class TfmSinusoidalPositions(nn.Module):
    """Fixed sinusoidal absolute positions; the table is a computed buffer, rebuilt by `_init_weights`."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.num_positions, self.dim = config.max_position_embeddings, config.hidden_size
        self.table = nn.Buffer(sinusoidal_table(self.num_positions, self.dim), persistent=False)

    def forward(self, hidden_states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.table[position_ids].to(hidden_states.dtype)


# ---------------------------------------------------------------------------------------------------------- RoPE


class TfmRotaryEmbedding(nn.Module):
    """RoPE with every transformers scaling type: `forward(x, position_ids) -> (cos, sin)`, as `LlamaRotaryEmbedding`,
    whose pattern `PreTrainedModel._init_weights` follows to recompute `inv_freq` after meta-device loading (the class
    name, `original_inv_freq`, `rope_type`, `config.rope_parameters`: a config nested per layer type is copied with the
    dict of `layer_type`)."""

    def __init__(self, config: TfmConfig, device=None, layer_type: str | None = None):
        super().__init__()
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        if config.nested_rope():
            config = copy.copy(config)
            config.rope_parameters = dict(config.rope_parameters[layer_type])
        self.config = config
        self.tables_in_float32 = "rope_tables_in_float32" in config.numerics
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
        """(cos, sin) in the model's dtype (Llama) or float32 (OLMo 2's `numerics`)."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        if self.tables_in_float32:
            return cos, sin
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotary_width(config: TfmConfig, layer_type: str) -> int:
    """How many leading features of each head RoPE's tables cover: twice the inverse frequencies its init function
    gives (fewer than `head_dim` under a `partial_rotary_factor`, except for a RoPE type that pads them with zeros)."""
    return 2 * TfmRotaryEmbedding(config, device="meta", layer_type=layer_type).inv_freq.shape[-1]


class TfmPolarRotaryEmbedding(TfmRotaryEmbedding):
    """DeepSeek-V2's tables (`numerics: rope_as_complex`): cos and sin as `torch.polar` makes them, which round
    otherwise than the elementwise `cos` and `sin`; float32, as its rotation runs."""

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        turn = torch.polar(torch.ones_like(emb), emb) * self.attention_scaling
        return turn.real, turn.imag


class TfmRotaryEmbeddingPerLayerType(nn.ModuleDict):
    """A RoPE table for each layer type, when `rope_parameters` nests a dict per type (local and global theta)."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
        return {kind: table(x, position_ids) for kind, table in self.items()}


class NoRotaryEmbedding(nn.Module):
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> None:
        return None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(query, key, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama's `apply_rotary_pos_emb`, the same operations in the same order (tests/test_compat.py), on [B, H, L, D]
    queries and keys with [B, L, D] tables. The result has the queries' dtype (float32 tables rotate in float32,
    OLMo 2)."""
    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    query_rot = (query * cos) + (rotate_half(query) * sin)
    key_rot = (key * cos) + (rotate_half(key) * sin)
    return query_rot.to(query.dtype), key_rot.to(key.dtype)


def rotate_leading_features(rotary: int, rotate: Callable, query, key, position_embeddings):
    """Partial rotary (GPT-NeoX, Phi-3): the first `rotary` features of each head rotate, the rest pass through.
    Chosen when the model is built, so that a forward asks no question of a tensor's shape (a symbolic trace could
    not answer it)."""
    query_rot, key_rot = rotate(query[..., :rotary], key[..., :rotary], position_embeddings)
    return torch.cat((query_rot, query[..., rotary:]), dim=-1), torch.cat((key_rot, key[..., rotary:]), dim=-1)


def apply_rotary_in_float32(query, key, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys upcast to float32, rotated, and cast back (ModernBERT's `numerics`)."""
    query_rot, key_rot = apply_rotary(query.float(), key.float(), position_embeddings)
    return query_rot.to(query.dtype), key_rot.to(key.dtype)


def rotate_interleaved(query, key, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's `apply_rotary_pos_emb_interleave`, the same operations in the same order: the rotary features come
    in pairs `(x0, x1), (x2, x3)...`, each rotated by one frequency, and leave as two halves."""
    cos, sin = position_embeddings
    cos, sin = cos[..., : cos.shape[-1] // 2].unsqueeze(1), sin[..., : sin.shape[-1] // 2].unsqueeze(1)
    q1, q2, k1, k2 = query[..., 0::2], query[..., 1::2], key[..., 0::2], key[..., 1::2]
    query_rot = torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1)
    key_rot = torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1)
    return query_rot.to(query.dtype), key_rot.to(key.dtype)  # float32 tables rotate in float32


def rotate_as_complex(query, key, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's `apply_rotary_emb`, the same operations in the same order: each interleaved pair `(x0, x1)` is
    the complex number `x0 + i x1`, upcast to float32 and multiplied by `cos + i sin` (the tables made by
    `torch.polar`, as there); the pairs stay interleaved. The same function as `rotate_interleaved` with its features
    in another order (query and key alike)."""
    cos, sin = position_embeddings
    cos, sin = cos[..., : cos.shape[-1] // 2].unsqueeze(1), sin[..., : sin.shape[-1] // 2].unsqueeze(1)
    turn = torch.complex(cos.float(), sin.float())

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * turn).flatten(3).type_as(x)

    return rotate(query), rotate(key)


def no_rotation(query, key, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    return query, key


def rotation_for(config: TfmConfig, layer_idx: int, attention_type: str) -> Callable:
    """How one layer's attention rotates its queries and keys by RoPE's tables: by its layer type's pair when each
    layer type has a RoPE dict of its own (`rope_parameters` nested)."""
    if config.position_embedding_type != "rope" or layer_idx in (config.nope_layers or ()):
        return no_rotation
    rotate = apply_rotary_in_float32 if "rope_in_float32" in config.numerics else apply_rotary
    if config.rope_interleave:
        rotate = rotate_as_complex if "rope_as_complex" in config.numerics else rotate_interleaved
    rotary = rotary_width(config, attention_type)
    if rotary < config.head_dim:
        rotate = functools.partial(rotate_leading_features, rotary, rotate)
    return functools.partial(rotate_by_layer_type, attention_type, rotate) if config.nested_rope() else rotate


def rotate_by_layer_type(attention_type: str, rotate: Callable, query, key, position_embeddings):
    return rotate(query, key, position_embeddings[attention_type])


# --------------------------------------------------------------------------------------- attention score biases


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


class TfmAttentionBias(nn.Module):
    """A per-head additive bias on the attention scores from query-key distances (ALiBi, T5's relative bias). Added to
    the full-attention mask once for every layer where the backend takes it through the mask (eager, sdpa); handed to
    each layer otherwise (flex adds it to the scores). Never with sliding layers (the config rules refuse it)."""

    adds_to_masks = True  # a causal stack keeps its full mask (sdpa would otherwise get the bias alone, not causal)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """[B, q] and [B, kv] positions (B = 1 for positions every row shares) -> [B, heads, q, kv] in float32."""
        raise NotImplementedError

    def add_to_masks(self, masks: dict, position_ids: torch.Tensor, past_length, inputs_embeds: torch.Tensor):
        """(the masks, with the bias added to the full mask), or (the masks, the bias for each row)."""
        mask = masks["full_attention"]
        kv_length = mask.shape[-1] if mask is not None else past_length + position_ids.shape[-1]
        # [1, L] positions (shared by every row) give one [1, heads, q, kv] bias, as T5's reference builds it
        position_bias = self(position_ids, key_positions_for_bias(position_ids, past_length, kv_length))
        if self.config._attn_implementation in ("eager", "sdpa"):
            merged = merge_position_bias(mask, position_bias, compute_dtype(inputs_embeds))
            return {**masks, "full_attention": merged}, None
        return masks, position_bias.expand(inputs_embeds.shape[0], -1, -1, -1)  # a view over the shared row: no copy


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al.); non-powers of two interleave the next power's slopes, as in BLOOM."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra_base ** (2 * i + 1) for i in range(num_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float)


class TfmAlibiBias(TfmAttentionBias):
    """ALiBi: a per-head linear penalty on query-key distance. Distances use token positions (not cache slots), so
    left padding does not shift them."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.slopes = nn.Buffer(alibi_slopes(self.num_heads), persistent=False)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        distance = (query_positions[:, :, None] - key_positions[:, None, :]).abs().float()
        return -self.slopes[None, :, None, None] * distance[:, None]


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


class TfmRelativePositionBias(TfmAttentionBias):
    """T5's relative position bias: query-key offsets bucketed (exact when near, logarithmic when far) and a learned
    scalar per bucket and head. Bidirectional buckets for encoders, one-sided for causal decoders."""

    def __init__(self, config: TfmConfig, bidirectional: bool):
        super().__init__()
        self.config = config
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.relative_attention_bias = nn.Embedding(self.num_buckets, config.num_attention_heads)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        # contiguous: the embedding gives heads innermost, and a mask made from it would keep that layout, whose last
        # dimension's stride (heads) keeps sdpa on a GPU off its fused kernels (they need stride 1)
        relative_position = key_positions[:, None, :] - query_positions[:, :, None]
        buckets = relative_position_bucket(relative_position, self.bidirectional, self.num_buckets, self.max_distance)
        bias = self.relative_attention_bias(buckets).permute(0, 3, 1, 2)
        return bias.to(torch.float32, memory_format=torch.contiguous_format)


def log_bucket_position(relative: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """DeBERTa's bucket of each query-minus-key distance (`make_log_bucket_position`, the same operations): exact
    within `buckets // 2`, then logarithmic up to `max_distance`, signed."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    distance = torch.where(near, torch.tensor(mid - 1).type_as(relative), torch.abs(relative))
    log_scale = torch.log(torch.tensor((max_distance - 1) / mid))
    log_position = torch.ceil(torch.log(distance / mid) / log_scale * (mid - 1)) + mid
    return torch.where(distance <= mid, relative.type_as(log_position), log_position * sign).long()


class TfmRelativeDistances(nn.Module):
    """Disentangled attention's distances: each query's position minus each key's, log-bucketed [B or 1, q, kv]."""

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance

    def forward(self, hidden_states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        relative = position_ids[:, :, None] - position_ids[:, None, :]
        return log_bucket_position(relative, self.buckets, self.max_distance)


class TfmRelativeEmbeddings(nn.Module):
    """Disentangled attention's relative-position table (DeBERTa's `rel_embeddings`): a `hidden_size` row for each
    bucket each way, normed once per forward (`relative_embeddings_norm`) and handed to every layer, which projects it
    into position keys and queries."""

    adds_to_masks = False

    def __init__(self, config: TfmConfig):
        super().__init__()
        self.rel_embeddings = nn.Embedding(2 * config.relative_attention_num_buckets, config.hidden_size)
        self.norm = make_norm(config) if config.relative_embeddings_norm else Absent()

    def add_to_masks(self, masks: dict, position_ids: torch.Tensor, past_length, inputs_embeds: torch.Tensor):
        return masks, self.norm(self.rel_embeddings.weight)


class NoAttentionBias(nn.Module):
    adds_to_masks = False

    def add_to_masks(self, masks: dict, position_ids: torch.Tensor, past_length, inputs_embeds: torch.Tensor):
        return masks, None


# --------------------------------------------------------------------------------- numbering tokens without ids


def positions_over_padding(input_ids, attention_mask, past_length, pad_token_id: int) -> torch.Tensor | None:
    """RoBERTa's: each row counts its non-padding ids; padding is -1 (the position table's padding row). None
    without ids (embeddings given)."""
    if input_ids is None:
        return None
    real = (input_ids != pad_token_id).long()
    return (real.cumsum(-1) + past_length) * real - 1


def positions_over_attention_mask(input_ids, attention_mask, past_length) -> torch.Tensor | None:
    """OPT's: each row counts the tokens its 2D mask (past and present tokens) marks real; padding is -1. None
    without such a mask."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    real = attention_mask.long()
    return (real.cumsum(-1) * real - 1)[:, past_length:]


def position_counter(config: TfmConfig) -> Callable | None:
    """How a stack numbers its tokens when the caller gives no `position_ids`, where not in order: (input_ids,
    attention_mask, past_length) -> position ids, or None where it cannot tell."""
    if config.position_ids_from_padding:
        return functools.partial(positions_over_padding, pad_token_id=config.pad_token_id)
    if config.position_ids_from_attention_mask:
        return positions_over_attention_mask
    return None


# ---------------------------------------------------------------------------------------------- the three parts


def make_positions(config: TfmConfig, is_causal: bool, layer_types: tuple[str, ...]) -> tuple[nn.Module, ...]:
    """A stack's (embed_positions, rotary_emb, position_bias) for the config's scheme; `layer_types`: those in use."""
    scheme = config.position_embedding_type
    absolute, rotary, bias = Absent(), NoRotaryEmbedding(), NoAttentionBias()
    if scheme == "learned":
        absolute = TfmLearnedPositions(config)
    elif scheme == "sinusoidal":
        absolute = TfmSinusoidalPositions(config)
    elif scheme == "rope" and config.nested_rope():
        rotary = TfmRotaryEmbeddingPerLayerType(
            {kind: TfmRotaryEmbedding(config, layer_type=kind) for kind in layer_types}
        )
    elif scheme == "rope":
        rotary = (
            TfmPolarRotaryEmbedding(config) if "rope_as_complex" in config.numerics else TfmRotaryEmbedding(config)
        )
    elif scheme == "alibi":
        bias = TfmAlibiBias(config)
    elif scheme == "relative_bias":
        bias = TfmRelativePositionBias(config, bidirectional=not is_causal)
    elif scheme == "disentangled":
        rotary, bias = TfmRelativeDistances(config), TfmRelativeEmbeddings(config)
    return absolute, rotary, bias
