"""The body every hf_tfm paradigm shares: the Transformer block, the PreTrainedModel base, input checks and the
stack (embeddings, position scheme, blocks, final norm), causal or bidirectional, with or without cross-attention.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs, maybe_install_capturing_hooks

from .capabilities import backend_refusal
from .compat import (
    CACHE_NAME,
    CACHE_NAMES,
    MASK_CACHE_ARGUMENT,
    accepts_legacy_cache_argument,
    slice_logits_to_keep,
)
from .configuration_tfm import TfmConfig, round_up_to_multiple
from .configuration_tfm_parallel import TfmParallelMixin
from .modeling_tfm_layers import (
    AttentionModule,
    TfmAlibiBias,
    TfmAttention,
    TfmExperts,
    TfmFeedForward,
    TfmLatentAttention,
    TfmMoE,
    TfmPooler,
    TfmRelativePositionBias,
    TfmRMSNorm,
    TfmRotaryEmbedding,
    TfmRouter,
    TfmSinusoidalPositionalEmbedding,
    alibi_slopes,
    freeze_lm_head_bias,
    key_positions_for_bias,
    make_norm,
    merge_position_bias,
    reads_its_weight,
    sinusoidal_table,
)
from .modeling_tfm_loss import compute_dtype
from .modeling_tfm_saving import TfmSavingMixin


@dataclass
class TfmModelOutput(BaseModelOutputWithPoolingAndCrossAttentions):
    """A stack's output, plus each MoE layer's router logits when `output_router_logits` asks for them."""

    router_logits: tuple[torch.FloatTensor, ...] | None = None


class TfmBlock(GradientCheckpointingLayer):
    """Self-attention, optional cross-attention over an encoder's output, then feed-forward (dense or MoE), each in a
    residual branch. `norm_position` places the norms: before each sublayer (pre: GPT-2, Llama), on the residual sum
    after it (post: BERT, BART), on both sides of it (sandwich: Gemma 2) or on its output only (output: OLMo 2). With
    `parallel_residual` attention and feed-forward both read the block input (GPT-NeoX). A norm a placement does not
    have is None."""

    def __init__(self, config: TfmConfig, layer_idx: int, is_causal: bool = True, cross_attention: bool = False):
        super().__init__()
        self.post_norm = config.norm_position == "post"  # the first norm of each sublayer takes the residual sum
        self.parallel_residual = config.parallel_residual
        self.hidden_dropout = config.hidden_dropout
        attention = TfmAttention if config.kv_lora_rank is None else TfmLatentAttention
        self.self_attn = attention(config, layer_idx, is_causal=is_causal)
        self.attn_norm, self.post_attn_norm = block_norms(config)
        if layer_idx == 0 and not config.first_layer_attn_norm:
            self.attn_norm = None
        self.cross_attn = self.cross_attn_norm = self.post_cross_attn_norm = None
        if cross_attention:
            self.cross_attn = TfmAttention(config, layer_idx, is_cross_attention=True)
            self.cross_attn_norm, self.post_cross_attn_norm = block_norms(config)
        self.mlp = TfmMoE(config) if config.is_moe_layer(layer_idx) else TfmFeedForward(config)
        self.ffn_norm, self.post_ffn_norm = block_norms(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        # positional, so that reentrant gradient checkpointing treats them as inputs (the bias is learned)
        encoder_hidden_states: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: Cache | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        residual = hidden_states
        if self.attn_norm is not None and not self.post_norm:
            hidden_states = self.attn_norm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            cache=cache,
            **kwargs,
        )
        if self.post_attn_norm is not None:
            hidden_states = self.post_attn_norm(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        if self.parallel_residual:  # GPT-NeoX: the feed-forward reads the block input too (and its order of the sum)
            mlp_output = self.mlp(self.ffn_norm(residual))
            mlp_output = nn.functional.dropout(mlp_output, p=self.hidden_dropout, training=self.training)
            return mlp_output + hidden_states + residual
        hidden_states = residual + hidden_states
        if self.post_norm:
            hidden_states = self.attn_norm(hidden_states)

        if self.cross_attn is not None:
            residual = hidden_states
            if self.cross_attn_norm is not None and not self.post_norm:
                hidden_states = self.cross_attn_norm(hidden_states)
            hidden_states, _ = self.cross_attn(
                hidden_states,
                attention_mask=encoder_attention_mask,
                key_value_states=encoder_hidden_states,
                cache=cache,
                **kwargs,
            )
            if self.post_cross_attn_norm is not None:
                hidden_states = self.post_cross_attn_norm(hidden_states)
            hidden_states = residual + nn.functional.dropout(
                hidden_states, p=self.hidden_dropout, training=self.training
            )
            if self.post_norm:
                hidden_states = self.cross_attn_norm(hidden_states)

        residual = hidden_states
        if self.ffn_norm is not None and not self.post_norm:
            hidden_states = self.ffn_norm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if self.post_ffn_norm is not None:
            hidden_states = self.post_ffn_norm(hidden_states)
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        if self.post_norm:
            hidden_states = self.ffn_norm(hidden_states)
        return hidden_states


def block_norms(config: TfmConfig) -> tuple[nn.Module | None, nn.Module | None]:
    """A sublayer's (first norm, output norm): pre and post have only the first (on the input, or on the residual
    sum), sandwich both, output only the output norm."""
    first = make_norm(config) if config.norm_position != "output" else None
    second = make_norm(config) if config.norm_position in ("sandwich", "output") else None
    return first, second


class TfmPreTrainedModel(TfmSavingMixin, TfmParallelMixin, PreTrainedModel):
    """What transformers needs to know about an hf_tfm model: its capability flags and output recorders, the
    attention and experts backends it can run, and how its weights are initialised. Saving, loading and publishing
    come from `TfmSavingMixin` (modeling_tfm_saving), the parallel layout check and the router-bias update from
    `TfmParallelMixin` (configuration_tfm_parallel), generate()'s masks from `TfmGenerationMixin` (below)."""

    config: TfmConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TfmBlock"]
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

    def _can_set_experts_implementation(self) -> bool:
        # yes exactly when the config has MoE layers. transformers' classmethod greps the class's own file for
        # `@use_experts_implementation` (hf_tfm's experts live in another file: it would say no, and grouped_mm would
        # silently run eager); every caller in transformers asks a model, not its class
        return self.config.has_moe_layers()

    def post_init(self):
        # a backend set by name at build or load time that transformers does not route through
        # get_correct_attn_implementation (a kernel from the Hub) is asked here
        if refusal := backend_refusal(self.config, self.config._attn_implementation):
            raise ValueError(refusal)
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

    def get_correct_experts_implementation(self, requested_experts: str | None) -> str:
        # transformers accepts any experts backend on a model without experts as a silent no-op
        if requested_experts not in (None, "eager") and not self._can_set_experts_implementation():
            raise ValueError(
                f"experts_implementation={requested_experts!r} needs Mixture-of-Experts layers, but this model "
                f"has none (num_experts={self.config.num_experts}, moe_layers={self.config.moe_layers}): a dense "
                "model runs no experts. Leave experts_implementation unset, or set num_experts > 0."
            )
        return super().get_correct_experts_implementation(requested_experts)

    def _init_weights(self, module):
        super()._init_weights(module)
        # from_pretrained builds the model on the meta device: computed buffers hold garbage until rebuilt here
        if isinstance(module, TfmSinusoidalPositionalEmbedding):
            init.copy_(module.table, sinusoidal_table(module.num_positions, module.dim))
        elif isinstance(module, TfmAlibiBias):
            init.copy_(module.slopes, alibi_slopes(module.num_heads))
        elif isinstance(module, TfmRMSNorm) and module.unit_offset:  # transformers sets every RMSNorm to ones
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
            init.normal_(module.gate_up_proj, mean=0.0, std=self.config.initializer_range)
            init.normal_(module.down_proj, mean=0.0, std=self.config.initializer_range)
            if module.down_proj_bias is not None:
                init.zeros_(module.gate_up_proj_bias)
                init.zeros_(module.down_proj_bias)
        elif isinstance(module, TfmAttention) and module.sinks is not None:
            init.normal_(module.sinks, mean=0.0, std=self.config.initializer_range)  # as GPT-OSS

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' `resize_token_embeddings`, keeping the vocabulary apart from the tables' padding:
        `config.vocab_size` becomes `new_num_tokens` (the tokens the logits score), and the token table and LM head
        hold it rounded up to `pad_to_multiple_of`, by default the config's `pad_vocab_size_to_multiple_of` (which
        is set to it, so a padded model stays padded). transformers counts the padding rows as tokens instead: they
        get logits, and generate() may pick them."""
        if new_num_tokens is None and pad_to_multiple_of is None:
            return self.get_input_embeddings()
        arguments = (("new_num_tokens", new_num_tokens, 1), ("pad_to_multiple_of", pad_to_multiple_of, 0))
        for name, value, least in arguments:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name} must be an integer >= {least} or None, got {value!r}")
        config = self.config
        vocab = config.vocab_size if new_num_tokens is None else new_num_tokens
        multiple = config.pad_vocab_size_to_multiple_of if pad_to_multiple_of is None else pad_to_multiple_of
        rows = round_up_to_multiple(vocab, multiple)
        embeddings = super().resize_token_embeddings(rows, mean_resizing=mean_resizing)
        config.vocab_size, config.pad_vocab_size_to_multiple_of = vocab, multiple
        self.vocab_size = vocab
        return embeddings


def stores_signature(forward: Callable) -> Callable:
    """A generating head's forward with its signature stored on it (`__signature__`, which `inspect` reads first):
    generate() asks a model registered for the Auto classes for its forward's signature at every decode step (a
    cache_position check for remote code), and building it through the decorators takes 16 us where reading it takes
    4: 1344 Python calls against 1216 a Llama decode step (tests/test_step_budget.py counts them)."""
    forward.__signature__ = inspect.signature(forward)
    return forward


class TfmGenerationMixin(GenerationMixin):
    """transformers' GenerationMixin for the heads that generate, with the masks generate() asks a model for built by
    the generating stack itself."""

    @accepts_legacy_cache_argument
    def create_masks_for_generate(self, inputs_embeds, attention_mask=None, cache=None, **kwargs):
        # generate() calls this for a static cache, the one whose decode step it compiles, so that each step gets masks
        # of the cache's full length: a padding mask passed on as it is grows by a token per step, and the compiled
        # step would recompile at every token for its new shape (and run eagerly once dynamo gives up). The masks are
        # the generating stack's own (each layer type's, and the full mask a position bias adds to), built as its
        # forward builds them.
        stack = self.model.decoder if self.config.is_encoder_decoder else self.model
        if isinstance(cache, EncoderDecoderCache):
            cache = cache.self_attention_cache
        return stack.build_masks(inputs_embeds, attention_mask, cache)


def read_bounds(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Each tensor's [min, max], brought to the host together: one device synchronisation however many tensors."""
    device = tensors[0].device
    return torch.stack([torch.stack(torch.aminmax(tensor)).to(device, torch.long) for tensor in tensors]).tolist()


def check_inputs(
    config: TfmConfig,
    input_ids,
    inputs_embeds,
    attention_mask,
    position_ids,
    token_type_ids,
    past_length: int | torch.Tensor,
    prefix: str = "",
    first_training_step: bool = True,
) -> None:
    """Turn bad input into an error that names it, instead of an index error deep in an embedding (or a silent wrong
    answer). `prefix` is how the caller spells the arguments ("decoder_" for an encoder-decoder's decoder). Skipped
    under torch.compile (but for the choice of input), where data-dependent checks would break the graph.

    Shapes are checked on every forward. Values (ids, token types, given absolute positions) are read, all in one
    host-device synchronisation, only by a forward that starts a sequence (nothing cached: evaluation, generate()'s
    prompt) or feeds several tokens (a prompt continued on a cache, assisted decoding's candidates): never by a decode
    step's single token, which the model sampled from its own vocabulary, nor by a training step after the first
    (`first_training_step`: a step must not wait for the device, and a later batch comes from the same tokenizer and
    collator; an id outside a table still stops at the embedding's own bounds check). A static cache counts its
    tokens in a device tensor: unknown on the host, so one token on an initialised static cache counts as a decode
    step."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"You must specify exactly one of {prefix}input_ids or {prefix}inputs_embeds")
    if torch.compiler.is_compiling():
        return
    if input_ids is not None and input_ids.dim() != 2:
        raise ValueError(
            f"{prefix}input_ids has shape {tuple(input_ids.shape)}, expected (batch, sequence length); "
            "for a single sequence add the batch dimension (input_ids[None])"
        )
    if inputs_embeds is not None and (inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size):
        raise ValueError(
            f"{prefix}inputs_embeds has shape {tuple(inputs_embeds.shape)}, expected "
            f"(batch, sequence length, hidden_size={config.hidden_size})"
        )
    tokens = input_ids if input_ids is not None else inputs_embeds
    batch, length = tokens.shape[:2]
    if length == 0:
        name = f"{prefix}input_ids" if input_ids is not None else f"{prefix}inputs_embeds"
        raise ValueError(f"{name} has shape {tuple(tokens.shape)}: an empty sequence, give at least one token")
    if token_type_ids is not None:
        if config.type_vocab_size == 0:
            raise ValueError(
                "token_type_ids were given but the config has type_vocab_size=0 (no token-type embeddings)"
            )
        if tuple(token_type_ids.shape) != (batch, length):
            raise ValueError(f"token_type_ids have shape {tuple(token_type_ids.shape)}, expected {(batch, length)}")
    if attention_mask is not None and not isinstance(attention_mask, dict):  # a dict: prepared masks per layer type
        # 2D padding masks, or 4D masks already prepared (transformers' masking utils pass those on as they are)
        padding_mask = attention_mask.dim() == 2
        if isinstance(past_length, int):
            wrong = padding_mask and tuple(attention_mask.shape) != (batch, past_length + length)
            expected = f"{(batch, past_length + length)} (batch, cached tokens {past_length} + new tokens {length})"
        else:  # a static cache's length is a device tensor: comparing it would synchronise
            wrong = padding_mask and (attention_mask.shape[0] != batch or attention_mask.shape[1] < length)
            expected = f"(batch {batch}, cached tokens + new tokens {length})"
        if attention_mask.dim() not in (2, 4) or wrong:
            raise ValueError(
                f"{prefix}attention_mask has shape {tuple(attention_mask.shape)}, expected {expected}, "
                "or a prepared 4D mask"
            )
    if position_ids is not None and (
        position_ids.dim() != 2 or position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != length
    ):
        raise ValueError(
            f"{prefix}position_ids has shape {tuple(position_ids.shape)}, expected {(batch, length)} or {(1, length)}"
        )
    if not config.check_input_values or batch == 0:  # nothing to read in an empty batch
        return

    starts = length > 1 or (isinstance(past_length, int) and past_length == 0)
    read_values = starts and first_training_step
    checked = []  # (argument, tensor, the first value past its table, what the table holds)
    if read_values and input_ids is not None:
        checked.append((f"{prefix}input_ids", input_ids, config.vocab_size, "the vocabulary"))
    if read_values and token_type_ids is not None:
        checked.append(("token_type_ids", token_type_ids, config.type_vocab_size, "the token types (type_vocab_size)"))
    # positions index a table only for learned and sinusoidal embeddings. The stack's own count the tokens so far and
    # pass the table exactly when the host-known length does; given ones are read with the ids, and on a decode step
    # only once that length is past the table, so that the step still gets its error without a sync on the others
    table = config.max_position_embeddings
    beyond = isinstance(past_length, int) and past_length + length > table
    if config.position_embedding_type in ("learned", "sinusoidal"):
        if position_ids is None and beyond:
            raise beyond_the_position_table(config, f"{prefix}position_ids", past_length + length - 1)
        if position_ids is not None and (read_values or beyond):
            checked.append((f"{prefix}position_ids", position_ids, table, "positions"))
    if not checked:
        return
    for (name, _, limit, what), (low, high) in zip(checked, read_bounds([entry[1] for entry in checked])):
        if name.endswith("position_ids"):
            lowest = -1 if config.position_ids_from_padding else 0  # -1: padding, which reads the padding row
            if low < lowest:
                raise ValueError(f"{name} contains position {low}: positions must be >= {lowest}")
            if high >= limit:
                raise beyond_the_position_table(config, name, high)
        elif low < 0 or high >= limit:
            raise ValueError(f"{name} contains id {low if low < 0 else high}, outside {what} [0, {limit})")


def beyond_the_position_table(config: TfmConfig, name: str, position: int) -> ValueError:
    """The error for positions past a learned or sinusoidal table, given or made by the stack alike."""
    return ValueError(
        f"{name} reach position {position}, beyond the {config.position_embedding_type} position table "
        f"(max_position_embeddings={config.max_position_embeddings}); shorten the input"
    )


def check_labels(labels, input_ids, inputs_embeds, inputs_name: str = "input_ids") -> None:
    """Labels must line up token for token with the inputs they score."""
    tokens = input_ids if input_ids is not None else inputs_embeds
    if labels is not None and tokens is not None and tuple(labels.shape) != tuple(tokens.shape[:2]):
        raise ValueError(
            f"labels have shape {tuple(labels.shape)}, expected {tuple(tokens.shape[:2])} (the shape of {inputs_name})"
        )


def rotary_module(config: TfmConfig, is_causal: bool) -> nn.Module:
    """RoPE's tables: one, or one per layer type when `rope_parameters` is nested (local and global theta)."""
    if not config.nested_rope():
        return TfmRotaryEmbedding(config)
    kinds = sorted(config.layer_kinds())
    return nn.ModuleDict({kind: TfmRotaryEmbedding(config, layer_type=kind) for kind in kinds})


# transformers' mask helper for each (causal, layer type)
MASK_HELPERS = {
    (True, "full_attention"): create_causal_mask,
    (True, "sliding_attention"): create_sliding_window_causal_mask,
    (False, "full_attention"): create_bidirectional_mask,
    (False, "sliding_attention"): create_bidirectional_sliding_window_mask,
}

# each position scheme: the stack attribute holding its module, and how the module is built (config, is_causal)
POSITION_MODULES = {
    "learned": (
        "embed_positions",
        lambda config, _: nn.Embedding(config.max_position_embeddings + config.position_offset, config.hidden_size),
    ),
    "sinusoidal": ("embed_positions", lambda config, _: TfmSinusoidalPositionalEmbedding(config)),
    "rope": ("rotary_emb", rotary_module),
    "alibi": ("position_bias", lambda config, _: TfmAlibiBias(config)),
    "relative_bias": (
        "position_bias",
        lambda config, is_causal: TfmRelativePositionBias(config, bidirectional=not is_causal),
    ),
}


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
        # an encoder-decoder's stacks are given the body's token table: one module, held by the body and both stacks
        self.embed_tokens = (
            embed_tokens if embed_tokens is not None else nn.Embedding(config.padded_vocab_size(), config.hidden_size)
        )
        # absent parts are None, not missing: a failed hasattr on a Module costs an exception per forward
        self.embed_positions = self.rotary_emb = self.position_bias = self.embed_token_types = None
        if config.position_embedding_type in POSITION_MODULES:  # "none" has no module
            attribute, build = POSITION_MODULES[config.position_embedding_type]
            setattr(self, attribute, build(config, is_causal))
        if config.type_vocab_size > 0:
            self.embed_token_types = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.embed_norm = make_norm(config) if config.embedding_norm else None
        self.embed_dropout = nn.Dropout(config.embedding_dropout)
        self.embed_scale = config.hidden_size**0.5 if config.scale_embeddings else 1.0
        # Gemma multiplies by its scale rounded to the table's dtype (a tensor it casts at each forward): that value
        # for each floating dtype, computed once on the CPU (no buffer for a meta-device load or vLLM to rebuild)
        self.rounded_embed_scales = {}
        if config.scale_embeddings and config.round_embedding_scale:
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                self.rounded_embed_scales[dtype] = torch.tensor(self.embed_scale, dtype=dtype, device="cpu").item()
        self.layers = nn.ModuleList(
            [TfmBlock(config, i, is_causal, cross_attention) for i in range(num_layers or config.num_hidden_layers)]
        )
        # resolved once, not at every decode step: each layer's attention kind (which mask and RoPE table it reads),
        # the kinds in use (the masks to build), and whether it skips RoPE (`nope_layers`)
        nope = set(config.nope_layers or ())
        self.layer_plan = tuple((config.layer_type(i), i in nope) for i in range(len(self.layers)))
        self.layer_kinds = tuple(sorted({kind for kind, _ in self.layer_plan}))
        self.norm = make_norm(config) if config.final_norm else None
        self.pooler = TfmPooler(config) if pooler else None
        self.gradient_checkpointing = False
        self.trained_a_step = False  # whether a training forward has run (and checked its inputs' values)
        self.post_init()

    def init_parallel_plans(self) -> None:
        super().init_parallel_plans()
        if self.config.is_encoder_decoder:
            # a stack of an encoder-decoder is part of the body, whose plans name both stacks by prefix: the body
            # gives them out (a stack's own would be the body's again, with a rule for the table it shares)
            self._tp_plan, self._ep_plan, self._pp_plan = {}, {}, {}

    def packed_sequence_ids(self, position_ids, attention_mask, cache, batch: int) -> torch.Tensor | None:
        """Which example each token belongs to [batch, length] when rows hold several examples back to back, as
        DataCollatorWithFlattening lays them out: position_ids given by the caller that restart (fall back) inside
        a row, with no attention_mask and nothing cached. None for an ordinary batch (the stack asks only about
        positions a caller gave, never about those it makes itself). Positions that only jump ahead (a shifted or
        stretched row) stay one example: transformers' own detection (`find_packed_sequence_indices`, used by its
        causal mask helpers) cuts at any step but +1 and would make each such token an example of its own."""
        compiling = torch.compiler.is_compiling()  # traced, the detection cannot answer "not packed"
        if attention_mask is not None:
            return None
        if position_ids.shape[1] == 1:  # one token is one example (and a decode step: a static cache's length below
            return None  # is a device tensor, comparing it would be a host sync per step)
        if cache is not None and (compiling or cache.get_seq_length() > 0):
            return None  # continuing cached sequences
        if compiling and self.cross_attention:
            return None
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
                "position_ids restart inside a row (packed sequences) but a cache was given: a cache of "
                "several examples in one row could not be continued. Pass no cache for packed rows, or an "
                "attention_mask for a padded batch."
            )
        if batch > 1 and "flash" in self.config._attn_implementation:
            raise ValueError(
                f"position_ids restart inside {batch} rows: flash attention reads packed sequences from one row "
                "only ([1, total tokens], as DataCollatorWithFlattening makes them)"
            )
        return sequence_ids

    def build_masks(self, inputs_embeds, attention_mask, cache, sequence_ids=None) -> dict:
        """The mask of each layer type in use, from transformers' mask helpers (sliding ones for sliding layers).
        Packed rows (`sequence_ids` from `packed_sequence_ids`) get a block-diagonal mask on top: each token attends
        within its own example only. The helpers take it as an `and_mask_function`; the causal ones would detect
        packing from position_ids themselves, but only without a cache object, and the bidirectional ones never do,
        so the stack detects it once and never hands them position_ids."""
        options = {}  # the helpers' keyword arguments besides the inputs
        if sequence_ids is not None:
            options["and_mask_function"] = packed_sequence_mask_function(sequence_ids)
        if self.is_causal:
            # an additive position bias needs the full causal mask to add to (sdpa would otherwise get None and the
            # bias alone, not causal), unless one query sees every key: a decode step's mask may be skipped then
            one_query = inputs_embeds.shape[1] == 1
            options |= {MASK_CACHE_ARGUMENT: cache, "allow_is_causal_skip": self.position_bias is None or one_query}
        return {
            kind: MASK_HELPERS[self.is_causal, kind](
                config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, **options
            )
            for kind in self.layer_kinds
        }

    def train(self, mode: bool = True):
        # An MoE stack's router logits are recorded by transformers' output-capturing hooks, at every training step.
        # transformers installs them on the first forward that asks, under a threading lock that torch.compile
        # cannot trace (a graph break; an error with fullgraph=True): installed here instead, outside any graph.
        if mode and self.config.has_moe_layers():
            maybe_install_capturing_hooks(self)
        return super().train(mode)

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
    ) -> TfmModelOutput:
        config = self.config
        if not self.is_causal:
            use_cache = False  # an encoder sees its whole input at once: nothing to cache
        training_step = self.training and torch.is_grad_enabled()
        if self.gradient_checkpointing and training_step:
            # the backward pass re-runs each block: a cache would take its keys twice. transformers' checkpointing
            # layer drops it by keyword, whose name differs between releases: dropped here for all of them
            use_cache, cache = False, None
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        past_length = self_cache.get_seq_length() if self_cache is not None else 0
        given_positions = position_ids  # a caller's positions may restart inside a row: packed sequences
        if position_ids is None and config.position_ids_from_padding and input_ids is not None:
            # RoBERTa's positions: counted over non-padding tokens, -1 for padding (row `position_offset - 1`)
            real = (input_ids != config.pad_token_id).long()
            position_ids = (real.cumsum(-1) + past_length) * real - 1
        check_inputs(
            config,
            input_ids,
            inputs_embeds,
            attention_mask,
            position_ids,
            token_type_ids,
            past_length,
            prefix="decoder_" if self.cross_attention else "",  # how the user spelled this stack's arguments
            first_training_step=not (training_step and self.trained_a_step),
        )
        if training_step and not torch.compiler.is_compiling():  # a compiled graph checks nothing (check_inputs)
            self.trained_a_step = True
        tokens = input_ids if input_ids is not None else inputs_embeds
        batch, length = tokens.shape[:2]
        sequence_ids = None
        if given_positions is not None:
            sequence_ids = self.packed_sequence_ids(given_positions, attention_mask, cache, batch)
        if sequence_ids is not None:
            use_cache = False  # packed rows are trained on or scored, never continued
        if use_cache and cache is None:
            self_cache = cache = DynamicCache(config=config)
            if self.cross_attention:
                cache = EncoderDecoderCache(self_cache, DynamicCache(config=config))
        if position_ids is None:
            # one row that broadcasts over the batch, as in Llama: RoPE's cos/sin are then [1, L, D], not [B, L, D]
            position_ids = (torch.arange(length, device=tokens.device) + past_length).unsqueeze(0)

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds
        if self.embed_scale != 1.0:
            hidden_states = inputs_embeds * self.rounded_embed_scales.get(inputs_embeds.dtype, self.embed_scale)
        if self.embed_token_types is not None:  # before positions: BERT's summation order, so parity is bit-exact
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            hidden_states = hidden_states + self.embed_token_types(token_type_ids)
        if self.embed_positions is not None:
            positions = position_ids + config.position_offset if config.position_offset else position_ids
            hidden_states = hidden_states + self.embed_positions(positions).to(hidden_states.dtype)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(hidden_states)
        hidden_states = self.embed_dropout(hidden_states)

        masks = attention_mask  # generate() may have prepared each layer type's mask already
        if not isinstance(masks, dict):
            masks = self.build_masks(hidden_states, attention_mask, self_cache, sequence_ids)
        rotary = {}  # RoPE's (cos, sin) for each layer type
        if isinstance(self.rotary_emb, nn.ModuleDict):  # a table per layer type (local and global theta)
            rotary = {kind: table(hidden_states, position_ids) for kind, table in self.rotary_emb.items()}
        elif self.rotary_emb is not None:
            rotary = dict.fromkeys(self.layer_kinds, self.rotary_emb(hidden_states, position_ids))
        position_bias = None
        if self.position_bias is not None:  # never with sliding layers (the config refuses it): one mask
            mask = masks["full_attention"]
            kv_length = mask.shape[-1] if mask is not None else past_length + length
            # [1, L] positions (shared by every row) give one [1, heads, q, kv] bias, as T5's reference builds it
            key_positions = key_positions_for_bias(position_ids, past_length, kv_length)
            position_bias = self.position_bias(position_ids, key_positions)
            if config._attn_implementation in ("eager", "sdpa"):  # added to the mask once, not in every layer
                merged = merge_position_bias(mask, position_bias, compute_dtype(hidden_states))
                masks, position_bias = {**masks, "full_attention": merged}, None
            else:  # flex reads it per batch row: a view over the shared row, no copy
                position_bias = position_bias.expand(batch, -1, -1, -1)
        if self.cross_attention:
            encoder_attention_mask = self.cross_attention_mask(
                hidden_states, encoder_hidden_states, encoder_attention_mask
            )

        if sequence_ids is not None:  # flash attention reads the examples' boundaries from the positions (varlen)
            kwargs["position_ids"] = position_ids
        for layer, (kind, nope) in zip(self.layers, self.layer_plan):
            hidden_states = layer(
                hidden_states,
                encoder_hidden_states,
                position_bias,
                masks[kind],  # positional too: a relative-position bias merged into it is learned
                position_embeddings=None if nope else rotary.get(kind),
                cache=cache,
                encoder_attention_mask=encoder_attention_mask,
                **kwargs,
            )
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return TfmModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states) if self.pooler is not None else None,
            **{CACHE_NAME: cache},
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
    head = nn.Linear(config.hidden_size, config.padded_vocab_size(), bias=config.lm_head_bias)
    freeze_lm_head_bias(config, head)
    return head


def lm_logits(config: TfmConfig, lm_head: nn.Linear, hidden_states: torch.Tensor, logits_to_keep) -> torch.Tensor:
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    if config.scale_lm_head_input:  # T5 rescales before a tied head
        hidden_states = hidden_states * config.hidden_size**-0.5
    if config.lm_head_bias and reads_its_weight(lm_head):
        # BART adds its final_logits_bias after the matmul, not inside it: rounded twice in bf16, as the reference
        logits = nn.functional.linear(hidden_states, lm_head.weight) + lm_head.bias
    else:
        logits = lm_head(hidden_states)
    if logits.shape[-1] != config.vocab_size:  # a padded head (pad_vocab_size_to_multiple_of): the real tokens only
        # a view, not a copy: transformers' losses flatten it with .view, generate() copies the last position anyway
        logits = logits[..., : config.vocab_size]
    cap = config.final_logit_softcapping
    if cap is None:
        return logits
    # one step per line, so each intermediate [batch, length, vocab] tensor is freed as the next is made
    logits = logits / cap
    logits = torch.tanh(logits)
    return logits * cap
