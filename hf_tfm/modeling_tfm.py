"""hf_tfm models: the shared PreTrainedModel base, the Transformer block and stack, and the paradigms with their heads.

A paradigm is a thin composition: the decoder-only model is the shared stack with a causal mask. Blocks come from
`modeling_tfm_layers.py`; caching, masks, generation, loss and output capture come from transformers.
"""

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GenericForSequenceClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel, slice_logits_to_keep
from transformers.utils import can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_tfm import TfmConfig, TfmDecoderConfig
from .modeling_tfm_layers import (
    TfmAlibiBias,
    TfmAttention,
    TfmFeedForward,
    TfmRotaryEmbedding,
    TfmSinusoidalPositionalEmbedding,
    alibi_slopes,
    key_positions_for_bias,
    make_norm,
    sinusoidal_table,
)


class TfmBlock(GradientCheckpointingLayer):
    """Self-attention then feed-forward, each in a residual branch with a pre- or post-norm."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool = True):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.self_attn = TfmAttention(config, layer_idx, is_causal=is_causal)
        self.attn_norm = make_norm(config)
        self.mlp = TfmFeedForward(config)
        self.ffn_norm = make_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def _residual(self, hidden_states, norm, sublayer, **kwargs):
        branch = sublayer(norm(hidden_states) if self.pre_norm else hidden_states, **kwargs)
        if isinstance(branch, tuple):  # attention returns (output, weights); weights are captured by hooks
            branch = branch[0]
        hidden_states = hidden_states + self.dropout(branch)
        return hidden_states if self.pre_norm else norm(hidden_states)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
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
    _can_record_outputs = {"hidden_states": TfmBlock, "attentions": TfmAttention}

    def _init_weights(self, module):
        super()._init_weights(module)
        # Computed buffers are garbage after meta-device loading: rebuild them here (HF_V5_NOTES trap 3).
        if isinstance(module, TfmSinusoidalPositionalEmbedding):
            init.copy_(module.table, sinusoidal_table(module.num_positions, module.dim))
        elif isinstance(module, TfmAlibiBias):
            init.copy_(module.slopes, alibi_slopes(module.num_heads))

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers writes `auto_map` only for the saved class; list every Auto class of this paradigm so that
        # AutoModel, AutoModelForCausalLM... all load the folder with trust_remote_code.
        classes = AUTO_CLASSES.get(type(self.config), {})
        if self._auto_class is not None and classes:
            auto_map = {"AutoConfig": f"configuration_tfm.{type(self.config).__name__}"}
            auto_map.update({auto: f"modeling_tfm.{cls.__name__}" for auto, cls in classes.items()})
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **auto_map}
        return super().save_pretrained(save_directory, *args, **kwargs)


def check_inputs(config: TfmConfig, input_ids, attention_mask, position_ids, past_length: int, batch: int, length: int):
    """Turn bad input into an error that names it, instead of an index error deep in an embedding (or a silent
    wrong answer). Skipped under torch.compile, where data-dependent checks would break the graph."""
    if torch.compiler.is_compiling():
        return
    if input_ids is not None and input_ids.numel() > 0:
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"input_ids contains token id {bad}, outside the vocabulary [0, {config.vocab_size})")
    if attention_mask is not None and attention_mask.dim() == 2:
        expected = (batch, past_length + length)
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected {expected} "
                f"(batch, cached tokens {past_length} + new tokens {length})"
            )
    if config.position_embedding_type in ("learned", "sinusoidal") and position_ids.numel() > 0:
        longest = int(position_ids.max())
        if longest >= config.max_position_embeddings:
            raise ValueError(
                f"position {longest} is beyond the {config.position_embedding_type} position table "
                f"(max_position_embeddings={config.max_position_embeddings}); shorten the input"
            )


class TfmStack(TfmPreTrainedModel):
    """Embeddings, position scheme, N blocks and the final norm: the body every paradigm shares."""

    is_causal = True

    def __init__(self, config: TfmConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        position = config.position_embedding_type
        if position == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        elif position == "sinusoidal":
            self.embed_positions = TfmSinusoidalPositionalEmbedding(config)
        elif position == "rope":
            self.rotary_emb = TfmRotaryEmbedding(config)
        elif position == "alibi":
            self.alibi = TfmAlibiBias(config)
        if config.type_vocab_size > 0:
            self.embed_token_types = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.embed_norm = make_norm(config) if config.embedding_norm else None
        self.embed_dropout = nn.Dropout(config.embedding_dropout)
        self.embed_scale = config.hidden_size**0.5 if config.scale_embeddings else 1.0
        self.layers = nn.ModuleList(
            [TfmBlock(config, i, is_causal=self.is_causal) for i in range(config.num_hidden_layers)]
        )
        self.norm = make_norm(config) if config.final_norm else None
        self.gradient_checkpointing = False
        self.post_init()

    def embed(self, input_ids, inputs_embeds, position_ids, token_type_ids) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds * self.embed_scale
        if hasattr(self, "embed_positions"):
            hidden_states = hidden_states + self.embed_positions(position_ids).to(hidden_states.dtype)
        if hasattr(self, "embed_token_types"):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            hidden_states = hidden_states + self.embed_token_types(token_type_ids)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(hidden_states)
        return self.embed_dropout(hidden_states)

    def build_mask(self, inputs_embeds, attention_mask, past_key_values, position_ids):
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
            # an additive position bias needs the full mask to add to; sdpa would otherwise get None
            allow_is_causal_skip=self.config.position_embedding_type != "alibi",
        )

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
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if position_ids is None:
            position_ids = (torch.arange(length, device=device) + past_length).unsqueeze(0).expand(batch, -1)
        check_inputs(self.config, input_ids, attention_mask, position_ids, past_length, batch, length)

        hidden_states = self.embed(input_ids, inputs_embeds, position_ids, token_type_ids)
        mask = self.build_mask(hidden_states, attention_mask, past_key_values, position_ids)
        position_embeddings = self.rotary_emb(hidden_states, position_ids) if hasattr(self, "rotary_emb") else None
        position_bias = None
        if hasattr(self, "alibi"):
            kv_length = mask.shape[-1] if mask is not None else past_length + length
            key_positions = key_positions_for_bias(attention_mask, position_ids, kv_length)
            position_bias = self.alibi(position_ids.expand(batch, -1), key_positions)

        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                position_bias=position_bias,
                past_key_values=past_key_values,
                **kwargs,
            )
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=past_key_values)


# ------------------------------------------------------------------------------------------------ decoder-only


class TfmDecoderModel(TfmStack):
    """Decoder-only body (GPT-2 / Llama): the shared stack with causal self-attention."""

    config: TfmDecoderConfig


class TfmDecoderForCausalLM(TfmPreTrainedModel, GenerationMixin):
    config: TfmDecoderConfig
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TfmDecoderConfig):
        super().__init__(config)
        self.model = TfmDecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        if labels is not None:
            tokens_shape = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
            if labels.shape != tokens_shape:
                raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {tuple(tokens_shape)} (batch, length)")
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            # kwargs carry Trainer's num_items_in_batch, which keeps gradient accumulation exact (trap 5)
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class TfmDecoderForSequenceClassification(GenericForSequenceClassification, TfmPreTrainedModel):
    """Classifies from the last non-padding token, like `LlamaForSequenceClassification`."""

    config: TfmDecoderConfig

    def __init__(self, config: TfmDecoderConfig):
        # Build the body directly rather than through AutoModel, so remote-code loading needs no registry.
        TfmPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = TfmDecoderModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()


__all__ = [
    "TfmPreTrainedModel",
    "TfmBlock",
    "TfmStack",
    "TfmDecoderModel",
    "TfmDecoderForCausalLM",
    "TfmDecoderForSequenceClassification",
]


# Every Auto class each paradigm answers to: the one place that registration and `auto_map` read from.
AUTO_CLASSES: dict[type[TfmConfig], dict[str, type[TfmPreTrainedModel]]] = {
    TfmDecoderConfig: {
        "AutoModel": TfmDecoderModel,
        "AutoModelForCausalLM": TfmDecoderForCausalLM,
        "AutoModelForSequenceClassification": TfmDecoderForSequenceClassification,
    },
}
