"""The decoder families' records: GPT-2, GPT-NeoX and the Llama-shaped ones (Llama, Mistral, Mixtral, Qwen2,
Qwen3, Qwen3-MoE, OLMo2, Phi-3, Gemma 2, SmolLM3). What each one is beyond Llama is said in its record's comment;
`hf_tfm.convert` runs them.
"""

import copy

from ..compat import GPT_OSS_FIXED_SWIGLU, gpt_oss_declares_swiglu
from .common import (
    LLAMA_FAMILY_STACK,
    config_with,
    field_names,
    head_dim_kwargs,
    implicit_head_dim,
    require_full_rotary,
)
from .record import (
    PRESET_DECODER,
    PRESET_SIZE,
    PRESET_UNSET_TOKENS,
    TINY_DECODER,
    TINY_VOCAB,
    TINY_WINDOW,
    Family,
    Weights,
)


def classifier_dropout_written_out(config):
    """An hf_tfm config whose classifier dropout is written out (None means `hidden_dropout`), the form the way back
    gives."""
    return config_with(config, classifier_dropout=config.classifier_dropout_probability())


# ------------------------------------------------------------------------------------------------------------ GPT-2
# Conv1D weights stored [in, out] and q, k, v fused in c_attn: transposed and split on the way in, back on the way out.
GPT2 = Family(
    name="gpt2",
    tiny=dict(n_embd=32, n_layer=2, n_head=4, vocab_size=TINY_VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2),
    paradigm="tfm_decoder",
    classes={
        "GPT2LMHeadModel": "TfmDecoderForCausalLM",
        "GPT2ForSequenceClassification": "TfmDecoderForSequenceClassification",
    },
    config_class="GPT2Config",
    fields={
        "vocab_size": "vocab_size",
        "n_embd": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_positions": "max_position_embeddings",
        "activation_function": "hidden_act",
        "layer_norm_epsilon": "layer_norm_eps",
        "embd_pdrop": "embedding_dropout",
        "resid_pdrop": "hidden_dropout",
        "attn_pdrop": "attention_dropout",
        "tie_word_embeddings": "tie_word_embeddings",
        "initializer_range": "initializer_range",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "pad_token_id": "pad_token_id",
    },
    fixed=dict(
        position_embedding_type="learned",
        norm_type="layernorm",
        norm_position="pre",
        ffn_type="mlp",
        attention_bias=True,
        mlp_bias=True,
    ),
    unread={
        **dict.fromkeys(
            (
                "summary_type",
                "summary_use_proj",
                "summary_activation",
                "summary_proj_to_labels",
                "summary_first_dropout",
            ),
            "read only by GPT2DoubleHeadsModel's multiple-choice head",
        ),
        "reorder_and_upcast_attn": "the same attention, computed in float32 (a half-precision eager training option)",
        "n_ctx": "an old GPT2Config key transformers 5 keeps but never reads; n_positions sizes the position table",
    },
    weights=Weights(
        renames=(
            (r"^transformer\.wte\.", "model.embed_tokens."),
            (r"^transformer\.wpe\.", "model.embed_positions."),
            (r"^transformer\.ln_f\.", "model.norm."),
            (r"^transformer\.h\.", "model.layers."),
            (r"\.ln_1\.", ".attn_norm."),
            (r"\.ln_2\.", ".ffn_norm."),
            (r"\.attn\.c_attn\.", ".self_attn.qkv."),
            (r"\.attn\.c_proj\.", ".self_attn.o_proj."),
            (r"\.mlp\.c_fc\.", ".mlp.up_proj."),
            (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
        ),
        transposed=r"\.(c_attn|c_proj|c_fc)\.weight$",
        fused={"self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")},
    ),
    pair={},
    # n_inner=None is GPT-2's way of writing the default width 4 * n_embd; q, k and v stay one matrix, as c_attn
    # (one matmul a layer where three would run at every decode step: the H200 measured GPT-2 generating at 1.03-1.08x
    # the reference's time with three, benchmarks/results/gpu-2026-11-27-2.json)
    to_tfm=lambda config: {"intermediate_size": config.n_inner or 4 * config.n_embd, "fused_qkv_proj": True},
    from_tfm=lambda config: {
        "n_inner": None if config.intermediate_size == 4 * config.hidden_size else config.intermediate_size
    },
    their_form=lambda config: config_with(config, n_inner=None) if config.n_inner == 4 * config.n_embd else config,
)


# --------------------------------------------------------------------------------------------------------- GPT-NeoX
# q, k, v fused in query_key_value with rows interleaved per head; rotary_pct is RoPE's partial_rotary_factor,
# use_parallel_residual is parallel_residual.
def _neox_rope_to_tfm(rope: dict) -> dict:
    # GPTNeoXConfig fills in partial_rotary_factor=0.25 when it is absent; hf_tfm's absent means 1.0 (all rotated)
    return {key: value for key, value in rope.items() if (key, value) != ("partial_rotary_factor", 1.0)}


GPT_NEOX = Family(
    name="gpt_neox",
    tiny=dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 16: rotary_pct 0.25 rotates 4 of its 16 features
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    summary="parallel residual",
    paradigm="tfm_decoder",
    classes={
        "GPTNeoXForCausalLM": "TfmDecoderForCausalLM",
        "GPTNeoXForSequenceClassification": "TfmDecoderForSequenceClassification",
    },
    config_class="GPTNeoXConfig",
    fields=field_names(
        "intermediate_size",
        "hidden_act",
        "layer_norm_eps",
        "attention_bias",
        use_parallel_residual="parallel_residual",
    ),
    fixed=dict(
        position_embedding_type="rope", norm_type="layernorm", norm_position="pre", ffn_type="mlp", mlp_bias=True
    ),
    weights=Weights(
        renames=(
            (r"^gpt_neox\.embed_in\.", "model.embed_tokens."),
            (r"^gpt_neox\.final_layer_norm\.", "model.norm."),
            (r"^gpt_neox\.layers\.", "model.layers."),
            (r"\.input_layernorm\.", ".attn_norm."),
            (r"\.post_attention_layernorm\.", ".ffn_norm."),
            (r"\.attention\.dense\.", ".self_attn.o_proj."),
            (r"\.attention\.query_key_value\.", ".self_attn.qkv."),
            (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
            (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
        ),
        fused={"self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")},
        interleaved=True,
    ),
    # Pythia's recipe: a quarter of each head rotated, parallel residual, untied head
    preset=dict(PRESET_SIZE, **PRESET_UNSET_TOKENS, intermediate_size=512, rotary_pct=0.25, tie_word_embeddings=False),
    to_tfm=lambda config: dict(
        attention_out_bias=config.attention_bias,  # one flag for query_key_value and dense
        fused_qkv_proj=True,  # q, k and v stay one matrix, as query_key_value (rows stacked, not interleaved)
        attention_dropout=float(config.attention_dropout),
        hidden_dropout=float(config.hidden_dropout),  # after each sublayer and on the embeddings
        embedding_dropout=float(config.hidden_dropout),
        classifier_dropout=float(config.classifier_dropout),  # its token classifier's
        rope_parameters=_neox_rope_to_tfm(config.rope_parameters),
    ),
    from_tfm=lambda config: dict(
        attention_dropout=config.attention_dropout,
        hidden_dropout=config.hidden_dropout,
        classifier_dropout=config.classifier_dropout_probability(),
        rope_parameters={"partial_rotary_factor": 1.0, **(config.rope_parameters or {})},
    ),
    our_form=classifier_dropout_written_out,
)

# ------------------------------------------------------------------------------------------------------------ BLOOM
# ALiBi (BLOOM's slopes; positions counted over real tokens, which shifts every score of a row alike), a LayerNorm on
# the embeddings, pre-LayerNorm blocks with biases everywhere, q, k and v fused per head (GPT-NeoX's interleaving), a
# tanh-GELU MLP of 4x the width, the head tied to the token table. BLOOM's GELU writes sqrt(2/pi) as 0.79788456 and
# its scores add the ALiBi bias inside one baddbmm: the same values to float32 rounding.
BLOOM = Family(
    name="bloom",
    tiny=dict(
        vocab_size=TINY_VOCAB, hidden_size=32, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=1, eos_token_id=2
    ),
    summary="ALiBi, embedding LayerNorm",
    paradigm="tfm_decoder",
    classes={
        "BloomForCausalLM": "TfmDecoderForCausalLM",
        "BloomForSequenceClassification": "TfmDecoderForSequenceClassification",
    },
    config_class="BloomConfig",
    # BloomConfig reads num_hidden_layers and num_attention_heads as n_layer and n_head; it has no position table
    fields=field_names(without=("max_position_embeddings",), layer_norm_epsilon="layer_norm_eps"),
    fixed=dict(
        position_embedding_type="alibi",
        norm_type="layernorm",
        norm_position="pre",
        embedding_norm=True,
        final_norm=True,
        ffn_type="mlp",
        hidden_act="gelu_pytorch_tanh",
        attention_bias=True,
        attention_out_bias=True,
        mlp_bias=True,
        fused_qkv_proj=True,
        scale_embeddings=False,
        embedding_dropout=0.0,
        lm_head_bias=False,
    ),
    # with slow_but_exact and pretraining_tp > 1 BLOOM sums its output projections in slices and drops their biases:
    # another function, compared (and refused) then
    unread_of=lambda config: (
        {}
        if config.slow_but_exact and config.pretraining_tp > 1
        else dict.fromkeys(
            ("pretraining_tp", "slow_but_exact"), "read only together, by slow_but_exact with pretraining_tp > 1"
        )
    ),
    weights=Weights(
        renames=(
            (r"^transformer\.word_embeddings\.", "model.embed_tokens."),
            (r"^transformer\.word_embeddings_layernorm\.", "model.embed_norm."),
            (r"^transformer\.ln_f\.", "model.norm."),
            (r"^transformer\.h\.", "model.layers."),
            (r"\.input_layernorm\.", ".attn_norm."),
            (r"\.post_attention_layernorm\.", ".ffn_norm."),
            (r"\.self_attention\.dense\.", ".self_attn.o_proj."),
            (r"\.self_attention\.query_key_value\.", ".self_attn.qkv."),
            (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
            (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
        ),
        fused={"self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")},
        interleaved=True,
    ),
    preset=dict(
        vocab_size=PRESET_SIZE["vocab_size"],
        hidden_size=PRESET_SIZE["hidden_size"],
        n_layer=PRESET_SIZE["num_hidden_layers"],
        n_head=PRESET_SIZE["num_attention_heads"],
        **PRESET_UNSET_TOKENS,
    ),
    to_tfm=lambda config: dict(
        intermediate_size=4 * config.hidden_size,
        hidden_dropout=float(config.hidden_dropout),  # after each sublayer; none on the embeddings
        attention_dropout=float(config.attention_dropout),
    ),
    from_tfm=lambda config: dict(
        hidden_dropout=config.hidden_dropout,
        attention_dropout=config.attention_dropout,
        apply_residual_connection_post_layernorm=False,  # the residual is the block's input, not the normed input
    ),
)

# -------------------------------------------------------------------------------------------------------------- OPT
# Learned positions looked up at position + 2 and counted over the attention mask's real tokens, LayerNorm before each
# sublayer with a final norm (or after each, without one: OPT-350m), biases everywhere, a ReLU MLP, the head tied to
# the token table, no dropout on the embeddings. The projected-embedding variant (OPT-350m: a token table of
# word_embed_proj_dim, project_in before the positions, project_out after the last block) is hf_tfm's
# word_embed_proj_dim; OPT projects only when it differs from hidden_size.
OPT = Family(
    name="opt",
    tiny=dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    summary="learned positions counted over the attention mask; OPT-350m's projected token table",
    paradigm="tfm_decoder",
    classes={
        "OPTForCausalLM": "TfmDecoderForCausalLM",
        "OPTForSequenceClassification": "TfmDecoderForSequenceClassification",
    },
    config_class="OPTConfig",
    fields=field_names(
        "layerdrop",
        without=("initializer_range",),
        ffn_dim="intermediate_size",
        activation_function="hidden_act",
        init_std="initializer_range",
    ),
    fixed=dict(
        position_embedding_type="learned",
        position_offset=2,
        position_ids_from_attention_mask=True,
        norm_type="layernorm",
        layer_norm_eps=1e-5,
        embedding_norm=False,
        embedding_dropout=0.0,
        scale_embeddings=False,
        ffn_type="mlp",
        lm_head_bias=False,
        numerics=["scale_queries_as_projected"],
        freeze_pad_embedding=True,
    ),
    unread={
        # published OPT configs (fairseq's) carry it; OPTConfig does not declare it and OPT's layers never read it
        "activation_dropout": "never applied by transformers' OPT",
    },
    weights=Weights(
        renames=(
            (r"^model\.decoder\.embed_tokens\.", "model.embed_tokens."),
            (r"^model\.decoder\.embed_positions\.", "model.embed_positions."),
            (r"^model\.decoder\.final_layer_norm\.", "model.norm."),
            (r"^model\.decoder\.project_(in|out)\.", r"model.project_\1."),
            (r"^model\.decoder\.layers\.", "model.layers."),
            (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
            (r"\.self_attn_layer_norm\.", ".attn_norm."),
            (r"\.fc1\.", ".mlp.up_proj."),
            (r"\.fc2\.", ".mlp.down_proj."),
            (r"\.final_layer_norm\.", ".ffn_norm."),
        ),
    ),
    preset=dict(PRESET_SIZE, **PRESET_UNSET_TOKENS, ffn_dim=512, word_embed_proj_dim=PRESET_SIZE["hidden_size"]),
    to_tfm=lambda config: dict(
        norm_position="pre" if config.do_layer_norm_before else "post",
        final_norm=config.do_layer_norm_before and not config._remove_final_layer_norm,  # none after post-norms
        **dict.fromkeys(("attention_bias", "attention_out_bias", "mlp_bias"), config.enable_bias),
        hidden_dropout=float(config.dropout),  # after each sublayer
        attention_dropout=float(config.attention_dropout),
        word_embed_proj_dim=config.word_embed_proj_dim if config.word_embed_proj_dim != config.hidden_size else None,
    ),
    from_tfm=lambda config: dict(
        do_layer_norm_before=config.norm_position == "pre",
        _remove_final_layer_norm=config.norm_position == "pre" and not config.final_norm,
        enable_bias=config.attention_bias,
        word_embed_proj_dim=config.token_width(),  # as wide as the blocks: no projection in or out
        layer_norm_elementwise_affine=True,
        dropout=config.hidden_dropout,
        attention_dropout=config.attention_dropout,
    ),
)

# ------------------------------------------------------------------------------------------------ the Llama family
# what every Llama-shaped family's layers are named beyond Llama's own: the two per-layer norms
LLAMA_RENAMES = ((r"\.input_layernorm\.", ".attn_norm."), (r"\.post_attention_layernorm\.", ".ffn_norm."))
# the router: the same [experts, hidden] weight under another name (Mixtral, Qwen3-MoE)
ROUTER_RENAMES = (*LLAMA_RENAMES, (r"\.mlp\.gate\.weight$", ".mlp.router.weight"))
# Llama-family config field -> TfmDecoderConfig field, for the fields every Llama-shaped decoder has
LLAMA_FAMILY_NAMES = field_names("num_key_value_heads", "head_dim", "hidden_act", rms_norm_eps="layer_norm_eps")
# what Llama always is, in TfmConfig terms
LLAMA_ARCHITECTURE = dict(
    position_embedding_type="rope", norm_type="rmsnorm", norm_position="pre", ffn_type="glu", **LLAMA_FAMILY_STACK
)
# what the MoE families' router is beyond their own fields: no jitter-free options hf_tfm adds
ROUTER_DEFAULTS = dict(
    scoring_func="softmax",
    moe_layers=None,
    shared_expert_intermediate_size=0,
    router_z_loss_coef=0.0,
    router_bias_update_rate=0.0,
    capacity_factor=None,
)
# the Qwen MoE routers cast their top-k weights to the router logits' dtype
ROUTER_WEIGHTS_IN_MODEL_DTYPE = {**ROUTER_DEFAULTS, "numerics": ["router_weights_in_model_dtype"]}
# GPT-OSS's router picks the top-k logits and weights them by their own softmax, in the logits' dtype
GPT_OSS_ROUTER = {**ROUTER_DEFAULTS, "scoring_func": "top_k_softmax"}
# keys of released Qwen config.json files that no Qwen text model reads once its config exists
QWEN_UNREAD = {
    "max_window_layers": "Qwen2 and Qwen3 read it only to fill layer_types when a config has none (the converted "
    "layer_types carry it); Qwen3-MoE never reads it, though its released configs carry it",
    "use_mrope": "Qwen2-VL's multimodal RoPE switch, which released Qwen2.5 configs carry as false",
}


def llama_family_names(*same: str, without: tuple[str, ...] = (), **renamed: str) -> dict[str, str]:
    """A Llama-family field table: `LLAMA_FAMILY_NAMES` less `without`, plus `same` (one name on both sides) and
    `renamed` (`source_name="target_name"`)."""
    kept = {theirs: ours for theirs, ours in LLAMA_FAMILY_NAMES.items() if theirs not in without}
    return kept | {name: name for name in same} | renamed


def llama_family_rope(config) -> dict:
    """The RoPE dict of either side as a Llama-family model reads it: every feature of a head is rotated, so a
    `partial_rotary_factor` is left behind (and the round trip names `rope_parameters`)."""
    return {key: value for key, value in (config.rope_parameters or {}).items() if key != "partial_rotary_factor"}


def _derived_head_dim(config) -> bool:
    """Whether `config.head_dim` is the width the modeling code derives anyway, `hidden_size // heads`."""
    return getattr(config, "head_dim", None) == config.hidden_size // config.num_attention_heads


def without_derived_head_dim(config):
    """A config without a `head_dim` key that equals the width the modeling code derives anyway (the way back
    writes the key only when it differs)."""
    if _derived_head_dim(config):
        config = copy.deepcopy(config)
        del config.head_dim
    return config


def one_attention_bias(config) -> dict:
    """hf_tfm's output-projection bias from a family with one `attention_bias` flag for q, k, v and o."""
    return {"attention_out_bias": config.attention_bias}


def qwen_window_to_tfm(config) -> dict:
    """hf_tfm's window fields from a Qwen2-style config (`sliding_window` is None unless `use_sliding_window`)."""
    return dict(sliding_window=config.sliding_window, layer_types=list(config.layer_types))


def qwen_window_from_tfm(config) -> dict:
    """Qwen2's window fields from hf_tfm's. `max_window_layers` is written as the first sliding layer (Qwen2's
    pattern: full layers, then sliding ones) for readers of config.json; `layer_types` decides."""
    types = config.layer_types
    return dict(
        use_sliding_window=config.sliding_window is not None,
        sliding_window=config.sliding_window,
        max_window_layers=types.index("sliding_attention") if "sliding_attention" in types else len(types),
        layer_types=list(types),
    )


LLAMA_WEIGHTS = Weights(renames=LLAMA_RENAMES)
# transformers' generic token classifier drops out with `classifier_dropout`, else `hidden_dropout`, else this
GENERIC_CLASSIFIER_DROPOUT = 0.1


def generic_classifier_dropout_to_tfm(config) -> dict:
    """The dropout transformers' generic token classifier applies, as hf_tfm's `classifier_dropout` (a Llama-shaped
    config declares neither field it reads, so its token classifier drops out with 0.1)."""
    for name in ("classifier_dropout", "hidden_dropout"):
        if getattr(config, name, None) is not None:
            return {"classifier_dropout": float(getattr(config, name))}
    return {"classifier_dropout": GENERIC_CLASSIFIER_DROPOUT}


def generic_classifier_dropout_from_tfm(config) -> dict:
    """hf_tfm's classifier dropout for transformers' generic token classifier: written only where it is not the
    value that classifier takes without it."""
    probability = config.classifier_dropout_probability()
    return {} if probability == GENERIC_CLASSIFIER_DROPOUT else {"classifier_dropout": probability}


# the task heads of a Llama-shaped family: transformers' generic ones (the body under `model`, a `score` layer), each
# hf_tfm's head of the same name (suffix of the reference's class name -> hf_tfm's class)
LLAMA_FAMILY_HEADS = {
    "ForSequenceClassification": "TfmDecoderForSequenceClassification",
    "ForTokenClassification": "TfmDecoderForTokenClassification",
}


def llama_family(name: str, reference: str, fields: dict, fixed: dict, *, implicit_head_dim_field=False, to_tfm=None,
                 from_tfm=None, weights=LLAMA_WEIGHTS, heads=tuple(LLAMA_FAMILY_HEADS), head_prefix=None,
                 **record) -> Family:  # fmt: skip
    """A Llama-shaped family: Llama's weight names unless `weights` says otherwise, the config pieces every member
    computes (RoPE without a partial factor, attention dropout as a float) and the family's own (`to_tfm`,
    `from_tfm`).
    `implicit_head_dim_field`: the reference config has no `head_dim` field (its attention reads `head_dim` if a
    config carries one, else `hidden_size // heads`).
    `heads`: which of LLAMA_FAMILY_HEADS the family's transformers release has, named `head_prefix` (the reference's
    name without "ForCausalLM" unless given) plus the suffix."""
    head_prefix = head_prefix or reference.removesuffix("ForCausalLM")
    our_form = record.pop("our_form", None)
    classes = {reference: "TfmDecoderForCausalLM"} | {head_prefix + head: LLAMA_FAMILY_HEADS[head] for head in heads}

    def computed_to_tfm(config) -> dict:
        own = dict(rope_parameters=llama_family_rope(config), attention_dropout=float(config.attention_dropout))
        own |= generic_classifier_dropout_to_tfm(config)
        if implicit_head_dim_field:
            own["head_dim"] = implicit_head_dim(config)
        return own | (to_tfm(config) if to_tfm else {})

    def computed_from_tfm(config) -> dict:
        own = dict(rope_parameters=llama_family_rope(config), attention_dropout=config.attention_dropout)
        own |= generic_classifier_dropout_from_tfm(config)
        if implicit_head_dim_field:
            own |= head_dim_kwargs(config)
        return own | (from_tfm(config) if from_tfm else {})

    return Family(
        name=name,
        paradigm="tfm_decoder",
        classes=classes,
        config_class=record.pop("config_class", reference.replace("ForCausalLM", "Config")),
        fields=fields,
        fixed=fixed,
        weights=weights,
        to_tfm=computed_to_tfm,
        from_tfm=computed_from_tfm,
        our_form=lambda config: classifier_dropout_written_out(our_form(config) if our_form else config),
        **record,
    )


# Llama's attention_bias covers q, k, v and o: hf_tfm's attention_out_bias defaults to it
LLAMA = llama_family(
    "llama",
    "LlamaForCausalLM",
    llama_family_names("intermediate_size", "mlp_bias", "attention_bias"),
    LLAMA_ARCHITECTURE,
    unread={"pretraining_tp": "transformers 5's Llama never reads it (a 4.x way of computing the same layers)"},
    pair={},
    tiny=TINY_DECODER,
)

# Llama without biases, plus a sliding window on every layer when sliding_window is set (hf_tfm's default
# layer_types for a config with a window)
MISTRAL = llama_family(
    "mistral",
    "MistralForCausalLM",
    llama_family_names("intermediate_size", "sliding_window"),
    {**LLAMA_ARCHITECTURE, "attention_bias": False, "mlp_bias": False},
    preset=dict(PRESET_DECODER, sliding_window=128),
    summary="sliding window",
    tiny=dict(TINY_DECODER, sliding_window=TINY_WINDOW),
)


def _mixtral_from_tfm(config) -> dict:
    if config.num_experts == 0:  # MixtralConfig takes num_local_experts=0, but builds no working model from it
        raise ValueError(
            f"Cannot convert {type(config).__name__} to MixtralConfig exactly: num_experts=0 is a dense model, and "
            "every Mixtral layer routes over experts"
        )
    return {}


# Llama with every feed-forward a softmax top-k router over fused GLU experts, in hf_tfm's layout
MIXTRAL = llama_family(
    "mixtral",
    "MixtralForCausalLM",
    llama_family_names(
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "router_jitter_noise",
        "output_router_logits",
        without=("head_dim",),
        num_local_experts="num_experts",
        intermediate_size="moe_intermediate_size",
    ),
    dict(
        **LLAMA_ARCHITECTURE,
        **ROUTER_DEFAULTS,
        attention_bias=False,
        mlp_bias=False,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
    implicit_head_dim_field=True,  # MixtralConfig keeps head_dim=None (its default) for the derived width
    # no dense layer reads intermediate_size; giving it the expert width keeps a fresh config's defaults sensible
    to_tfm=lambda config: {"intermediate_size": config.intermediate_size},
    from_tfm=_mixtral_from_tfm,
    weights=Weights(renames=ROUTER_RENAMES),
    # MixtralConfig writes the derived head width as None: compared in that form
    their_form=lambda config: config_with(config, head_dim=None) if _derived_head_dim(config) else config,
    pair={"experts_implementation": "grouped_mm"},
    summary="MoE",
    tiny=dict(TINY_DECODER, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02),
)

# Mistral with biases on q, k and v but none on o, its window on the layers layer_types marks sliding; no head_dim
QWEN2 = llama_family(
    "qwen2",
    "Qwen2ForCausalLM",
    llama_family_names("intermediate_size", without=("head_dim",)),
    dict(**LLAMA_ARCHITECTURE, attention_bias=True, attention_out_bias=False, mlp_bias=False),
    implicit_head_dim_field=True,
    to_tfm=qwen_window_to_tfm,
    from_tfm=qwen_window_from_tfm,
    unread=QWEN_UNREAD,
    their_form=without_derived_head_dim,
    preset=PRESET_DECODER,
    tiny=TINY_DECODER,
)

# Qwen2 with a per-head RMSNorm on queries and keys, one attention_bias flag, and a head_dim field
QWEN3 = llama_family(
    "qwen3",
    "Qwen3ForCausalLM",
    llama_family_names("intermediate_size", "attention_bias"),
    dict(**LLAMA_ARCHITECTURE, qk_norm="per_head", mlp_bias=False),
    to_tfm=lambda config: one_attention_bias(config) | qwen_window_to_tfm(config),
    from_tfm=qwen_window_from_tfm,
    unread=QWEN_UNREAD,
    preset=dict(PRESET_DECODER, head_dim=32),
    pair={},
    summary="QK-norm",
    tiny=dict(TINY_DECODER, head_dim=16),  # 4 heads of 16 on a width of 32,
)

# Qwen3's attention with Mixtral's router, renormalised only with norm_topk_prob, on the layers decoder_sparse_step
# and mlp_only_layers pick; a window covers every layer (Mistral's way); no head_dim field
QWEN3_MOE = llama_family(
    "qwen3_moe",
    "Qwen3MoeForCausalLM",
    llama_family_names(
        "intermediate_size",
        "attention_bias",
        "sliding_window",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "decoder_sparse_step",
        "norm_topk_prob",
        "router_aux_loss_coef",
        "output_router_logits",
        without=("head_dim",),
    ),
    dict(
        **LLAMA_ARCHITECTURE,
        **ROUTER_WEIGHTS_IN_MODEL_DTYPE,
        qk_norm="per_head",
        mlp_bias=False,
        router_jitter_noise=0.0,
    ),
    implicit_head_dim_field=True,
    to_tfm=lambda config: one_attention_bias(config) | {"mlp_only_layers": list(config.mlp_only_layers)},
    from_tfm=lambda config: dict(
        use_sliding_window=config.sliding_window is not None, mlp_only_layers=list(config.mlp_only_layers)
    ),
    weights=Weights(renames=ROUTER_RENAMES),
    unread=QWEN_UNREAD,
    their_form=without_derived_head_dim,
    preset=dict(PRESET_DECODER, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=176),
    summary="MoE",
    tiny=dict(
        TINY_DECODER,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        router_aux_loss_coef=0.02,
    ),
)


def _qwen2_moe_window_to_tfm(config) -> dict:
    # Qwen2MoeConfig writes sliding_window=0 when use_sliding_window is off; its layers then all attend fully
    sliding = "sliding_attention" in config.layer_types
    return dict(sliding_window=config.sliding_window if sliding else None, layer_types=list(config.layer_types))


def _qwen2_moe_from_tfm(config) -> dict:
    if config.shared_expert_intermediate_size == 0:  # Qwen2MoeSparseMoeBlock always builds one, and its gate
        raise ValueError(
            f"Cannot convert {type(config).__name__} to Qwen2MoeConfig exactly: shared_expert_intermediate_size=0, "
            "and every Qwen2-MoE layer has a gated shared expert"
        )
    return qwen_window_from_tfm(config) | dict(
        qkv_bias=config.attention_bias, mlp_only_layers=list(config.mlp_only_layers)
    )


# Qwen2's attention (biases on q, k, v: qkv_bias) with a softmax top-k router renormalised only with norm_topk_prob,
# plus a shared expert on every MoE layer whose output a sigmoid gate scales; MoE layers picked by
# decoder_sparse_step and mlp_only_layers (a dense GLU of intermediate_size elsewhere); Qwen2's window fields
QWEN2_MOE = llama_family(
    "qwen2_moe",
    "Qwen2MoeForCausalLM",
    llama_family_names(
        "intermediate_size",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "norm_topk_prob",
        "router_aux_loss_coef",
        "output_router_logits",
        without=("head_dim",),
    ),
    dict(
        **LLAMA_ARCHITECTURE,
        **{k: v for k, v in ROUTER_WEIGHTS_IN_MODEL_DTYPE.items() if k != "shared_expert_intermediate_size"},
        shared_expert_gate=True,
        attention_out_bias=False,
        mlp_bias=False,
        router_jitter_noise=0.0,
    ),
    implicit_head_dim_field=True,
    to_tfm=lambda config: (
        _qwen2_moe_window_to_tfm(config)
        | dict(attention_bias=config.qkv_bias, mlp_only_layers=list(config.mlp_only_layers))
    ),
    from_tfm=_qwen2_moe_from_tfm,
    weights=Weights(renames=ROUTER_RENAMES),
    unread=QWEN_UNREAD,
    their_form=without_derived_head_dim,
    pair={"experts_implementation": "grouped_mm"},
    summary="MoE, shared expert",
    preset=dict(
        PRESET_DECODER,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=176,
        shared_expert_intermediate_size=352,
    ),
    tiny=dict(
        TINY_DECODER,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        router_aux_loss_coef=0.02,
        shared_expert_intermediate_size=24,
    ),
)


# norms on the sublayer outputs, x + norm(f(x)) (no input norms), and an RMSNorm over the whole query and key
# projections before the split into heads; its RMSNorm scales in float32, then casts, and its RoPE rotates in float32
# (the same numbers in bfloat16 too).
OLMO2 = llama_family(
    "olmo2",
    "Olmo2ForCausalLM",
    llama_family_names("intermediate_size", "attention_bias", without=("head_dim",)),
    dict(
        position_embedding_type="rope",
        norm_type="rmsnorm",
        norm_position="output",
        qk_norm="projection",
        ffn_type="glu",
        mlp_bias=False,
        numerics=["rmsnorm_scale_in_float32", "rope_tables_in_float32"],
        **LLAMA_FAMILY_STACK,
    ),
    heads=("ForSequenceClassification",),  # Olmo2 has no token-classification head
    implicit_head_dim_field=True,
    to_tfm=one_attention_bias,
    weights=Weights(
        renames=(
            (r"\.post_attention_layernorm\.", ".post_attn_norm."),
            (r"\.post_feedforward_layernorm\.", ".post_ffn_norm."),
        )
    ),
    preset=PRESET_DECODER,
    tiny=dict(TINY_DECODER, pad_token_id=0),
)


GEMMA_FIELDS = llama_family_names(
    "intermediate_size",
    "attention_bias",
    "sliding_window",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    without=("hidden_act",),
    hidden_activation="hidden_act",
)
GEMMA_ARCHITECTURE = dict(
    position_embedding_type="rope",
    norm_type="rmsnorm",
    rmsnorm_unit_offset=True,
    norm_position="sandwich",
    ffn_type="glu",
    mlp_bias=False,
    **{**LLAMA_FAMILY_STACK, "scale_embeddings": True, "numerics": ["round_embedding_scale"]},
)
GEMMA_WEIGHTS = Weights(
    renames=(
        (r"\.input_layernorm\.", ".attn_norm."),
        (r"\.post_attention_layernorm\.", ".post_attn_norm."),
        (r"\.pre_feedforward_layernorm\.", ".ffn_norm."),
        (r"\.post_feedforward_layernorm\.", ".post_ffn_norm."),
    )
)


def gemma_to_tfm(config) -> dict:
    return one_attention_bias(config) | dict(
        query_pre_attn_scalar=float(config.query_pre_attn_scalar), layer_types=list(config.layer_types)
    )


def gemma_from_tfm(config) -> dict:
    # an int in Gemma's configs: a fractional value (or a scale set by attention_multiplier) comes back changed and
    # is refused by name
    scalar = config.query_pre_attn_scalar if config.query_pre_attn_scalar is not None else config.head_dim
    return dict(query_pre_attn_scalar=int(scalar), layer_types=list(config.layer_types))


def gemma_unread(config) -> dict:
    # use_bidirectional_attention None and False both mean causal attention, the only kind hf_tfm's decoder has
    return {} if config.use_bidirectional_attention else {"use_bidirectional_attention": "causal either way"}


def gemma_our_form(config):
    # hf_tfm's default scale head_dim ** -0.5 is Gemma 2's query_pre_attn_scalar = head_dim
    if config.query_pre_attn_scalar is None and config.attention_multiplier is None:
        return config_with(config, query_pre_attn_scalar=float(config.head_dim))
    return config


def gemma_eager(model, target) -> None:
    if target.config.attn_logit_softcapping is not None:
        target.set_attn_implementation("eager")  # transformers 5.17 defaults Gemma 2 to sdpa, which drops the cap


# sandwich norms, RMSNorm scaling by 1 + weight, embeddings scaled by sqrt(hidden_size), the attention scale
# query_pre_attn_scalar ** -0.5, tanh soft-capping of scores and logits, alternating sliding / full layers
GEMMA2 = llama_family(
    "gemma2",
    "Gemma2ForCausalLM",
    GEMMA_FIELDS,
    GEMMA_ARCHITECTURE,
    to_tfm=gemma_to_tfm,
    from_tfm=gemma_from_tfm,
    weights=GEMMA_WEIGHTS,
    unread_of=gemma_unread,
    our_form=gemma_our_form,
    prepare_reference=gemma_eager,
    preset=dict(
        PRESET_DECODER,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=128,
        hidden_activation="gelu_pytorch_tanh",
    ),
    pair={"attention": "eager"},  # eager on both sides: sdpa cannot soft-cap attention scores
    summary="sandwich norms, soft-capping",
    tiny=dict(
        TINY_DECODER,
        num_hidden_layers=3,  # sliding, full, sliding
        head_dim=16,  # not hidden_size / heads = 8
        query_pre_attn_scalar=24,  # not head_dim
        sliding_window=TINY_WINDOW,
        attn_logit_softcapping=1.0,  # small enough that the tiny model's scores are really capped
        final_logit_softcapping=2.0,
        pad_token_id=0,
    ),
)


LAYER_KINDS = ("full_attention", "sliding_attention")


def _gemma3_rope(config) -> dict:
    """Gemma 3's RoPE per layer type (local theta 10k, global 1M in its checkpoints); an hf_tfm config with one dict
    means it for both. Its default RoPE reads only rope_theta: a partial factor is refused."""
    rope = llama_family_rope(config)
    nested = {kind: dict(rope.get(kind, {})) for kind in LAYER_KINDS} if set(rope) & set(LAYER_KINDS) else None
    rope = nested or {kind: dict(rope) for kind in LAYER_KINDS}
    require_full_rotary(rope, config, "Gemma 3")
    return rope


# Gemma 2 plus a per-head RMSNorm (1 + weight) on queries and keys and RoPE with its own theta for local (sliding)
# and global layers (five local layers to one global in its checkpoints). Its config keeps Gemma 2's
# attn_logit_softcapping, but its attention never reads it (transformers 5.x): unread, and None on hf_tfm's side.
GEMMA3 = llama_family(
    "gemma3_text",
    "Gemma3ForCausalLM",
    {theirs: ours for theirs, ours in GEMMA_FIELDS.items() if theirs != "attn_logit_softcapping"},
    dict(GEMMA_ARCHITECTURE, qk_norm="per_head", attn_logit_softcapping=None),
    heads=("ForSequenceClassification",),  # text-only: Gemma3ForSequenceClassification is the multimodal one
    head_prefix="Gemma3Text",
    config_class="Gemma3TextConfig",
    to_tfm=lambda config: gemma_to_tfm(config) | {"rope_parameters": _gemma3_rope(config)},
    from_tfm=lambda config: gemma_from_tfm(config) | {"rope_parameters": _gemma3_rope(config)},
    weights=GEMMA_WEIGHTS,
    unread={
        "attn_logit_softcapping": "Gemma 3's attention never reads it (only Gemma 2's caps scores)",
        "sliding_window_pattern": "only fills layer_types when a config has none (the converted layer_types carry it)",
    },
    unread_of=gemma_unread,
    # one RoPE dict for every layer is the same as one per layer type, the form that comes back
    our_form=lambda config: config_with(gemma_our_form(config), rope_parameters=_gemma3_rope(config)),
    preset=dict(
        PRESET_DECODER,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=128,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    ),
    pair={},
    summary="QK-norm, local/global RoPE",
    tiny=dict(
        TINY_DECODER,
        num_hidden_layers=3,
        head_dim=16,  # not hidden_size / heads = 8
        query_pre_attn_scalar=24,  # not head_dim
        sliding_window=TINY_WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        pad_token_id=0,
    ),
)


def _gpt_oss_swiglu_to_tfm(config) -> dict:
    # where GptOssConfig has no such fields, its experts use the fixed values whatever a config.json key says
    if not gpt_oss_declares_swiglu():
        return dict(GPT_OSS_FIXED_SWIGLU)
    return {name: getattr(config, name) for name in GPT_OSS_FIXED_SWIGLU}


def _gpt_oss_unread(config) -> dict:
    if gpt_oss_declares_swiglu():
        return {}
    return dict.fromkeys(GPT_OSS_FIXED_SWIGLU, "this release's GPT-OSS fixes its SwiGLU and never reads the key")


def _gpt_oss_from_tfm(config) -> dict:
    if config.swiglu_limit is None:
        raise ValueError(
            f"Cannot convert {type(config).__name__} to GptOssConfig exactly: swiglu_limit=None is the plain GLU, "
            "and GPT-OSS's experts clamp their SwiGLU"
        )
    swiglu = {name: getattr(config, name) for name in GPT_OSS_FIXED_SWIGLU}
    if gpt_oss_declares_swiglu():
        return {"layer_types": list(config.layer_types), **swiglu}
    changed = ", ".join(f"{name}={value}" for name, value in swiglu.items() if value != GPT_OSS_FIXED_SWIGLU[name])
    if changed:
        raise ValueError(
            f"Cannot convert {type(config).__name__} to GptOssConfig exactly: {changed}, but this transformers "
            f"release's GPT-OSS fixes its SwiGLU at {GPT_OSS_FIXED_SWIGLU}"
        )
    return {"layer_types": list(config.layer_types)}


# Llama's blocks with a learned sink logit per head in every attention softmax, biases on q, k, v and o, alternating
# sliding and full layers, and every feed-forward a router with a bias (softmax over its top-k logits) over experts
# with biases and the clamped SwiGLU. Its experts store [in, out] with the gate and up columns alternating: transposed
# and regrouped on the way in, back on the way out.
GPT_OSS = llama_family(
    "gpt_oss",
    "GptOssForCausalLM",
    llama_family_names(
        "sliding_window",
        "attention_bias",
        "num_experts_per_tok",
        "router_aux_loss_coef",
        "output_router_logits",
        num_local_experts="num_experts",
        intermediate_size="moe_intermediate_size",
    ),
    dict(
        **LLAMA_ARCHITECTURE,
        **GPT_OSS_ROUTER,
        numerics=["rmsnorm_scale_in_float32"],
        mlp_bias=False,
        norm_topk_prob=True,  # a softmax over the top-k logits sums to 1
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_jitter_noise=0.0,
        attention_sinks=True,
        router_bias=True,
        expert_mlp_bias=True,
    ),
    # no dense layer reads intermediate_size; giving it the expert width keeps a fresh config's defaults sensible
    to_tfm=lambda config: (
        one_attention_bias(config)
        | dict(intermediate_size=config.intermediate_size, layer_types=list(config.layer_types))
        | _gpt_oss_swiglu_to_tfm(config)
    ),
    from_tfm=_gpt_oss_from_tfm,
    unread_of=_gpt_oss_unread,
    # keys of the released config.json files (OpenAI's own names) that no transformers GPT-OSS class reads
    unread={
        "experts_per_token": "OpenAI's name for num_experts_per_tok, which GPT-OSS reads instead",
        "initial_context_length": "the pretraining length, which GPT-OSS reads from rope_parameters instead",
    },
    weights=Weights(
        renames=LLAMA_RENAMES,
        transposed=r"\.experts\.(gate_up_proj|down_proj)$",
        alternating=((r"\.experts\.gate_up_proj$", -2), (r"\.experts\.gate_up_proj_bias$", -1)),
    ),
    preset=dict(
        PRESET_DECODER,
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=176,
        head_dim=32,
        sliding_window=128,
        tie_word_embeddings=False,
        # GPT-OSS's YaRN, its factor the ratio of the preset's 512 positions to the pretraining length
        rope_parameters=dict(
            rope_type="yarn",
            factor=32.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=16,
            rope_theta=150000.0,
        ),
    ),
    # eager on both sides: sdpa cannot add sinks (transformers' GPT-OSS does not offer it)
    pair={"attention": "eager", "experts_implementation": "grouped_mm"},
    summary="attention sinks, MoE with biases and clamped SwiGLU",
    tiny=dict(
        TINY_DECODER,
        num_hidden_layers=3,  # sliding, full, sliding
        head_dim=16,  # not hidden_size / heads = 8
        intermediate_size=16,  # each expert's width
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=TINY_WINDOW,
        router_aux_loss_coef=0.02,
        pad_token_id=0,
        swiglu_limit=0.5,  # really clamps at this scale (7.0 never bites); where the config declares it
    ),
)


def _deepseek_v3_to_tfm(config) -> dict:
    return dict(
        output_router_logits=getattr(config, "output_router_logits", False),
        attention_out_bias=config.attention_bias,  # one flag for q_a, kv_a and o
        shared_expert_intermediate_size=config.n_shared_experts * config.moe_intermediate_size,
        mlp_only_layers=list(range(config.first_k_dense_replace)),
    )


def _deepseek_from_tfm(config, family: str) -> dict:
    """DeepSeek's shared experts (a multiple of the expert width) and its dense layers (the first ones), for `family`
    ("V2" or "V3")."""
    shared, width, dense = config.shared_expert_intermediate_size, config.moe_intermediate_size, config.mlp_only_layers
    refusals = (
        ("shared_expert_intermediate_size", shared == 0 or shared % width, f"a positive multiple of {width}"),
        ("mlp_only_layers", list(dense) != list(range(len(dense))), "the first layers, [0, 1, ...]"),
    )
    for field, refused, expected in refusals:
        if refused:
            raise ValueError(
                f"Cannot convert {type(config).__name__} to Deepseek{family}Config exactly: "
                f"{field}={getattr(config, field)!r}, but DeepSeek-{family}'s is {expected}"
            )
    return dict(
        n_shared_experts=shared // width,
        first_k_dense_replace=len(dense),
        output_router_logits=config.output_router_logits,
    )


# Llama's blocks with multi-head latent attention (a normed query bottleneck, keys and values expanded from a normed
# latent, a rotary key part shared by all heads, interleaved rotary pairs, YaRN's mscale in the score scale) and,
# after the first dense layers, MoE layers: sigmoid scores, a choice-only per-expert bias (e_score_correction_bias),
# group-limited top-k, renormalised weights scaled by routed_scaling_factor, plus ungated shared experts. No aux loss.
DEEPSEEK_V3 = llama_family(
    "deepseek_v3",
    "DeepseekV3ForCausalLM",
    llama_family_names(
        "intermediate_size",
        "moe_intermediate_size",
        "num_experts_per_tok",
        "norm_topk_prob",
        "routed_scaling_factor",
        "attention_bias",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "v_head_dim",
        "rope_interleave",
        without=("head_dim",),
        qk_rope_head_dim="head_dim",
        n_routed_experts="num_experts",
        n_group="num_expert_groups",
        topk_group="topk_expert_groups",
    ),
    dict(
        LLAMA_ARCHITECTURE,
        **{field: value for field, value in ROUTER_DEFAULTS.items() if field != "shared_expert_intermediate_size"},
    )
    | dict(
        scoring_func="sigmoid",
        router_choice_bias=True,
        numerics=["router_in_float32"],
        router_aux_loss_coef=0.0,
        mlp_bias=False,
        decoder_sparse_step=1,
        shared_expert_gate=False,
        router_jitter_noise=0.0,
    ),
    to_tfm=_deepseek_v3_to_tfm,
    from_tfm=lambda config: _deepseek_from_tfm(config, "V3"),
    # more dense layers than layers is every layer dense: the same model, written back as the depth
    their_form=lambda config: (
        config_with(config, first_k_dense_replace=config.num_hidden_layers)
        if config.first_k_dense_replace > config.num_hidden_layers
        else config
    ),
    unread={
        "pretraining_tp": "transformers 5's DeepSeek-V3 never reads it",
        "num_mtp_layers": "the multi-token-prediction layers, which transformers' DeepSeek-V3 never builds",
        "qk_head_dim": "derived: qk_nope_head_dim + qk_rope_head_dim",
        # a run option (router logits returned without labels), and no field of DeepseekV3Config before 5.19
        "output_router_logits": "whether forward returns router logits without labels; not the architecture",
        # keys of the released config.json files that transformers' DeepSeek-V3 does not read
        "scoring_func": "transformers' DeepSeek-V3 always scores with a sigmoid (hf_tfm's scoring_func='sigmoid')",
        "topk_method": "transformers' DeepSeek-V3 always routes group-limited with its correction bias (noaux_tc)",
    },
    weights=Weights(
        renames=(
            *ROUTER_RENAMES,
            (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.router.expert_bias"),
            (r"\.mlp\.shared_experts\.", ".mlp.shared_expert."),
            (r"\.self_attn\.q_a_layernorm\.", ".self_attn.q_a_norm."),
            (r"\.self_attn\.kv_a_proj_with_mqa\.", ".self_attn.kv_a_proj."),
            (r"\.self_attn\.kv_a_layernorm\.", ".self_attn.kv_a_norm."),
        )
    ),
    summary="latent attention, group-limited sigmoid MoE with shared experts",
    preset=dict(
        PRESET_DECODER,
        num_key_value_heads=4,  # latent attention expands every head's keys
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        moe_intermediate_size=88,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=64,
        q_lora_rank=96,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        tie_word_embeddings=False,
    ),
    pair={"experts_implementation": "grouped_mm"},
    tiny=dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        num_hidden_layers=3,  # one dense layer, then two MoE layers
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        moe_intermediate_size=8,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        n_shared_experts=2,
        kv_lora_rank=16,
        q_lora_rank=12,
        qk_rope_head_dim=4,
        qk_nope_head_dim=6,
        v_head_dim=5,  # narrower than the keys' 10
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
)


def _deepseek_v2_groups(config) -> bool:
    """Whether a DeepSeek-V2 config routes group-limited (its greedy routing never reads the group fields)."""
    return config.topk_method == "group_limited_greedy"


def _deepseek_v2_to_tfm(config) -> dict:
    if config.num_experts_per_tok is None:  # DeepseekV2Config's default: its router cannot run so
        raise ValueError("Cannot convert DeepseekV2Config: num_experts_per_tok=None, but its router picks top-k")
    grouped = _deepseek_v2_groups(config)
    return _deepseek_v3_to_tfm(config) | dict(
        num_expert_groups=config.n_group if grouped else 1,
        topk_expert_groups=config.topk_group if grouped else 1,
    )


def _deepseek_v2_from_tfm(config) -> dict:
    """DeepSeek-V3's shared experts and dense layers, and the routing method: group-limited where groups are set."""
    grouped = config.num_expert_groups > 1
    return _deepseek_from_tfm(config, "V2") | dict(
        topk_method="group_limited_greedy" if grouped else "greedy",
        n_group=config.num_expert_groups if grouped else None,
        topk_group=config.topk_expert_groups if grouped else None,
    )


def _deepseek_v2_unread(config) -> dict:
    if _deepseek_v2_groups(config):
        return {}
    return {name: "greedy routing (topk_method='greedy') never reads the groups" for name in ("n_group", "topk_group")}


# DeepSeek-V3's latent attention and MoE layout with DeepSeek-V2's routing: softmax scores in float32, greedy or
# group-limited top-k (a group scored by its best expert), the weights not renormalised (the reference never reads
# norm_topk_prob) and scaled by routed_scaling_factor, no choice bias; its rotary pairs rotate as complex numbers.
DEEPSEEK_V2 = llama_family(
    "deepseek_v2",
    "DeepseekV2ForCausalLM",
    {
        theirs: ours
        for theirs, ours in DEEPSEEK_V3.fields.items()
        if theirs not in ("norm_topk_prob", "rope_interleave", "n_group", "topk_group")
    }
    | {"mlp_bias": "mlp_bias"},
    {field: value for field, value in DEEPSEEK_V3.fixed.items() if field not in ("mlp_bias", "router_choice_bias")}
    | dict(
        scoring_func="softmax",
        norm_topk_prob=False,
        router_choice_bias=False,
        expert_group_score="max",
        rope_interleave=True,
        numerics=["rope_as_complex", "router_in_float32"],
    ),
    heads=("ForSequenceClassification",),  # DeepSeek-V2 has no token-classification head
    to_tfm=_deepseek_v2_to_tfm,
    from_tfm=_deepseek_v2_from_tfm,
    their_form=DEEPSEEK_V3.their_form,
    unread_of=_deepseek_v2_unread,
    unread={
        "pretraining_tp": "transformers 5's DeepSeek-V2 never reads it",
        "norm_topk_prob": "transformers' DeepSeek-V2 never renormalises the top-k weights",
        "head_dim": "set to qk_rope_head_dim by the config itself",
        "qk_head_dim": "derived: qk_nope_head_dim + qk_rope_head_dim",
        "output_router_logits": "whether forward returns router logits without labels; not the architecture",
    },
    weights=Weights(
        renames=tuple(rename for rename in DEEPSEEK_V3.weights.renames if "e_score_correction_bias" not in rename[0])
    ),
    summary="latent attention, greedy or group-limited softmax MoE with shared experts",
    preset=dict(
        {field: value for field, value in DEEPSEEK_V3.preset.items() if field not in ("n_group", "topk_group")},
        topk_method="greedy",
        n_shared_experts=2,
        moe_intermediate_size=64,
    ),
    # not benchmarked: DeepSeek-V3's pair measures the same attention and experts
    tiny=dict(
        DEEPSEEK_V3.tiny,
        topk_method="group_limited_greedy",
        topk_group=1,  # a group scored by its best expert holds a token's best two: one group is a real limit
        routed_scaling_factor=1.5,
        mlp_bias=True,
    ),
)


def _phi3_rope(rope: dict) -> dict:
    # Phi3Config fills in partial_rotary_factor=1.0; hf_tfm's absent means the same (every feature rotated)
    return {key: value for key, value in (rope or {}).items() if (key, value) != ("partial_rotary_factor", 1.0)}


def _phi3_from_tfm(config) -> dict:
    rope = dict(config.rope_parameters or {})
    # Phi3Config keeps LongRoPE's pretraining length at the top level too, and lets that one win over the dict's
    pretraining_length = {}
    if rope.get("rope_type") == "longrope" and "original_max_position_embeddings" in rope:
        pretraining_length["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return dict(**pretraining_length, resid_pdrop=config.hidden_dropout, rope_parameters=rope)


def _phi3_unread(config) -> dict:
    if config.rope_parameters.get("rope_type") == "longrope":
        return {}
    return {"original_max_position_embeddings": "read only by LongRoPE; the other RoPE types never read it"}


# Llama with q, k, v fused in qkv_proj and gate, up in gate_up_proj (rows stacked); a partial rotary factor and
# LongRoPE live in rope_parameters; a window covers every layer; resid_pdrop drops each sublayer's output
PHI3 = llama_family(
    "phi3",
    "Phi3ForCausalLM",
    llama_family_names("intermediate_size", "sliding_window", without=("head_dim",)),
    {
        **{field: value for field, value in LLAMA_ARCHITECTURE.items() if field != "hidden_dropout"},  # resid_pdrop
        "attention_bias": False,
        "mlp_bias": False,
    },
    implicit_head_dim_field=True,
    # q, k and v stay one matrix, as Phi-3's qkv_proj (its name too: LoRA targets written for Phi-3 find it)
    to_tfm=lambda config: dict(
        hidden_dropout=float(config.resid_pdrop),
        rope_parameters=_phi3_rope(config.rope_parameters),
        fused_qkv_proj=True,
    ),
    from_tfm=_phi3_from_tfm,
    weights=Weights(
        renames=(
            *LLAMA_RENAMES,
            (r"\.self_attn\.qkv_proj\.", ".self_attn.qkv."),
            (r"\.mlp\.gate_up_proj\.", ".mlp.gate_up."),
        ),
        fused={
            "self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        },
    ),
    unread={"embd_pdrop": "Phi3Model never applies it (no dropout on the embeddings)"},
    unread_of=_phi3_unread,
    our_form=lambda config: (
        config_with(config, rope_parameters=_phi3_rope(config.rope_parameters))
        if (config.rope_parameters or {}).get("partial_rotary_factor") == 1.0
        else config
    ),
    preset=PRESET_DECODER,
    tiny=dict(TINY_DECODER, pad_token_id=0),
)


def _smollm3_rope(config) -> dict:
    """The RoPE dict of either side as SmolLM3 reads it: one for every layer. SmolLM3Config takes a dict nested per
    layer type (it has layer_types), but its model cannot be built from one."""
    rope = llama_family_rope(config)
    if rope and set(rope) <= {"full_attention", "sliding_attention"}:
        raise ValueError(
            f"Cannot convert {type(config).__name__} exactly: rope_parameters is nested per layer type "
            f"({sorted(rope)}), and SmolLM3 reads one RoPE dict for every layer"
        )
    return rope


def _smollm3_from_tfm(config) -> dict:
    nope = set(config.nope_layers or ())
    return dict(
        rope_parameters=_smollm3_rope(config),
        no_rope_layers=[int(i not in nope) for i in range(config.num_hidden_layers)],
        layer_types=list(config.layer_types),
        # the attention reads the window only where use_sliding_window is set (flash attention; the masks of the
        # other backends slide on every sliding layer whatever it says)
        use_sliding_window="sliding_attention" in config.layer_types,
        sliding_window=config.sliding_window,
    )


def _smollm3_unread(config) -> dict:
    unread = {"no_rope_layer_interval": "only fills no_rope_layers when that is not given; the model reads that"}
    if "sliding_attention" not in config.layer_types:
        unread["use_sliding_window"] = "read only on sliding_attention layers, and layer_types has none"
    return unread


# Llama with NoPE layers: no_rope_layers[i] == 0 is hf_tfm's nope_layers; its optional sliding window is layer_types
# and sliding_window as transformers has them (by default the NoPE layers slide when use_sliding_window is set)
SMOLLM3 = llama_family(
    "smollm3",
    "SmolLM3ForCausalLM",
    llama_family_names("intermediate_size", "attention_bias", "mlp_bias", without=("head_dim",)),
    LLAMA_ARCHITECTURE,
    implicit_head_dim_field=True,
    to_tfm=lambda config: (
        one_attention_bias(config)
        | dict(
            rope_parameters=_smollm3_rope(config),
            nope_layers=[i for i in range(config.num_hidden_layers) if not config.no_rope_layers[i]] or None,
            layer_types=list(config.layer_types),
            sliding_window=config.sliding_window,
        )
    ),
    from_tfm=_smollm3_from_tfm,
    unread_of=_smollm3_unread,
    # entries of no_rope_layers past the last layer are never read
    their_form=lambda config: (
        config_with(config, no_rope_layers=config.no_rope_layers[: config.num_hidden_layers])
        if len(config.no_rope_layers) > config.num_hidden_layers
        else config
    ),
    # the same NoPE layers in the one form that comes back: sorted, [] as None
    our_form=lambda config: (
        config_with(config, nope_layers=sorted(set(config.nope_layers)) or None)
        if config.nope_layers is not None
        else config
    ),
    preset=PRESET_DECODER,  # NoPE every 4th layer, as SmolLM3-3B
    summary="NoPE layers",
    tiny=dict(TINY_DECODER, num_hidden_layers=4, no_rope_layer_interval=2, pad_token_id=0),  # layers 1, 3 NoPE,
)

DECODERS = (
    GPT2,
    LLAMA,
    MISTRAL,
    MIXTRAL,
    QWEN2,
    QWEN3,
    QWEN3_MOE,
    QWEN2_MOE,
    OLMO2,
    PHI3,
    GPT_NEOX,
    BLOOM,
    OPT,
    GEMMA2,
    GEMMA3,
    SMOLLM3,
    GPT_OSS,
    DEEPSEEK_V2,
    DEEPSEEK_V3,
)
