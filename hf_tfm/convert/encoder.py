"""The encoder families' records: BERT, RoBERTa, ELECTRA, ALBERT, DeBERTa-v2 and ModernBERT, each as its base model
and its heads."""

import copy

from .common import config_with, field_names, require_full_rotary
from .record import PRESET_ENCODER_TOKENS, PRESET_SIZE, TINY_ENCODER, TINY_WINDOW, Family, Weights

# ------------------------------------------------------------------------------------------------------------- BERT
# A post-norm encoder with a norm after the embeddings and none after the last block, learned absolute positions,
# token types, a dense+tanh pooler and an MLM head (dense, act, norm, tied decoder with its own bias); every linear
# layer an nn.Linear like hf_tfm's, so weights only change names.
BERT_FIELDS = field_names(
    "intermediate_size",
    "hidden_act",
    "type_vocab_size",
    "layer_norm_eps",
    hidden_dropout_prob="hidden_dropout",
    attention_probs_dropout_prob="attention_dropout",
)
# BERT's, RoBERTa's and ELECTRA's classifiers drop out with classifier_dropout, else hidden_dropout_prob: hf_tfm's rule
BERT_CLASSIFIER_FIELDS = BERT_FIELDS | {"classifier_dropout": "classifier_dropout"}
BERT_ARCHITECTURE = dict(
    position_embedding_type="learned",
    position_offset=0,
    norm_type="layernorm",
    norm_position="post",
    norm_bias=True,
    embedding_norm=True,
    final_norm=False,
    scale_embeddings=False,
    ffn_type="mlp",
    attention_bias=True,
    mlp_bias=True,
    freeze_pad_embedding=True,  # and RoBERTa's padding position row
)
# the encoder's modules, the same under BERT's and RoBERTa's prefixes (`attention.output` before `output`)
BERT_BODY_RENAMES = (
    (r"embeddings\.word_embeddings\.", "embed_tokens."),
    (r"embeddings\.position_embeddings\.", "embed_positions."),
    (r"embeddings\.token_type_embeddings\.", "embed_token_types."),
    (r"embeddings\.LayerNorm\.", "embed_norm."),
    (r"encoder\.layer\.", "layers."),
    (r"\.attention\.self\.query\.", ".self_attn.q_proj."),
    (r"\.attention\.self\.key\.", ".self_attn.k_proj."),
    (r"\.attention\.self\.value\.", ".self_attn.v_proj."),
    (r"\.attention\.output\.dense\.", ".self_attn.o_proj."),
    (r"\.attention\.output\.LayerNorm\.", ".attn_norm."),
    (r"\.intermediate\.dense\.", ".mlp.up_proj."),
    (r"\.output\.dense\.", ".mlp.down_proj."),
    (r"\.output\.LayerNorm\.", ".ffn_norm."),
)
# BERT's masked-LM head (`cls.predictions`), DeBERTa's legacy one too
BERT_HEAD_RENAMES = (
    (r"^cls\.predictions\.transform\.dense\.", "lm_head.dense."),
    (r"^cls\.predictions\.transform\.LayerNorm\.", "lm_head.norm."),
    (r"^cls\.predictions\.decoder\.", "lm_head.decoder."),
)
ONE_DECODER_BIAS = "TfmMaskedLMHead holds a single decoder bias"  # an untied head keeps two, only one reaches logits


def _bert_unread(config) -> dict:
    if getattr(config, "position_embedding_type", "absolute") == "absolute":  # not a field since transformers 5
        return {"position_embedding_type": "transformers 5's BERT and RoBERTa only have absolute positions"}
    return {}


def _one_token_type(target: str):
    def from_tfm(config) -> dict:
        if config.type_vocab_size == 0:  # the config takes 0, but the model still looks up token type 0
            raise ValueError(
                f"Cannot convert {type(config).__name__} to {target} exactly: type_vocab_size=0, and "
                f"{target.removesuffix('Config')} always adds a token-type embedding"
            )
        return {}

    return from_tfm


def _pooler_options(model) -> dict:
    """BertModel and RobertaModel keep their pooler out of the config (`add_pooling_layer`): a masked-LM head's body
    has none, and hf_tfm's masked-LM head builds none whatever `use_pooler` says; the token-classification and
    question-answering heads' bodies have none, the sequence classifier's has one."""
    return {"use_pooler": "MaskedLM" in type(model).__name__ or model.base_model.pooler is not None}


def _pooling_layer(model) -> dict:
    # only the bare body takes `add_pooling_layer`; each head class builds its body with or without a pooler itself
    return {"add_pooling_layer": model.pooler is not None} if type(model).__name__ == "TfmEncoderModel" else {}


# the task heads BERT's layout shares with hf_tfm's (suffix of the reference's class name -> hf_tfm's class): the
# same task layer (`classifier`, `qa_outputs`) over the body, a sequence classifier over the pooler
BERT_TOKEN_HEADS = {
    "ForTokenClassification": "TfmEncoderForTokenClassification",
    "ForQuestionAnswering": "TfmEncoderForQuestionAnswering",
}
BERT_HEADS = {"ForSequenceClassification": "TfmEncoderForSequenceClassification", **BERT_TOKEN_HEADS}


def heads_of(prefix: str, heads: dict[str, str]) -> dict[str, str]:
    """A family's task-head classes, named `prefix` + suffix."""
    return {prefix + suffix: ours for suffix, ours in heads.items()}


# what BERT and RoBERTa alike keep outside their configs (the pooler) or write in another form
BERT_HOOKS = dict(
    unread_of=_bert_unread,
    options=_pooler_options,
    our_options=lambda config: {"use_pooler": config.use_pooler},
    reference_kwargs=_pooling_layer,
)


BERT = Family(
    name="bert",
    tiny=TINY_ENCODER,
    paradigm="tfm_encoder",
    classes={
        "BertForMaskedLM": "TfmEncoderForMaskedLM",
        "BertModel": "TfmEncoderModel",
        **heads_of("Bert", BERT_HEADS),
    },
    config_class="BertConfig",
    fields=BERT_CLASSIFIER_FIELDS,
    fixed=BERT_ARCHITECTURE,
    weights=Weights(
        renames=(
            (r"^bert\.", "model."),
            *BERT_HEAD_RENAMES,
            *BERT_BODY_RENAMES,
        ),
        copies={"cls.predictions.bias": ("cls.predictions.decoder.bias", ONE_DECODER_BIAS)},
    ),
    pair={},
    to_tfm=lambda config, use_pooler=True: dict(embedding_dropout=config.hidden_dropout_prob, use_pooler=use_pooler),
    from_tfm=_one_token_type("BertConfig"),
    **BERT_HOOKS,
)


# ---------------------------------------------------------------------------------------------------------- RoBERTa
# BERT with other positions and other names around the same layers. Its positions count only the non-padding tokens
# and start after the padding id: a real token at count c (1-based) reads table row c + pad_token_id, padding reads
# row pad_token_id. In hf_tfm that is position_ids_from_padding with position_offset = pad_token_id + 1 and a table
# of max_position_embeddings + position_offset rows, so hf_tfm's max_position_embeddings is RoBERTa's minus the
# offset. Without position_ids both derive them the same way; explicit position_ids differ: RoBERTa reads them as
# table rows, hf_tfm as positions (row = id + offset). The MLM head is BERT's with RoBERTa's names, but its
# activation is always gelu (BERT's follows hidden_act): a masked LM whose hidden_act is not gelu is refused.
def _roberta_to_tfm(config, use_pooler: bool = True) -> dict:
    if config.pad_token_id is None:
        raise ValueError("Cannot convert RobertaConfig: pad_token_id=None, but RoBERTa's positions count from it")
    offset = config.pad_token_id + 1
    return dict(
        position_ids_from_padding=True,
        position_offset=offset,
        max_position_embeddings=config.max_position_embeddings - offset,
        embedding_dropout=config.hidden_dropout_prob,
        use_pooler=use_pooler,
    )


def _roberta_from_tfm(config) -> dict:
    _one_token_type("RobertaConfig")(config)
    return {"max_position_embeddings": config.max_position_embeddings + config.position_offset}


def require_gelu_head(family: str, reference: str):
    """A check for a family whose masked-LM head calls gelu whatever hidden_act says (RoBERTa's, ELECTRA's
    generator's), where hf_tfm's head applies hidden_act: `model` of either side with another hidden_act is refused."""

    def check(model) -> None:
        name = type(model).__name__
        if "MaskedLM" in name and model.config.hidden_act != "gelu":
            target = "TfmEncoderForMaskedLM" if name == reference else reference
            raise ValueError(
                f"Cannot convert {type(model.config).__name__} to {target} exactly: hidden_act="
                f"{model.config.hidden_act!r}, but {family}'s MLM head always applies gelu and hf_tfm's applies "
                "hidden_act"
            )

    return check


ROBERTA = Family(
    name="roberta",
    tiny=dict(
        TINY_ENCODER,
        max_position_embeddings=40,
        type_vocab_size=1,  # as roberta-base
        layer_norm_eps=1e-5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    paradigm="tfm_encoder",
    # its sequence classifier is a head of its own (dense, tanh, out_proj, no pooler): not converted
    classes={
        "RobertaForMaskedLM": "TfmEncoderForMaskedLM",
        "RobertaModel": "TfmEncoderModel",
        **heads_of("Roberta", BERT_TOKEN_HEADS),
    },
    config_class="RobertaConfig",
    fields={theirs: ours for theirs, ours in BERT_CLASSIFIER_FIELDS.items() if theirs != "max_position_embeddings"},
    fixed=BERT_ARCHITECTURE,
    weights=Weights(
        renames=((r"^roberta\.", "model."), (r"^lm_head\.layer_norm\.", "lm_head.norm."), *BERT_BODY_RENAMES),
        copies={"lm_head.bias": ("lm_head.decoder.bias", ONE_DECODER_BIAS)},
    ),
    preset=dict(PRESET_SIZE, intermediate_size=512, max_position_embeddings=514),  # pad 1 (its own)
    to_tfm=_roberta_to_tfm,
    from_tfm=_roberta_from_tfm,
    check=require_gelu_head("RoBERTa", "RobertaForMaskedLM"),
    **BERT_HOOKS,
)


# ------------------------------------------------------------------------------------------------------- ModernBERT
# A pre-norm encoder with a LayerNorm after the token embeddings (no positions or token types there), none before the
# first layer's attention, a final norm, GeGLU feed-forwards and RoPE with one theta for the global layers and another
# for the local ones (rope_parameters nested per layer type). Its local layers see the keys at most
# local_attention // 2 tokens away: config.sliding_window, which hf_tfm's bidirectional sliding_window means too.
# Wqkv holds q, k and v stacked; Wi the activated half (hf_tfm's gate_proj) then the multiplying half (up_proj).
# The MLM head is dense, activation, norm and the tied decoder, as hf_tfm's, whose dense always has a bias and applies
# hidden_act; ModernBERT's has a bias only with classifier_bias (off in the published checkpoints) and applies
# classifier_activation. A missing dense bias converts as zeros (same logits) and zeros go back as
# classifier_bias=False; another classifier_activation than hidden_activation is refused. Its attention_dropout drops
# out the attention weights and the attention's output (none on the feed-forward's), its mlp_dropout the GLU product.
def _modernbert_to_tfm(config) -> dict:
    require_full_rotary(config.rope_parameters, config, "ModernBERT")
    kinds = list(config.rope_parameters.values())  # one flat dict when the layer types agree (what hf_tfm's means)
    rope = kinds[0] if all(kind == kinds[0] for kind in kinds) else config.rope_parameters
    return dict(
        attention_dropout=float(config.attention_dropout),
        hidden_dropout=float(config.attention_dropout),  # on the attention's output (`out_drop`)
        # none on the feed-forward's output: said as None (hidden_dropout's) where that is 0, as configs without
        # dropout say it
        ffn_dropout=0.0 if config.attention_dropout else None,
        activation_dropout=float(config.mlp_dropout),
        attention_out_bias=config.attention_bias,  # one flag for Wqkv and Wo
        fused_qkv_proj=True,  # q, k and v stay one matrix, as Wqkv: one matmul a layer
        embedding_dropout=float(config.embedding_dropout),
        layer_types=list(config.layer_types),
        sliding_window=config.sliding_window if "sliding_attention" in config.layer_types else None,
        rope_parameters=copy.deepcopy(rope),
        sep_token_id=config.sep_token_id,  # not a TfmConfig field, but a PreTrainedConfig key it keeps
    )


def _modernbert_from_tfm(config) -> dict:
    rope = copy.deepcopy(config.rope_parameters or {})
    if not config.nested_rope():  # one dict for every layer type
        rope = {kind: dict(rope) for kind in ("full_attention", "sliding_attention")}
    require_full_rotary(rope, config, "ModernBERT")
    window = {} if config.sliding_window is None else {"local_attention": 2 * config.sliding_window}
    return dict(
        **window,
        attention_dropout=config.attention_dropout,
        mlp_dropout=config.activation_dropout,
        embedding_dropout=config.embedding_dropout,
        layer_types=list(config.layer_types),
        rope_parameters=rope,
        classifier_activation=config.hidden_act,  # hf_tfm's MLM head applies hidden_act
        classifier_bias=True,  # hf_tfm's MLM head dense has a bias (a zero one goes back as False)
        cls_token_id=config.bos_token_id,
        sep_token_id=getattr(config, "sep_token_id", None),
    )


def _modernbert_unread(config) -> dict:
    import dataclasses

    import transformers

    unread = {}
    if "sliding_attention" not in config.layer_types:
        unread["local_attention"] = "read only by sliding_attention layers, and there are none"
    if not config.sparse_prediction:
        unread["sparse_pred_ignore_index"] = "read only with sparse_prediction=True"
    # keys a config.json carries that are no ModernBertConfig field (global_attn_every_n_layers, which filled
    # layer_types; position_embedding_type and others the Hub's files hold): nothing else reads them
    declared = {field.name for field in dataclasses.fields(transformers.ModernBertConfig)} | {"model_type"}
    for key in config.to_dict().keys() - declared:
        unread[key] = "not a ModernBertConfig field: no ModernBERT class reads it"
    return unread


def _zero_head_bias(model, state: dict) -> None:
    if "MaskedLM" in type(model).__name__ and not model.config.classifier_bias:
        state["lm_head.dense.bias"] = model.head.norm.weight.new_zeros(model.head.norm.weight.shape)


def _head_bias_config(model, config):
    if "MaskedLM" in type(model).__name__ and not model.lm_head.dense.bias.any():  # ModernBERT's layout: no bias
        config.classifier_bias = False
    return config


MODERNBERT = Family(
    name="modernbert",
    tiny=dict(
        TINY_ENCODER,
        intermediate_size=48,
        num_hidden_layers=3,  # global, local, local (global_attn_every_n_layers=3)
        local_attention=TINY_WINDOW,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
    summary="local/global",
    paradigm="tfm_encoder",
    classes={"ModernBertForMaskedLM": "TfmEncoderForMaskedLM", "ModernBertModel": "TfmEncoderModel"},
    config_class="ModernBertConfig",
    fields=field_names(
        "intermediate_size",
        "norm_bias",
        "mlp_bias",
        "attention_bias",
        hidden_activation="hidden_act",
        norm_eps="layer_norm_eps",
    ),
    fixed=dict(
        position_embedding_type="rope",
        numerics=["rope_in_float32"],  # ModernBERT upcasts queries and keys to rotate them
        freeze_pad_embedding=True,
        norm_type="layernorm",
        norm_position="pre",
        first_layer_attn_norm=False,
        embedding_norm=True,
        final_norm=True,
        ffn_type="glu",
        type_vocab_size=0,
        use_pooler=False,
    ),
    unread={
        "classifier_pooling": "read only by ModernBertForSequenceClassification",
        "classifier_dropout": "read only by the classification, token-classification and QA heads",
        "deterministic_flash_attn": "picks flash attention's deterministic kernel; the values are the same",
        "cls_token_id": "a tokenizer id; no ModernBERT class reads it (it goes back as bos_token_id, its default)",
        "classifier_bias": "a missing dense bias of the MLM head is converted as zeros, which give the same logits",
    },
    weights=Weights(
        renames=(
            (r"embeddings\.tok_embeddings\.", "embed_tokens."),
            (r"embeddings\.norm\.", "embed_norm."),
            (r"final_norm\.", "norm."),
            (r"\.attn\.Wqkv\.", ".self_attn.qkv."),
            (r"\.attn\.Wo\.", ".self_attn.o_proj."),
            (r"\.mlp_norm\.", ".ffn_norm."),
            (r"\.mlp\.Wi\.", ".mlp.gate_up."),
            (r"\.mlp\.Wo\.", ".mlp.down_proj."),
            (r"^head\.dense\.", "lm_head.dense."),
            (r"^head\.norm\.", "lm_head.norm."),
            (r"^decoder\.", "lm_head.decoder."),
        ),
        fused={
            "self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        },
    ),
    preset=dict(
        PRESET_SIZE,
        **PRESET_ENCODER_TOKENS,
        cls_token_id=1,
        sep_token_id=2,
        intermediate_size=352,
        local_attention=128,
    ),
    to_tfm=_modernbert_to_tfm,
    from_tfm=_modernbert_from_tfm,
    unread_of=_modernbert_unread,
    state_to_tfm=_zero_head_bias,
    reference_config=_head_bias_config,
)


# ---------------------------------------------------------------------------------------------------------- ELECTRA
# BERT's body with factorised embeddings: the tables and their LayerNorm are embedding_size wide and
# `embeddings_project` maps them to hidden_size (hf_tfm's embedding_size and embed_proj); no pooler. Its checkpoints
# come in two: the discriminator (`ElectraForPreTraining`, a replaced-token logit per token: hf_tfm's
# TfmEncoderForPreTraining) and the generator (`ElectraForMaskedLM`, whose head maps back to embedding_size before
# the tied table and always applies gelu).
def _electra_to_tfm(config) -> dict:
    # ELECTRA projects only when the widths differ; hf_tfm's embed_proj is there whenever embedding_size is set
    factorised = config.embedding_size != config.hidden_size
    return dict(
        embedding_dropout=config.hidden_dropout_prob,
        use_pooler=False,
        embedding_size=config.embedding_size if factorised else None,
    )


def _electra_from_tfm(config) -> dict:
    return _one_token_type("ElectraConfig")(config) | {"embedding_size": config.embedding_width()}


def _electra_unread(config) -> dict:
    summary = {
        name: "read only by ElectraForMultipleChoice's sequence summary, which hf_tfm does not convert"
        for name in ("summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout")
    }
    return summary | _bert_unread(config)


ELECTRA = Family(
    name="electra",
    tiny=dict(TINY_ENCODER, embedding_size=16, type_vocab_size=2, pad_token_id=0),
    paradigm="tfm_encoder",
    classes={
        "ElectraForPreTraining": "TfmEncoderForPreTraining",
        "ElectraForMaskedLM": "TfmEncoderForMaskedLM",
        "ElectraModel": "TfmEncoderModel",
        **heads_of("Electra", BERT_TOKEN_HEADS),  # its sequence classifier is a head of its own (gelu): not converted
    },
    config_class="ElectraConfig",
    fields=BERT_CLASSIFIER_FIELDS,
    fixed=BERT_ARCHITECTURE,
    weights=Weights(
        renames=(
            (r"^electra\.", "model."),
            (r"^generator_predictions\.dense\.", "lm_head.dense."),
            (r"^generator_predictions\.LayerNorm\.", "lm_head.norm."),
            (r"^generator_lm_head\.", "lm_head.decoder."),
            (r"embeddings_project\.", "embed_proj."),
            *BERT_BODY_RENAMES,
        ),
    ),
    preset=dict(PRESET_SIZE, embedding_size=64, intermediate_size=512, pad_token_id=0),
    summary="factorised embeddings; the discriminator as TfmEncoderForPreTraining",
    to_tfm=_electra_to_tfm,
    from_tfm=_electra_from_tfm,
    check=require_gelu_head("ELECTRA", "ElectraForMaskedLM"),
    unread_of=_electra_unread,
)


# ----------------------------------------------------------------------------------------------------------- ALBERT
# BERT's post-norm blocks with factorised embeddings (`embedding_hidden_mapping_in`: hf_tfm's embed_proj, there even
# when embedding_size is hidden_size) and cross-layer sharing: num_hidden_groups groups of inner_group_num blocks,
# layer i of num_hidden_layers running group int(i / (num_hidden_layers / num_hidden_groups)). hf_tfm runs the
# groups' blocks one by one (num_hidden_layers * inner_group_num layers) and numbers the distinct blocks
# group * inner_group_num + inner (`layer_sharing`). Dropout follows the attention output and the embeddings, never
# the feed-forward (ffn_dropout=0). The MLM head is BERT's mapped back to embedding_size, applying hidden_act.
def albert_order(layers: int, groups: int, inner: int) -> list[int]:
    """The distinct block each layer runs, as AlbertTransformer picks its group (the same float division)."""
    return [int(i / (layers / groups)) * inner + k for i in range(layers) for k in range(inner)]


def _runs_every_group(order: list[int], groups: int, inner: int) -> bool:
    """Whether `order` runs every block of ALBERT's `groups` groups (more groups than layers leave some unrun)."""
    return set(order) == set(range(groups * inner))


def _albert_groups(order: list[int]) -> tuple[int, int, int] | None:
    """(num_hidden_layers, num_hidden_groups, inner_group_num) whose blocks run in `order` (a single block per group
    where one fits), or None."""
    depth, blocks = len(order), max(order) + 1
    for inner in range(1, blocks + 1):
        if blocks % inner == 0 and depth % inner == 0:
            layers, groups = depth // inner, blocks // inner
            if groups <= layers and albert_order(layers, groups, inner) == order:
                return layers, groups, inner
    return None


def _albert_to_tfm(config, use_pooler: bool = True) -> dict:
    layers, groups, inner = config.num_hidden_layers, config.num_hidden_groups, config.inner_group_num
    order = albert_order(layers, groups, inner)
    if not _runs_every_group(order, groups, inner):
        raise ValueError(
            f"Cannot convert AlbertConfig exactly: num_hidden_groups={groups} for num_hidden_layers={layers} leaves "
            "groups that no layer runs, whose weights hf_tfm would not hold"
        )
    return dict(
        num_hidden_layers=len(order),
        layer_sharing=order if order != list(range(len(order))) else None,
        embedding_size=config.embedding_size,
        embedding_dropout=config.hidden_dropout_prob,
        ffn_dropout=0.0,
        use_pooler=use_pooler,
    )


def _albert_shape(config) -> tuple[int, int, int]:
    order = config.layer_sharing or list(range(config.num_hidden_layers))
    shape = _albert_groups(order)
    if shape is None:
        raise ValueError(
            f"Cannot convert layer_sharing={order} to AlbertConfig exactly: ALBERT's layer i of num_hidden_layers "
            "runs group int(i / (num_hidden_layers / num_hidden_groups)), each group inner_group_num blocks in turn"
        )
    return shape


def _albert_from_tfm(config) -> dict:
    _one_token_type("AlbertConfig")(config)
    if not config.factorised_embeddings():
        raise ValueError(
            "Cannot convert to AlbertConfig exactly: embedding_size=None, but ALBERT always maps its embeddings "
            "through a linear layer (embedding_hidden_mapping_in); set embedding_size"
        )
    layers, groups, inner = _albert_shape(config)
    return dict(
        num_hidden_layers=layers,
        num_hidden_groups=groups,
        inner_group_num=inner,
        embedding_size=config.embedding_size,
    )


def _albert_form(config):
    """One grouping for each order of blocks: a single block per group where one fits (a grouping that leaves
    groups unused stays as it is, for `_albert_to_tfm` to refuse)."""
    shape = config.num_hidden_layers, config.num_hidden_groups, config.inner_group_num
    order = albert_order(*shape)
    if not _runs_every_group(order, *shape[1:]):
        return config
    layers, groups, inner = _albert_groups(order)
    return config_with(config, num_hidden_layers=layers, num_hidden_groups=groups, inner_group_num=inner)


def _albert_layer_renames(config) -> tuple[tuple[str, str], ...]:
    inner = config.inner_group_num
    return tuple(
        (rf"encoder\.albert_layer_groups\.{group}\.albert_layers\.{k}\.", f"layers.{group * inner + k}.")
        for group in range(config.num_hidden_groups)
        for k in range(inner)
    )


ALBERT = Family(
    name="albert",
    tiny=dict(
        TINY_ENCODER,
        embedding_size=16,
        num_hidden_layers=3,
        num_hidden_groups=2,  # layers 0 and 1 run group 0, layer 2 group 1
        inner_group_num=2,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    ),
    paradigm="tfm_encoder",
    classes={"AlbertForMaskedLM": "TfmEncoderForMaskedLM", "AlbertModel": "TfmEncoderModel"},
    config_class="AlbertConfig",
    fields={theirs: ours for theirs, ours in BERT_FIELDS.items() if theirs != "num_hidden_layers"},
    fixed=BERT_ARCHITECTURE,
    unread={
        "classifier_dropout_prob": "read only by ALBERT's sentence-order, classification and multiple-choice heads",
    },
    weights=Weights(
        renames=(
            (r"^(albert\.)?pooler\.", r"\1pooler.dense."),
            (r"^albert\.", "model."),
            (r"^predictions\.dense\.", "lm_head.dense."),
            (r"^predictions\.LayerNorm\.", "lm_head.norm."),
            (r"^predictions\.decoder\.", "lm_head.decoder."),
            *BERT_BODY_RENAMES[:4],  # the embeddings
            (r"encoder\.embedding_hidden_mapping_in\.", "embed_proj."),
            (r"\.attention\.query\.", ".self_attn.q_proj."),
            (r"\.attention\.key\.", ".self_attn.k_proj."),
            (r"\.attention\.value\.", ".self_attn.v_proj."),
            (r"\.attention\.dense\.", ".self_attn.o_proj."),
            (r"\.attention\.LayerNorm\.", ".attn_norm."),
            (r"\.ffn\.", ".mlp.up_proj."),
            (r"\.ffn_output\.", ".mlp.down_proj."),
            (r"\.full_layer_layer_norm\.", ".ffn_norm."),
        ),
        copies={"predictions.bias": ("predictions.decoder.bias", ONE_DECODER_BIAS)},
    ),
    layer_renames=_albert_layer_renames,
    preset=dict(PRESET_SIZE, embedding_size=64, intermediate_size=512, pad_token_id=0, bos_token_id=2, eos_token_id=3),
    summary="factorised embeddings, blocks shared across depth",
    to_tfm=_albert_to_tfm,
    from_tfm=_albert_from_tfm,
    their_form=_albert_form,
    our_form=lambda config: config_with(config, ffn_dropout=config.ffn_dropout_probability()),
    options=_pooler_options,
    our_options=lambda config: {"use_pooler": config.use_pooler},
    reference_kwargs=_pooling_layer,
)


# ------------------------------------------------------------------------------------------------------- DeBERTa-v2
# BERT's post-norm blocks with disentangled attention (relative_attention: hf_tfm's position_embedding_type
# "disentangled"): a relative-position table of 2 * position_buckets rows (normed with norm_rel_ebd="layer_norm"),
# log-bucketed distances up to max_relative_positions, content-to-position and position-to-content scores
# (pos_att_type) from the layers' own key and query projections (share_att_key) or their own. The class of the
# DeBERTa-v3 checkpoints, which have no absolute positions (position_biased_input=False); without relative attention
# the absolute table is hf_tfm's learned positions. Its MLM head is BERT's (`legacy=True`, the default).
NORM_REL_EBD = "layer_norm"


def _deberta_norms(config) -> list[str]:
    return [part.strip() for part in getattr(config, "norm_rel_ebd", "none").lower().split("|")]


def _deberta_max_distance(config) -> int:
    return config.max_relative_positions if config.max_relative_positions >= 1 else config.max_position_embeddings


def _deberta_to_tfm(config) -> dict:
    refused = (
        (getattr(config, "conv_kernel_size", 0) > 0, "conv_kernel_size", "its convolution after the first layer"),
        (
            getattr(config, "embedding_size", config.hidden_size) != config.hidden_size,
            "embedding_size",
            "its embeddings projected before their norm",
        ),
        (
            config.relative_attention and config.position_biased_input,
            "position_biased_input",
            "absolute positions beside relative attention (hf_tfm's models take one position scheme)",
        ),
        (
            not config.relative_attention and bool(config.pos_att_type),
            "pos_att_type",
            "attention scores scaled for position terms without relative attention, which computes none",
        ),
        (
            not config.relative_attention and NORM_REL_EBD in _deberta_norms(config),
            "norm_rel_ebd",
            "a norm of a relative-position table without relative attention, whose weights nothing reads",
        ),
        (
            config.relative_attention and getattr(config, "position_buckets", -1) <= 0,
            "position_buckets",
            "relative positions without buckets (every DeBERTa-v2 and v3 checkpoint buckets them)",
        ),
    )
    for refuses, field, what in refused:
        if refuses:
            raise ValueError(
                f"Cannot convert DebertaV2Config exactly: {field}={getattr(config, field)!r} asks for {what}, which "
                "hf_tfm does not build"
            )
    common = dict(embedding_dropout=config.hidden_dropout_prob, use_pooler=False)
    if not config.relative_attention:
        return common | dict(position_embedding_type="learned" if config.position_biased_input else "none")
    return common | dict(
        position_embedding_type="disentangled",
        relative_attention_num_buckets=config.position_buckets,
        relative_attention_max_distance=_deberta_max_distance(config),
        pos_att_type=list(config.pos_att_type or []),
        share_att_key=getattr(config, "share_att_key", False),
        relative_embeddings_norm=NORM_REL_EBD in _deberta_norms(config),
    )


def _deberta_from_tfm(config) -> dict:
    scheme = config.position_embedding_type
    refused = (
        (
            scheme not in ("disentangled", "learned", "none"),
            "position_embedding_type",
            "disentangled, learned or none",
        ),
        (config.factorised_embeddings(), "embedding_size", "None: its embeddings are projected before their norm"),
    )
    for refuses, field, instead in refused:
        if refuses:
            raise ValueError(
                f"Cannot convert {field}={getattr(config, field)!r} to DebertaV2Config exactly; it takes {instead}"
            )
    if scheme != "disentangled":
        return dict(relative_attention=False, position_biased_input=scheme == "learned")
    return dict(
        relative_attention=True,
        position_biased_input=False,
        position_buckets=config.relative_attention_num_buckets,
        max_relative_positions=config.relative_attention_max_distance,
        pos_att_type=list(config.disentangled_terms()),
        share_att_key=config.share_att_key,
        norm_rel_ebd=NORM_REL_EBD if config.relative_embeddings_norm else "none",
    )


def _deberta_form(config):
    """Its defaults written out: the relative distance, the shared projections, the norm of the table."""
    if not config.relative_attention:
        return config_with(config, pos_att_type=config.pos_att_type or None)
    return config_with(
        config,
        max_relative_positions=_deberta_max_distance(config),
        share_att_key=getattr(config, "share_att_key", False),
        norm_rel_ebd=NORM_REL_EBD if NORM_REL_EBD in _deberta_norms(config) else "none",
    )


def _deberta_unread(config) -> dict:
    unread = dict.fromkeys(
        ("pooler_dropout", "pooler_hidden_act", "pooler_hidden_size"),
        "read only by DeBERTa's ContextPooler, in the classification and multiple-choice heads",
    )
    unread["legacy"] = "picks the masked-LM head's layout; hf_tfm converts the legacy one (the default)"
    if hasattr(config, "attention_head_size"):
        unread["attention_head_size"] = "DeBERTa's output projection needs it to be hidden_size // num_attention_heads"
    if not config.relative_attention:
        for name in ("max_relative_positions", "position_buckets", "share_att_key", "norm_rel_ebd"):
            unread[name] = "read by relative attention only"
    return unread


def _deberta_legacy_head(model) -> None:
    if "MaskedLM" in type(model).__name__ and not getattr(model.config, "legacy", True):
        raise ValueError(
            "Cannot convert DebertaV2ForMaskedLM with legacy=False exactly: hf_tfm converts the legacy masked-LM head "
            "(cls.predictions), DeBERTa-v2's default"
        )


DEBERTA_V2 = Family(
    name="deberta-v2",
    tiny=dict(
        TINY_ENCODER,
        relative_attention=True,
        position_biased_input=False,
        position_buckets=8,  # distances past 4 log-bucketed: the tests' rows reach 11
        max_relative_positions=-1,  # max_position_embeddings
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        pad_token_id=0,
    ),
    paradigm="tfm_encoder",
    classes={"DebertaV2ForMaskedLM": "TfmEncoderForMaskedLM", "DebertaV2Model": "TfmEncoderModel"},
    config_class="DebertaV2Config",
    fields=BERT_FIELDS,
    fixed=BERT_ARCHITECTURE,
    weights=Weights(
        renames=(
            (r"^deberta\.", "model."),
            *BERT_HEAD_RENAMES,
            *BERT_BODY_RENAMES[:4],  # the embeddings
            (r"encoder\.rel_embeddings\.", "position_bias.rel_embeddings."),
            (r"encoder\.LayerNorm\.", "position_bias.norm."),
            (r"encoder\.layer\.", "layers."),
            (r"\.attention\.self\.query_proj\.", ".self_attn.q_proj."),
            (r"\.attention\.self\.key_proj\.", ".self_attn.k_proj."),
            (r"\.attention\.self\.value_proj\.", ".self_attn.v_proj."),
            (r"\.attention\.self\.pos_key_proj\.", ".self_attn.pos_key_proj."),
            (r"\.attention\.self\.pos_query_proj\.", ".self_attn.pos_query_proj."),
            *BERT_BODY_RENAMES[8:],  # the blocks' output projections and norms
        ),
        copies={"cls.predictions.bias": ("cls.predictions.decoder.bias", ONE_DECODER_BIAS)},
    ),
    preset=dict(
        PRESET_SIZE,
        intermediate_size=512,
        relative_attention=True,
        position_biased_input=False,
        position_buckets=64,
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        **PRESET_ENCODER_TOKENS,
    ),
    summary="disentangled attention",
    to_tfm=_deberta_to_tfm,
    from_tfm=_deberta_from_tfm,
    their_form=_deberta_form,
    unread_of=_deberta_unread,
    check=_deberta_legacy_head,
)

ENCODERS = (BERT, ROBERTA, ELECTRA, ALBERT, DEBERTA_V2, MODERNBERT)
