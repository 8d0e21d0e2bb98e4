"""Exact conversion between transformers' `RobertaModel` / `RobertaForMaskedLM` and `TfmEncoderModel` /
`TfmEncoderForMaskedLM`, both directions.

RoBERTa is BERT with other positions and other names around the same layers. Its positions count only the
non-padding tokens and start after the padding id: a real token at count c (1-based) reads table row
`c + pad_token_id`, padding reads row `pad_token_id`. In hf_tfm that is `position_ids_from_padding` with
`position_offset = pad_token_id + 1` and a table of `max_position_embeddings + position_offset` rows, so hf_tfm's
`max_position_embeddings` is RoBERTa's minus the offset. Without `position_ids` both derive them the same way;
explicit `position_ids` differ: RoBERTa reads them as table rows, hf_tfm as positions (row = id + offset).

The MLM head is BERT's with RoBERTa's names, except that its activation is always gelu (BERT's follows
`hidden_act`): a `RobertaForMaskedLM` whose `hidden_act` is not gelu is refused.

Not carried over: `padding_idx` of RoBERTa's word and position embeddings (it only zeroes those rows' gradients).
"""

import copy

import torch
from transformers import RobertaConfig, RobertaForMaskedLM, RobertaModel

from .configuration_tfm import TfmEncoderConfig
from .convert_bert import _BERT_ARCHITECTURE
from .convert_bert import _CONFIG_NAMES as _BERT_CONFIG_NAMES
from .convert_bert import _module_names as _bert_module_names
from .convert_common import converted_config, inverted, load_exact, renamed_fields, renamed_modules
from .modeling_tfm import TfmEncoderForMaskedLM, TfmEncoderModel

# RobertaConfig field -> TfmEncoderConfig field: BERT's, but for the position table (its size includes the offset)
_CONFIG_NAMES = {theirs: ours for theirs, ours in _BERT_CONFIG_NAMES.items() if theirs != "max_position_embeddings"}
_MLM_NAMES = {
    "lm_head.dense": "lm_head.dense",
    "lm_head.layer_norm": "lm_head.norm",
    "lm_head.decoder": "lm_head.decoder",
}
MLM_HEAD_ACT = "gelu"  # RobertaLMHead calls gelu whatever hidden_act says


def _to_tfm(config: RobertaConfig, use_pooler: bool) -> TfmEncoderConfig:
    if config.pad_token_id is None:
        raise ValueError("Cannot convert RobertaConfig: pad_token_id=None, but RoBERTa's positions count from it")
    offset = config.pad_token_id + 1
    # BERT's architecture, with positions counted over the real tokens from pad_token_id + 1
    architecture = {**_BERT_ARCHITECTURE, "position_ids_from_padding": True, "position_offset": offset}
    return TfmEncoderConfig(
        **renamed_fields(config, _CONFIG_NAMES),
        **architecture,
        max_position_embeddings=config.max_position_embeddings - offset,
        embedding_dropout=config.hidden_dropout_prob,
        use_pooler=use_pooler,
    )


def _to_roberta(config: TfmEncoderConfig) -> RobertaConfig:
    if config.type_vocab_size == 0:  # RobertaConfig takes 0, but RobertaModel still looks up token type 0
        raise ValueError(
            f"Cannot convert {type(config).__name__} to RobertaConfig exactly: type_vocab_size=0, and RoBERTa always "
            "adds a token-type embedding"
        )
    return RobertaConfig(
        **renamed_fields(config, inverted(_CONFIG_NAMES)),
        max_position_embeddings=config.max_position_embeddings + config.position_offset,
    )


def roberta_config_to_tfm(config: RobertaConfig, use_pooler: bool = True) -> TfmEncoderConfig:
    """`use_pooler`: whether the converted model gets BERT's pooler (RoBERTa keeps that choice out of its config,
    in `RobertaModel(add_pooling_layer=...)`)."""
    irrelevant = {}
    if getattr(config, "position_embedding_type", "absolute") == "absolute":  # not a field since transformers 5
        irrelevant["position_embedding_type"] = "transformers 5's RoBERTa only has absolute positions"
    if config.classifier_dropout == config.hidden_dropout_prob:  # what hf_tfm's classifier heads drop out with
        config = copy.deepcopy(config)
        config.classifier_dropout = None
    return converted_config(config, lambda source: _to_tfm(source, use_pooler), _to_roberta, irrelevant)


def tfm_config_to_roberta(config: TfmEncoderConfig) -> RobertaConfig:
    return converted_config(config, _to_roberta, lambda back: _to_tfm(back, config.use_pooler))


def _require_gelu_head(config, target: str) -> None:
    if config.hidden_act != MLM_HEAD_ACT:
        raise ValueError(
            f"Cannot convert {type(config).__name__} to {target} exactly: hidden_act={config.hidden_act!r}, but "
            "RoBERTa's MLM head always applies gelu and hf_tfm's applies hidden_act"
        )


def _module_names(num_layers: int, mlm: bool, pooler: bool) -> dict[str, str]:
    """Every RoBERTa module holding weights -> our module: BERT's, under other prefixes and MLM head names."""
    return _bert_module_names(num_layers, mlm, pooler, base="roberta.", mlm_names=_MLM_NAMES)


def roberta_to_tfm(model: RobertaModel | RobertaForMaskedLM) -> TfmEncoderModel | TfmEncoderForMaskedLM:
    """Convert a `RobertaModel` (-> `TfmEncoderModel`) or `RobertaForMaskedLM` (-> `TfmEncoderForMaskedLM`) with
    identical outputs, pooler included."""
    mlm = isinstance(model, RobertaForMaskedLM)
    if not mlm and not isinstance(model, RobertaModel):
        raise TypeError(f"roberta_to_tfm converts RobertaModel or RobertaForMaskedLM, got {type(model).__name__}")
    source = model.state_dict()
    if mlm:
        _require_gelu_head(model.config, "TfmEncoderForMaskedLM")
        if not torch.equal(source["lm_head.bias"], source["lm_head.decoder.bias"]):
            # tied configs share these; an untied RoBERTa keeps two, and only `decoder.bias` reaches the logits
            raise ValueError(
                "Cannot convert RobertaForMaskedLM to TfmEncoderForMaskedLM exactly: lm_head.bias differs from "
                "lm_head.decoder.bias, and TfmMaskedLMHead holds a single decoder bias"
            )
    pooler = not mlm and model.pooler is not None
    config = roberta_config_to_tfm(model.config, use_pooler=mlm or pooler)
    state = renamed_modules(source, _module_names(config.num_hidden_layers, mlm, pooler))
    target = TfmEncoderForMaskedLM(config) if mlm else TfmEncoderModel(config)
    return load_exact(target, state)


def tfm_to_roberta(model: TfmEncoderModel | TfmEncoderForMaskedLM) -> RobertaModel | RobertaForMaskedLM:
    """Convert a RoBERTa-shaped `TfmEncoderModel` (-> `RobertaModel`) or `TfmEncoderForMaskedLM`
    (-> `RobertaForMaskedLM`) back, with identical outputs."""
    mlm = isinstance(model, TfmEncoderForMaskedLM)
    if not mlm and not isinstance(model, TfmEncoderModel):
        raise TypeError(
            f"tfm_to_roberta converts TfmEncoderModel or TfmEncoderForMaskedLM, got {type(model).__name__}"
        )
    if mlm:
        _require_gelu_head(model.config, "RobertaForMaskedLM")
    config = tfm_config_to_roberta(model.config)
    pooler = not mlm and model.pooler is not None
    source = model.state_dict()
    state = renamed_modules(source, inverted(_module_names(config.num_hidden_layers, mlm, pooler)))
    if mlm:
        state["lm_head.bias"] = source["lm_head.decoder.bias"]
        target = RobertaForMaskedLM(config)
    else:
        target = RobertaModel(config, add_pooling_layer=pooler)
    return load_exact(target, state)
