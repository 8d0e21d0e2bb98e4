"""The body every hf_tfm paradigm shares: the Transformer block, the PreTrainedModel base, input checks and the
stack (embeddings, position scheme, blocks, final norm), causal or bidirectional, with or without cross-attention.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel, slice_logits_to_keep
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_tfm import TfmConfig
from .modeling_tfm_layers import (
    TfmAlibiBias,
    TfmAttention,
    TfmExperts,
    TfmFeedForward,
    TfmMoE,
    TfmPooler,
    TfmRelativePositionBias,
    TfmRotaryEmbedding,
    TfmRouter,
    TfmSinusoidalPositionalEmbedding,
    alibi_slopes,
    key_positions_for_bias,
    make_norm,
    sinusoidal_table,
)


@dataclass
class TfmModelOutput(BaseModelOutputWithPoolingAndCrossAttentions):
    """A stack's output, plus each MoE layer's router logits when `output_router_logits` asks for them."""

    router_logits: tuple[torch.FloatTensor, ...] | None = None


def maybe_dropout(dropout: nn.Dropout, hidden_states: torch.Tensor) -> torch.Tensor:
    """`dropout(hidden_states)`, minus the module call when it cannot drop anything (eval, or p = 0): in batch-1
    decoding the no-op calls are measurable."""
    return dropout(hidden_states) if dropout.training and dropout.p > 0 else hidden_states


class TfmBlock(GradientCheckpointingLayer):
    """Self-attention, optional cross-attention over an encoder's output, then feed-forward (dense or MoE); each
    sublayer in a residual branch with a pre- or post-norm."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool = True, cross_attention: bool = False):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.self_attn = TfmAttention(config, layer_idx, is_causal=is_causal)
        self.attn_norm = make_norm(config)
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per call
        self.cross_attn = self.cross_attn_norm = None
        if cross_attention:
            self.cross_attn = TfmAttention(config, layer_idx, is_cross_attention=True)
            self.cross_attn_norm = make_norm(config)
        self.mlp = TfmMoE(config) if config.is_moe_layer(layer_idx) else TfmFeedForward(config)
        self.ffn_norm = make_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def _residual(self, hidden_states, norm, sublayer, **kwargs):
        branch = sublayer(norm(hidden_states) if self.pre_norm else hidden_states, **kwargs)
        if isinstance(branch, tuple):  # attention returns (output, weights); weights are captured by hooks
            branch = branch[0]
        hidden_states = hidden_states + maybe_dropout(self.dropout, branch)
        return hidden_states if self.pre_norm else norm(hidden_states)

    def forward(
        self,
        hidden_states: torch.Tensor,
        # positional, so that reentrant gradient checkpointing treats them as inputs (the bias is learned)
        encoder_hidden_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values: Cache | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        hidden_states = self._residual(
            hidden_states,
            self.attn_norm,
            self.self_attn,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            past_key_values=past_key_values,
            **kwargs,
        )
        if self.cross_attn is not None:
            hidden_states = self._residual(
                hidden_states,
                self.cross_attn_norm,
                self.cross_attn,
                attention_mask=encoder_attention_mask,
                key_value_states=encoder_hidden_states,
                past_key_values=past_key_values,
                **kwargs,
            )
        return self._residual(hidden_states, self.ffn_norm, self.mlp)


class TfmPreTrainedModel(PreTrainedModel):
    config: TfmConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TfmBlock"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": TfmBlock,
        "attentions": OutputRecorder(TfmAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(TfmAttention, index=1, layer_name="cross_attn"),
        "router_logits": OutputRecorder(TfmRouter, index=0),
    }

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # transformers greps the model class's own file for `@use_experts_implementation`; our experts live in
        # modeling_tfm_layers.py, so without this the fused backends would silently fall back to eager (trap 4).
        return True

    def _init_weights(self, module):
        super()._init_weights(module)
        # Computed buffers are garbage after meta-device loading: rebuild them here (HF_V5_NOTES trap 3).
        if isinstance(module, TfmSinusoidalPositionalEmbedding):
            init.copy_(module.table, sinusoidal_table(module.num_positions, module.dim))
        elif isinstance(module, TfmAlibiBias):
            init.copy_(module.slopes, alibi_slopes(module.num_heads))
        elif isinstance(module, TfmRouter):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.balancing:
                init.zeros_(module.expert_bias)
                init.zeros_(module.tokens_per_expert)
        elif isinstance(module, TfmExperts):
            init.normal_(module.gate_up_proj, mean=0.0, std=self.config.initializer_range)
            init.normal_(module.down_proj, mean=0.0, std=self.config.initializer_range)

    @torch.no_grad()
    def update_router_biases(self) -> None:
        """Auxiliary-loss-free balancing: after an optimizer step, move every router's expert bias against the load
        it saw since the last call (`RouterBiasCallback` does this under Trainer)."""
        for module in self.modules():
            if isinstance(module, TfmRouter) and module.balancing:
                module.update_bias(self.config.router_bias_update_rate)

    def add_router_losses(self, loss, router_logits, attention_mask, labels, **kwargs):
        """The task loss plus the weighted aux and z losses, and the aux loss to report. Under Trainer's
        `num_items_in_batch` each micro-batch adds its share of tokens, so accumulated micro-batches sum to one
        token-weighted average (trap 5) instead of counting the router losses once per micro-batch."""
        aux, z_loss = self.router_losses(router_logits, attention_mask, with_z_loss=self.config.router_z_loss_coef > 0)
        if loss is not None:
            detached = torch.is_grad_enabled() and loss.requires_grad and not any(r.requires_grad for r in router_logits)
            if detached and (self.config.router_aux_loss_coef or self.config.router_z_loss_coef):
                # reentrant checkpointing runs the first forward under no_grad: the recorded router logits carry
                # no graph, and the router losses would add to the loss value but silently not to the gradient
                raise ValueError(
                    "the router losses cannot reach the gradient: router logits were recorded without autograd "
                    "(reentrant gradient checkpointing). Use gradient_checkpointing_kwargs={'use_reentrant': False}."
                )
            extra = self.config.router_aux_loss_coef * aux + self.config.router_z_loss_coef * z_loss
            num_items = kwargs.get("num_items_in_batch")
            if num_items is not None:
                targets = labels[..., 1:] if self.loss_type == "ForCausalLM" else labels
                extra = extra * (targets != -100).sum() / num_items
            loss = loss + extra
        return loss, aux

    def router_losses(self, router_logits, attention_mask, with_z_loss: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The load-balancing loss (Switch/Mixtral, over all MoE layers, padding excluded) and the ST-MoE z-loss
        (mean squared log-sum-exp of the router logits over real tokens, summed over layers; 0.0 unless
        `with_z_loss`, so that a model trained without it does not pay for it)."""
        mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        aux = load_balancing_loss_func(router_logits, self.config.num_experts, self.config.num_experts_per_tok, mask)
        weights = mask.reshape(-1).float() if mask is not None else None
        z_loss = 0.0
        for logits in router_logits if with_z_loss else ():
            squared = torch.logsumexp(logits.float(), dim=-1) ** 2
            z_loss = z_loss + (squared.mean() if weights is None else (squared * weights).sum() / weights.sum())
        return aux, z_loss

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers writes `auto_map` only for the saved class; list every Auto class of this paradigm so that
        # AutoModel, AutoModelFor... all load the folder with trust_remote_code.
        classes = getattr(self.config, "auto_classes", {})
        if self._auto_class is not None and classes:
            auto_map = {"AutoConfig": f"configuration_tfm.{type(self.config).__name__}"}
            auto_map.update({auto: f"modeling_tfm.{name}" for auto, name in classes.items()})
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **auto_map}
        return super().save_pretrained(save_directory, *args, **kwargs)


def check_ids(name: str, ids: torch.Tensor | None, limit: int, what: str) -> None:
    if ids is not None and ids.numel() > 0:
        low, high = (int(bound) for bound in torch.aminmax(ids))  # one op: one device sync, not two
        if low < 0 or high >= limit:
            raise ValueError(f"{name} contains id {low if low < 0 else high}, outside {what} [0, {limit})")


def check_inputs(
    config: TfmConfig,
    input_ids,
    attention_mask,
    position_ids,
    token_type_ids,
    past_length: int,
    batch: int,
    length: int,
    prefix: str = "",
):
    """Turn bad input into an error that names it, instead of an index error deep in an embedding (or a silent
    wrong answer). `prefix` is how the caller spells the arguments ("decoder_" for an encoder-decoder's decoder).
    Skipped under torch.compile, where data-dependent checks would break the graph."""
    if torch.compiler.is_compiling():
        return
    check_ids(f"{prefix}input_ids", input_ids, config.vocab_size, "the vocabulary")
    if token_type_ids is not None:
        if config.type_vocab_size == 0:
            raise ValueError("token_type_ids were given but the config has type_vocab_size=0 (no token-type embeddings)")
        if tuple(token_type_ids.shape) != (batch, length):
            raise ValueError(f"token_type_ids have shape {tuple(token_type_ids.shape)}, expected {(batch, length)}")
        check_ids("token_type_ids", token_type_ids, config.type_vocab_size, "the token types (type_vocab_size)")
    if attention_mask is not None and attention_mask.dim() == 2:
        expected = (batch, past_length + length)
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"{prefix}attention_mask has shape {tuple(attention_mask.shape)}, expected {expected} "
                f"(batch, cached tokens {past_length} + new tokens {length})"
            )
    if config.position_embedding_type in ("learned", "sinusoidal") and position_ids.numel() > 0:
        longest = int(position_ids.max())
        if longest >= config.max_position_embeddings:
            raise ValueError(
                f"position {longest} is beyond the {config.position_embedding_type} position table "
                f"(max_position_embeddings={config.max_position_embeddings}); shorten the input"
            )


def check_labels(labels, input_ids, inputs_embeds, inputs_name: str = "input_ids") -> None:
    """Labels must line up token for token with the inputs they score."""
    tokens = input_ids if input_ids is not None else inputs_embeds
    if labels is not None and tokens is not None and tuple(labels.shape) != tuple(tokens.shape[:2]):
        raise ValueError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(tokens.shape[:2])} (the shape of {inputs_name})"
        )


def share_embeddings(stack: nn.Module, table: nn.Embedding) -> None:
    """Give a stack its owner's token table without registering it as the stack's own submodule: the owner holds
    the one parameter, so the state dict has a single copy whatever `tie_word_embeddings` says (transformers would
    only accept the shared tensor as a declared tie, and ties follow that flag)."""
    stack.__dict__["embed_tokens"] = table


class TfmStack(TfmPreTrainedModel):
    """Embeddings, position scheme, N blocks and the final norm: the body every paradigm shares. Causal or
    bidirectional, optionally with cross-attention (an encoder-decoder's decoder) and a pooler (an encoder)."""

    def __init__(
        self,
        config: TfmConfig,
        is_causal: bool = True,
        cross_attention: bool = False,
        num_layers: int | None = None,
        pooler: bool = False,
        embed_tokens: nn.Embedding | None = None,
    ):
        super().__init__(config)
        self.is_causal = is_causal
        self.cross_attention = cross_attention  # only an encoder-decoder's decoder attends to another stack
        if embed_tokens is None:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        else:
            share_embeddings(self, embed_tokens)
        position = config.position_embedding_type
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per forward
        self.embed_positions = self.rotary_emb = self.position_bias = self.embed_token_types = None
        if position == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings + config.position_offset, config.hidden_size)
        elif position == "sinusoidal":
            self.embed_positions = TfmSinusoidalPositionalEmbedding(config)
        elif position == "rope":
            self.rotary_emb = TfmRotaryEmbedding(config)
        elif position == "alibi":
            self.position_bias = TfmAlibiBias(config)
        elif position == "relative_bias":
            self.position_bias = TfmRelativePositionBias(config, bidirectional=not is_causal)
        if config.type_vocab_size > 0:
            self.embed_token_types = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.embed_norm = make_norm(config) if config.embedding_norm else None
        self.embed_dropout = nn.Dropout(config.embedding_dropout)
        self.embed_scale = config.hidden_size**0.5 if config.scale_embeddings else 1.0
        self.layers = nn.ModuleList(
            [TfmBlock(config, i, is_causal, cross_attention) for i in range(num_layers or config.num_hidden_layers)]
        )
        self.norm = make_norm(config) if config.final_norm else None
        self.pooler = TfmPooler(config) if pooler else None
        self.gradient_checkpointing = False
        self.post_init()

    def embed(self, input_ids, inputs_embeds, position_ids, token_type_ids) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds * self.embed_scale if self.embed_scale != 1.0 else inputs_embeds
        if self.embed_token_types is not None:  # before positions: BERT's summation order, so parity is bit-exact
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            hidden_states = hidden_states + self.embed_token_types(token_type_ids)
        if self.embed_positions is not None:
            positions = position_ids + self.config.position_offset if self.config.position_offset else position_ids
            hidden_states = hidden_states + self.embed_positions(positions).to(hidden_states.dtype)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(hidden_states)
        return maybe_dropout(self.embed_dropout, hidden_states)

    def build_mask(self, inputs_embeds, attention_mask, past_key_values, position_ids):
        if not self.is_causal:
            return create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
            # an additive position bias needs the full causal mask to add to; sdpa would otherwise get None
            allow_is_causal_skip=self.position_bias is None,
        )

    def new_cache(self) -> Cache:
        cache = DynamicCache(config=self.config)
        if self.cross_attention:
            return EncoderDecoderCache(cache, DynamicCache(config=self.config))
        return cache

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> TfmModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if not self.is_causal:
            use_cache = False  # an encoder sees its whole input at once: nothing to cache
        if use_cache and past_key_values is None:
            past_key_values = self.new_cache()
        self_cache = past_key_values.self_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else past_key_values
        past_length = self_cache.get_seq_length() if self_cache is not None else 0
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if position_ids is None:
            # one row that broadcasts over the batch, as in Llama: RoPE's cos/sin are then [1, L, D], not [B, L, D]
            position_ids = (torch.arange(length, device=device) + past_length).unsqueeze(0)
        prefix = "decoder_" if self.cross_attention else ""  # how the user spelled this stack's arguments
        check_inputs(self.config, input_ids, attention_mask, position_ids, token_type_ids, past_length, batch, length, prefix)

        hidden_states = self.embed(input_ids, inputs_embeds, position_ids, token_type_ids)
        mask = self.build_mask(hidden_states, attention_mask, self_cache, position_ids)
        position_embeddings = self.rotary_emb(hidden_states, position_ids) if self.rotary_emb is not None else None
        position_bias = None
        if self.position_bias is not None:
            kv_length = mask.shape[-1] if mask is not None else past_length + length
            query_positions = position_ids.expand(batch, -1)
            key_positions = key_positions_for_bias(attention_mask, query_positions, kv_length)
            position_bias = self.position_bias(query_positions, key_positions)
        if self.cross_attention:
            encoder_attention_mask = self.cross_attention_mask(hidden_states, encoder_hidden_states, encoder_attention_mask)

        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                encoder_hidden_states,
                position_bias,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                past_key_values=past_key_values,
                encoder_attention_mask=encoder_attention_mask,
                **kwargs,
            )
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return TfmModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states) if self.pooler is not None else None,
            past_key_values=past_key_values,
        )

    def cross_attention_mask(self, hidden_states, encoder_hidden_states, encoder_attention_mask):
        if encoder_hidden_states is None:
            raise ValueError("this decoder has cross-attention: pass encoder_hidden_states (the encoder's output)")
        expected = tuple(encoder_hidden_states.shape[:2])
        if encoder_attention_mask is not None and tuple(encoder_attention_mask.shape) != expected:
            raise ValueError(
                f"the encoder attention_mask has shape {tuple(encoder_attention_mask.shape)}, expected {expected} "
                "(batch, encoder length)"
            )
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )


def make_lm_head(config: TfmConfig) -> nn.Linear:
    return nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)


def lm_logits(config: TfmConfig, lm_head: nn.Linear, hidden_states: torch.Tensor, logits_to_keep) -> torch.Tensor:
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    if config.scale_lm_head_input:  # T5 rescales before a tied head
        hidden_states = hidden_states * config.hidden_size**-0.5
    return lm_head(hidden_states)
