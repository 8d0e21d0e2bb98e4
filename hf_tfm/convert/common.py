"""What the conversion engine (`hf_tfm.convert`) and the family records share: field tables, the round-trip config
check that refuses what a conversion would change, and strict loading."""

import copy
import dataclasses

import torch
from torch import nn
from transformers.configuration_utils import PreTrainedConfig

from ..model.configuration_tfm import TfmConfig, TfmEncoderConfig, TfmEncoderDecoderConfig

# what every Llama-family decoder is beyond its blocks (TfmDecoderConfig defaults but the last, stated so that a
# mapping to hf_tfm reads as the whole architecture): a final norm, bare token embeddings, attention dropout only,
# plain head, the pad row of the token table frozen
LLAMA_FAMILY_STACK = {
    "final_norm": True,
    "embedding_norm": False,
    "scale_embeddings": False,
    "type_vocab_size": 0,
    "embedding_dropout": 0.0,
    "hidden_dropout": 0.0,
    "attention_multiplier": None,
    "scale_lm_head_input": False,
    "lm_head_bias": False,
    "freeze_pad_embedding": True,  # nn.Embedding(padding_idx=pad_token_id)
}

# config fields that transformers' model configs and hf_tfm's name alike and mean alike: the core of every
# converter's field table
SHARED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
    "initializer_range", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
)  # fmt: skip


def field_names(*same: str, without: tuple[str, ...] = (), **renamed: str) -> dict[str, str]:
    """A `{source name: target name}` field table: `SHARED_FIELDS` (less `without`, the ones a family's config lacks
    or names otherwise) and `same` under one name on both sides, plus `renamed` (`source_name="target_name"`)."""
    shared = [name for name in SHARED_FIELDS if name not in without]
    return {name: name for name in (*shared, *same)} | renamed


def config_with(config, **values):
    """A copy of `config` with `values` set: a field in the one form a conversion compares, or a run's choice."""
    config = copy.deepcopy(config)
    for name, value in values.items():
        setattr(config, name, value)
    return config


def implicit_head_dim(config) -> int:
    """The head width of a reference config without a `head_dim` field (Qwen2, OLMo2, SmolLM3, Phi-3): its modeling
    code reads `getattr(config, "head_dim", hidden_size // num_attention_heads)`, so an extra `head_dim` key counts."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def head_dim_kwargs(config: TfmConfig) -> dict:
    """`head_dim` for such a reference config: passed only when it is not the one derived from the widths, so a
    config.json written back has no key the original did not have."""
    derived = config.hidden_size // config.num_attention_heads
    return {} if config.head_dim == derived else {"head_dim": config.head_dim}


def require_full_rotary(rope_by_kind: dict, config, family: str) -> None:
    """A family whose default RoPE ignores `partial_rotary_factor` (ModernBERT, Gemma 3: per layer type) rotates
    every feature of a head, where hf_tfm would rotate fewer: refused by name."""
    factors = [kind.get("partial_rotary_factor", 1.0) for kind in rope_by_kind.values()]
    if any(factor != 1.0 for factor in factors):
        raise ValueError(
            f"Cannot convert {type(config).__name__} exactly: rope_parameters has partial_rotary_factor "
            f"{factors}, but {family} rotates every feature of a head"
        )


def require_compatible(config, target: str, expected: dict[str, object], unsupported: dict[str, bool] | None = None):
    """Raise one ValueError naming every field of `config` whose value differs from `expected` or is flagged True in
    `unsupported`: a precondition on an hf_tfm model (upcycling). Converters check with `converted_config`."""
    bad = [field for field, value in expected.items() if getattr(config, field) != value]
    bad += [field for field, flagged in (unsupported or {}).items() if flagged]
    if bad:
        details = ", ".join(f"{field}={getattr(config, field)!r}" for field in bad)
        raise ValueError(f"Cannot convert {type(config).__name__} to {target} exactly: unsupported {details}")


def require_paradigm(config, config_class: type, target: str) -> None:
    """A mapping that reads one paradigm's fields (an encoder-decoder's `decoder_layers`) takes only that paradigm."""
    if not isinstance(config, config_class):
        raise ValueError(
            f"Cannot convert {type(config).__name__} to {target}: model_type={config.model_type!r}, but {target} "
            f"converts {config_class.model_type!r} models"
        )


# an encoder-decoder's fields that only its decoder reads
DECODER_FIELDS = ("decoder_layers", "decoder_start_token_id", "decoder_moe_layers", "is_encoder_decoder")


def shared_fields(config: TfmConfig) -> dict[str, object]:
    """hf_tfm's own fields (TfmConfig's beyond transformers' base config) and the special token ids, as a config of
    another paradigm takes them."""
    base = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    ids = ("pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings")
    names = [field.name for field in dataclasses.fields(TfmConfig)]
    return {name: getattr(config, name) for name in names if name not in base or name in ids}


def encoder_of(config: TfmEncoderDecoderConfig) -> TfmEncoderConfig:
    """The encoder of an encoder-decoder config as an encoder-only one (T5EncoderModel's hf_tfm side): the same
    fields, no pooler, no token types unless the encoder-decoder has them."""
    fields = {name: value for name, value in shared_fields(config).items() if name not in DECODER_FIELDS}
    return TfmEncoderConfig(**fields | {"use_pooler": False})


def encoder_decoder_of(config: TfmEncoderConfig) -> TfmEncoderDecoderConfig:
    """An encoder-only config as the encoder-decoder whose encoder it is, the decoder its mirror: what a family of
    encoder-decoders converts (a field its encoder cannot hold is refused there, by name)."""
    fields = shared_fields(config)
    if all(kind == "full_attention" for kind in config.layer_types or ()):
        fields["layer_types"] = None  # the default of every stack; other kinds are refused by the rules, by name
    return TfmEncoderDecoderConfig(**fields)


def renamed_fields(config, names: dict[str, str]) -> dict[str, object]:
    """Read `config.<source name>` for each entry of a `{source name: target name}` table, keyed by target name."""
    return {target: getattr(config, source) for source, target in names.items()}


def inverted(names: dict[str, str]) -> dict[str, str]:
    """A `{source name: target name}` table read the other way, for the converter back."""
    return {target: source for source, target in names.items()}


def load_exact(
    model: nn.Module,
    state_dict: dict[str, torch.Tensor],
    tie: bool = True,
    generation_config=None,
    may_miss: frozenset[str] = frozenset(),
) -> nn.Module:
    """Load a converted state dict; any missing or unexpected key is a converter bug, never silently ignored.
    With `tie`, a head tied by the config may be absent and is re-tied after loading; without, every tensor
    is loaded as given (for a target whose config claims a tie its weights do not have: T5). `generation_config`
    (the source model's) is copied onto the model; `may_miss` names weights the caller sets itself."""
    result = model.load_state_dict(without_vocab_padding(model, state_dict), strict=False)
    tied = {"lm_head.weight"} if tie and getattr(model.config, "tie_word_embeddings", False) else set()
    # a parameter held under more names than one (an encoder-decoder's stacks hold the body's token table) loads
    # under its first
    every_name = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    aliases = every_name - dict(model.named_parameters()).keys()
    missing = set(result.missing_keys) - tied - may_miss - aliases
    if missing or result.unexpected_keys:
        raise ValueError(
            f"Converted weights do not fit {type(model).__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(result.unexpected_keys)}"
        )
    if tied:
        model.tie_weights()
    if generation_config is not None:
        model.generation_config = copy.deepcopy(generation_config)
    return model.eval()


def without_vocab_padding(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the padding rows of hf_tfm's padded token tables (`pad_vocab_size_to_multiple_of`) cut off where
    `model` holds only the real `vocab_size` rows: the reference classes on the way back. The padding is never read,
    so nothing the model computes is lost; the config conversion has already checked both `vocab_size` agree."""
    vocab, expected = getattr(model.config, "vocab_size", None), model.state_dict()
    fitted = {}
    for key, tensor in state.items():
        target = expected.get(key)
        if target is not None and target.dim() == tensor.dim() and target.shape != tensor.shape:
            if all(want == have or want == vocab < have for want, have in zip(target.shape, tensor.shape)):
                tensor = tensor[tuple(slice(want) for want in target.shape)]  # BART's final_logits_bias is [1, vocab]
        fitted[key] = tensor
    return fitted


# config.json keys that describe a file, a run or a task, not the function the weights compute (`model_type` and
# `is_decoder` are compared: a bidirectional encoder is not a causal decoder, even with equal fields). The second
# line: transformers 4.x configs carried these, and transformers 5 keeps them as attributes that nothing reads.
NOT_ARCHITECTURE = frozenset(
    {
        "_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version", "auto_map", "use_cache",
        "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "id2label", "label2id",
        "problem_type", "tokenizer_class", "task_specific_params", "finetuning_task", "gradient_checkpointing",
        "output_past", "torchscript", "use_bfloat16", "xla_device", "_num_labels", "prefix",
    }
)  # fmt: skip
# Keys every transformers 4.x config carried that transformers 5 declares only on the config classes whose models
# read them (BERT's `is_decoder`, GPT-2's `add_cross_attention`): compared there, a leftover anywhere else.
DECLARED_WHERE_READ = frozenset({"is_decoder", "add_cross_attention", "tie_encoder_decoder", "pruned_heads"})

# Fields only a Mixture-of-Experts layer reads. A field missing here is compared like any other: forgetting one makes
# converters refuse too much, never too little.
MOE_FIELDS = (
    "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "moe_layers",
    "shared_expert_intermediate_size", "shared_expert_gate", "scoring_func", "norm_topk_prob", "router_jitter_noise",
    "router_aux_loss_coef", "router_z_loss_coef", "router_bias_update_rate", "capacity_factor",
    "output_router_logits", "router_bias", "expert_mlp_bias", "swiglu_limit", "swiglu_alpha", "router_choice_bias",
    "num_expert_groups", "topk_expert_groups", "routed_scaling_factor", "moe_ffn_type", "expert_capacity",
    "router_loss_style", "decoder_moe_layers", "router_aux_loss_scope",
)  # fmt: skip
# Fields only latent attention (kv_lora_rank) reads.
LATENT_ATTENTION_FIELDS = ("q_lora_rank", "qk_nope_head_dim", "v_head_dim", "rope_interleave")


# TfmConfig fields that choose how an hf_tfm model computes, not what: no reference class has them, the way there
# leaves them at their defaults, and the way back drops them without changing any output
COMPUTATION_CHOICES = {
    "pad_vocab_size_to_multiple_of": "the token tables' padding rows are never read (and are not converted)",
    "loss_chunk_size": "the same loss, computed a chunk of tokens at a time",
    "check_input_values": "whether bad inputs are named in an error; a valid input's output is the same",
    "fused_qkv_proj": "q, k and v stored as one matrix or as three: the same projections",
    "freeze_pad_embedding": "which embedding rows training updates, not what the model computes",
    "router_aux_loss_scope": "one process's router losses are the same; under data parallelism the reference "
    "counts each rank's tokens",
}


def unread_fields(config: TfmConfig) -> dict[str, str]:
    """The fields an hf_tfm model built from `config` never reads, given its other fields, each with the reason.
    Dropping them changes nothing the model computes, so `converted_config` does not refuse them: a dense model's
    router settings (a dense Llama-shaped model converts whatever its `router_aux_loss_coef`), LayerNorm's bias
    under RMSNorm, the position options of a scheme not in use."""
    unread = {}
    if config.num_experts == 0:
        unread |= dict.fromkeys(MOE_FIELDS, "a dense model (num_experts=0) has no router and no experts")
    elif all(config.is_moe_layer(i, decoder) for _, depth, decoder in config.stacks() for i in range(depth)):
        unread["intermediate_size"] = "every layer is a Mixture of Experts: no dense feed-forward reads it"
    if config.swiglu_limit is None:
        unread["swiglu_alpha"] = "read by the clamped SwiGLU (swiglu_limit) only"
    if config.num_expert_groups == 1:
        unread["topk_expert_groups"] = "read by group-limited routing (num_expert_groups > 1) only"
    if config.kv_lora_rank is None:
        unread |= dict.fromkeys(LATENT_ATTENTION_FIELDS, "read by latent attention (kv_lora_rank) only")
    if config.norm_type == "rmsnorm":
        unread["norm_bias"] = "RMSNorm has no bias"
    else:
        unread["rmsnorm_unit_offset"] = "read by RMSNorm only"
    position = config.position_embedding_type
    if position not in ("relative_bias", "disentangled"):
        for field in ("relative_attention_num_buckets", "relative_attention_max_distance"):
            unread[field] = f"read by relative_bias and disentangled positions only, not {position}"
    if position != "disentangled":
        for field in ("pos_att_type", "share_att_key", "relative_embeddings_norm"):
            unread[field] = f"read by disentangled attention only, not {position}"
    if position not in ("learned", "sinusoidal"):
        unread["position_offset"] = f"read by position tables only, not {position}"
    if position not in ("learned", "sinusoidal", "rope"):
        unread["max_position_embeddings"] = f"{position} positions have no table and no RoPE scaling"
    if not isinstance(config, TfmEncoderConfig):
        unread["use_pooler"] = "only an encoder has a pooler"
    if "sliding_attention" not in (config.layer_types or ()):  # an encoder-decoder has none
        unread["sliding_window"] = "no layer is a sliding_attention layer"
    return unread


# the `numerics` entries a model reads, given its other fields: an entry it does not read changes nothing it computes
NUMERICS_READ = {
    "rope_tables_in_float32": lambda fields: fields["position_embedding_type"] == "rope",
    "rope_in_float32": lambda fields: fields["position_embedding_type"] == "rope",
    "rmsnorm_scale_in_float32": lambda fields: fields["norm_type"] == "rmsnorm" and not fields["rmsnorm_unit_offset"],
    "round_embedding_scale": lambda fields: fields["scale_embeddings"],
    "router_in_float32": lambda fields: fields["num_experts"] > 0,
    "router_weights_in_model_dtype": lambda fields: fields["num_experts"] > 0,
    "router_scores_in_model_dtype": lambda fields: fields["num_experts"] > 0,
    "scale_queries_as_projected": lambda fields: True,
    "rope_as_complex": lambda fields: fields["position_embedding_type"] == "rope",
    # what a float16 load keeps in float32: an hf_tfm model saved without it converts to T5, which keeps it
    "ffn_output_in_float32": lambda fields: False,
}


def _normal_form(fields: dict) -> dict:
    """An hf_tfm config's fields with the default attention scale written one way (None), however it was given, and
    only the `numerics` entries the model reads."""
    fields = dict(fields)
    fields["numerics"] = [entry for entry in fields.get("numerics") or [] if NUMERICS_READ[entry](fields)]
    if fields.get("attention_multiplier") == fields["head_dim"] ** -0.5:
        fields["attention_multiplier"] = None
    if fields.get("query_pre_attn_scalar") == fields["head_dim"]:
        fields["query_pre_attn_scalar"] = None
    return fields


def converted_config(config, to_other, back, irrelevant: dict[str, str] | None = None):
    """`to_other(config)`, refused when it cannot express `config` exactly. Every key of both configs' `to_dict()`
    is checked, not a hand-kept list: `config -> to_other -> back` must give `config` again, so a field the mapping
    drops or cannot represent comes back changed and is named in the error, a field added to either config class
    included. Not compared: `NOT_ARCHITECTURE`, the `DECLARED_WHERE_READ` keys `config`'s class does not declare,
    and `irrelevant`: the fields (with the reason) that may change because the architecture never reads them
    (Qwen2's `max_window_layers` without a sliding window). From an hf_tfm config, `unread_fields` and
    `COMPUTATION_CHOICES` are not compared either, and the default attention scale may be given either way. A key
    absent on one side equals None."""
    other = to_other(config)
    before, after = config.to_dict(), back(other).to_dict()
    declared = {field.name for field in dataclasses.fields(config)}
    skip = NOT_ARCHITECTURE | (DECLARED_WHERE_READ - declared) | set(irrelevant or {})
    if isinstance(config, TfmConfig):
        before, after = _normal_form(before), _normal_form(after)
        skip |= set(unread_fields(config)) | set(COMPUTATION_CHOICES)
    lost = sorted(key for key in before.keys() | after.keys() if key not in skip and before.get(key) != after.get(key))
    if lost:
        details = ", ".join(f"{key}={_shown(before, key)} (comes back as {_shown(after, key)})" for key in lost)
        raise ValueError(f"Cannot convert {type(config).__name__} to {type(other).__name__} exactly: {details}")
    return other


def _shown(fields: dict, key: str) -> str:
    return repr(fields[key]) if key in fields else "<unset>"
