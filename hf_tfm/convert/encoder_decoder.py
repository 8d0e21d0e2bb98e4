"""The encoder-decoder families' records: T5 and BART. hf_tfm keeps one token table for encoder and decoder, so the
copies both references keep per stack must equal it.
"""

from .common import config_with
from .record import PRESET_ENCODER_TOKENS, PRESET_SIZE, TINY_VOCAB, Family, Weights

ONE_TOKEN_TABLE = "hf_tfm keeps one token table shared by encoder and decoder"

# --------------------------------------------------------------------------------------------------------------- T5
# T5's relative position bias (kept by T5 in block 0's self-attention of each stack, by hf_tfm on the stack), pre-norm
# RMSNorm with a final norm, no biases, unscaled attention scores, head_dim = d_kv, a ReLU MLP (v1.0) or a gated GELU
# (v1.1: wi_0 the gate, wi_1 up). T5Config always says tie_word_embeddings=True and keeps the saved flag as
# scale_decoder_outputs (v1.0 rescales the LM head input, v1.1 does not); a v1.1 checkpoint is untied only because
# its lm_head differs from shared when loaded. So the tie is read from the model's tensors and the scaling from
# scale_decoder_outputs. One dropout rate everywhere: on the embeddings, the attention weights, each sublayer's
# output, inside the feed-forward (activation_dropout) and after each stack's final norm (final_norm_dropout).


def _t5_dropouts_and_tokens(config) -> dict:
    """What T5 and Switch Transformer keep alike: one dropout rate everywhere, and tokens their configs may lack."""
    dropouts = ("hidden_dropout", "attention_dropout", "embedding_dropout", "activation_dropout", "final_norm_dropout")
    return dict(
        **dict.fromkeys(dropouts, float(config.dropout_rate)),
        bos_token_id=getattr(config, "bos_token_id", None),
        decoder_start_token_id=getattr(config, "decoder_start_token_id", None),
    )


def _t5_to_tfm(config, tie_word_embeddings: bool | None = None) -> dict:
    """`tie_word_embeddings` defaults to the saved flag (`scale_decoder_outputs`): tied v1.0, untied v1.1."""
    return dict(
        ffn_type="glu" if config.is_gated_act else "mlp",
        hidden_act=config.dense_act_fn,
        scale_lm_head_input=config.scale_decoder_outputs,
        tie_word_embeddings=config.scale_decoder_outputs if tie_word_embeddings is None else tie_word_embeddings,
        **_t5_dropouts_and_tokens(config),
    )


def _t5_from_tfm(config) -> dict:
    gated = config.ffn_type == "glu"
    # T5 spells the GELU-tanh gate "gated-gelu"; every other activation by its own name (a GELU gate comes back as
    # GELU-tanh and is refused by name)
    activation = "gelu" if gated and config.hidden_act == "gelu_new" else config.hidden_act
    return dict(
        bos_token_id=config.bos_token_id,
        feed_forward_proj=f"gated-{activation}" if gated else activation,
        dropout_rate=config.hidden_dropout,
        tie_word_embeddings=config.scale_lm_head_input,  # T5Config stores it as scale_decoder_outputs
        decoder_start_token_id=config.decoder_start_token_id,
    )


def _t5_form(config):
    if getattr(config, "decoder_start_token_id", None) is None:  # T5 starts decoding with pad
        return config_with(config, decoder_start_token_id=config.pad_token_id)
    return config


def _untie(model, target) -> None:
    """T5ForConditionalGeneration ties lm_head to shared whatever its config says: untied here, as from_pretrained
    does for a checkpoint with its own lm_head."""
    import torch
    from torch import nn

    if not model.config.tie_word_embeddings:
        target.lm_head.weight = nn.Parameter(torch.empty_like(target.lm_head.weight))
        target.all_tied_weights_keys.pop("lm_head.weight", None)


# T5's layout, Switch Transformer's too: each block's sublayers are numbered (self-attention, cross-attention in the
# decoder, feed-forward), the position bias is kept by block 0's self-attention, one token table per stack
T5_STACK_RENAMES = (
    (
        r"^(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.",
        r"model.\1.position_bias.relative_attention_bias.",
    ),
    (r"^(encoder|decoder)\.final_layer_norm\.", r"model.\1.norm."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.", r"model.encoder.layers.\1.feed_forward."),
    (r"^decoder\.block\.(\d+)\.layer\.1\.", r"model.decoder.layers.\1.cross_attention."),
    (r"^decoder\.block\.(\d+)\.layer\.2\.", r"model.decoder.layers.\1.feed_forward."),
    (r"^(encoder|decoder)\.block\.(\d+)\.layer\.0\.", r"model.\1.layers.\2.self_attention."),
    (r"\.self_attention\.SelfAttention\.([qkvo])\.", r".self_attn.\1_proj."),
    (r"\.self_attention\.layer_norm\.", ".attn_norm."),
    (r"\.cross_attention\.EncDecAttention\.([qkvo])\.", r".cross_attn.\1_proj."),
    (r"\.cross_attention\.layer_norm\.", ".cross_attn_norm."),
    (r"\.feed_forward\.layer_norm\.", ".ffn_norm."),
    (r"^shared\.", "model.shared."),
)
T5_TABLE_COPIES = {
    "encoder.embed_tokens.weight": ("shared.weight", ONE_TOKEN_TABLE),
    "decoder.embed_tokens.weight": ("shared.weight", ONE_TOKEN_TABLE),
}
T5_FIELDS = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_kv": "head_dim",
    "d_ff": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_decoder_layers": "decoder_layers",
    "num_heads": "num_attention_heads",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "layer_norm_epsilon": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "eos_token_id": "eos_token_id",
}
T5_ARCHITECTURE = dict(
    position_embedding_type="relative_bias",
    norm_type="rmsnorm",
    norm_position="pre",
    final_norm=True,
    embedding_norm=False,
    scale_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    attention_multiplier=1.0,
    lm_head_bias=False,
)
T5_UNREAD_INIT = {"initializer_factor": "read only to initialise weights; converted weights are given"}
T5_OUR_UNREAD = {"initializer_range": "read only to initialise weights; converted weights are given"}


T5 = Family(
    name="t5",
    tiny=dict(  # v1.0: ReLU MLP, the LM head tied and rescaled; few buckets, so the logarithmic ones are used
        vocab_size=TINY_VOCAB,
        d_model=32,
        d_kv=16,  # 4 heads of 16: an inner width of 64, not d_model
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
    ),
    summary="v1.0 and v1.1",
    paradigm="tfm_encoder_decoder",
    classes={
        "T5ForConditionalGeneration": "TfmEncoderDecoderForConditionalGeneration",
        "T5EncoderModel": "TfmEncoderModel",
    },
    config_class="T5Config",
    fields=T5_FIELDS,
    fixed={**T5_ARCHITECTURE, "numerics": ["ffn_output_in_float32"]},  # T5's `_keep_in_fp32_modules = ["wo"]`
    unread={
        **T5_UNREAD_INIT,
        "classifier_dropout": "read only by T5's classification heads",
        "n_positions": "a transformers 4.x T5Config key that transformers 5's T5 never reads (no position table)",
    },
    our_unread=T5_OUR_UNREAD,
    weights=Weights(
        # each block's sublayers are numbered: self-attention, (cross-attention,) feed-forward
        renames=(
            *T5_STACK_RENAMES,
            (r"\.feed_forward\.DenseReluDense\.wi_0\.", ".mlp.gate_proj."),
            (r"\.feed_forward\.DenseReluDense\.wi_1\.", ".mlp.up_proj."),
            (r"\.feed_forward\.DenseReluDense\.wi\.", ".mlp.up_proj."),
            (r"\.feed_forward\.DenseReluDense\.wo\.", ".mlp.down_proj."),
        ),
        copies=T5_TABLE_COPIES,
    ),
    pair={"defaults": {"decoder_start_token_id": 0}},  # T5's decoder starts from pad, as its checkpoints
    to_tfm=_t5_to_tfm,
    from_tfm=_t5_from_tfm,
    their_form=_t5_form,
    options=lambda model: (
        {"tie_word_embeddings": model.lm_head.weight is model.shared.weight} if hasattr(model, "lm_head") else {}
    ),
    our_options=lambda config: {"tie_word_embeddings": config.tie_word_embeddings},
    prepare_reference=_untie,
)

# ------------------------------------------------------------------------------------------------------------- BART
# Learned positions looked up at position + 2, post-norm LayerNorm (eps 1e-5) with a norm after the embeddings and
# none at the end, biases everywhere, a GELU MLP (its activation_dropout inside), and the LM head bias
# final_logits_bias ([1, V], a buffer) as lm_head.bias.
BART = Family(
    name="bart",
    tiny=dict(
        vocab_size=TINY_VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        scale_embedding=True,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    ),
    paradigm="tfm_encoder_decoder",
    classes={"BartForConditionalGeneration": "TfmEncoderDecoderForConditionalGeneration"},
    config_class="BartConfig",
    fields={
        "vocab_size": "vocab_size",
        "d_model": "hidden_size",
        "encoder_layers": "num_hidden_layers",
        "decoder_layers": "decoder_layers",
        "encoder_attention_heads": "num_attention_heads",
        "encoder_ffn_dim": "intermediate_size",
        "activation_function": "hidden_act",
        "activation_dropout": "activation_dropout",
        "max_position_embeddings": "max_position_embeddings",
        "scale_embedding": "scale_embeddings",
        "init_std": "initializer_range",
        "tie_word_embeddings": "tie_word_embeddings",
        "pad_token_id": "pad_token_id",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "decoder_start_token_id": "decoder_start_token_id",
    },
    fixed=dict(
        position_embedding_type="learned",
        position_offset=2,
        freeze_pad_embedding=True,  # the shared token table's; BART's position tables have no padding row
        norm_type="layernorm",
        norm_position="post",
        layer_norm_eps=1e-5,
        norm_bias=True,
        embedding_norm=True,
        final_norm=False,
        ffn_type="mlp",
        attention_bias=True,
        mlp_bias=True,
        lm_head_bias=True,
        scale_lm_head_input=False,
    ),
    unread={
        "classifier_dropout": "read only by BART's classification head",
        **dict.fromkeys(
            ("add_bias_logits", "add_final_layer_norm", "classif_dropout", "normalize_before", "normalize_embedding"),
            "a transformers 4.x BartConfig key that transformers 5's BART never reads",
        ),
        "forced_eos_token_id": "a generation default, carried over by the model's generation_config",
    },
    weights=Weights(
        renames=(
            (r"^final_logits_bias$", "lm_head.bias"),
            (r"\.layernorm_embedding\.", ".embed_norm."),
            (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
            (r"\.self_attn_layer_norm\.", ".attn_norm."),
            (r"\.encoder_attn\.out_proj\.", ".cross_attn.o_proj."),
            (r"\.encoder_attn\.", ".cross_attn."),
            (r"\.encoder_attn_layer_norm\.", ".cross_attn_norm."),
            (r"\.fc1\.", ".mlp.up_proj."),
            (r"\.fc2\.", ".mlp.down_proj."),
            (r"\.final_layer_norm\.", ".ffn_norm."),
        ),
        copies={
            "model.encoder.embed_tokens.weight": ("model.shared.weight", ONE_TOKEN_TABLE),
            "model.decoder.embed_tokens.weight": ("model.shared.weight", ONE_TOKEN_TABLE),
        },
    ),
    pair={},
    to_tfm=lambda config: dict(
        hidden_dropout=float(config.dropout),
        embedding_dropout=float(config.dropout),
        attention_dropout=float(config.attention_dropout),
        layerdrop=float(config.encoder_layerdrop),  # one rate for both stacks: another decoder_layerdrop is refused
    ),
    from_tfm=lambda config: dict(
        decoder_attention_heads=config.num_attention_heads,
        decoder_ffn_dim=config.intermediate_size,
        dropout=config.hidden_dropout,
        attention_dropout=config.attention_dropout,
        encoder_layerdrop=config.layerdrop,
        decoder_layerdrop=config.layerdrop,
        forced_eos_token_id=None,  # a generation default: carried by generation_config, not by TfmConfig
    ),
)

# ------------------------------------------------------------------------------------------- Switch Transformer
# T5 v1.0 (ReLU MLP, the LM head input rescaled when tied) with every `step`-th feed-forward a Mixture of Experts: a
# float32 top-1 softmax router (probabilities rounded to the model's dtype, the chosen one weighting its expert),
# ungated ReLU experts held one module each (stacked into hf_tfm's fused [E, ...] tensors), a capacity per expert per
# sequence (a dropped token's expert output is 0), and Switch's own router losses. transformers' Switch makes layer i
# of a stack sparse when `i % step == 1` (or every layer when step is 1; `step = layers // sparse layers`, each stack
# its own); hf_tfm lists the layers (`moe_layers`, and `decoder_moe_layers` where the decoder's differ).


def _switch_sparse_layers(layers: int, step: int) -> list[int]:
    """The layers transformers' SwitchTransformers makes sparse in a stack of `layers` with `step`."""
    return [i for i in range(layers) if step > 0 and (step == 1 or i % step == 1)]


def _switch_sparse_count(layers: int, sparse: list[int]) -> int | None:
    """The fewest `num_sparse_*_layers` that make exactly `sparse` the sparse layers of a stack of `layers` (more
    than `layers` make none sparse: step 0)."""
    for count in range(layers + 2):
        if _switch_sparse_layers(layers, layers // count if count else layers) == sparse:
            return count
    return None


def _switch_stacks(config) -> list[tuple[str, int, int]]:
    """(the name of its sparse-layer count, its depth, its step) for the encoder and the decoder."""
    return [
        ("num_sparse_encoder_layers", config.num_layers, config.encoder_sparse_step),
        ("num_sparse_decoder_layers", config.num_decoder_layers, config.decoder_sparse_step),
    ]


def _cannot_convert_switch(why: str):
    return ValueError(f"Cannot convert SwitchTransformersConfig to TfmEncoderDecoderConfig exactly: {why}")


def _switch_to_tfm(config) -> dict:
    if config.router_dtype != "float32":
        raise _cannot_convert_switch(f"router_dtype={config.router_dtype!r} (hf_tfm's router scores in float32)")
    for name, _, step in _switch_stacks(config):
        if step == 1 and (config.router_aux_loss_coef or config.router_z_loss_coef):
            raise _cannot_convert_switch(
                f"{name}={getattr(config, name)} makes every layer sparse, where SwitchTransformers computes no "
                "router losses and hf_tfm would; set router_aux_loss_coef and router_z_loss_coef to 0"
            )
    encoder, decoder = (_switch_sparse_layers(depth, step) for _, depth, step in _switch_stacks(config))
    return dict(
        **_t5_dropouts_and_tokens(config),
        ffn_type="mlp",
        moe_ffn_type="mlp",
        hidden_act=config.dense_act_fn,
        scale_lm_head_input=config.tie_word_embeddings,  # Switch rescales a tied head's input, as T5 v1.0
        tie_word_embeddings=config.tie_word_embeddings,
        moe_intermediate_size=config.d_ff,
        moe_layers=encoder,
        decoder_moe_layers=None if decoder == encoder else decoder,
    )


def _switch_from_tfm(config) -> dict:
    counts = {}
    layers = config.moe_layers if config.num_experts else []
    decoder_layers = layers if config.decoder_moe_layers is None else config.decoder_moe_layers
    for name, depth, sparse in (
        ("num_sparse_encoder_layers", config.num_hidden_layers, layers),
        ("num_sparse_decoder_layers", config.decoder_layers, decoder_layers),
    ):
        counts[name] = _switch_sparse_count(depth, sparse)
        if counts[name] is None:
            raise ValueError(
                f"Cannot convert TfmEncoderDecoderConfig to SwitchTransformersConfig exactly: MoE layers {sparse} "
                f"are no layout of Switch's (layer i of {depth} sparse when i % step == 1; moe_layers, "
                "decoder_moe_layers)"
            )
    return dict(
        **counts,
        dense_act_fn=config.hidden_act,
        dropout_rate=config.hidden_dropout,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def _switch_form(config):
    """Each stack's sparse-layer count as the fewest that give its sparse layers (several counts give one layout)."""
    counts = {}
    for name, depth, step in _switch_stacks(config):
        counts[name] = _switch_sparse_count(depth, _switch_sparse_layers(depth, step))
    return _t5_form(config_with(config, **counts))


def _switch_our_form(config):
    """The decoder's MoE layers written once: None where they are the encoder's."""
    if config.decoder_moe_layers is not None and config.decoder_moe_layers == config.moe_layers:
        return config_with(config, decoder_moe_layers=None)
    return config


SWITCH_TRANSFORMERS = Family(
    name="switch_transformers",
    tiny=dict(  # layer 1 of 2 sparse in each stack; a capacity of 3 drops tokens of the tests' 9-token prompts
        vocab_size=TINY_VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,  # its default is 12 whatever num_layers says
        num_heads=4,
        num_experts=4,
        num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1,
        expert_capacity=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        router_jitter_noise=0.0,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
    ),
    # PRESET_SIZE with T5's names: 4 + 4 layers, layers 1 and 3 of each with 8 experts
    preset=dict(
        vocab_size=PRESET_SIZE["vocab_size"],
        d_model=PRESET_SIZE["hidden_size"],
        d_kv=32,
        d_ff=352,
        num_layers=PRESET_SIZE["num_hidden_layers"],
        num_decoder_layers=PRESET_SIZE["num_hidden_layers"],
        num_heads=PRESET_SIZE["num_attention_heads"],
        num_experts=8,
        num_sparse_encoder_layers=2,
        num_sparse_decoder_layers=2,
        expert_capacity=64,
        **PRESET_ENCODER_TOKENS,
        decoder_start_token_id=PRESET_ENCODER_TOKENS["pad_token_id"],
    ),
    summary="top-1 ungated experts, a capacity per sequence, Switch's router losses",
    paradigm="tfm_encoder_decoder",
    classes={
        "SwitchTransformersForConditionalGeneration": "TfmEncoderDecoderForConditionalGeneration",
        "SwitchTransformersEncoderModel": "TfmEncoderModel",
    },
    config_class="SwitchTransformersConfig",
    fields={
        **T5_FIELDS,
        "num_experts": "num_experts",
        "expert_capacity": "expert_capacity",
        "router_bias": "router_bias",
        "router_jitter_noise": "router_jitter_noise",
        "router_z_loss_coef": "router_z_loss_coef",
        "router_aux_loss_coef": "router_aux_loss_coef",
    },
    fixed=dict(
        T5_ARCHITECTURE,
        num_experts_per_tok=1,
        norm_topk_prob=False,
        scoring_func="softmax",
        router_loss_style="switch",
        numerics=["router_in_float32", "router_scores_in_model_dtype"],
    ),
    unread={
        **T5_UNREAD_INIT,
        "router_ignore_padding_tokens": "SwitchTransformers stores it and never reads it",
        "add_router_probs": "transformers 5's SwitchTransformers never reads it",
        # the way back writes the steps from the counts, as SwitchTransformersConfig does
        "encoder_sparse_step": "derived from num_sparse_encoder_layers, which is compared",
        "decoder_sparse_step": "derived from num_sparse_decoder_layers, which is compared",
    },
    our_unread={
        **T5_OUR_UNREAD,
        "output_router_logits": "SwitchTransformers returns router logits when a call asks (no config field)",
    },
    weights=Weights(
        renames=(
            *T5_STACK_RENAMES,
            (r"\.feed_forward\.mlp\.router\.classifier\.", ".mlp.router."),
            (r"\.feed_forward\.mlp\.experts\.expert_(\d+)\.wi\.weight$", r".mlp.experts.\1.up_proj"),
            (r"\.feed_forward\.mlp\.experts\.expert_(\d+)\.wo\.weight$", r".mlp.experts.\1.down_proj"),
            (r"\.feed_forward\.mlp\.wi\.", ".mlp.up_proj."),
            (r"\.feed_forward\.mlp\.wo\.", ".mlp.down_proj."),
        ),
        stacked=r"^(.*\.experts)\.(\d+)\.(up_proj|down_proj)$",
        copies=T5_TABLE_COPIES,
    ),
    to_tfm=_switch_to_tfm,
    from_tfm=_switch_from_tfm,
    their_form=_switch_form,
    our_form=_switch_our_form,
)

ENCODER_DECODERS = (T5, BART, SWITCH_TRANSFORMERS)
