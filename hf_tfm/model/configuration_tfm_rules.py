"""What an hf_tfm config may not hold, as a table: each rule names a field, says when its value is refused and why.

`check_config` runs every rule when a config is made and when it is saved (a class validator), and raises the first
refusal as `ValueError("Invalid `field`: ...")`. The tables at the top say what each plain field may hold (positive,
a probability, one of a few choices); `RULES` holds the combinations. Also here: the warning for keys that are no
field (a misspelling would silently leave the model at the default) and the refusal of a config.json whose
`model_type` names another paradigm.
"""

import dataclasses
import difflib
import functools
from collections.abc import Callable

from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig
from transformers.generation import GenerationConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging

logger = logging.get_logger(__name__)

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rope", "alibi", "relative_bias", "disentangled", "none")
# schemes that add a per-head bias to the attention scores instead of changing the embeddings
ATTENTION_BIAS_POSITIONS = ("alibi", "relative_bias", "disentangled")
DISENTANGLED_TERMS = ("c2p", "p2c")
LAYER_TYPES = ("full_attention", "sliding_attention")
CHOICES = {
    "position_embedding_type": POSITION_EMBEDDING_TYPES,
    "norm_type": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post", "sandwich", "output"),
    "ffn_type": ("mlp", "glu"),
    "qk_norm": ("none", "per_head", "projection"),
    "scoring_func": ("softmax", "sigmoid", "top_k_softmax"),
    "moe_ffn_type": ("mlp", "glu"),
    "router_loss_style": ("mixtral", "switch"),
    "router_aux_loss_scope": ("local", "global"),
    "expert_group_score": ("top2_sum", "max"),
}
# where a converted model rounds as its reference does (`numerics`); each was a boolean field of its own before
NUMERICS = (
    "rope_tables_in_float32",
    "rope_in_float32",
    "rmsnorm_scale_in_float32",
    "round_embedding_scale",
    "router_in_float32",
    "router_weights_in_model_dtype",
    "router_scores_in_model_dtype",
    "scale_queries_as_projected",
    "rope_as_complex",
    "ffn_output_in_float32",
)
POSITIVE = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
    "num_key_value_heads", "head_dim", "intermediate_size", "relative_attention_num_buckets",
    "relative_attention_max_distance", "layer_norm_eps", "decoder_layers",
)  # fmt: skip
POSITIVE_OR_NONE = (
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "sliding_window",
    "attention_multiplier", "capacity_factor", "expert_capacity", "swiglu_limit", "embedding_size",
    "word_embed_proj_dim",
)  # fmt: skip
AT_LEAST_ZERO = (
    "type_vocab_size", "position_offset", "pad_vocab_size_to_multiple_of", "loss_chunk_size", "initializer_range",
    "num_experts", "router_aux_loss_coef", "router_z_loss_coef", "router_bias_update_rate", "router_jitter_noise",
    "shared_expert_intermediate_size",
)  # fmt: skip
PROBABILITIES = (
    "embedding_dropout",
    "hidden_dropout",
    "attention_dropout",
    "activation_dropout",
    "final_norm_dropout",
    "layerdrop",
)
PROBABILITIES_OR_NONE = ("ffn_dropout", "classifier_dropout")
LAYER_LISTS = ("nope_layers", "mlp_only_layers", "moe_layers", "decoder_moe_layers")
# fields an MoE model must hold positive: checked only with experts (a dense model's are inert)
MOE_POSITIVE = ("moe_intermediate_size", "decoder_sparse_step", "swiglu_alpha", "routed_scaling_factor")
LATENT_WIDTHS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim")


@dataclasses.dataclass(frozen=True)
class Rule:
    field: str
    refuses: Callable  # config -> whether the field's value is refused
    why: str | Callable  # formatted with `value` (the field's) and `config`, or config -> the reason


def _value(config, field: str):
    return getattr(config, field, None)


def _depth(config) -> int:
    return max(config.num_hidden_layers, getattr(config, "decoder_layers", None) or 0)


def _rope_dicts(config) -> list[dict]:
    if config.position_embedding_type != "rope" or not config.rope_parameters:
        return []
    return [config.rope_parameters_for(kind) for kind in sorted(set(config.layer_types or ["full_attention"]))]


def _bad_rope_dict(config) -> str | None:
    """What is wrong with a RoPE dict in use, or None."""
    for rope in _rope_dicts(config):
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            return f"unknown rope_type {rope_type!r}; known: {['default', *ROPE_INIT_FUNCTIONS]}"
        factor = rope.get("partial_rotary_factor", 1.0)
        if not (0 < factor <= 1 and int(config.head_dim * factor) % 2 == 0):
            return (
                f"partial_rotary_factor={factor} must be in (0, 1] and rotate an even number of the "
                f"head_dim={config.head_dim} features"
            )
        if rope_type in ("linear", "dynamic", "yarn", "llama3") and not isinstance(rope.get("factor"), (int, float)):
            return f"rope_type={rope_type!r} needs a numeric 'factor'"
    return None


def _unlike_shared_layers(config) -> str | None:
    """What is wrong with `layer_sharing` (ALBERT's cross-layer sharing), or None: one entry per layer, the distinct
    blocks numbered in order of first use, and layers that share a block built alike (a block is built once, for its
    first layer)."""
    order = config.layer_sharing
    if not order:
        return None
    if len(order) != config.num_hidden_layers:
        return f"has {len(order)} entries for num_hidden_layers={config.num_hidden_layers}; set both together"
    if any(not 0 <= block <= max(order[:i], default=-1) + 1 for i, block in enumerate(order)):
        return f"{order} must number the distinct blocks in order of first use: 0, then at most one past the largest"
    nope = set(config.nope_layers or ())
    for layer, block in enumerate(order):
        first = order.index(block)
        unlike = [
            name
            for name, differs in (
                ("layer_types", config.layer_types[layer] != config.layer_types[first]),
                ("MoE layers", config.is_moe_layer(layer) != config.is_moe_layer(first)),
                ("nope_layers", (layer in nope) != (first in nope)),
                ("first_layer_attn_norm", first == 0 and layer > 0 and not config.first_layer_attn_norm),
            )
            if differs
        ]
        if unlike:
            return f"layer {layer} runs block {block}, built for layer {first}, but their {', '.join(unlike)} differ"
    return None


def _each(fields, refuses: Callable, why: str, when: Callable = lambda config: True) -> list[Rule]:
    """A rule for each of `fields`: `refuses(value)`, in configs that `when` holds for."""
    return [Rule(f, lambda c, f=f: when(c) and refuses(_value(c, f)), why) for f in fields]


def _experts(config) -> bool:
    return config.num_experts > 0


def _latent(config) -> bool:
    return config.kv_lora_rank is not None


def _sliding(config) -> bool:
    return "sliding_attention" in (config.layer_types or ())


def _rope_scaling(config) -> str:
    rope = config.rope_parameters or {}
    return rope.get("rope_type", rope.get("type", "default"))


NOT_WITH_LATENT = "{value!r} is not available with latent attention (kv_lora_rank)"
NOT_WITH_TOP_K_SOFTMAX = "{value!r} is not available with top_k_softmax scoring"
# fmt: off
RULES = (
    # what each plain field may hold
    *_each(POSITIVE, lambda v: v is not None and v <= 0, "must be > 0, got {value}"),
    *_each(POSITIVE_OR_NONE, lambda v: v is not None and v <= 0, "must be > 0 or None, got {value}"),
    *_each(AT_LEAST_ZERO, lambda v: v is not None and v < 0, "must be >= 0, got {value}"),
    *_each(PROBABILITIES, lambda v: not 0.0 <= v < 1.0, "a dropout probability is in [0, 1), got {value}"),
    *_each(PROBABILITIES_OR_NONE, lambda v: v is not None and not 0.0 <= v < 1.0,
           "a dropout probability is in [0, 1) or None, got {value}"),
    *_each(MOE_POSITIVE, lambda v: v <= 0, "must be > 0, got {value}", when=_experts),
    *_each(LATENT_WIDTHS, lambda v: v is not None and v <= 0, "must be a positive integer, got {value}", when=_latent),
    *[Rule(f, lambda c, f=f, a=a: _value(c, f) not in a, f"{{value!r}} is not one of {a}")
      for f, a in CHOICES.items()],
    *[Rule(f, lambda c, f=f: any(not 0 <= i < _depth(c) for i in _value(c, f) or ()),
           "layer indices {value} are not all in [0, num_hidden_layers)") for f in LAYER_LISTS],
    Rule("hidden_act", lambda c: c.hidden_act not in ACT2FN, "{value!r} is not a transformers activation"),
    Rule("numerics", lambda c: not set(c.numerics or ()) <= set(NUMERICS), f"{{value}} are not all among {NUMERICS}"),
    # combinations
    Rule("hidden_size", lambda c: c.head_dim is None, "{value} is not divisible by num_attention_heads="
         "{config.num_attention_heads} (set head_dim explicitly to decouple them)"),
    Rule("num_key_value_heads", lambda c: c.num_attention_heads % c.num_key_value_heads != 0,
         "num_attention_heads={config.num_attention_heads} is not divisible by num_key_value_heads={value}"),
    Rule("query_pre_attn_scalar", lambda c: c.query_pre_attn_scalar is not None and c.attention_multiplier is not None,
         "set it or attention_multiplier, not both: both set the attention scale"),
    Rule("parallel_residual", lambda c: c.parallel_residual and c.norm_position != "pre",
         "a parallel residual reads pre-norms, but norm_position={config.norm_position!r}"),
    Rule("parallel_residual", lambda c: c.parallel_residual and c.is_encoder_decoder,
         "an encoder-decoder's decoder has a cross-attention sublayer between the two branches"),
    Rule("first_layer_attn_norm", lambda c: not c.first_layer_attn_norm and c.norm_position not in ("pre", "sandwich"),
         "only a norm before attention can be dropped, but norm_position={config.norm_position!r}"),
    Rule("numerics", lambda c: "scale_queries_as_projected" in c.numerics and (c.fused_qkv_proj or _latent(c)),
         "scale_queries_as_projected is built for separate q, k and v projections (not fused_qkv_proj or "
         "kv_lora_rank)"),
    Rule("numerics", lambda c: "rope_as_complex" in c.numerics and not c.rope_interleave,
         "rope_as_complex rotates interleaved pairs, but rope_interleave=False"),
    Rule("numerics", lambda c: "ffn_output_in_float32" in c.numerics and (
        c.norm_type != "rmsnorm" or c.rmsnorm_unit_offset or "rmsnorm_scale_in_float32" in c.numerics),
         "ffn_output_in_float32 casts T5's RMSNorm to its weight's dtype (norm_type='rmsnorm', no unit offset, not "
         "rmsnorm_scale_in_float32)"),
    Rule("embedding_size", lambda c: c.factorised_embeddings() and (c.is_decoder or c.is_encoder_decoder),
         "{value} is set: factorised embeddings are built for encoders (ALBERT, ELECTRA); a language-model head "
         "would need a projection back to the tied table"),
    Rule("word_embed_proj_dim",
         lambda c: c.word_embed_proj_dim is not None and (not c.is_decoder or c.is_encoder_decoder),
         "{value} is set: a projected token table is built for decoder-only models (OPT); an encoder factorises its "
         "embeddings with embedding_size"),
    Rule("embedding_size",
         lambda c: c.embedding_width() != c.hidden_size and c.position_embedding_type == "sinusoidal",
         "{value} differs from hidden_size={config.hidden_size}, which sinusoidal positions are as wide as"),
    Rule("position_ids_from_attention_mask",
         lambda c: c.position_ids_from_attention_mask and c.position_ids_from_padding,
         "positions are counted over the attention mask or over non-padding ids (position_ids_from_padding), "
         "not both"),
    Rule("pad_token_id", lambda c: c.freeze_pad_embedding and c.pad_token_id is not None
         and not 0 <= c.pad_token_id < c.vocab_size,
         "{value} is not a row of the token table (vocab_size={config.vocab_size}), whose pad row "
         "freeze_pad_embedding freezes"),
    Rule("position_ids_from_padding", lambda c: c.position_ids_from_padding and c.pad_token_id is None,
         "positions counted over non-padding tokens need pad_token_id"),
    # disentangled attention (DeBERTa)
    *[Rule(f, lambda c, r=r: c.position_embedding_type == "disentangled" and r(c), why) for f, r, why in (
        ("position_embedding_type", lambda c: c.is_decoder or c.is_encoder_decoder,
         "{value!r} is built for encoders (DeBERTa): its scores need every query's and key's distance, and it has no "
         "cache"),
        ("pos_att_type",
         lambda c: not c.disentangled_terms() or not set(c.disentangled_terms()) <= set(DISENTANGLED_TERMS),
         f"{{value}} must name one or both of {DISENTANGLED_TERMS}"),
        ("relative_attention_max_distance", lambda c: c.relative_attention_max_distance
         <= c.relative_attention_num_buckets // 2 + 1,
         "{value} must exceed relative_attention_num_buckets // 2 + 1 (relative_attention_num_buckets="
         "{config.relative_attention_num_buckets}): DeBERTa's log buckets span the distances between"),
        *[(f, r, "{value!r} is not available with disentangled attention") for f, r in (
            ("num_key_value_heads", lambda c: c.num_key_value_heads != c.num_attention_heads),
            ("qk_norm", lambda c: c.qk_norm != "none"),
            ("fused_qkv_proj", lambda c: c.fused_qkv_proj),
            ("kv_lora_rank", _latent),
            ("numerics", lambda c: "scale_queries_as_projected" in c.numerics),
        )],
    )],
    # RoPE
    Rule("rope_parameters", lambda c: c.position_embedding_type != "rope" and _rope_scaling(c) != "default",
         "RoPE scaling {value} is set but position_embedding_type={config.position_embedding_type!r}; use "
         "position_embedding_type='rope'"),
    Rule("rope_parameters", lambda c: c.position_embedding_type == "rope" and c.nested_rope()
         and not set(c.layer_types or ["full_attention"]) <= set(c.rope_parameters),
         "nested per layer type, but has no entry for each of {config.layer_types}"),
    Rule("rope_parameters", lambda c: _bad_rope_dict(c) is not None, _bad_rope_dict),
    Rule("nope_layers", lambda c: bool(c.nope_layers) and c.position_embedding_type != "rope",
         "lists layers without RoPE, but position_embedding_type={config.position_embedding_type!r}"),
    # layer types: an encoder-decoder's caches size themselves from them, which would not fit a decoder of other depth
    *[Rule(f, lambda c, f=f: c.is_encoder_decoder and bool(_value(c, f)),
           "per-layer options are for single-stack models only")
      for f in ("layer_types", "sliding_window", "nope_layers")],
    Rule("layer_types", lambda c: not c.is_encoder_decoder and len(c.layer_types) != c.num_hidden_layers,
         lambda c: f"has {len(c.layer_types)} entries for num_hidden_layers={c.num_hidden_layers}; set both together"),
    Rule("layer_types", lambda c: not set(c.layer_types or ()) <= set(LAYER_TYPES),
         f"{{value}} are not all among {LAYER_TYPES}"),
    Rule("layer_sharing", lambda c: bool(c.layer_sharing) and (c.is_decoder or c.is_encoder_decoder),
         "shared blocks are built for encoders (ALBERT): a decoder's shared block would write one cache slot at "
         "every depth it runs"),
    Rule("layer_sharing", lambda c: _unlike_shared_layers(c) is not None, _unlike_shared_layers),
    Rule("sliding_window", lambda c: _sliding(c) and c.sliding_window is None,
         "layer_types has sliding_attention layers, but sliding_window is not set"),
    Rule("layer_types", lambda c: _sliding(c) and c.position_embedding_type in ATTENTION_BIAS_POSITIONS,
         "sliding layers cannot use position_embedding_type={config.position_embedding_type!r} (its bias spans "
         "every key)"),
    # Mixture of Experts
    Rule("num_experts_per_tok", lambda c: _experts(c) and not 1 <= c.num_experts_per_tok <= c.num_experts,
         "top-k must be in [1, num_experts={config.num_experts}], got {value}"),
    *[Rule(f, lambda c, r=r: _experts(c) and c.scoring_func == "top_k_softmax" and r(c), NOT_WITH_TOP_K_SOFTMAX)
      for f, r in (
        ("norm_topk_prob", lambda c: not c.norm_topk_prob),
        ("router_choice_bias", lambda c: c.router_choice_bias),
        ("router_bias_update_rate", lambda c: c.router_bias_update_rate > 0),
        ("num_expert_groups", lambda c: c.num_expert_groups > 1),
    )],
    Rule("expert_capacity", lambda c: c.expert_capacity is not None and c.capacity_factor is not None,
         "set it or capacity_factor, not both: both limit what an expert takes"),
    Rule("router_aux_loss_scope", lambda c: c.router_aux_loss_scope == "global" and c.router_loss_style != "mixtral",
         "router_loss_style={config.router_loss_style!r} averages the losses per sequence; global-batch balancing "
         "sums expert loads over every token (router_loss_style='mixtral')"),
    Rule("swiglu_limit", lambda c: _experts(c) and c.moe_ffn_type == "mlp" and c.swiglu_limit is not None,
         "clamps a gated expert's SwiGLU, but moe_ffn_type='mlp'"),
    Rule("num_expert_groups", lambda c: _experts(c) and (
         c.num_expert_groups < 1 or c.num_experts % c.num_expert_groups
         or (c.num_expert_groups > 1 and c.num_experts // c.num_expert_groups < 2)),
         "{value} must split num_experts={config.num_experts} into equal groups of at least 2 experts"),
    Rule("topk_expert_groups", lambda c: _experts(c) and (not 1 <= c.topk_expert_groups <= c.num_expert_groups
         or c.num_experts_per_tok > c.topk_expert_groups * (c.num_experts // c.num_expert_groups)),
         "{value} must be in [1, num_expert_groups={config.num_expert_groups}] and its groups must hold "
         "num_experts_per_tok={config.num_experts_per_tok} experts"),
    # latent attention
    *[Rule(f, lambda c, r=r: _latent(c) and r(c), NOT_WITH_LATENT) for f, r in (
        ("position_embedding_type", lambda c: c.position_embedding_type != "rope"),
        ("qk_norm", lambda c: c.qk_norm != "none"),
        ("layer_types", _sliding),
        ("attention_sinks", lambda c: c.attention_sinks),
        ("attn_logit_softcapping", lambda c: c.attn_logit_softcapping is not None),
        ("is_encoder_decoder", lambda c: c.is_encoder_decoder),
        ("fused_qkv_proj", lambda c: c.fused_qkv_proj),
    )],
)
# fmt: on


def check_config(config, kwargs: dict | None = None) -> None:
    """Raise `ValueError("Invalid `field`: why")` for the first rule `config` breaks. `kwargs`: the keys a config
    was made with besides its fields (a legacy `rope_scaling` is checked as `rope_parameters`)."""
    legacy_rope = (kwargs or {}).get("rope_scaling")
    if legacy_rope and config.position_embedding_type != "rope":
        kind = legacy_rope.get("rope_type", legacy_rope.get("type", "default"))
        if kind != "default":
            raise ValueError(
                f"Invalid `rope_parameters`: RoPE scaling {legacy_rope} is set but position_embedding_type="
                f"{config.position_embedding_type!r}; use position_embedding_type='rope'"
            )
    for rule in RULES:
        if rule.refuses(config):
            why = (
                rule.why(config)
                if callable(rule.why)
                else rule.why.format(value=_value(config, rule.field), config=config)
            )
            raise ValueError(f"Invalid `{rule.field}`: {why}")


def numerics_from_legacy_fields(kwargs: dict) -> list[str]:
    """The `numerics` entries of a config saved when each was a field of its own, popped from its keys."""
    return [name for name in NUMERICS if kwargs.pop(name, False)]


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


def warn_unknown_keys(config, kwargs: dict) -> None:
    """transformers keeps every unknown key of a config as an attribute that nothing reads: a misspelled field
    (`position_embeding_type`, `num_expert=8`) would silently leave the model at the default."""
    known, public = _known_keys(type(config))
    source = f" (from {kwargs['name_or_path']})" if kwargs.get("name_or_path") else ""
    for key in sorted(set(kwargs) - known):
        close = difflib.get_close_matches(key, public, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "it is kept as an attribute, but no hf_tfm model reads it"
        logger.warning(f"{type(config).__name__}{source}: {key!r} is not a config field; {hint}")


def check_model_type(config_class: type, config_dict: dict, paradigms: dict) -> None:
    """A config.json's model_type names its paradigm: a misspelled one, or another paradigm's, would build this class
    from fields meant for another (transformers only logs a warning). Checked where hf_tfm's config classes load, so
    importing hf_tfm changes nothing of how other models load."""
    model_type = config_dict.get("model_type", config_class.model_type)
    if config_class.model_type not in paradigms or model_type == config_class.model_type:
        return
    reader = paradigms.get(model_type)
    reads = f"{reader.__name__} reads it" if reader is not None else "it is not one of them"
    raise ValueError(
        f"config.json has model_type {model_type!r}: the valid hf_tfm model types are "
        f"{', '.join(map(repr, paradigms))}; {config_class.__name__} reads {config_class.model_type!r} ({reads})"
    )
