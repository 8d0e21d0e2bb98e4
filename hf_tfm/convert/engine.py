"""The one conversion engine: any family record (`hf_tfm.convert.families`) run both ways, exactly.

    from hf_tfm.convert import to_tfm, from_tfm
    ours = to_tfm(LlamaForCausalLM.from_pretrained(...))      # the family is found from the class
    theirs = from_tfm(ours, "llama")                            # back to the family named

Configs go through `converted_config` (the round trip must give the config again, every key compared, or the error
names each field that would change); weights through the record's `Weights` (renames, transposes, fused splits,
alternating gate/up rows, kept copies), inverted for the way back by mapping the reference model's own keys;
`load_exact` refuses any missing or unexpected tensor.
"""

import dataclasses
import functools
import re
import types
import typing

import torch
import transformers
from torch import nn

from ..model import modeling_tfm
from ..model.configuration_tfm import PARADIGM_CONFIGS, TfmConfig, TfmEncoderConfig
from .common import (
    config_with,
    converted_config,
    encoder_decoder_of,
    encoder_of,
    inverted,
    load_exact,
    renamed_fields,
    require_paradigm,
)
from .families import FAMILIES
from .qkv import join_qkv, split_qkv
from .record import Family, Weights

__all__ = ["config_from_tfm", "config_to_tfm", "family", "from_tfm", "to_tfm", "weights_from_tfm", "weights_to_tfm"]


# ------------------------------------------------------------------------------------------------ finding a record


def family(name: str) -> Family:
    """The record named `name` (a transformers model_type)."""
    if name not in FAMILIES:
        raise ValueError(f"no converted family {name!r}; hf_tfm converts {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of_model(model: nn.Module) -> Family:
    """The record whose reference classes include `model`'s."""
    found = type(model).__name__
    for record in FAMILIES.values():
        if found in record.classes:
            return record
    known = ", ".join(name for record in FAMILIES.values() for name in record.classes)
    raise TypeError(f"to_tfm converts {known}; got {found}")


# ---------------------------------------------------------------------------------------------------------- configs


def task_fields(config) -> dict:
    """What a config says of a task head's labels (their names, hence their number, and the loss they take): every
    config has them, a classification head reads them, and they go across as they are."""
    return {name: getattr(config, name) for name in ("id2label", "label2id", "problem_type")}


def _to_tfm_config(record: Family, config, **options) -> TfmConfig:
    computed = record.to_tfm(config, **options) if record.to_tfm else {}
    # computed fields win over fixed ones (RoBERTa's position offset is BERT's architecture but for the offset)
    fields = renamed_fields(config, record.fields) | task_fields(config)
    return PARADIGM_CONFIGS[record.paradigm](**fields, **(record.fixed | computed))


def _from_tfm_config(record: Family, config: TfmConfig):
    require_paradigm(config, PARADIGM_CONFIGS[record.paradigm], record.config_class)
    computed = record.from_tfm(config) if record.from_tfm else {}
    config_class = getattr(transformers, record.config_class)
    fields = renamed_fields(config, inverted(record.fields)) | task_fields(config)
    return config_class(**as_declared(config_class, fields), **as_declared(config_class, computed))


@functools.cache
def _floats_only(config_class: type) -> frozenset[str]:
    """The fields `config_class` types as a float alone (or None)."""
    return frozenset(
        field.name
        for field in dataclasses.fields(config_class)
        if set(typing.get_args(field.type) or (field.type,)) - {types.NoneType} == {float}
    )


def as_declared(config_class: type, fields: dict) -> dict:
    """`fields` with an integer given for a field `config_class` types as a float alone written as a float:
    hf_tfm's numeric fields take both (as transformers' dropouts do, since a config.json may say 0), some
    references' strict fields refuse an int (Mixtral's `router_jitter_noise`, Gemma 2's soft caps)."""
    floats_only = _floats_only(config_class)
    return {
        name: float(value) if name in floats_only and type(value) is int else value for name, value in fields.items()
    }


def config_to_tfm(config, **options) -> TfmConfig:
    """A reference config as hf_tfm's, refused (naming each field) when the round trip would change it. `options`:
    what the family keeps outside its config (`use_pooler` for BERT and RoBERTa, `tie_word_embeddings` for T5)."""
    record = family(config.model_type)
    unread = record.unread | (record.unread_of(config) if record.unread_of else {})
    compared = record.their_form(config) if record.their_form else config
    return converted_config(
        compared,
        lambda theirs: _to_tfm_config(record, theirs, **options),
        lambda ours: _from_tfm_config(record, ours),
        irrelevant=unread,
    )


def config_from_tfm(config: TfmConfig, name: str):
    """An hf_tfm config as family `name`'s, refused (naming each field) when the round trip would change it."""
    record = family(name)
    compared = record.our_form(config) if record.our_form else config
    options = record.our_options(compared) if record.our_options else {}
    return converted_config(
        compared,
        lambda ours: _from_tfm_config(record, ours),
        lambda theirs: _to_tfm_config(record, theirs, **options),
        irrelevant=record.our_unread,
    )


# ---------------------------------------------------------------------------------------------------------- weights


def _renamed(weights: Weights, key: str) -> str:
    for pattern, replacement in weights.renames:
        key = re.sub(pattern, replacement, key)
    return key


def _parts(weights: Weights, key: str) -> list[str] | None:
    """hf_tfm's keys a fused hf_tfm-named `key` holds, in row order; None for a key that is not fused."""
    module, _, leaf = key.rpartition(".")
    for fused, parts in weights.fused.items():
        if module == fused or module.endswith("." + fused):
            prefix = module[: len(module) - len(fused)]
            return [f"{prefix}{part}.{leaf}" for part in parts]
    return None


def _split(weights: Weights, tensor: torch.Tensor, rows: list[int], heads: int) -> tuple[torch.Tensor, ...]:
    if not weights.interleaved:
        return tensor.split(rows)
    per_head = tensor.reshape(heads, len(rows), -1, *tensor.shape[1:])  # [heads, parts, head_dim, ...]
    return tuple(per_head[:, i].reshape(-1, *tensor.shape[1:]) for i in range(len(rows)))


def _joined(weights: Weights, tensors: list[torch.Tensor], heads: int) -> torch.Tensor:
    if not weights.interleaved:
        return torch.cat(tensors)
    per_head = [tensor.reshape(heads, -1, *tensor.shape[1:]) for tensor in tensors]
    return torch.stack(per_head, dim=1).reshape(-1, *tensors[0].shape[1:])


def _transposed(weights: Weights, key: str) -> bool:
    """Whether the reference tensor `key` is stored `[in, out]`."""
    return weights.transposed is not None and re.search(weights.transposed, key) is not None


def _alternation(weights: Weights, key: str) -> int | None:
    """The axis along which the reference tensor `key`'s gate and up rows alternate, if they do."""
    return next((axis for pattern, axis in weights.alternating if re.search(pattern, key)), None)


def _stacked(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    """Alternating gate and up rows (g0, u0, g1, u1...) along `axis` -> all gate rows, then all up rows."""
    axis %= tensor.dim()
    rows = tensor.unflatten(axis, (-1, 2))
    return torch.cat([rows.select(axis + 1, 0), rows.select(axis + 1, 1)], dim=axis)


def _alternated(tensor: torch.Tensor, axis: int) -> torch.Tensor:
    """The inverse of `_stacked`."""
    axis %= tensor.dim()
    gate, up = tensor.chunk(2, dim=axis)
    return torch.stack([gate, up], dim=axis + 1).flatten(axis, axis + 1)


def _expert_slot(weights: Weights, key: str) -> tuple[str, int] | None:
    """(the stacked hf_tfm key, the index in it) for an hf_tfm-named `key` that `weights.stacked` matches."""
    found = re.match(weights.stacked, key) if weights.stacked else None
    return None if found is None else (f"{found[1]}.{found[3]}", int(found[2]))


def _stack(slots: dict[str, dict[int, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each stacked key's tensors joined along a new first axis, in index order (every index from 0 present)."""
    state = {}
    for key, tensors in slots.items():
        if sorted(tensors) != list(range(len(tensors))):
            raise ValueError(f"Cannot stack {key}: indices {sorted(tensors)} are not 0 to {len(tensors) - 1}")
        state[key] = torch.stack([tensors[index] for index in range(len(tensors))])
    return state


def _fitted(tensor: torch.Tensor, expected: torch.Tensor | None) -> torch.Tensor:
    """`tensor` with `expected`'s axes of size 1 where the two differ only by such axes (BART's `final_logits_bias`
    is `[1, vocab]`, hf_tfm's head bias `[vocab]`). The sizes stay the tensor's own: a padded vocabulary is cut
    later, by `load_exact`."""
    if expected is None or tensor.shape == expected.shape:
        return tensor
    sizes = [size for size in tensor.shape if size != 1]
    if len(sizes) != sum(size != 1 for size in expected.shape):
        return tensor
    sizes = iter(sizes)
    return tensor.reshape([1 if size == 1 else next(sizes) for size in expected.shape])


def _require_copies(weights: Weights, source: dict, model: nn.Module, target: nn.Module) -> None:
    for key, (original, reason) in weights.copies.items():
        if key in source and not torch.equal(source[key], source[original]):
            raise ValueError(
                f"Cannot convert {type(model).__name__} to {type(target).__name__} exactly: {key} differs from "
                f"{original}, and {reason}"
            )


def weights_to_tfm(weights: Weights, source: dict, target: nn.Module) -> dict:
    """A reference state dict in hf_tfm's names and layout, for `target` (whose parameters give the fused parts'
    rows; records name q, k and v apart, joined at the end for a target with `fused_qkv_proj`)."""
    own, heads = target.state_dict(), target.config.num_attention_heads
    expected = split_qkv(own, target.config)
    state, slots = {}, {}
    for key, tensor in source.items():
        if key in weights.copies:
            continue
        if _transposed(weights, key):
            tensor = tensor.transpose(-2, -1)
        if (axis := _alternation(weights, key)) is not None:
            tensor = _stacked(tensor, axis)
        ours = _renamed(weights, key)
        if (slot := _expert_slot(weights, ours)) is not None:
            slots.setdefault(slot[0], {})[slot[1]] = tensor
            continue
        parts = _parts(weights, ours)
        if parts is None:
            state[ours] = _fitted(tensor, expected.get(ours))
            continue
        missing = [part for part in parts if part not in expected]
        if missing:
            raise ValueError(f"Converted weights do not fit {type(target).__name__}: {key} has no parts {missing}")
        state.update(zip(parts, _split(weights, tensor, [expected[part].shape[0] for part in parts], heads)))
    return join_qkv(state | _stack(slots), own.keys())


def weights_from_tfm(weights: Weights, source: dict, target: nn.Module, heads: int) -> dict:
    """An hf_tfm state dict in the reference `target`'s names and layout: each of its keys mapped the way in."""
    state, expected = {}, target.state_dict()
    for key in expected:
        if key in weights.copies:
            continue
        ours = _renamed(weights, key)
        parts = _parts(weights, ours)
        if (slot := _expert_slot(weights, ours)) is not None:
            stacked = source.get(slot[0])
            tensor = None if stacked is None or slot[1] >= stacked.shape[0] else stacked[slot[1]]
        elif parts is None:
            tensor = source.get(ours)
        elif all(part in source for part in parts):
            tensor = _joined(weights, [source[part] for part in parts], heads)
        else:
            tensor = None
        if tensor is None:
            continue  # load_exact names it
        if (axis := _alternation(weights, key)) is not None:
            tensor = _alternated(tensor, axis)
        if _transposed(weights, key):
            tensor = tensor.transpose(-2, -1)
        state[key] = _fitted(tensor, expected[key])
    for key, (original, _) in weights.copies.items():
        if original in state and key in expected:  # an encoder-only class holds no decoder copy
            state[key] = state[original]
    return state


# ----------------------------------------------------------------------------------------------------------- models


def tfm_model_for(model: nn.Module) -> nn.Module:
    """hf_tfm's model for a reference model (its class and configuration), with its own fresh weights: what `to_tfm`
    fills, and what benchmarks/trace.py runs on fake weights."""
    record = family_of_model(model)
    encoder_only = record.encoder_only(type(model).__name__)
    # an encoder-only class (T5EncoderModel) marks its config as no encoder-decoder, which the family's config is
    their_config = config_with(model.config, is_encoder_decoder=True) if encoder_only else model.config
    config = config_to_tfm(their_config, **(record.options(model) if record.options else {}))
    if encoder_only:
        config = encoder_of(config)
    return getattr(modeling_tfm, record.classes[type(model).__name__])(config)


def to_tfm(model: nn.Module) -> nn.Module:
    """A reference model (any class a family record lists) as hf_tfm's, with identical outputs."""
    record = family_of_model(model)
    if record.check:
        record.check(model)
    target = tfm_model_for(model)
    source, weights = model.state_dict(), record.weights_for(model.config, type(model).__name__)
    _require_copies(weights, source, model, target)
    state = weights_to_tfm(weights, source, target)
    if record.state_to_tfm:
        record.state_to_tfm(model, state)
    return load_exact(target, state, generation_config=getattr(model, "generation_config", None))


def from_tfm(model: nn.Module, name: str) -> nn.Module:
    """An hf_tfm model as family `name`'s reference class, with identical outputs."""
    record = family(name)
    reference = {ours: theirs for theirs, ours in record.classes.items()}.get(type(model).__name__)
    if reference is None:
        raise TypeError(
            f"from_tfm to {name} converts {' or '.join(dict.fromkeys(record.classes.values()))}, "
            f"got {type(model).__name__}"
        )
    if record.check:
        record.check(model)
    config = model.config
    if isinstance(config, TfmEncoderConfig) and config.use_pooler and getattr(model, "pooler", None) is None:
        config = config_with(config, use_pooler=False)  # says nothing about a model without a pooler (an MLM head)
    their_config = config_from_tfm(encoder_decoder_of(config) if record.encoder_only(reference) else config, name)
    if record.reference_config:
        their_config = record.reference_config(model, their_config)
    target = getattr(transformers, reference)(
        their_config, **(record.reference_kwargs(model) if record.reference_kwargs else {})
    )
    if record.prepare_reference:
        record.prepare_reference(model, target)
    source = split_qkv(model.state_dict(), config)  # records name q, k and v apart (hf_tfm/convert/qkv.py)
    weights = record.weights_for(their_config, reference)
    state = weights_from_tfm(weights, source, target, config.num_attention_heads)
    # every tensor is given, ties included: loading re-ties nothing (T5's config claims a tie its tensors may lack)
    return load_exact(target, state, tie=False, generation_config=getattr(model, "generation_config", None))
