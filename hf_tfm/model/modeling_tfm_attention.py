"""Attention, through transformers' attention interface (eager, sdpa, flex, flash, paged, vLLM's): self-attention with
separate or fused q/k/v projections, cross-attention over an encoder's output, and multi-head latent attention. The
config picks the class when the model is built (`make_self_attention`); each forward reads straight through."""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

from .configuration_tfm import TfmConfig
from .modeling_tfm_layers import Absent, TfmRMSNorm, joint_projections, make_dropout, make_norm
from .modeling_tfm_positions import merge_position_bias, no_rotation, rotation_for


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
    """The eager backend: Llama's (Gemma 2's, with `softcap`; GPT-OSS's, with the per-head sink logits `s_aux`),
    the same operations in the same order so converted models match bit for bit (tests/test_compat.py)."""
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


def attention_scale(config: TfmConfig) -> float:
    if config.attention_multiplier is not None:
        return config.attention_multiplier
    if config.query_pre_attn_scalar is not None:
        return config.query_pre_attn_scalar**-0.5
    return config.head_dim**-0.5


def qkv_widths(config: TfmConfig) -> list[int]:
    """The widths of a self-attention's query, key and value projections, stacked in that order in a fused
    `qkv_proj`."""
    return [heads * config.head_dim for heads in (config.num_attention_heads, *[config.num_key_value_heads] * 2)]


class AttentionModule(nn.Module):
    """Every hf_tfm attention returns (output, weights): what `output_attentions` records. Each forward looks up
    transformers' attention interface and calls it itself, as transformers' own attention classes do: vLLM's
    Transformers backend finds the call, its `scaling=` and its `s_aux=` (the sinks) in the source of the class's
    `forward`, and the rest of the forward by tracing it with torch.fx."""

    def output(self, attn_output: torch.Tensor, input_shape: torch.Size) -> torch.Tensor:
        """[B, L, heads, D] -> the output projection of [B, L, heads * D]."""
        return self.o_proj(attn_output.reshape(*input_shape, -1).contiguous())


class TfmAttention(AttentionModule):
    """Self-attention with MHA/GQA/MQA, its q, k and v projections apart (`q_proj`, `k_proj`, `v_proj`), an optional
    QK-norm (per head, or over the whole projection), RoPE (full or partial) or none, an optional additive position
    bias, sliding window, score soft-capping and sinks. `is_causal` is set explicitly: sdpa reads it when the mask is
    skipped."""

    def __init__(
        self, config: TfmConfig, layer_idx: int, is_causal: bool = True, attention_type: str = "full_attention"
    ):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.scaling = attention_scale(config)
        self.attention_dropout = config.attention_dropout
        sliding = attention_type == "sliding_attention"
        # flash attention reads a window w as w - 1 tokens on each side; a bidirectional mask keeps |q - k| <= w
        self.sliding_window = config.sliding_window + (not is_causal) if sliding else None
        self.softcap = config.attn_logit_softcapping
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if config.attention_sinks else None
        self.rotate = rotation_for(config, layer_idx, attention_type)
        # a rotated query and key are new tensors: a value still viewing their joint projection would keep it alive
        self.rotates = self.rotate is not no_rotation
        self.qkv_widths = qkv_widths(config)
        self.build_projections(config)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_out_bias)
        # a QK-norm over each head's features (Qwen3), or over the whole projection before the split (OLMo 2)
        self.q_norm = self.k_norm = Absent()
        self.qk_norm_over_projection = config.qk_norm == "projection"
        if config.qk_norm == "per_head":
            self.q_norm, self.k_norm = make_norm(config, self.head_dim), make_norm(config, self.head_dim)
        elif config.qk_norm == "projection":
            self.q_norm = make_norm(config, self.qkv_widths[0])
            self.k_norm = make_norm(config, self.qkv_widths[1])

    def build_projections(self, config: TfmConfig) -> None:
        bias = config.attention_bias
        self.qkv_proj = None
        self.q_proj = nn.Linear(config.hidden_size, self.qkv_widths[0], bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.qkv_widths[1], bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.qkv_widths[2], bias=bias)

    def project(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        return joint_projections(hidden_states, [self.q_proj, self.k_proj, self.v_proj])

    def split_heads(self, projected: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """[B, L, heads * head_dim] -> [B, heads, L, head_dim], through the QK-norm."""
        if self.qk_norm_over_projection:
            return self.value_heads(norm(projected))
        # the shape unpacked, not splatted: a symbolic trace (vLLM's) can unpack a shape whose values it does not know
        batch, length, _ = projected.shape
        return norm(projected.view(batch, length, -1, self.head_dim)).transpose(1, 2)

    def value_heads(self, projected: torch.Tensor) -> torch.Tensor:
        batch, length, _ = projected.shape
        return projected.view(batch, length, -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        query, key, value = self.project(hidden_states)
        query_states, key_states = self.split_heads(query, self.q_norm), self.split_heads(key, self.k_norm)
        value_states = self.value_heads(value)
        query_states, key_states = self.rotate(query_states, key_states, position_embeddings)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
        elif self.rotates and value._base is not None and value._base is query._base:
            # the value views the joint q/k/v output (qkv_proj, joint_projections), which backward would otherwise
            # keep whole for it alone: a copy of the value lets it go (a cache's copy does the same)
            value_states = value_states.contiguous()
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
            sliding_window=self.sliding_window,
            softcap=self.softcap,
            s_aux=self.sinks,  # the sink logits named in the call, as GPT-OSS does: vLLM reads this keyword
            position_bias=position_bias,  # flex adds it to the scores (eager's and sdpa's mask already holds it)
            **kwargs,
        )
        return self.output(attn_output, input_shape), attn_weights


class TfmFusedQKVAttention(TfmAttention):
    """Self-attention holding q, k and v as one `qkv_proj` (`fused_qkv_proj`: GPT-2's `c_attn`, Phi-3's `qkv_proj`):
    one matmul where three would run at every decode step."""

    def build_projections(self, config: TfmConfig) -> None:
        self.q_proj = self.k_proj = self.v_proj = None
        self.qkv_proj = nn.Linear(config.hidden_size, sum(self.qkv_widths), bias=config.attention_bias)

    def project(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        return self.qkv_proj(hidden_states).split(self.qkv_widths, dim=-1)


class TfmQueryScaledAttention(TfmAttention):
    """Self-attention whose queries are scaled as they are projected, its scores then unscaled (OPT; numerics
    `"scale_queries_as_projected"`): the same scores, rounded as OPT's in bf16."""

    def __init__(
        self, config: TfmConfig, layer_idx: int, is_causal: bool = True, attention_type: str = "full_attention"
    ):
        super().__init__(config, layer_idx, is_causal, attention_type)
        self.query_scale, self.scaling = self.scaling, 1.0

    def project(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        query, key, value = super().project(hidden_states)
        return [query * self.query_scale, key, value]


class TfmDisentangledAttention(TfmAttention):
    """DeBERTa's disentangled self-attention (`position_embedding_type="disentangled"`): beside each query-key score,
    content-to-position (`"c2p"`: the query against the key projection of the table row of their distance) and
    position-to-content (`"p2c"`: the key against the query projection of the row of the query's distance to it),
    the table projected by this layer's own key and query projections (`share_att_key`) or by `pos_key_proj` and
    `pos_query_proj`. Every term is scaled by `(head_dim * (1 + terms)) ** -0.5`; the position scores reach the
    backend through the mask (eager, sdpa)."""

    def __init__(
        self, config: TfmConfig, layer_idx: int, is_causal: bool = False, attention_type: str = "full_attention"
    ):
        super().__init__(config, layer_idx, is_causal, attention_type)
        self.terms = config.disentangled_terms()
        # DeBERTa divides by a float32 square root; the same value here
        self.score_divisor = float(torch.tensor(float(self.head_dim * (1 + len(self.terms))), device="cpu").sqrt())
        self.scaling = 1.0 / self.score_divisor
        self.buckets = config.relative_attention_num_buckets
        self.position_dropout = make_dropout(config.hidden_dropout)  # on the table, as DeBERTa's pos_dropout
        self.share_att_key = config.share_att_key
        width = self.num_heads * self.head_dim
        if not config.share_att_key and "c2p" in self.terms:
            self.pos_key_proj = nn.Linear(config.hidden_size, width)
        if not config.share_att_key and "p2c" in self.terms:
            self.pos_query_proj = nn.Linear(config.hidden_size, width)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        query, key, value = self.project(hidden_states)
        query_states, key_states = self.value_heads(query), self.value_heads(key)
        # position_embeddings: the bucketed distances [B or 1, q, kv]; position_bias: the relative-position table
        scores = self.position_scores(
            query_states, key_states, position_embeddings, self.position_dropout(position_bias)
        )
        attention_mask = merge_position_bias(attention_mask, scores, query_states.dtype)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            self.value_heads(value),
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            softcap=self.softcap,
            s_aux=self.sinks,
            **kwargs,
        )
        return self.output(attn_output, input_shape), attn_weights

    def position_scores(self, query_states, key_states, distances, table) -> torch.Tensor:
        """The c2p and p2c scores [B, heads, q, kv], gathered as DeBERTa gathers them."""
        batch, heads = query_states.shape[:2]

        def table_rows(signed_distances):  # [B or 1, q, kv] -> the table row of each, for every head
            rows = (signed_distances[:, None] + self.buckets).clamp(0, 2 * self.buckets - 1)
            return rows.expand(batch, heads, -1, -1)

        scores = torch.zeros((), dtype=query_states.dtype, device=query_states.device)
        if "c2p" in self.terms:
            position_keys = self.value_heads((self.k_proj if self.share_att_key else self.pos_key_proj)(table)[None])
            c2p = torch.matmul(query_states, position_keys.transpose(-1, -2)).gather(-1, table_rows(distances))
            scores = scores + c2p / self.score_divisor
        if "p2c" in self.terms:
            position_queries = self.value_heads(
                (self.q_proj if self.share_att_key else self.pos_query_proj)(table)[None]
            )
            p2c = torch.matmul(key_states, position_queries.transpose(-1, -2)).gather(-1, table_rows(-distances))
            p2c = p2c.transpose(-1, -2)
            scores = scores + p2c / self.score_divisor
        return scores


class TfmCrossAttention(TfmAttention):
    """Attention from a decoder's tokens to an encoder's output: the keys and values are computed from the encoder's
    output at the first step of a generation and read from the `EncoderDecoderCache` at the others (BART's pattern).
    No positions, no window, never causal."""

    def __init__(self, config: TfmConfig, layer_idx: int):
        # its q, k and v apart whatever `fused_qkv_proj` says: the keys and values read another stack's states
        super().__init__(config, layer_idx, is_causal=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        query_states = self.split_heads(self.q_proj(hidden_states), self.q_norm)
        key_states, value_states = self.key_values(encoder_hidden_states, cache)
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
            sliding_window=self.sliding_window,
            softcap=self.softcap,
            s_aux=self.sinks,
            **kwargs,
        )
        return self.output(attn_output, input_shape), attn_weights

    def key_values(self, encoder_hidden_states: torch.Tensor, cache: EncoderDecoderCache | None):
        """The keys and values of the encoder's output: computed at a generation's first step, then cached."""
        if cache is not None and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            return layer.keys, layer.values
        key_states = self.split_heads(self.k_proj(encoder_hidden_states), self.k_norm)
        value_states = self.value_heads(self.v_proj(encoder_hidden_states))
        if cache is not None:
            key_states, value_states = cache.cross_attention_cache.update(key_states, value_states, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return key_states, value_states


def latent_attention_scale(config: TfmConfig) -> float:
    """Latent attention's score scale: `(qk_nope_head_dim + head_dim) ** -0.5`, times YaRN's `mscale_all_dim` factor
    squared under a scaled RoPE (DeepSeek's `yarn_get_mscale`); `attention_multiplier` if set."""
    if config.attention_multiplier is not None:
        return config.attention_multiplier
    scale = (config.qk_nope_head_dim + config.head_dim) ** -0.5
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim") and rope["factor"] > 1:
        mscale = 0.1 * rope["mscale_all_dim"] * math.log(rope["factor"]) + 1.0
        scale = scale * mscale * mscale  # not mscale**2, which can round otherwise
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
        self.is_causal = is_causal
        self.num_heads, self.num_key_value_groups = config.num_attention_heads, 1
        self.nope_dim, self.rope_dim, self.value_dim = config.qk_nope_head_dim, config.head_dim, config.v_head_dim
        self.head_dim = self.nope_dim + self.rope_dim
        self.latent_dim = config.kv_lora_rank
        self.scaling = latent_attention_scale(config)
        self.attention_dropout = config.attention_dropout
        self.sliding_window = self.softcap = self.sinks = None
        self.rotate = rotation_for(config, layer_idx, "full_attention")
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
        query_rot, key_rot = self.rotate(query_rot, key_rot, position_embeddings)
        if cache is not None:
            latent, key_rot = cache.update(latent, key_rot, self.layer_idx)
        query_states = torch.cat((query_pass, query_rot), dim=-1)
        # keys and values of every head from the latent: [B, heads, L, nope + rope] and [B, heads, L, value]
        expanded = self.kv_b_proj(latent).view(batch, latent.shape[2], -1, self.nope_dim + self.value_dim)
        key_pass, value_states = torch.split(expanded.transpose(1, 2), [self.nope_dim, self.value_dim], dim=-1)
        key_states = torch.cat((key_pass, key_rot.expand(-1, key_pass.shape[1], -1, -1)), dim=-1)
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
        return self.output(attn_output, (batch, length)), attn_weights


def make_self_attention(config: TfmConfig, layer_idx: int, is_causal: bool, attention_type: str) -> AttentionModule:
    if config.kv_lora_rank is not None:
        return TfmLatentAttention(config, layer_idx, is_causal)
    if config.position_embedding_type == "disentangled":
        return TfmDisentangledAttention(config, layer_idx, is_causal, attention_type)
    if config.fused_qkv_proj:
        return TfmFusedQKVAttention(config, layer_idx, is_causal, attention_type)
    if "scale_queries_as_projected" in config.numerics:
        return TfmQueryScaledAttention(config, layer_idx, is_causal, attention_type)
    return TfmAttention(config, layer_idx, is_causal, attention_type)
