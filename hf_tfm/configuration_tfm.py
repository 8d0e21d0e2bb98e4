"""Configuration for the hf_tfm family: one config of shared building blocks, one subclass per paradigm.

A config is data that picks the blocks (position scheme, norm, feed-forward, attention shape). Every invalid
value or combination raises `ValueError` naming the field at construction time, before any model is built.
"""

import dataclasses
import difflib
import functools
from typing import ClassVar

from huggingface_hub.dataclasses import strict
from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig
from transformers.generation import GenerationConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging

from .compat import CACHE_NAMES

logger = logging.get_logger(__name__)

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rope", "alibi", "relative_bias", "none")
# schemes that add a per-head bias to the attention scores instead of changing the embeddings
ATTENTION_BIAS_POSITIONS = ("alibi", "relative_bias")
NORM_TYPES = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post", "sandwich", "output")
LAYER_TYPES = ("full_attention", "sliding_attention")
QK_NORMS = ("none", "per_head", "projection")
FFN_TYPES = ("mlp", "glu")


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ValueError(f"Invalid `{field}`: {message}")


def round_up_to_multiple(count: int, multiple: int | None) -> int:
    """`count` rounded up to a multiple of `multiple`; None, 0 and 1 leave it as it is."""
    return -(-count // multiple) * multiple if multiple and multiple > 1 else count


# Keys besides its dataclass fields that PreTrainedConfig takes (its __post_init__ reads or pops them), that
# transformers writes into config.json, or that configs saved by transformers 4.x carry and tools still read.
PRETRAINED_CONFIG_KEYS = frozenset(
    {
        "name_or_path", "num_labels", "torch_dtype", "_commit_hash", "attn_implementation", "experts_implementation",
        "output_attentions", "per_layer_config", "rope_scaling", "rope_theta", "partial_rotary_factor", "auto_map",
        "model_type", "transformers_version", "quantization_config", "tokenizer_class", "task_specific_params",
        "finetuning_task", "prefix", "sep_token_id", "torchscript", "use_bfloat16", "pruned_heads",
        "tie_encoder_decoder", "add_cross_attention", "cross_attention_hidden_size", "_attn_implementation_autoset",
    }
)  # fmt: skip


@functools.cache
def _known_keys(config_class: type) -> tuple[frozenset, list[str]]:
    """Every key a config of this class takes without comment, and the public names to suggest for a typo."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    generation = set(vars(GenerationConfig()))  # generation keys in a config.json are popped by transformers
    public = sorted(name for name in fields | PRETRAINED_CONFIG_KEYS if not name.startswith("_"))
    base = set(dir(PreTrainedConfig)) | set(vars(PreTrainedConfig()))  # its properties and instance attributes
    known = fields | PRETRAINED_CONFIG_KEYS | generation | base | set(config_class.attribute_map)
    return frozenset(known), public


def _warn_unknown_keys(config: PreTrainedConfig, kwargs: dict) -> None:
    """transformers keeps every unknown key of a config as an attribute that nothing reads: a misspelled field
    (`position_embeding_type`, `num_expert=8`) would silently leave the model at the default."""
    known, public = _known_keys(type(config))
    source = f" (from {kwargs['name_or_path']})" if kwargs.get("name_or_path") else ""
    for key in sorted(set(kwargs) - known):
        close = difflib.get_close_matches(key, public, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "it is kept as an attribute, but no hf_tfm model reads it"
        logger.warning(f"{type(config).__name__}{source}: {key!r} is not a config field; {hint}")


@strict
class TfmConfig(PreTrainedConfig):
    r"""
    Shared options of every hf_tfm Transformer. Field names follow the transformers models users know.

    Args:
        vocab_size (`int`): number of token ids: the vocabulary the inputs index and the logits score.
        pad_vocab_size_to_multiple_of (`int`, *optional*): the token table and the LM head hold `vocab_size` rounded
            up to this multiple (64 suits GPU tensor cores), and the logits are sliced back to `vocab_size`, so every
            output is unchanged; the padding rows are never read. None, 0 or 1: no padding. The word is that of
            transformers' `resize_token_embeddings(pad_to_multiple_of=...)`, which here pads the same way (the
            padding is not counted as tokens).
        hidden_size (`int`): width of the residual stream.
        num_hidden_layers (`int`): number of Transformer blocks.
        num_attention_heads (`int`): query heads per attention layer.
        num_key_value_heads (`int`, *optional*): key/value heads; equal to `num_attention_heads` (MHA) by default,
            fewer for GQA, 1 for MQA. Must divide `num_attention_heads`.
        head_dim (`int`, *optional*): width of one head; `hidden_size // num_attention_heads` by default.
        intermediate_size (`int`, *optional*): feed-forward width; `4 * hidden_size` by default.
        hidden_act (`str`): activation name from `transformers.activations.ACT2FN` (`gelu`, `gelu_new`, `relu`,
            `silu`...).
        ffn_type (`str`): `"mlp"` (up, act, down) or `"glu"` (act(gate) * up, down: SwiGLU with `silu`, GeGLU with
            `gelu`).
        mlp_bias (`bool`): biases on the feed-forward projections.
        attention_bias (`bool`): biases on the query, key and value projections.
        attention_out_bias (`bool`, *optional*): a bias on the attention output projection; `attention_bias` by
            default (Qwen2 has q/k/v biases but none on the output).
        fused_qkv_proj (`bool`): self-attention stores its query, key and value projections as one `qkv_proj`
            linear layer (rows stacked q, k, v, as GPT-2's `c_attn` and Phi-3's `qkv_proj`) instead of `q_proj`,
            `k_proj` and `v_proj`: one matmul where three run at every decode step. The same function either way
            (conversion splits or joins them); GPT-2's, Phi-3's, GPT-NeoX's and ModernBERT's conversions set it.
            Tensor parallelism gathers its output (Phi-3's plan: a column split would cut across the three); PEFT
            targets `qkv_proj`.
        position_embedding_type (`str`): `"learned"`, `"sinusoidal"`, `"rope"`, `"alibi"`, `"relative_bias"` (T5's
            bucketed relative position bias, learned per head) or `"none"`.
        max_position_embeddings (`int`): rows of the learned position table; pretraining length for RoPE scaling.
        position_offset (`int`): learned positions are looked up at `position + offset` (BART uses 2).
        position_ids_from_padding (`bool`): without `position_ids`, count positions over the non-padding tokens
            only (`input_ids != pad_token_id`) and give padding position -1 (RoBERTa, with `position_offset =
            pad_token_id + 1`: padding reads the table's padding row).
        relative_attention_num_buckets (`int`), relative_attention_max_distance (`int`): T5's relative-bias buckets.
        rope_parameters (`dict`, *optional*): transformers' RoPE dict (`rope_type` in default, linear, dynamic, yarn,
            longrope, llama3, `rope_theta`, and `partial_rotary_factor` < 1 to rotate only the first features of each
            head, GPT-NeoX and Phi); only meaningful with `position_embedding_type="rope"`. Or one such dict per
            layer type, as transformers nests them (`{"full_attention": {...}, "sliding_attention": {...}}`:
            ModernBERT's global and local theta).
        rope_tables_in_float32 (`bool`): RoPE's cos and sin stay float32, so queries and keys rotate in float32, then
            cast (OLMo 2); by default the tables are cast to the model's dtype first (Llama). The same in float32.
        rope_in_float32 (`bool`): queries and keys are upcast to float32 to rotate by the (model-dtype) tables, then
            cast back (ModernBERT). The same in float32.
        nope_layers (`list[int]`, *optional*): layers that get no position encoding in a RoPE model (SmolLM3's NoPE
            layers).
        layer_types (`list[str]`, *optional*): each layer's attention, `"full_attention"` or `"sliding_attention"`
            (transformers' names); by default every layer is sliding when `sliding_window` is set (Mistral), else
            full.
        sliding_window (`int`, *optional*): the window of the sliding layers: a causal query sees itself and the
            `sliding_window - 1` tokens before it, a bidirectional one the tokens at most `sliding_window` away
            (transformers' mask helpers).
        qk_norm (`str`): `"none"`, `"per_head"` (a norm of width `head_dim` on every query and key head before
            RoPE, Qwen3) or `"projection"` (a norm over the whole query and key projections, OLMo2).
        attn_logit_softcapping (`float`, *optional*): attention scores become `cap * tanh(scores / cap)` (Gemma 2;
            eager and flex attention only).
        final_logit_softcapping (`float`, *optional*): the same capping on the LM-head logits (Gemma 2).
        attention_sinks (`bool`): a learned sink logit per head joins each query's softmax and takes its share of
            the attention without a value (GPT-OSS); eager, flex and flash attention only.
        kv_lora_rank (`int`, *optional*): multi-head latent attention (DeepSeek-V2/V3) when set: keys and values are
            expanded from one compressed latent of this width per token (normed), which is what the cache holds,
            beside one rotary key of `head_dim` features shared by every head; each query and key head is
            `qk_nope_head_dim` features without position plus `head_dim` rotated ones, each value head `v_head_dim`.
            None is the standard attention.
        q_lora_rank (`int`, *optional*): under latent attention, queries pass through a normed bottleneck of this
            width; None projects them directly.
        qk_nope_head_dim (`int`), v_head_dim (`int`): latent attention's per-head widths (see `kv_lora_rank`).
        rope_interleave (`bool`): latent attention's rotary features come in interleaved pairs `(x0, x1), (x2, x3)...`
            (DeepSeek's checkpoints) instead of two halves.
        query_pre_attn_scalar (`float`, *optional*): attention scale `query_pre_attn_scalar ** -0.5` (Gemma 2);
            exclusive with `attention_multiplier`.
        norm_type (`str`): `"layernorm"` or `"rmsnorm"`.
        rmsnorm_unit_offset (`bool`): RMSNorm scales by `1 + weight`, with the weight initialised at 0 (Gemma).
        rmsnorm_scale_in_float32 (`bool`): RMSNorm scales the float32 normalised states by its weight, then casts
            (OLMo 2, GPT-OSS); by default it casts, then scales (Llama). The same in float32; in bf16 the output
            rounds as the reference's does. (With `rmsnorm_unit_offset` the scale is in float32 anyway.)
        norm_position (`str`): where each sublayer's norm sits: `"pre"` (`x + f(norm(x))`: GPT-2, Llama), `"post"`
            (`norm(x + f(x))`: original Transformer, BERT), `"sandwich"` (`x + norm2(f(norm1(x)))`: Gemma 2) or
            `"output"` (`x + norm(f(x))`: OLMo2).
        parallel_residual (`bool`): attention and feed-forward both read the block input, `x + attn(norm1(x)) +
            mlp(norm2(x))` (GPT-NeoX, GPT-J); pre-norm only.
        first_layer_attn_norm (`bool`): False drops the first layer's attention-input norm (ModernBERT, whose
            embeddings are already normed).
        layer_norm_eps (`float`): epsilon of every norm.
        norm_bias (`bool`): bias in LayerNorm (ignored by RMSNorm).
        final_norm (`bool`): a norm after the last block (standard for pre-norm stacks).
        embedding_norm (`bool`): a norm right after the embeddings (BERT).
        embedding_dropout (`float`), hidden_dropout (`float`), attention_dropout (`float`): dropout probabilities.
        scale_embeddings (`bool`): multiply token embeddings by `sqrt(hidden_size)` (original Transformer, Gemma).
        round_embedding_scale (`bool`): that scale rounded to the embeddings' dtype before it multiplies, as Gemma
            keeps it (a tensor cast to the table's dtype); BART multiplies by the exact value. The same in float32.
        type_vocab_size (`int`): number of token types (segment embeddings); 0 means none.
        tie_word_embeddings (`bool`): the LM head shares the token embedding matrix.
        initializer_range (`float`): std of the normal init of linear and embedding weights.
        attention_multiplier (`float`, *optional*): scale of the attention scores; `head_dim**-0.5` by default
            (T5 uses 1.0).
        lm_head_bias (`bool`): a bias on the LM head (BART's `final_logits_bias`), frozen as BART's buffer is.
        scale_lm_head_input (`bool`): multiply the last hidden state by `hidden_size**-0.5` before the LM head
            (T5 with tied embeddings).
        use_pooler (`bool`): encoders get a pooler (dense + tanh on the first token, BERT's) for sentence-level heads.
        loss_chunk_size (`int` or `None`): language-model heads training with labels project this many tokens at a
            time and return the loss without logits, never holding the `[tokens, vocab]` logits or their gradient
            whole (`modeling_tfm_loss.py`); None (the default) sizes the chunks so that each one's logits hold no
            more values than the layers' hidden states of the batch (few, large chunks where the layers outweigh the
            vocabulary; `python -m benchmarks.trace` counts what each one costs on a GPU), at least twice the hidden
            size in tokens.
            In eval mode, and with 0, they compute the full logits as transformers does.
        check_input_values (`bool`): read the inputs' values to name a bad one (a token id outside the vocabulary, a
            token type outside `type_vocab_size`, a position outside the position table) in a `ValueError`. Reading a
            value is a host-device synchronisation on an accelerator, so it is done on a forward that starts a
            sequence or feeds several tokens (training, evaluation, the prompt of `generate()`), never on a decode
            step's single token (which the model sampled from its own vocabulary); a position past the table is still
            named at the step that reaches it, where the host knows the cache length. False skips every value check
            (production serving); shape checks never read values and always run.

        > Mixture of Experts (every paradigm; `num_experts=0` keeps every layer dense)

        num_experts (`int`): routed experts per MoE layer; 0 means dense.
        num_experts_per_tok (`int`): top-k experts each token is routed to.
        moe_intermediate_size (`int`, *optional*): width of one expert; `intermediate_size` by default. Experts are
            gated (GLU with `hidden_act`, as Mixtral's) whatever `ffn_type` the dense layers use.
        decoder_sparse_step (`int`): every N-th layer is MoE (layer i when `(i + 1) % N == 0`); 1 means all.
        mlp_only_layers (`list[int]`): layers kept dense regardless of the step.
        moe_layers (`list[int]`, *optional*): the exact MoE layers, overriding the step and `mlp_only_layers`.
        shared_expert_intermediate_size (`int`): an always-on expert of this width (DeepSeekMoE, Qwen-MoE); 0 = none.
        shared_expert_gate (`bool`): scale the shared expert by a learned sigmoid gate (Qwen2-MoE).
        scoring_func (`str`): router scores, `"softmax"` (Mixtral) or `"sigmoid"` (DeepSeek-V3), or
            `"top_k_softmax"` (GPT-OSS): the top-k experts by logit, weighted by the softmax of their k logits (in
            the logits' dtype). The same weights as softmax with `norm_topk_prob`, computed as GPT-OSS computes them,
            with two operations instead of six.
        norm_topk_prob (`bool`): renormalise the top-k scores to sum to 1.
        router_jitter_noise (`float`): multiplicative noise on the router input while training.
        router_in_float32 (`bool`): score the experts in float32 (router input and weight upcast) whatever the model's
            dtype, as DeepSeek-V3's router does, so that a bf16 model routes as its float32 scores say.
        router_weights_in_model_dtype (`bool`): cast the top-k weights to the router logits' dtype (the model's)
            before they scale the experts' outputs, as Qwen2-MoE's and Qwen3-MoE's routers do; float32 otherwise
            (Mixtral, DeepSeek-V3; `top_k_softmax` computes them in that dtype). The same in float32; in bf16 the
            weights round as the reference's do.
        router_aux_loss_coef (`float`): weight of the load-balancing loss (Switch/Mixtral) added to the task loss;
            by default 0.001 with MoE layers and 0.0 without, so that a dense model looks dense to clients that read a
            non-zero coefficient as a request for router logits (TRL's trainers).
        router_z_loss_coef (`float`): weight of the router z-loss (ST-MoE) added to the task loss.
        router_bias_update_rate (`float`): auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias, used only
            to choose experts, moved by this rate against each expert's observed load after every optimizer step.
        capacity_factor (`float`, *optional*): None is dropless; otherwise each expert takes at most
            `ceil(capacity_factor * tokens * top_k / num_experts)` tokens per forward and drops the rest.
        output_router_logits (`bool`): return per-layer router logits (and the aux loss) even without labels.
        router_bias (`bool`): a learned bias on the router's logits (GPT-OSS).
        expert_mlp_bias (`bool`): biases on the experts' projections (GPT-OSS).
        swiglu_limit (`float`, *optional*): GPT-OSS's clamped SwiGLU in the experts: gate clamped to at most the
            limit and up to [-limit, limit], then `(up + 1) * gate * sigmoid(swiglu_alpha * gate)` in place of
            `act(gate) * up`; None keeps the plain GLU with `hidden_act`.
        swiglu_alpha (`float`): the clamped SwiGLU's sigmoid slope (1.702 in GPT-OSS).
        router_choice_bias (`bool`): a per-expert bias added to the scores only to choose experts, a saved state
            (DeepSeek-V3's `e_score_correction_bias`); `router_bias_update_rate` > 0 learns it while training.
        num_expert_groups (`int`), topk_expert_groups (`int`): group-limited routing (DeepSeek-V3): the experts form
            this many equal groups, each scored by the sum of its two best experts' choice scores, and a token picks
            its top-k experts from its best `topk_expert_groups` groups only. 1 group routes over all experts.
        routed_scaling_factor (`float`): the routed experts' weights are multiplied by this (DeepSeek-V3: 2.5).
    """

    model_type = "tfm"
    keys_to_ignore_at_inference: ClassVar[list[str]] = CACHE_NAMES  # Trainer's evaluation leaves the cache out
    # DeepSeek's name for latent attention's rotary width, which vLLM's Transformers backend reads for its MLA layer
    attribute_map: ClassVar[dict[str, str]] = {"qk_rope_head_dim": "head_dim"}

    vocab_size: int = 32000
    pad_vocab_size_to_multiple_of: int | None = None
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    ffn_type: str = "mlp"
    mlp_bias: bool = True
    attention_bias: bool = True
    attention_out_bias: bool | None = None
    fused_qkv_proj: bool = False
    position_embedding_type: str = "learned"
    max_position_embeddings: int = 1024
    position_offset: int = 0
    position_ids_from_padding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    rope_parameters: dict | None = None
    rope_tables_in_float32: bool = False
    rope_in_float32: bool = False
    nope_layers: list[int] | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    qk_norm: str = "none"
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    attention_sinks: bool = False
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    rope_interleave: bool = False
    query_pre_attn_scalar: int | float | None = None
    norm_type: str = "layernorm"
    rmsnorm_unit_offset: bool = False
    rmsnorm_scale_in_float32: bool = False
    norm_position: str = "pre"
    parallel_residual: bool = False
    first_layer_attn_norm: bool = True
    layer_norm_eps: float = 1e-5
    norm_bias: bool = True
    final_norm: bool = True
    embedding_norm: bool = False
    embedding_dropout: float = 0.0
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    scale_embeddings: bool = False
    round_embedding_scale: bool = False
    type_vocab_size: int = 0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    attention_multiplier: float | None = None
    lm_head_bias: bool = False
    scale_lm_head_input: bool = False
    use_pooler: bool = True
    loss_chunk_size: int | None = None
    check_input_values: bool = True
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    moe_layers: list[int] | None = None
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    scoring_func: str = "softmax"
    norm_topk_prob: bool = True
    router_jitter_noise: float = 0.0
    router_in_float32: bool = False
    router_weights_in_model_dtype: bool = False
    router_aux_loss_coef: float | None = None
    router_z_loss_coef: float = 0.0
    router_bias_update_rate: float = 0.0
    capacity_factor: float | None = None
    output_router_logits: bool = False
    router_bias: bool = False
    expert_mlp_bias: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    router_choice_bias: bool = False
    num_expert_groups: int = 1
    topk_expert_groups: int = 1
    routed_scaling_factor: float = 1.0
    use_cache: bool = True
    is_decoder: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        _warn_unknown_keys(self, kwargs)
        self._check_fields(kwargs)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size
        if self.router_aux_loss_coef is None:
            self.router_aux_loss_coef = 0.001 if self.num_experts > 0 else 0.0
        if self.mlp_only_layers is None:
            self.mlp_only_layers = []
        if self.attention_out_bias is None:
            self.attention_out_bias = self.attention_bias
        kinds = self.layer_types
        if kinds is None and not self.is_encoder_decoder:
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            self.layer_types = [kind] * self.num_hidden_layers
        elif kinds and len(set(kinds)) == 1 and len(kinds) != self.num_hidden_layers:
            # one kind for every layer follows a new depth (`from_pretrained(path, num_hidden_layers=N)`, a config.json
            # edited); a per-layer pattern cannot be stretched (_check_layers names the mismatch)
            self.layer_types = [kinds[0]] * self.num_hidden_layers
        self._check_moe()
        self._check_layers()
        super().__post_init__(**kwargs)
        if self.position_embedding_type == "rope":
            self._check_rope()
        else:
            # transformers fills a default RoPE dict into every config; a non-RoPE model must not carry one.
            self.rope_parameters = None

    def _check_fields(self, kwargs: dict) -> None:
        for field in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ):
            _require(getattr(self, field) > 0, field, f"must be a positive integer, got {getattr(self, field)}")
        for field in ("num_key_value_heads", "head_dim", "intermediate_size"):
            value = getattr(self, field)
            _require(value is None or value > 0, field, f"must be a positive integer or None, got {value}")
        for field in ("type_vocab_size", "position_offset"):
            _require(getattr(self, field) >= 0, field, f"must be >= 0, got {getattr(self, field)}")
        chunk = self.loss_chunk_size
        _require(chunk is None or chunk >= 0, "loss_chunk_size", f"must be >= 0 or None, got {chunk}")
        multiple = self.pad_vocab_size_to_multiple_of
        _require(
            multiple is None or multiple >= 0,
            "pad_vocab_size_to_multiple_of",
            f"must be a positive integer (None, 0 or 1: no padding), got {multiple}",
        )
        for field in ("relative_attention_num_buckets", "relative_attention_max_distance"):
            _require(getattr(self, field) > 0, field, f"must be a positive integer, got {getattr(self, field)}")
        if self.head_dim is None:
            _require(
                self.hidden_size % self.num_attention_heads == 0,
                "hidden_size",
                f"{self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads} "
                "(set head_dim explicitly to decouple them)",
            )
        kv_heads = self.num_key_value_heads or self.num_attention_heads
        _require(
            self.num_attention_heads % kv_heads == 0,
            "num_key_value_heads",
            f"num_attention_heads={self.num_attention_heads} is not divisible by num_key_value_heads={kv_heads}",
        )
        for field, allowed in (
            ("position_embedding_type", POSITION_EMBEDDING_TYPES),
            ("norm_type", NORM_TYPES),
            ("norm_position", NORM_POSITIONS),
            ("ffn_type", FFN_TYPES),
            ("qk_norm", QK_NORMS),
        ):
            value = getattr(self, field)
            _require(value in allowed, field, f"{value!r} is not one of {allowed}")
        _require(self.hidden_act in ACT2FN, "hidden_act", f"{self.hidden_act!r} is not a transformers activation")
        for field in ("embedding_dropout", "hidden_dropout", "attention_dropout"):
            value = getattr(self, field)
            _require(0.0 <= value < 1.0, field, f"a dropout probability must be in [0, 1), got {value}")
        _require(self.layer_norm_eps > 0, "layer_norm_eps", f"must be > 0, got {self.layer_norm_eps}")
        _require(
            self.attention_multiplier is None or self.attention_multiplier > 0,
            "attention_multiplier",
            f"must be > 0 or None, got {self.attention_multiplier}",
        )
        _require(self.initializer_range >= 0, "initializer_range", f"must be >= 0, got {self.initializer_range}")
        for field in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "sliding_window"):
            value = getattr(self, field)
            _require(value is None or value > 0, field, f"must be > 0 or None, got {value}")
        _require(
            self.query_pre_attn_scalar is None or self.attention_multiplier is None,
            "query_pre_attn_scalar",
            "set it or attention_multiplier, not both: both set the attention scale",
        )
        _require(
            not self.parallel_residual or self.norm_position == "pre",
            "parallel_residual",
            f"a parallel residual reads pre-norms, but norm_position={self.norm_position!r}",
        )
        _require(
            not self.position_ids_from_padding or self.pad_token_id is not None,
            "position_ids_from_padding",
            "positions counted over non-padding tokens need pad_token_id",
        )
        rope = self.rope_parameters or kwargs.get("rope_scaling")
        if self.position_embedding_type != "rope":
            scaled = rope and rope.get("rope_type", rope.get("type", "default")) != "default"
            _require(
                not scaled,
                "rope_parameters",
                f"RoPE scaling {rope} is set but position_embedding_type={self.position_embedding_type!r}; "
                "use position_embedding_type='rope'",
            )

    def _check_moe(self) -> None:
        _require(self.num_experts >= 0, "num_experts", f"must be >= 0 (0 = dense), got {self.num_experts}")
        if self.num_experts == 0:
            return
        _require(
            1 <= self.num_experts_per_tok <= self.num_experts,
            "num_experts_per_tok",
            f"top-k must be in [1, num_experts={self.num_experts}], got {self.num_experts_per_tok}",
        )
        _require(
            self.moe_intermediate_size > 0, "moe_intermediate_size", f"must be > 0, got {self.moe_intermediate_size}"
        )
        _require(self.decoder_sparse_step >= 1, "decoder_sparse_step", f"must be >= 1, got {self.decoder_sparse_step}")
        depth = max(self.num_hidden_layers, getattr(self, "decoder_layers", None) or 0)
        for field in ("mlp_only_layers", "moe_layers"):
            bad = [i for i in getattr(self, field) or [] if not 0 <= i < depth]
            _require(not bad, field, f"layer indices {bad} are outside [0, {depth})")
        _require(
            self.scoring_func in ("softmax", "sigmoid", "top_k_softmax"),
            "scoring_func",
            f"{self.scoring_func!r} is not softmax, sigmoid or top_k_softmax",
        )
        if self.scoring_func == "top_k_softmax":  # it picks by logit and its weights always sum to 1
            for field, refused in (
                ("norm_topk_prob", not self.norm_topk_prob),
                ("router_choice_bias", self.router_choice_bias),
                ("router_bias_update_rate", self.router_bias_update_rate > 0),
                ("num_expert_groups", self.num_expert_groups > 1),
            ):
                _require(not refused, field, f"{getattr(self, field)!r} is not available with top_k_softmax scoring")
        _require(
            self.capacity_factor is None or self.capacity_factor > 0,
            "capacity_factor",
            f"must be > 0 or None (dropless), got {self.capacity_factor}",
        )
        for field in ("router_aux_loss_coef", "router_z_loss_coef", "router_bias_update_rate", "router_jitter_noise"):
            _require(getattr(self, field) >= 0, field, f"must be >= 0, got {getattr(self, field)}")
        _require(
            self.shared_expert_intermediate_size >= 0,
            "shared_expert_intermediate_size",
            f"must be >= 0 (0 = no shared expert), got {self.shared_expert_intermediate_size}",
        )
        for field in ("swiglu_limit", "swiglu_alpha", "routed_scaling_factor"):
            value = getattr(self, field)
            _require(value is None or value > 0, field, f"must be > 0, got {value}")
        groups = self.num_expert_groups
        _require(
            groups >= 1 and self.num_experts % groups == 0 and (groups == 1 or self.num_experts // groups >= 2),
            "num_expert_groups",
            f"{groups} must split num_experts={self.num_experts} into equal groups of at least 2 experts",
        )
        _require(
            1 <= self.topk_expert_groups <= groups
            and self.num_experts_per_tok <= self.topk_expert_groups * (self.num_experts // groups),
            "topk_expert_groups",
            f"{self.topk_expert_groups} must be in [1, num_expert_groups={groups}] and its groups must hold "
            f"num_experts_per_tok={self.num_experts_per_tok} experts",
        )

    def _check_latent_attention(self) -> None:
        if self.kv_lora_rank is None:
            return
        for field in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, field)
            _require(value is None or value > 0, field, f"must be a positive integer, got {value}")
        for field, refused in (
            ("position_embedding_type", self.position_embedding_type != "rope"),
            ("qk_norm", self.qk_norm != "none"),
            ("layer_types", "sliding_attention" in (self.layer_types or ())),
            ("attention_sinks", self.attention_sinks),
            ("attn_logit_softcapping", self.attn_logit_softcapping is not None),
            ("is_encoder_decoder", self.is_encoder_decoder),
            ("fused_qkv_proj", self.fused_qkv_proj),
        ):
            _require(
                not refused, field, f"{getattr(self, field)!r} is not available with latent attention (kv_lora_rank)"
            )

    def _check_layers(self) -> None:
        self._check_latent_attention()
        depth = self.num_hidden_layers
        _require(
            self.first_layer_attn_norm or self.norm_position in ("pre", "sandwich"),
            "first_layer_attn_norm",
            f"only a norm before attention can be dropped, but norm_position={self.norm_position!r}",
        )
        bad = [i for i in self.nope_layers or [] if not 0 <= i < depth]
        _require(not bad, "nope_layers", f"layer indices {bad} are outside [0, {depth})")
        _require(
            not self.nope_layers or self.position_embedding_type == "rope",
            "nope_layers",
            f"lists layers without RoPE, but position_embedding_type={self.position_embedding_type!r}",
        )
        if self.is_encoder_decoder:
            _require(
                not self.parallel_residual,
                "parallel_residual",
                "an encoder-decoder's decoder has a cross-attention sublayer between the two branches",
            )
            # caches size themselves from `layer_types`, which would not fit a decoder of another depth
            for field in ("layer_types", "sliding_window", "nope_layers"):
                _require(not getattr(self, field), field, "per-layer options are for single-stack models only")
            return
        _require(
            len(self.layer_types) == depth,
            "layer_types",
            f"has {len(self.layer_types)} entries for num_hidden_layers={depth}",
        )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        _require(not bad, "layer_types", f"{bad} are not among {LAYER_TYPES}")
        sliding = "sliding_attention" in self.layer_types
        _require(
            not sliding or self.sliding_window is not None,
            "sliding_window",
            "layer_types has sliding_attention layers, but sliding_window is not set",
        )
        _require(
            not sliding or self.position_embedding_type not in ATTENTION_BIAS_POSITIONS,
            "layer_types",
            f"sliding layers cannot use position_embedding_type={self.position_embedding_type!r} (its bias spans "
            "every key)",
        )

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        # a config.json's model_type names its paradigm: a misspelled one, or another paradigm's, would build this
        # class from fields meant for another (transformers only logs a warning). Checked here, where hf_tfm's own
        # config classes load (from_pretrained reads through from_dict, also as remote code), so importing hf_tfm
        # changes nothing of how other models load
        model_type = config_dict.get("model_type", cls.model_type)
        if cls.model_type in PARADIGM_CONFIGS and model_type != cls.model_type:
            reader = PARADIGM_CONFIGS.get(model_type)
            reads = f"{reader.__name__} reads it" if reader is not None else "it is not one of them"
            raise ValueError(
                f"config.json has model_type {model_type!r}: the valid hf_tfm model types are "
                f"{', '.join(map(repr, PARADIGM_CONFIGS))}; {cls.__name__} reads {cls.model_type!r} ({reads})"
            )
        # hf_tfm's fields given as keywords (`from_pretrained(path, num_hidden_layers=N)`) build the config together
        # with the file's, so that validation sees them (transformers sets them on the finished config)
        ours = cls.__dataclass_fields__.keys() - PreTrainedConfig.__dataclass_fields__.keys()
        given = {key: value for key, value in kwargs.items() if key in ours}
        return super().from_dict({**config_dict, **given}, **kwargs)

    def padded_vocab_size(self) -> int:
        """Rows of the token table and the LM head: `vocab_size` rounded up to `pad_vocab_size_to_multiple_of`."""
        return round_up_to_multiple(self.vocab_size, self.pad_vocab_size_to_multiple_of)

    def layer_type(self, layer_idx: int) -> str:
        """A layer's attention kind (an encoder-decoder has no `layer_types`: all full)."""
        if self.layer_types is None:
            return "full_attention"
        _require(
            len(self.layer_types) == self.num_hidden_layers,
            "layer_types",
            f"has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}; set both together",
        )
        return self.layer_types[layer_idx]

    def layer_kinds(self) -> set[str]:
        """The attention kinds the layers use."""
        return set(self.layer_types) if self.layer_types is not None else {"full_attention"}

    def has_moe_layers(self) -> bool:
        """Whether any layer of any stack is a Mixture-of-Experts layer."""
        depth = max(self.num_hidden_layers, getattr(self, "decoder_layers", None) or 0)
        return any(self.is_moe_layer(i) for i in range(depth))

    def joins_qkv(self, cross_attention: bool) -> bool:
        """Whether an attention holds its q, k and v as one `qkv_proj`: `fused_qkv_proj` joins a self-attention's;
        a cross-attention's keys and values read another stack's states, so its three stay apart."""
        return self.fused_qkv_proj and not cross_attention

    def is_moe_layer(self, layer_idx: int) -> bool:
        if self.num_experts == 0:
            return False
        if self.moe_layers is not None:
            return layer_idx in self.moe_layers
        return layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0

    def stacks(self) -> list[tuple[str, int, bool]]:
        """Each stack of the base model: (its name prefix there, its depth, whether it has cross-attention)."""
        return [("", self.num_hidden_layers, False)]

    def convert_rope_params_to_dict(self, **kwargs):
        # transformers 5.17 gives a nested dict (one per layer type) a top-level `rope_theta` and then fails to
        # validate it; each nested dict gets the defaults it lacks instead, as 5.17's ModernBertConfig does it
        if not self.nested_rope():
            return super().convert_rope_params_to_dict(**kwargs)
        kwargs.pop("rope_scaling", None)
        theta = kwargs.pop("rope_theta", self.default_theta)
        for rope in self.rope_parameters.values():
            rope.setdefault("rope_type", "default")
            rope.setdefault("rope_theta", theta)
        self.standardize_rope_params()
        return kwargs

    def rope_parameters_for(self, layer_type: str) -> dict:
        """The RoPE dict of one layer type: the one dict, or its entry when they are nested per layer type."""
        rope = self.rope_parameters
        return rope[layer_type] if self.nested_rope() else rope

    def nested_rope(self) -> bool:
        return bool(self.rope_parameters) and not set(self.rope_parameters).isdisjoint(LAYER_TYPES)

    def _check_rope(self) -> None:
        if self.nested_rope():
            missing = sorted(self.layer_kinds() - set(self.rope_parameters))
            _require(not missing, "rope_parameters", f"nested per layer type, but has no entry for {missing}")
        for layer_type in sorted(self.layer_kinds()):
            self._check_rope_dict(self.rope_parameters_for(layer_type))

    def _check_rope_dict(self, rope: dict) -> None:
        rope_type = rope.get("rope_type", "default")
        _require(
            rope_type == "default" or rope_type in ROPE_INIT_FUNCTIONS,
            "rope_parameters",
            f"unknown rope_type {rope_type!r}; known: {['default', *ROPE_INIT_FUNCTIONS]}",
        )
        factor = rope.get("partial_rotary_factor", 1.0)
        _require(
            0 < factor <= 1 and int(self.head_dim * factor) % 2 == 0,
            "rope_parameters",
            f"partial_rotary_factor={factor} must be in (0, 1] and rotate an even number of the head_dim="
            f"{self.head_dim} features",
        )
        if rope_type in ("linear", "dynamic", "yarn", "llama3", "longrope"):
            required = {"linear": "factor", "dynamic": "factor", "yarn": "factor", "llama3": "factor"}.get(rope_type)
            _require(
                required is None or isinstance(rope.get(required), (int, float)),
                "rope_parameters",
                f"rope_type={rope_type!r} needs a numeric {required!r}",
            )


@strict
class TfmDecoderConfig(TfmConfig):
    r"""Decoder-only (GPT-2 / Llama-style) configuration: causal self-attention blocks and an LM head."""

    model_type = "tfm_decoder"
    # Every Auto class this paradigm answers to, with the model class (in modeling_tfm.py) it builds: the one
    # place that registration (hf_tfm/__init__.py) and `auto_map` (save_pretrained) read from.
    auto_classes: ClassVar[dict[str, str]] = {
        "AutoModel": "TfmDecoderModel",
        "AutoModelForCausalLM": "TfmDecoderForCausalLM",
        "AutoModelForSequenceClassification": "TfmDecoderForSequenceClassification",
        "AutoModelForTokenClassification": "TfmDecoderForTokenClassification",
        "AutoModelForQuestionAnswering": "TfmDecoderForQuestionAnswering",
    }
    is_decoder: bool = True


@strict
class TfmEncoderConfig(TfmConfig):
    r"""Encoder-only (BERT-style) configuration: bidirectional self-attention blocks, token types, pooler."""

    model_type = "tfm_encoder"
    auto_classes: ClassVar[dict[str, str]] = {
        "AutoModel": "TfmEncoderModel",
        "AutoModelForMaskedLM": "TfmEncoderForMaskedLM",
        "AutoModelForSequenceClassification": "TfmEncoderForSequenceClassification",
        "AutoModelForTokenClassification": "TfmEncoderForTokenClassification",
        "AutoModelForQuestionAnswering": "TfmEncoderForQuestionAnswering",
    }
    type_vocab_size: int = 2


@strict
class TfmEncoderDecoderConfig(TfmConfig):
    r"""
    Encoder-decoder (T5 / BART / original Transformer) configuration. The shared fields describe both stacks;
    `num_hidden_layers` is the encoder depth and `decoder_layers` the decoder depth (transformers' flat
    encoder-decoder convention: `get_text_config(decoder=True)` maps it to `num_hidden_layers`).

    Args:
        decoder_layers (`int`, *optional*): decoder depth; the encoder's by default.
        decoder_start_token_id (`int`, *optional*): first decoder input; labels are shifted right behind it.
    """

    model_type = "tfm_encoder_decoder"
    auto_classes: ClassVar[dict[str, str]] = {
        "AutoModel": "TfmEncoderDecoderModel",
        "AutoModelForSeq2SeqLM": "TfmEncoderDecoderForConditionalGeneration",
    }
    is_encoder_decoder: bool = True
    decoder_layers: int | None = None
    decoder_start_token_id: int | None = None

    def stacks(self) -> list[tuple[str, int, bool]]:
        # `get_text_config(decoder=True)` gives a view whose `num_hidden_layers` is the decoder's and no decoder_layers
        decoder_layers = self.decoder_layers or self.num_hidden_layers
        return [("encoder.", self.num_hidden_layers, False), ("decoder.", decoder_layers, True)]

    def __post_init__(self, **kwargs):
        if self.decoder_layers is None:
            self.decoder_layers = self.num_hidden_layers
        _require(self.decoder_layers > 0, "decoder_layers", f"must be a positive integer, got {self.decoder_layers}")
        super().__post_init__(**kwargs)


# the three paradigms' config classes, by model type
PARADIGM_CONFIGS = {
    config.model_type: config for config in (TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig)
}
