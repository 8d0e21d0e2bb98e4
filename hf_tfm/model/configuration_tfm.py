"""The hf_tfm config: the schema of every option and its defaults, one subclass per paradigm.

A config is data that picks the building blocks; the model is composed from it when it is built
(`modeling_tfm_stack.py`). What a config may not hold is the rules table's (`configuration_tfm_rules.py`), checked when
a config is made and again when it is saved, each refusal a `ValueError` naming the field.
"""

from typing import ClassVar

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .capabilities import expert_parallel_plan, pipeline_parallel_plan, tensor_parallel_plan
from .compat import CACHE_NAMES, nested_rope_params_to_dict
from .configuration_tfm_rules import (
    LAYER_TYPES,
    check_config,
    check_model_type,
    numerics_from_legacy_fields,
    warn_unknown_keys,
)


def round_up_to_multiple(count: int, multiple: int | None) -> int:
    """`count` rounded up to a multiple of `multiple`; None, 0 and 1 leave it as it is."""
    return -(-count // multiple) * multiple if multiple and multiple > 1 else count


class ComputedPlan:
    """A parallel plan of the base model that transformers reads from the config (`base_model_tp_plan`,
    `base_model_ep_plan`, `base_model_pp_plan`), computed from the fields as it is read, so that it follows them; rules
    assigned to it once the config is made (`config.base_model_tp_plan = {...}`) stay on top."""

    def __init__(self, compute):
        self.compute = compute

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, config, owner=None):
        if config is None:
            return self
        return {**(self.compute(config) or {}), **config.__dict__.get(self.name, {})}

    def __set__(self, config, plan):
        config.__dict__[self.name] = dict(plan or {})  # where transformers' to_dict leaves an assigned plan out


@strict
class TfmConfig(PreTrainedConfig):
    r"""
    Options shared by every hf_tfm Transformer. Field names follow the transformers models users know.

    Args:
        vocab_size (`int`): token ids the inputs index and the logits score.
        pad_vocab_size_to_multiple_of (`int`, *optional*): the token table and the LM head hold `vocab_size` rounded up
            to this multiple (64 suits GPU tensor cores); the logits are sliced back to `vocab_size` and the padding
            rows are never read. None, 0 or 1: no padding.
        hidden_size (`int`): width of the residual stream.
        num_hidden_layers (`int`): number of Transformer blocks a forward runs.
        layer_sharing (`list[int]`, *optional*): cross-layer weight sharing (ALBERT): layer i runs the weights of
            distinct block `layer_sharing[i]`, the blocks numbered in order of first use (`[0, 0, 0, 0]`: one block run
            four times). `layers` holds the distinct blocks, so they are trained as one and saved once. Encoders only;
            None: every layer its own.
        num_attention_heads (`int`): query heads per attention layer.
        num_key_value_heads (`int`, *optional*): key/value heads (MHA by default, fewer for GQA, 1 for MQA); must
            divide `num_attention_heads`.
        head_dim (`int`, *optional*): width of one head; `hidden_size // num_attention_heads` by default.
        intermediate_size (`int`, *optional*): feed-forward width; `4 * hidden_size` by default.
        hidden_act (`str`): an activation of `transformers.activations.ACT2FN` (`gelu`, `gelu_new`, `relu`, `silu`...).
        ffn_type (`str`): `"mlp"` (up, act, down) or `"glu"` (act(gate) * up, down: SwiGLU, GeGLU).
        mlp_bias (`bool`): biases on the feed-forward's projections.
        attention_bias (`bool`): biases on the q/k/v projections.
        attention_out_bias (`bool`, *optional*): a bias on the attention output; `attention_bias` by default.
        fused_qkv_proj (`bool`): self-attention holds q, k and v as one `qkv_proj` (rows stacked q, k, v: GPT-2's
            `c_attn`, Phi-3's `qkv_proj`): one matmul where three run at every decode step, the same function.
        position_embedding_type (`str`): `"learned"`, `"sinusoidal"`, `"rope"`, `"alibi"`, `"relative_bias"` (T5's
            bucketed relative bias, learned per head), `"disentangled"` (DeBERTa's disentangled attention over
            log-bucketed relative positions; encoders, eager and sdpa) or `"none"`.
        max_position_embeddings (`int`): rows of the learned position table; pretraining length for RoPE scaling.
        position_offset (`int`): learned positions are looked up at `position + offset` (BART: 2).
        position_ids_from_padding (`bool`): without `position_ids`, count positions over non-padding tokens and give
            padding position -1 (RoBERTa, with `position_offset = pad_token_id + 1`).
        position_ids_from_attention_mask (`bool`): without `position_ids`, count positions over the tokens a 2D
            `attention_mask` marks real and give padding position -1 (OPT, with `position_offset = 2`).
        relative_attention_num_buckets (`int`): T5's relative-bias buckets; for disentangled attention, DeBERTa's
            `position_buckets` (the relative-position table holds twice as many rows: distances each way).
        relative_attention_max_distance (`int`): the distance T5's log-spaced buckets reach; for disentangled
            attention, DeBERTa's `max_relative_positions`.
        pos_att_type (`list[str]`, *optional*): disentangled attention's position terms (DeBERTa's names): `"c2p"`
            (each query against the embedding of its distance to each key) and `"p2c"` (each key against the embedding
            of the query's distance to it); None: both.
        share_att_key (`bool`): disentangled attention projects the relative-position embeddings with the layer's own
            key and query projections (DeBERTa-v3), else with its own `pos_key_proj` and `pos_query_proj`.
        relative_embeddings_norm (`bool`): a LayerNorm on the relative-position table before the layers read it
            (DeBERTa's `norm_rel_ebd="layer_norm"`).
        rope_parameters (`dict`, *optional*): transformers' RoPE dict (`rope_type`: default, linear, dynamic, yarn,
            longrope, llama3; `rope_theta`; `partial_rotary_factor` < 1 rotates only the first features of each head),
            or one such dict per layer type (`{"full_attention": {...}, "sliding_attention": {...}}`, ModernBERT).
        nope_layers (`list[int]`, *optional*): layers without position encoding in a RoPE model (SmolLM3).
        layer_types (`list[str]`, *optional*): each layer's `"full_attention"` or `"sliding_attention"`; by default
            every layer is sliding when `sliding_window` is set (Mistral), else full.
        sliding_window (`int`, *optional*): a causal query sees itself and the `sliding_window - 1` tokens before it, a
            bidirectional one the tokens at most `sliding_window` away.
        qk_norm (`str`): `"none"`, `"per_head"` (a `head_dim` norm on each query and key head, Qwen3) or `"projection"`
            (a norm over the whole query and key projections, OLMo 2).
        attn_logit_softcapping (`float`, *optional*): scores become `cap * tanh(scores / cap)` (Gemma 2).
        final_logit_softcapping (`float`, *optional*): the same capping on the LM-head logits.
        attention_sinks (`bool`): a learned sink logit per head joins each query's softmax (GPT-OSS).
        kv_lora_rank (`int`, *optional*): multi-head latent attention (DeepSeek-V2/V3): keys and values expanded from
            one normed latent of this width per token (what the cache holds) beside one rotary key of `head_dim`
            features shared by every head; query and key heads are `qk_nope_head_dim` + `head_dim` wide, value heads
            `v_head_dim`. None: standard attention.
        q_lora_rank (`int`, *optional*): latent attention's normed query bottleneck; None projects queries directly.
        qk_nope_head_dim (`int`): latent attention's per-head width of the query and key features without RoPE.
        v_head_dim (`int`): latent attention's per-head width of the values.
        rope_interleave (`bool`): latent attention's rotary features come in interleaved pairs (DeepSeek).
        query_pre_attn_scalar (`float`, *optional*): attention scale `query_pre_attn_scalar ** -0.5` (Gemma 2).
        attention_multiplier (`float`, *optional*): the attention scale itself (T5: 1.0); `head_dim ** -0.5` by
            default.
        norm_type (`str`): `"layernorm"` or `"rmsnorm"`.
        rmsnorm_unit_offset (`bool`): RMSNorm scales by `1 + weight`, the weight starting at 0 (Gemma).
        norm_position (`str`): each sublayer's norm: `"pre"` (`x + f(norm(x))`: GPT-2, Llama), `"post"` (`norm(x +
            f(x))`: BERT, BART), `"sandwich"` (`x + norm2(f(norm1(x)))`: Gemma 2) or `"output"` (`x + norm(f(x))`: OLMo
            2).
        parallel_residual (`bool`): `x + attn(norm1(x)) + mlp(norm2(x))` (GPT-NeoX); pre-norm only.
        first_layer_attn_norm (`bool`): False drops the first layer's attention-input norm (ModernBERT).
        layer_norm_eps (`float`): epsilon of every norm.
        norm_bias (`bool`): LayerNorm's bias.
        final_norm (`bool`): a norm after the last block.
        embedding_norm (`bool`): a norm after the embeddings (BERT).
        embedding_dropout (`float`): dropout probability on the embeddings.
        hidden_dropout (`float`): dropout probability on each sublayer's output.
        attention_dropout (`float`): dropout probability on the attention weights.
        ffn_dropout (`float`, *optional*): dropout on the feed-forward's output; `hidden_dropout` by default (ALBERT
            drops out only the attention's).
        activation_dropout (`float`): dropout inside the feed-forward, on the activation's output before the output
            projection (BART's and OPT's `activation_dropout`, T5's inner dropout).
        final_norm_dropout (`float`): dropout on the final norm's output (T5 drops out there with its `dropout_rate`).
        classifier_dropout (`float`, *optional*): dropout before the token classifiers' and the encoder's sequence
            classifier's task layer; `hidden_dropout` by default (BERT's rule). A decoder's sequence classifier has
            none, as transformers' generic one.
        layerdrop (`float`): LayerDrop, the probability that a whole layer is skipped at each training forward (BART's
            `encoder_layerdrop` and `decoder_layerdrop`, OPT's `layerdrop`), drawn before each layer as they draw it.
        scale_embeddings (`bool`): token embeddings times `sqrt(hidden_size)` (original Transformer, Gemma).
        embedding_size (`int`, *optional*): factorised embeddings (ALBERT, ELECTRA): the token, position and token-type
            tables and the embedding norm are this wide, a linear layer (`embed_proj`, there whenever the field is set,
            even at `hidden_size` as in ALBERT) maps them to `hidden_size`, and a masked-LM head maps back to this
            width before its tied vocabulary projection. Encoders only; None: the tables are `hidden_size` wide and
            feed the blocks directly.
        word_embed_proj_dim (`int`, *optional*): a decoder's token table and LM head this wide (OPT's name, OPT-350m):
            the looked-up tokens projected to `hidden_size` before the positions are added (`project_in`), the final
            hidden states projected back after the final norm (`project_out`), both without bias. None: the token table
            is as wide as the other embeddings.
        type_vocab_size (`int`): token types (segment embeddings); 0: none.
        tie_word_embeddings (`bool`): the LM head is the token table.
        freeze_pad_embedding (`bool`): the token table's `pad_token_id` row gets no gradient (`nn.Embedding`'s
            `padding_idx`, as Llama, BERT, BART and most transformers models keep it) and starts at zero; so does the
            position row padding reads under `position_ids_from_padding` (RoBERTa). Which rows training updates, not
            what the model computes.
        initializer_range (`float`): std of the normal init of linear and embedding weights.
        lm_head_bias (`bool`): a bias on the LM head (BART's `final_logits_bias`), frozen as BART's buffer is.
        scale_lm_head_input (`bool`): the last hidden state times `hidden_size ** -0.5` before the head (T5, tied).
        use_pooler (`bool`): an encoder's pooler (dense + tanh on the first token) for sentence-level heads.
        numerics (`list[str]`): where a converted model rounds as its reference does; each the same in float32,
            different roundings in bf16: `"rope_tables_in_float32"` (RoPE's cos and sin stay float32: OLMo 2),
            `"rope_in_float32"` (queries and keys rotate upcast: ModernBERT), `"rmsnorm_scale_in_float32"` (RMSNorm
            scales, then casts: OLMo 2, GPT-OSS), `"round_embedding_scale"` (the embedding scale rounded to the table's
            dtype: Gemma), `"router_in_float32"` (experts scored in float32: DeepSeek-V3),
            `"router_weights_in_model_dtype"` (top-k weights cast to the model's dtype: Qwen-MoE, GPT-OSS),
            `"router_scores_in_model_dtype"` (the router's probabilities cast to the model's dtype before the experts
            are chosen: Switch Transformer), `"scale_queries_as_projected"` (queries scaled as they are projected, the
            scores unscaled: OPT), `"rope_as_complex"` (interleaved rotary pairs rotate as complex numbers in float32
            and stay interleaved: DeepSeek-V2), `"ffn_output_in_float32"` (a float16 load keeps each feed-forward's
            output projection in float32, its input cast to it, and the RMSNorms cast to their weight's dtype: T5's
            `wo`, which float16 would overflow).
        num_experts (`int`): routed experts per MoE layer (every paradigm); 0 keeps every layer dense.
        num_experts_per_tok (`int`): top-k.
        moe_intermediate_size (`int`, *optional*): one expert's width (`intermediate_size` by default).
        moe_ffn_type (`str`): the experts' feed-forward, whatever `ffn_type` the dense layers use: `"glu"` (gated,
            `hidden_act` on the gate: Mixtral) or `"mlp"` (up, `hidden_act`, down: Switch Transformer).
        decoder_sparse_step (`int`): layer i is MoE when `(i + 1) % N == 0`.
        mlp_only_layers (`list[int]`): kept dense.
        moe_layers (`list[int]`, *optional*): the exact MoE layers, overriding `decoder_sparse_step` and
            `mlp_only_layers`.
        shared_expert_intermediate_size (`int`): an always-on expert of this width; 0: none.
        shared_expert_gate (`bool`): the shared expert scaled by a learned sigmoid gate (Qwen2-MoE).
        scoring_func (`str`): `"softmax"` (Mixtral), `"sigmoid"` (DeepSeek-V3) or `"top_k_softmax"` (GPT-OSS: the top-k
            logits' own softmax).
        norm_topk_prob (`bool`): the top-k weights renormalised to sum to 1.
        router_jitter_noise (`float`): multiplicative noise on an MoE layer's input while training (the router's and
            the experts', as Mixtral's).
        router_aux_loss_coef (`float`): the load-balancing loss's weight; 0.001 with MoE layers by default, 0.0
            without.
        router_z_loss_coef (`float`): the router z-loss's weight (ST-MoE).
        router_bias_update_rate (`float`): auxiliary-loss-free balancing (DeepSeek-V3): a per-expert choice bias moved
            by this rate against each expert's load after every optimizer step.
        capacity_factor (`float`, *optional*): each expert takes at most `ceil(factor * tokens * top_k / experts)`
            tokens per forward, the rest dropped; None: dropless.
        expert_capacity (`int`, *optional*): each expert takes at most this many tokens of each sequence, the rest
            dropped (Switch Transformer); a dropped token's expert output is 0, so the residual carries it past the
            layer.
        router_loss_style (`str`): how the router losses average: `"mixtral"` (the load-balancing loss over every real
            token of every MoE layer at once, the z-loss a mean per layer, summed) or `"switch"` (Switch Transformer:
            the load-balancing loss per sequence over the MoE layers' tokens joined, then averaged over the sequences;
            the z-loss one mean over those tokens; padding counted).
        router_aux_loss_scope (`str`): whose tokens the router losses count under data parallelism: `"local"` (each
            rank's, as transformers' MoE models compute them) or `"global"` (expert loads, router probabilities and
            token counts summed over the data-parallel ranks first, so N ranks train as one process on the global
            batch; needs router_loss_style="mixtral").
        output_router_logits (`bool`): return the router logits and aux loss even without labels.
        router_bias (`bool`): a bias on the router (GPT-OSS).
        expert_mlp_bias (`bool`): biases on the experts' projections (GPT-OSS).
        swiglu_limit (`float`, *optional*): GPT-OSS's clamped SwiGLU in the experts: the clamp.
        swiglu_alpha (`float`): GPT-OSS's clamped SwiGLU in the experts: the sigmoid's scale.
        router_choice_bias (`bool`): a saved per-expert bias that only chooses experts (`e_score_correction_bias`).
        num_expert_groups (`int`): group-limited routing (DeepSeek-V2, V3): the experts split into this many groups.
        topk_expert_groups (`int`): group-limited routing: each token's experts come from its this many best groups.
        expert_group_score (`str`): a group's score, the sum of its two best choice scores (`"top2_sum"`: DeepSeek-V3)
            or its best one (`"max"`: DeepSeek-V2).
        routed_scaling_factor (`float`): the routed experts' weights times this (DeepSeek-V3: 2.5).
        loss_chunk_size (`int` or `None`): run-time policy, never changes what the model computes: language-model heads
            training with labels project this many tokens at a time and return the loss without logits
            (`modeling_tfm_lm_head.py`); None sizes the chunks by the layers' activations; 0 computes the full logits,
            as transformers does (always so in eval mode).
        check_input_values (`bool`): run-time policy, never changes what the model computes: read input values to name
            a bad one (a token id outside the vocabulary, a position past the table) on forwards that start a sequence
            or feed several tokens; False skips them.
    """

    model_type = "tfm"
    keys_to_ignore_at_inference: ClassVar[list[str]] = CACHE_NAMES  # Trainer's evaluation leaves the cache out
    base_model_tp_plan = ComputedPlan(tensor_parallel_plan)
    base_model_ep_plan = ComputedPlan(expert_parallel_plan)
    base_model_pp_plan = ComputedPlan(pipeline_parallel_plan)
    # DeepSeek's name for latent attention's rotary width, which vLLM's Transformers backend reads for its MLA layer
    attribute_map: ClassVar[dict[str, str]] = {"qk_rope_head_dim": "head_dim"}

    vocab_size: int = 32000
    pad_vocab_size_to_multiple_of: int | None = None
    hidden_size: int = 768
    num_hidden_layers: int = 12
    layer_sharing: list[int] | None = None
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
    position_ids_from_attention_mask: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    pos_att_type: list[str] | None = None
    share_att_key: bool = True
    relative_embeddings_norm: bool = True
    rope_parameters: dict | None = None
    nope_layers: list[int] | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    qk_norm: str = "none"
    attn_logit_softcapping: float | int | None = None
    final_logit_softcapping: float | int | None = None
    attention_sinks: bool = False
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    rope_interleave: bool = False
    query_pre_attn_scalar: int | float | None = None
    attention_multiplier: float | int | None = None
    norm_type: str = "layernorm"
    rmsnorm_unit_offset: bool = False
    norm_position: str = "pre"
    parallel_residual: bool = False
    first_layer_attn_norm: bool = True
    layer_norm_eps: float | int = 1e-5
    norm_bias: bool = True
    final_norm: bool = True
    embedding_norm: bool = False
    embedding_dropout: float | int = 0.0
    hidden_dropout: float | int = 0.0
    attention_dropout: float | int = 0.0
    ffn_dropout: float | int | None = None
    activation_dropout: float | int = 0.0
    final_norm_dropout: float | int = 0.0
    layerdrop: float | int = 0.0
    classifier_dropout: float | int | None = None
    scale_embeddings: bool = False
    embedding_size: int | None = None
    word_embed_proj_dim: int | None = None
    type_vocab_size: int = 0
    tie_word_embeddings: bool = True
    freeze_pad_embedding: bool = False
    initializer_range: float | int = 0.02
    lm_head_bias: bool = False
    scale_lm_head_input: bool = False
    use_pooler: bool = True
    numerics: list[str] | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    moe_ffn_type: str = "glu"
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    moe_layers: list[int] | None = None
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    scoring_func: str = "softmax"
    norm_topk_prob: bool = True
    router_jitter_noise: float | int = 0.0
    router_aux_loss_coef: float | int | None = None
    router_z_loss_coef: float | int = 0.0
    router_bias_update_rate: float | int = 0.0
    capacity_factor: float | int | None = None
    expert_capacity: int | None = None
    router_loss_style: str = "mixtral"
    router_aux_loss_scope: str = "local"
    output_router_logits: bool = False
    router_bias: bool = False
    expert_mlp_bias: bool = False
    swiglu_limit: float | int | None = None
    swiglu_alpha: float | int = 1.702
    router_choice_bias: bool = False
    num_expert_groups: int = 1
    topk_expert_groups: int = 1
    expert_group_score: str = "top2_sum"
    routed_scaling_factor: float | int = 1.0
    use_cache: bool = True
    is_decoder: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # run-time policy
    loss_chunk_size: int | None = None
    check_input_values: bool = True

    def __post_init__(self, **kwargs):
        # configs saved before `numerics` held each rounding choice as a field of its own
        self.numerics = sorted({*(self.numerics or ()), *numerics_from_legacy_fields(kwargs)})
        warn_unknown_keys(self, kwargs)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None and self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
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
            # one kind for every layer follows a new depth (`from_pretrained(path, num_hidden_layers=N)`); a pattern
            # of kinds cannot be stretched (the rules name the mismatch)
            self.layer_types = [kinds[0]] * self.num_hidden_layers
        check_config(self, kwargs)  # before transformers reads the fields
        super().__post_init__(**kwargs)
        for plan in ("base_model_tp_plan", "base_model_ep_plan", "base_model_pp_plan"):
            # some transformers releases (5.17 among them) assign the tied table's rule as a config is made
            # (`embed_tokens`, which an encoder-decoder names `shared`): the computed plans name the table themselves
            self.__dict__.pop(plan, None)
        if self.position_embedding_type != "rope":
            self.rope_parameters = None  # transformers fills a default RoPE dict into every config
        check_config(self)  # with the RoPE dict transformers completed

    def validate_hf_tfm_rules(self):
        # a class validator (transformers runs them when a config is saved): a field set after the config was made
        # is refused at the save, never at the next load
        check_config(self)

    def convert_rope_params_to_dict(self, **kwargs):
        if not self.nested_rope():
            return super().convert_rope_params_to_dict(**kwargs)
        return nested_rope_params_to_dict(self, kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        check_model_type(cls, config_dict, PARADIGM_CONFIGS)
        # hf_tfm's fields given as keywords (`from_pretrained(path, num_hidden_layers=N)`) build the config with the
        # file's, so that the rules see them (transformers would set them on the finished config)
        ours = cls.__dataclass_fields__.keys() - PreTrainedConfig.__dataclass_fields__.keys()
        given = {key: value for key, value in kwargs.items() if key in ours}
        return super().from_dict({**config_dict, **given}, **kwargs)

    def embedding_width(self) -> int:
        """Width of the token, position and token-type tables: `embedding_size`, else `hidden_size`."""
        return self.embedding_size or self.hidden_size

    def token_width(self) -> int:
        """Width of the token table and of the LM head's input: `word_embed_proj_dim`, else `embedding_width()`."""
        return self.word_embed_proj_dim or self.embedding_width()

    def output_width(self) -> int:
        """Width of a stack's last hidden states, which the task heads read: `word_embed_proj_dim`, else
        `hidden_size`."""
        return self.word_embed_proj_dim or self.hidden_size

    def factorised_embeddings(self) -> bool:
        """Whether `embed_proj` maps the tables' width (`embedding_size`) to the blocks'."""
        return self.embedding_size is not None

    def ffn_dropout_probability(self) -> float:
        """The dropout on a feed-forward's output: `ffn_dropout`, else `hidden_dropout`."""
        return self.hidden_dropout if self.ffn_dropout is None else self.ffn_dropout

    def classifier_dropout_probability(self) -> float:
        """The dropout before a classifier's task layer: `classifier_dropout`, else `hidden_dropout`."""
        return self.hidden_dropout if self.classifier_dropout is None else self.classifier_dropout

    def disentangled_terms(self) -> tuple[str, ...]:
        """Disentangled attention's position terms: `pos_att_type`, both by default."""
        return ("c2p", "p2c") if self.pos_att_type is None else tuple(self.pos_att_type)

    def padded_vocab_size(self) -> int:
        """Rows of the token table and the LM head: `vocab_size` rounded up to `pad_vocab_size_to_multiple_of`."""
        return round_up_to_multiple(self.vocab_size, self.pad_vocab_size_to_multiple_of)

    def is_moe_layer(self, layer_idx: int, decoder: bool = False) -> bool:
        """Whether layer `layer_idx` (of an encoder-decoder's decoder, with `decoder`) is a Mixture of Experts."""
        if self.num_experts == 0:
            return False
        if self.moe_layers is not None:
            return layer_idx in self.moe_layers
        return layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0

    def has_moe_layers(self) -> bool:
        """Whether any layer of any stack is a Mixture-of-Experts layer."""
        return any(self.is_moe_layer(i, decoder) for _, depth, decoder in self.stacks() for i in range(depth))

    def stacks(self) -> list[tuple[str, int, bool]]:
        """Each stack of the base model: (its name prefix there, its depth, whether it has cross-attention: an
        encoder-decoder's decoder)."""
        return [("", self.num_hidden_layers, False)]

    def nested_rope(self) -> bool:
        """Whether `rope_parameters` holds one dict per layer type."""
        return bool(self.rope_parameters) and not set(self.rope_parameters).isdisjoint(LAYER_TYPES)

    def rope_parameters_for(self, layer_type: str) -> dict:
        """The RoPE dict of one layer type: the one dict, or its entry when they are nested per layer type."""
        return self.rope_parameters[layer_type] if self.nested_rope() else self.rope_parameters

    def longrope_switch_length(self) -> int | None:
        """The length past which LongRoPE turns from its short factors to its long ones (its pretraining length,
        `original_max_position_embeddings`), or None for every other RoPE."""
        if self.nested_rope() or (self.rope_parameters or {}).get("rope_type") != "longrope":
            return None
        return self.rope_parameters["original_max_position_embeddings"]


@strict
class TfmDecoderConfig(TfmConfig):
    r"""Decoder-only (GPT-2 / Llama-style) configuration: causal self-attention blocks and an LM head."""

    model_type = "tfm_decoder"
    is_decoder: bool = True


@strict
class TfmEncoderConfig(TfmConfig):
    r"""Encoder-only (BERT-style) configuration: bidirectional self-attention blocks, token types, pooler."""

    model_type = "tfm_encoder"
    type_vocab_size: int = 2


@strict
class TfmEncoderDecoderConfig(TfmConfig):
    r"""
    Encoder-decoder (T5 / BART / original Transformer) configuration. The shared fields describe both stacks;
    `num_hidden_layers` is the encoder's depth and `decoder_layers` the decoder's (transformers' flat encoder-decoder
    convention: `get_text_config(decoder=True)` maps it to `num_hidden_layers`).

    Args:
        decoder_layers (`int`, *optional*): decoder depth; the encoder's by default.
        decoder_start_token_id (`int`, *optional*): first decoder input; labels are shifted right behind it.
        decoder_moe_layers (`list[int]`, *optional*): the decoder's exact MoE layers where they differ from the
            encoder's (Switch Transformer counts each stack's sparse layers apart); None: the encoder's rule.
    """

    model_type = "tfm_encoder_decoder"
    is_encoder_decoder: bool = True
    decoder_layers: int | None = None
    decoder_start_token_id: int | None = None
    decoder_moe_layers: list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.decoder_layers is None:
            self.decoder_layers = self.num_hidden_layers
        super().__post_init__(**kwargs)

    def is_moe_layer(self, layer_idx: int, decoder: bool = False) -> bool:
        if decoder and self.num_experts > 0 and self.decoder_moe_layers is not None:
            return layer_idx in self.decoder_moe_layers
        return super().is_moe_layer(layer_idx)

    def stacks(self) -> list[tuple[str, int, bool]]:
        # `get_text_config(decoder=True)` gives a view whose `num_hidden_layers` is the decoder's
        decoder_layers = self.decoder_layers or self.num_hidden_layers
        return [("encoder.", self.num_hidden_layers, False), ("decoder.", decoder_layers, True)]


# the three paradigms' config classes, by model type
PARADIGM_CONFIGS = {
    config.model_type: config for config in (TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig)
}
