"""The body every hf_tfm paradigm shares: the PreTrainedModel base, the Transformer blocks and the stack (token table,
position scheme, blocks, final norm). The config picks each part when the stack is built; the forwards read straight
through."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    BaseModelOutputWithPoolingAndCrossAttentions,
    MoeModelOutputWithPast,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs, maybe_install_capturing_hooks

from .capabilities import TfmParallelMixin, backend_refusal, experts_refusal
from .compat import CACHE_NAME, CACHE_NAMES, accepts_legacy_cache_argument
from .configuration_tfm import TfmConfig, round_up_to_multiple
from .configuration_tfm_rules import check_config
from .modeling_tfm_attention import AttentionModule, TfmAttention, TfmCrossAttention, make_self_attention
from .modeling_tfm_inputs import InputRules
from .modeling_tfm_layers import (
    Absent,
    TfmGLU,
    TfmMLP,
    TfmPooler,
    TfmTokenTypes,
    TfmUnitOffsetRMSNorm,
    make_dropout,
    make_norm,
    make_token_embedding,
)
from .modeling_tfm_loading import TfmLoadingMixin
from .modeling_tfm_moe import TfmExperts, TfmMoE, TfmRouter
from .modeling_tfm_positions import (
    TfmAlibiBias,
    TfmSinusoidalPositions,
    alibi_slopes,
    make_positions,
    position_counter,
    sinusoidal_table,
)


@dataclass
class TfmModelOutput(BaseModelOutputWithPoolingAndCrossAttentions):
    """An encoder's or an encoder-decoder's decoder's output (BERT's fields), plus each MoE layer's router logits when
    `output_router_logits` asks for them."""

    router_logits: tuple[torch.FloatTensor, ...] | None = None


def stack_output_class(config: TfmConfig, is_causal: bool, cross_attention: bool) -> type[ModelOutput]:
    """What a stack returns: a decoder-only stack what Llama's body returns (Mixtral's, with MoE layers), any other
    BERT's fields and the router logits."""
    if not is_causal or cross_attention:
        return TfmModelOutput
    return MoeModelOutputWithPast if config.num_experts > 0 else BaseModelOutputWithPast


# ---------------------------------------------------------------------------------------------------------- blocks


def sublayer_norms(config: TfmConfig) -> tuple[nn.Module, nn.Module]:
    """A sublayer's (input norm, output norm) for `norm_position`: pre has the first, output the second, sandwich both;
    post has one, on the residual sum (the first). A norm a placement lacks is an identity."""
    first = make_norm(config) if config.norm_position != "output" else Absent()
    second = make_norm(config) if config.norm_position in ("sandwich", "output") else Absent()
    return first, second


class TfmBlock(GradientCheckpointingLayer):
    """Self-attention, optional cross-attention over an encoder's output (an encoder-decoder's decoder), then the
    feed-forward (dense or MoE), each in a residual branch `x + dropout(output_norm(sublayer(input_norm(x))))`: the
    norm before the sublayer (pre: GPT-2, Llama), on both sides (sandwich: Gemma 2) or on its output (output:
    OLMo 2). `TfmPostNormBlock` and `TfmParallelBlock` place them otherwise."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool, attention_type: str, cross_attention: bool):
        super().__init__()
        self.attention_type = attention_type  # which mask and RoPE table the stack hands this layer
        self.self_attn = make_self_attention(config, layer_idx, is_causal, attention_type)
        self.attn_norm, self.post_attn_norm = sublayer_norms(config)
        if layer_idx == 0 and not config.first_layer_attn_norm:  # ModernBERT: its embeddings are normed already
            self.attn_norm = Absent()
        self.cross_attn = self.cross_attn_norm = self.post_cross_attn_norm = None
        if cross_attention:
            self.cross_attn = TfmCrossAttention(config, layer_idx)
            self.cross_attn_norm, self.post_cross_attn_norm = sublayer_norms(config)
        if config.is_moe_layer(layer_idx, decoder=cross_attention):
            self.mlp = TfmMoE(config)
        else:
            self.mlp = TfmGLU(config) if config.ffn_type == "glu" else TfmMLP(config)
        self.ffn_norm, self.post_ffn_norm = sublayer_norms(config)
        self.dropout = make_dropout(config.hidden_dropout)
        self.ffn_dropout = make_dropout(config.ffn_dropout_probability())

    def forward(
        self,
        hidden_states: torch.Tensor,
        # positional, so that reentrant gradient checkpointing treats them as inputs (a position bias is learned)
        encoder_hidden_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        residual = hidden_states  # (each sublayer's output rebinds hidden_states: freed once added)
        hidden_states, _ = self.self_attn(
            self.attn_norm(hidden_states),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            cache=cache,
            **kwargs,
        )
        hidden_states = residual + self.dropout(self.post_attn_norm(hidden_states))
        if self.cross_attn is not None:
            residual = hidden_states
            hidden_states, _ = self.cross_attn(
                self.cross_attn_norm(hidden_states), encoder_hidden_states, encoder_attention_mask, encoder_cache
            )
            hidden_states = residual + self.dropout(self.post_cross_attn_norm(hidden_states))
        return hidden_states + self.ffn_dropout(self.post_ffn_norm(self.mlp(self.ffn_norm(hidden_states))))


class TfmPostNormBlock(TfmBlock):
    """The norm on the residual sum, `norm(x + dropout(sublayer(x)))`: the original Transformer, BERT, BART."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            hidden_states,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.attn_norm(residual + self.dropout(hidden_states))
        if self.cross_attn is not None:
            residual = hidden_states
            hidden_states, _ = self.cross_attn(
                hidden_states, encoder_hidden_states, encoder_attention_mask, encoder_cache
            )
            hidden_states = self.cross_attn_norm(residual + self.dropout(hidden_states))
        return self.ffn_norm(hidden_states + self.ffn_dropout(self.mlp(hidden_states)))


class TfmParallelBlock(TfmBlock):
    """Attention and feed-forward both read the block input, `x + attn(norm1(x)) + mlp(norm2(x))` (GPT-NeoX), summed
    in GPT-NeoX's order. Pre-norm, without cross-attention (the config rules refuse the others)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        encoder_cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(
            self.attn_norm(hidden_states),
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            cache=cache,
            **kwargs,
        )
        attended = self.dropout(attended)  # drawn before the feed-forward's dropout, as GPT-NeoX draws them
        mlp_output = self.ffn_dropout(self.mlp(self.ffn_norm(hidden_states)))
        return mlp_output + attended + hidden_states


def block_class(config: TfmConfig) -> type[TfmBlock]:
    if config.parallel_residual:
        return TfmParallelBlock
    return TfmPostNormBlock if config.norm_position == "post" else TfmBlock


# ------------------------------------------------------------------------------------------------- the base class


class TfmPreTrainedModel(TfmLoadingMixin, TfmParallelMixin, PreTrainedModel):
    """What transformers needs to know about an hf_tfm model: its capability flags and output recorders, the attention
    and experts backends it can run, and how its weights are initialised. Loading checks and the hand-over to hf_tfm's
    saving come from `TfmLoadingMixin`, the parallel plans from `TfmParallelMixin`."""

    config: TfmConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TfmBlock", "TfmPostNormBlock", "TfmParallelBlock"]  # a model lists its own (post_init)
    _skip_keys_device_placement = CACHE_NAMES
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": TfmBlock,
        "attentions": OutputRecorder(AttentionModule, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(AttentionModule, index=1, layer_name="cross_attn"),
        "router_logits": OutputRecorder(TfmRouter, index=0),
    }

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # every hf_tfm class can hold experts (any config may have MoE layers); transformers' own answer greps the
        # class's file for the experts decorator, which lives in modeling_tfm_moe.py, and would say no
        return True

    def _grouped_mm_can_dispatch(self) -> bool:
        # asked when transformers picks the experts backend: a refusal makes its default eager (as where grouped_mm
        # cannot run at all) and is raised, naming the field, when grouped_mm is asked for by name
        if refusal := experts_refusal(self.config, "grouped_mm"):
            raise ValueError(refusal)
        return super()._grouped_mm_can_dispatch()

    def get_correct_experts_implementation(self, requested_experts: str | None) -> str:
        # the other fused backends (batched_mm...) asked for by name pass here; grouped_mm, above
        if requested_experts not in (None, "grouped_mm") and (
            refusal := experts_refusal(self.config, requested_experts)
        ):
            raise ValueError(refusal)
        return super().get_correct_experts_implementation(requested_experts)

    def post_init(self):
        # a backend set by name at build or load time that transformers does not route through
        # get_correct_attn_implementation (a kernel from the Hub) is asked here
        if refusal := backend_refusal(self.config, self.config._attn_implementation):
            raise ValueError(refusal)
        # the model names the one block class it is built of: accelerate's FSDP wrap policy (the default of Trainer's
        # and accelerate's transformer-based wrapping) looks up every name listed and refuses one the model lacks
        self._no_split_modules = [block_class(self.config).__name__]
        if "ffn_output_in_float32" in self.config.numerics:  # what a float16 load keeps in float32, as T5's `wo`
            self._keep_in_fp32_modules = ["mlp.down_proj"]
        super().post_init()

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        # every attention backend a model is built with, loaded with or switched to passes here: one that cannot run
        # this config is refused by the capabilities table, naming the field; the default (None, sdpa where it can)
        # is eager when sdpa cannot run it, as transformers falls back when sdpa is unavailable
        if requested_attention is None and backend_refusal(self.config, "sdpa"):
            requested_attention = "eager"
        implementation = super().get_correct_attn_implementation(requested_attention, is_init_check)
        if refusal := backend_refusal(self.config, implementation):
            raise ValueError(refusal)
        return implementation

    def _init_weights(self, module):
        super()._init_weights(module)
        # from_pretrained builds the model on the meta device: computed buffers hold garbage until rebuilt here
        if isinstance(module, TfmSinusoidalPositions):
            init.copy_(module.table, sinusoidal_table(module.num_positions, module.dim))
        elif isinstance(module, TfmAlibiBias):
            init.copy_(module.slopes, alibi_slopes(module.num_heads))
        elif isinstance(module, TfmUnitOffsetRMSNorm):  # transformers sets every RMSNorm to ones
            init.zeros_(module.weight)
        elif isinstance(module, TfmRouter):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
            if module.choice_bias:
                init.zeros_(module.expert_bias)
            if module.balancing:
                init.zeros_(module.tokens_per_expert)
        elif isinstance(module, TfmExperts):
            for name, weight in module.named_parameters(recurse=False):  # gate_up_proj or up_proj, down_proj, biases
                if name.endswith("_bias"):
                    init.zeros_(weight)
                else:
                    init.normal_(weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, TfmAttention) and module.sinks is not None:
            init.normal_(module.sinks, mean=0.0, std=self.config.initializer_range)  # as GPT-OSS

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' `resize_token_embeddings`, keeping the vocabulary apart from the tables' padding:
        `config.vocab_size` becomes `new_num_tokens` (the tokens the logits score), and the token table and LM head
        hold it rounded up to `pad_to_multiple_of`, by default the config's `pad_vocab_size_to_multiple_of` (which is
        set to it, so a padded model stays padded). transformers counts the padding rows as tokens instead: they get
        logits, and generate() may pick them."""
        if new_num_tokens is None and pad_to_multiple_of is None:
            return self.get_input_embeddings()
        if not isinstance(pad_to_multiple_of, int | None):  # transformers' own refusal, in its words
            return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        arguments = (("new_num_tokens", new_num_tokens, 1), ("pad_to_multiple_of", pad_to_multiple_of, 0))
        for name, value, least in arguments:  # beyond transformers: it would build a table of no or negative rows
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name} must be an integer >= {least} or None, got {value!r}")
        config = self.config
        vocab = config.vocab_size if new_num_tokens is None else new_num_tokens
        multiple = config.pad_vocab_size_to_multiple_of if pad_to_multiple_of is None else pad_to_multiple_of
        embeddings = super().resize_token_embeddings(
            round_up_to_multiple(vocab, multiple), mean_resizing=mean_resizing
        )
        config.vocab_size, config.pad_vocab_size_to_multiple_of = vocab, multiple
        self.vocab_size = vocab
        return embeddings


def stores_signature(forward: Callable) -> Callable:
    """A generating head's forward with its signature stored on it (`__signature__`, which `inspect` reads first):
    generate() asks a model registered for the Auto classes for its forward's signature at every decode step (a
    cache_position check for remote code), and building it through the decorators again each step costs about 80
    Python calls of a Llama decode step's 1,300 (tests/test_step_budget.py counts them)."""
    forward.__signature__ = inspect.signature(forward)
    return forward


class TfmGenerationMixin(GenerationMixin):
    """transformers' GenerationMixin for the heads that generate, with the masks generate() asks a model for built by
    the generating stack itself."""

    @accepts_legacy_cache_argument
    def create_masks_for_generate(self, inputs_embeds, attention_mask=None, cache=None, **kwargs):
        # generate() calls this for a static cache, the one whose decode step it compiles, so that each step gets masks
        # of the cache's full length: a padding mask passed on as it is grows by a token per step, and the compiled
        # step would recompile at every token (and run eagerly once dynamo gives up). The masks are the generating
        # stack's own (each layer type's, and the full mask a position bias adds to), built as its forward builds them.
        stack = self.model.decoder if self.config.is_encoder_decoder else self.model
        if isinstance(cache, EncoderDecoderCache):
            cache = cache.self_attention_cache
        return stack.build_masks(inputs_embeds, attention_mask, cache)

    def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
        """transformers' preparation, with Phi-3's LongRoPE rule: the step on which the sequence first outgrows the
        pretraining length drops the keys cached with the short factors and computes every position again with the
        long ones, so that no step attends to keys rotated by the other set."""
        switch, cache = self.config.longrope_switch_length(), kwargs.get(CACHE_NAME)
        if switch is not None and cache is not None and 0 < cache.get_seq_length() <= switch < input_ids.shape[1]:
            kwargs[CACHE_NAME] = None
            kwargs["next_sequence_length"] = None  # the whole sequence, not the new token alone
        return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)


# ------------------------------------------------------------------------------------------------------ the stack


class TfmStack(TfmPreTrainedModel):
    """Token table, position scheme, N blocks and the final norm: the body every paradigm shares. The causal stack
    (`TfmDecoderModel`) and the bidirectional one (`TfmEncoderModel`) build their masks and caches each their way;
    an encoder-decoder's decoder is a causal stack with cross-attention."""

    is_causal: bool

    def __init__(
        self,
        config: TfmConfig,
        cross_attention: bool = False,
        num_layers: int | None = None,
        pooler: bool = False,
        embed_tokens: nn.Embedding | None = None,
    ):
        super().__init__(config)
        check_config(config)  # a field assigned to a finished config is refused here, where the plan is read
        depth = num_layers or config.num_hidden_layers
        # the layer plan, read once: each layer's attention kind (an encoder-decoder's stacks are all full)
        self.layer_types = list(config.layer_types or ["full_attention"] * depth)
        self.layer_kinds = tuple(sorted(set(self.layer_types)))  # the masks to build
        self.cross_attention = cross_attention  # only an encoder-decoder's decoder attends to another stack
        # an encoder-decoder's stacks are given the body's token table: one module, held by the body and both stacks
        self.embed_tokens = embed_tokens if embed_tokens is not None else make_token_embedding(config)
        self.embed_positions, self.rotary_emb, self.position_bias = make_positions(
            config, self.is_causal, self.layer_kinds
        )
        self.count_positions = position_counter(config)  # without position_ids: RoBERTa's, OPT's, or None: in order
        self.embed_token_types = TfmTokenTypes(config) if config.type_vocab_size > 0 else Absent()
        self.embed_norm = make_norm(config, config.embedding_width()) if config.embedding_norm else Absent()
        self.embed_dropout = make_dropout(config.embedding_dropout)
        # factorised embeddings (ALBERT, ELECTRA): the tables' width mapped to the blocks'
        factorised = config.factorised_embeddings()
        self.embed_proj = nn.Linear(config.embedding_width(), config.hidden_size) if factorised else Absent()
        # a projected token table (OPT-350m): tokens projected in before the positions, the output back after the norm
        self.project_in = self.project_out = Absent()
        if config.word_embed_proj_dim is not None:
            self.project_in = nn.Linear(config.word_embed_proj_dim, config.hidden_size, bias=False)
            self.project_out = nn.Linear(config.hidden_size, config.word_embed_proj_dim, bias=False)
        # which block each layer runs: its own, or one it shares (ALBERT); `layers` holds each block once, built for
        # the first layer that runs it
        self.layer_order = list(config.layer_sharing or range(depth))
        first_layers = [self.layer_order.index(index) for index in range(max(self.layer_order) + 1)]
        block = block_class(config)
        self.layers = nn.ModuleList(
            block(config, i, self.is_causal, self.layer_types[i], cross_attention) for i in first_layers
        )
        self.norm = make_norm(config) if config.final_norm else Absent()
        self.final_dropout = make_dropout(config.final_norm_dropout)
        self.layerdrop = config.layerdrop
        self.pooler = TfmPooler(config) if pooler else None
        self.output_class = stack_output_class(config, self.is_causal, cross_attention)
        self.gradient_checkpointing = False
        self.input_rules = InputRules(config, prefix="decoder_" if cross_attention else "")
        self.post_init()

    def init_parallel_plans(self) -> None:
        super().init_parallel_plans()
        if self.config.is_encoder_decoder:
            # a stack of an encoder-decoder is part of the body, whose plans name both stacks by prefix
            self._tp_plan, self._ep_plan, self._pp_plan = {}, {}, {}

    def train(self, mode: bool = True):
        # An MoE stack's router logits are recorded by transformers' output-capturing hooks, at every training step.
        # transformers installs them on the first forward that asks, under a threading lock that torch.compile cannot
        # trace (a graph break; an error with fullgraph=True): installed here instead, outside any graph.
        if mode and self.config.has_moe_layers():
            maybe_install_capturing_hooks(self)
        return super().train(mode)

    def open_cache(self, cache: Cache | None, use_cache: bool | None) -> tuple[Cache | None, Cache | None]:
        """(the cache this forward continues and returns, its self-attention part): none for a bidirectional stack."""
        return None, None

    def build_masks(self, inputs_embeds, attention_mask, cache, sequence_ids=None) -> dict:
        """The mask of each layer type in use, from transformers' mask helpers."""
        raise NotImplementedError

    @accepts_legacy_cache_argument
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast | MoeModelOutputWithPast | TfmModelOutput:  # clients read the fields from it
        past_length = cache.get_seq_length() if cache is not None else 0
        self.input_rules.check(
            input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, past_length, self.training
        )
        sequence_ids = None
        if position_ids is not None:  # a caller's positions may restart inside a row: packed sequences
            sequence_ids = self.packed_sequence_ids(position_ids, attention_mask, cache, input_ids, inputs_embeds)
        if sequence_ids is not None:  # packed rows are trained on or scored, never continued
            use_cache = False
            kwargs["position_ids"] = position_ids  # flash attention reads the examples' boundaries from them
        cache, self_cache = self.open_cache(cache, use_cache)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if position_ids is None and self.count_positions is not None:  # RoBERTa's or OPT's numbering
            position_ids = self.count_positions(input_ids, attention_mask, past_length)
        if position_ids is None:  # one row counting on from the cached tokens, broadcast over the batch, as Llama's
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length)[None]

        # in BERT's summation order (token types, then positions), so parity is bit-exact
        hidden_states = self.embed_token_types(self.project_in(inputs_embeds), token_type_ids, position_ids)
        hidden_states = self.embed_dropout(self.embed_norm(self.embed_positions(hidden_states, position_ids)))
        hidden_states = self.embed_proj(hidden_states)
        masks = attention_mask  # generate() may have prepared each layer type's mask already
        if not isinstance(masks, dict):
            masks = self.build_masks(hidden_states, attention_mask, self_cache, sequence_ids)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        masks, position_bias = self.position_bias.add_to_masks(masks, position_ids, past_length, hidden_states)
        if self.cross_attention:
            encoder_attention_mask = self.cross_attention_mask(
                hidden_states, encoder_hidden_states, encoder_attention_mask
            )
        blocks = list(self.layers)  # each block once (pipeline stages: placeholders besides); layer_order: which runs
        for index, attention_type in zip(self.layer_order, self.layer_types):
            if self.training and self.layerdrop > 0 and torch.rand([]) < self.layerdrop:
                continue  # LayerDrop: the whole layer skipped, drawn where BART and OPT draw it
            hidden_states = blocks[index](
                hidden_states,
                encoder_hidden_states,
                position_bias,
                masks[attention_type],  # positional too: a relative-position bias merged into it is learned
                position_embeddings=position_embeddings,
                cache=self_cache,
                encoder_attention_mask=encoder_attention_mask,
                encoder_cache=cache,  # read by cross-attention alone
                **kwargs,
            )
        hidden_states = self.project_out(self.final_dropout(self.norm(hidden_states)))
        outputs = self.output_class(last_hidden_state=hidden_states, **{CACHE_NAME: cache})
        if self.pooler is not None:  # BERT's sentence vector (an item: ModelOutput's fields set later must be)
            outputs["pooler_output"] = self.pooler(hidden_states)
        return outputs

    def packed_sequence_ids(
        self, position_ids, attention_mask, cache, input_ids, inputs_embeds
    ) -> torch.Tensor | None:
        """Which example each token belongs to [batch, length] when rows hold several examples back to back, as
        DataCollatorWithFlattening lays them out: position_ids given by the caller that restart (fall back) inside a
        row, with no attention_mask and nothing cached. None for an ordinary batch. Positions that only jump ahead (a
        shifted or stretched row) stay one example: transformers' own detection (`find_packed_sequence_indices`)
        cuts at any step but +1 and would make each such token an example of its own."""
        compiling = torch.compiler.is_compiling()  # traced, the detection cannot answer "not packed"
        if attention_mask is not None or position_ids.shape[1] == 1:  # one token (a decode step) is one example
            return None
        if cache is not None and (compiling or cache.get_seq_length() > 0):
            return None  # continuing cached sequences
        if compiling and self.cross_attention:
            return None
        batch = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        positions = position_ids.expand(batch, -1)
        steps = torch.diff(positions, dim=-1, prepend=positions[:, :1] - 1)
        sequence_ids = (steps <= 0).cumsum(-1)
        if not compiling and not sequence_ids[:, -1].any():  # one host sync, as transformers' detection
            return None
        if self.cross_attention:
            raise ValueError(
                "decoder_position_ids restart inside a row (packed sequences), which an encoder-decoder cannot "
                "follow: cross-attention would not know which example's encoder output a token belongs to. Pad the "
                "batch instead (decoder_attention_mask)."
            )
        if cache is not None:
            raise ValueError(
                "position_ids restart inside a row (packed sequences) but a cache was given: a cache of several "
                "examples in one row could not be continued. Pass no cache for packed rows, or an attention_mask for "
                "a padded batch."
            )
        if batch > 1 and "flash" in self.config._attn_implementation:
            raise ValueError(
                f"position_ids restart inside {batch} rows: flash attention reads packed sequences from one row only "
                "([1, total tokens], as DataCollatorWithFlattening makes them)"
            )
        return sequence_ids

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


def new_dynamic_cache(config: TfmConfig, cross_attention: bool) -> Cache:
    """The cache a stack makes when asked to cache and given none: an `EncoderDecoderCache` for a decoder that
    cross-attends (its second part holds the encoder's keys and values)."""
    cache = DynamicCache(config=config)
    return EncoderDecoderCache(cache, DynamicCache(config=config)) if cross_attention else cache
