"""Exact conversion between transformers' `BertModel` / `BertForMaskedLM` and `TfmEncoderModel` /
`TfmEncoderForMaskedLM`, both directions.

BERT is a post-norm encoder with a norm after the embeddings and none after the last block, learned absolute
positions, token types, a dense+tanh pooler and an MLM head (dense, act, norm, tied decoder with its own bias).
Every BERT linear layer is an `nn.Linear` like ours, so weights only change names.

Not carried over: `padding_idx` of BERT's word embeddings (it only zeroes that row's gradient in training).
"""

import copy

import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from .configuration_tfm import TfmEncoderConfig
from .convert_common import converted_config, field_names, inverted, load_exact, renamed_fields, renamed_modules
from .modeling_tfm import TfmEncoderForMaskedLM, TfmEncoderModel

# BertConfig field -> TfmEncoderConfig field, for every field with a direct counterpart
_CONFIG_NAMES = field_names(
    "intermediate_size",
    "hidden_act",
    "type_vocab_size",
    "layer_norm_eps",
    hidden_dropout_prob="hidden_dropout",
    attention_probs_dropout_prob="attention_dropout",
)
# what BERT always is, in TfmConfig terms
_BERT_ARCHITECTURE = dict(
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
)

# BERT module -> our module, inside one layer
_LAYER_NAMES = {
    "attention.self.query": "self_attn.q_proj",
    "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.o_proj",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "mlp.up_proj",
    "output.dense": "mlp.down_proj",
    "output.LayerNorm": "ffn_norm",
}
_EMBEDDING_NAMES = {
    "embeddings.word_embeddings": "embed_tokens",
    "embeddings.position_embeddings": "embed_positions",
    "embeddings.token_type_embeddings": "embed_token_types",
    "embeddings.LayerNorm": "embed_norm",
}
_MLM_NAMES = {
    "cls.predictions.transform.dense": "lm_head.dense",
    "cls.predictions.transform.LayerNorm": "lm_head.norm",
    "cls.predictions.decoder": "lm_head.decoder",
}


def _to_tfm(config: BertConfig, use_pooler: bool = True) -> TfmEncoderConfig:
    return TfmEncoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **_BERT_ARCHITECTURE,
        embedding_dropout=config.hidden_dropout_prob,
        use_pooler=use_pooler,
    )


def _to_bert(config: TfmEncoderConfig) -> BertConfig:
    if config.type_vocab_size == 0:  # BertConfig takes 0, but BertModel still looks up token type 0
        raise ValueError(
            f"Cannot convert {type(config).__name__} to BertConfig exactly: type_vocab_size=0, and BERT always adds "
            "a token-type embedding"
        )
    return BertConfig(**renamed_fields(config, inverted(_CONFIG_NAMES)))


def bert_config_to_tfm(config: BertConfig, use_pooler: bool = True) -> TfmEncoderConfig:
    irrelevant = {}
    if getattr(config, "position_embedding_type", "absolute") == "absolute":  # not a field since transformers 5
        irrelevant["position_embedding_type"] = "transformers 5's BERT only has absolute positions"
    if config.classifier_dropout == config.hidden_dropout_prob:  # what hf_tfm's classifier heads drop out with
        config = copy.deepcopy(config)
        config.classifier_dropout = None
    return converted_config(config, lambda bert: _to_tfm(bert, use_pooler), _to_bert, irrelevant=irrelevant)


def tfm_config_to_bert(config: TfmEncoderConfig) -> BertConfig:
    # BertModel takes its pooler as an argument (add_pooling_layer): the config keeps whichever the model has
    return converted_config(config, _to_bert, lambda bert: _to_tfm(bert, config.use_pooler))


def _module_names(
    num_layers: int, mlm: bool, pooler: bool, base: str = "bert.", mlm_names: dict[str, str] = _MLM_NAMES
) -> dict[str, str]:
    """Every BERT module holding weights -> our module, with each side's prefix for the model class (`base`: the
    encoder's prefix under an MLM head; RoBERTa passes its own, and its head's `mlm_names`)."""
    theirs, ours = (base, "model.") if mlm else ("", "")
    names = {theirs + bert: ours + tfm for bert, tfm in _EMBEDDING_NAMES.items()}
    for i in range(num_layers):
        names.update({f"{theirs}encoder.layer.{i}.{b}": f"{ours}layers.{i}.{t}" for b, t in _LAYER_NAMES.items()})
    if pooler:
        names[theirs + "pooler.dense"] = ours + "pooler.dense"
    if mlm:
        names.update(mlm_names)
    return names


def bert_to_tfm(model: BertModel | BertForMaskedLM) -> TfmEncoderModel | TfmEncoderForMaskedLM:
    """Convert a `BertModel` (-> `TfmEncoderModel`) or `BertForMaskedLM` (-> `TfmEncoderForMaskedLM`) with
    identical outputs, pooler included."""
    mlm = isinstance(model, BertForMaskedLM)
    if not mlm and not isinstance(model, BertModel):
        raise TypeError(f"bert_to_tfm converts BertModel or BertForMaskedLM, got {type(model).__name__}")
    source = model.state_dict()
    if mlm and not torch.equal(source["cls.predictions.bias"], source["cls.predictions.decoder.bias"]):
        # tied configs share these; an untied BERT keeps two, and only `decoder.bias` reaches the logits
        raise ValueError(
            "Cannot convert BertForMaskedLM to TfmEncoderForMaskedLM exactly: cls.predictions.bias differs from "
            "cls.predictions.decoder.bias, and TfmMaskedLMHead holds a single decoder bias"
        )
    pooler = not mlm and model.pooler is not None
    config = bert_config_to_tfm(model.config, use_pooler=mlm or pooler)
    state = renamed_modules(source, _module_names(config.num_hidden_layers, mlm, pooler))
    target = TfmEncoderForMaskedLM(config) if mlm else TfmEncoderModel(config)
    return load_exact(target, state)


def tfm_to_bert(model: TfmEncoderModel | TfmEncoderForMaskedLM) -> BertModel | BertForMaskedLM:
    """Convert a BERT-shaped `TfmEncoderModel` (-> `BertModel`) or `TfmEncoderForMaskedLM` (-> `BertForMaskedLM`)
    back, with identical outputs."""
    mlm = isinstance(model, TfmEncoderForMaskedLM)
    if not mlm and not isinstance(model, TfmEncoderModel):
        raise TypeError(f"tfm_to_bert converts TfmEncoderModel or TfmEncoderForMaskedLM, got {type(model).__name__}")
    config = tfm_config_to_bert(model.config)
    pooler = not mlm and model.pooler is not None
    source = model.state_dict()
    state = renamed_modules(source, inverted(_module_names(config.num_hidden_layers, mlm, pooler)))
    if mlm:
        state["cls.predictions.bias"] = source["lm_head.decoder.bias"]
        target = BertForMaskedLM(config)
    else:
        target = BertModel(config, add_pooling_layer=pooler)
    return load_exact(target, state)
