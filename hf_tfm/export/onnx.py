"""ONNX export of hf_tfm models with dynamic batch and length, decoders with their KV cache, and a greedy loop over
onnxruntime that generates what `generate()` generates.

    from hf_tfm.export.onnx import export_onnx, OnnxGreedy
    export_onnx(model, "model-onnx")                  # model.onnx (or encoder.onnx + decoder*.onnx)
    tokens = OnnxGreedy("model-onnx").generate(input_ids, attention_mask, max_new_tokens=20)

Graphs, in optimum's ONNX Runtime layout (inputs `past_key_values.{i}.key/value`, outputs `present.{i}.key/value`):

| model | files | inputs -> outputs |
|---|---|---|
| decoder-only LM | `model.onnx` | input_ids, attention_mask (past + new), position_ids, past -> logits, present |
| encoder (any head) | `model.onnx` | input_ids, attention_mask -> the head's logits, or the body's hidden states |
| encoder-decoder | `encoder.onnx` | input_ids, attention_mask -> last_hidden_state |
| | `decoder.onnx` | decoder_input_ids, encoder_hidden_states, attention_mask -> logits, present (self and cross) |
| | `decoder_with_past.onnx` | decoder_input_ids, attention_mask, past (self and cross) -> logits, present (self) |

Exported with `torch.onnx.export(dynamo=True)`; the cache inside the graph is transformers' own DynamicCache /
EncoderDecoderCache, filled from the past inputs. optimum's exporter was not used: it needs a per-architecture
OnnxConfig for every hf_tfm variant (position scheme, MoE, attention options), and its generation loop
(ORTModelForCausalLM) is then the only consumer; the plain exporter covers every option hf_tfm has.
"""

import json
from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ..compat import CACHE_NAME

PAST = "past_key_values.{}.{}"
PRESENT = "present.{}.{}"


def _cache_names(prefix: str, layers: int, cross: bool = False) -> list[str]:
    kinds = ("key", "value", "cross_key", "cross_value") if cross else ("key", "value")
    return [prefix.format(i, kind) for i in range(layers) for kind in kinds]


def _filled_cache(past: tuple[torch.Tensor, ...], layers: int) -> DynamicCache:
    cache = DynamicCache()
    for i in range(layers):
        cache.update(past[2 * i], past[2 * i + 1], i)
    return cache


def _flat(cache: DynamicCache) -> list[torch.Tensor]:
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


class DecoderWithPast(torch.nn.Module):
    """A causal LM as a pure function of tensors: the cache comes in as past tensors and leaves as present ones."""

    def __init__(self, model):
        super().__init__()
        self.model, self.layers = model, model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = _filled_cache(past, self.layers)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{CACHE_NAME: cache},
        )
        return (outputs.logits, *_flat(cache))


class EncoderOnly(torch.nn.Module):
    """An encoder (body or head) returning the output fields `names` (the head's logits: `logits`, or extractive
    QA's `start_logits` and `end_logits`; the body's `last_hidden_state` and `pooler_output`)."""

    def __init__(self, model, names: list[str] | None = None):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids, attention_mask):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return tuple(outputs[name] for name in self.names)


def encoder_output_names(model, example: dict) -> list[str]:
    with torch.no_grad():
        outputs = model(**example)
    return [name for name in outputs if name.endswith("logits") or name in ("last_hidden_state", "pooler_output")]


class Seq2SeqEncoder(EncoderOnly):
    def forward(self, input_ids, attention_mask):
        return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Seq2SeqDecoder(torch.nn.Module):
    """The decoder's first step (no past: cross-attention keys and values computed from the encoder output), or a
    later one (`with_past`: self and cross keys and values given)."""

    def __init__(self, model, with_past: bool):
        super().__init__()
        self.model, self.with_past = model, with_past
        self.layers = model.config.decoder_layers

    def forward(self, decoder_input_ids, attention_mask, encoder_hidden_states, *past):
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for i in range(self.layers if self.with_past else 0):
            self_cache.update(past[4 * i], past[4 * i + 1], i)
            cross_cache.update(past[4 * i + 2], past[4 * i + 3], i)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        outputs = self.model(
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=(encoder_hidden_states,),
            use_cache=True,
            **{CACHE_NAME: cache},
        )
        present = []
        for i in range(self.layers):
            present += [cache.self_attention_cache.layers[i].keys, cache.self_attention_cache.layers[i].values]
            if not self.with_past:
                present += [cache.cross_attention_cache.layers[i].keys, cache.cross_attention_cache.layers[i].values]
        return (outputs.logits, *present)


def _export(module, args: tuple, names: list[str], outputs: list[str], dynamic: dict, path: Path) -> None:
    named = [name for name in names if not name.startswith("past_key_values.")]
    past = tuple(dynamic.get(name) for name in names[len(named) :])  # forward(..., *past): one group
    shapes = (*(dynamic.get(name) for name in named), past) if past else tuple(dynamic.get(name) for name in named)
    program = torch.onnx.export(
        module, args, dynamo=True, input_names=names, output_names=outputs, dynamic_shapes=shapes, verbose=False
    )
    program.save(str(path))


def _kv_shape(config, batch: int, length: int) -> tuple[int, ...]:
    return (batch, config.num_key_value_heads, length, config.head_dim)


def export_onnx(model, folder) -> Path:
    """Export `model` (any hf_tfm head, in eval mode) into `folder` as the graphs in this module's table, with
    dynamic batch, length and cache length, plus `onnx_export.json` naming them. The graphs are traced with eager
    attention and batched_mm experts (the same function: onnxruntime fuses it its own way), as torch 2.13's ONNX
    decompositions fail on sdpa with an additive bias (ALiBi, T5's relative bias) and have no ONNX function for
    transformers' grouped_mm operator; the model's own choices and its training mode are restored afterwards."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    attention, training = model.config._attn_implementation, model.training
    experts = getattr(model.config, "_experts_implementation", None) if model.config.has_moe_layers() else None
    model.eval().set_attn_implementation("eager")
    if experts is not None:
        model.set_experts_implementation("batched_mm")
    try:
        return _export_graphs(model, folder)
    finally:
        model.set_attn_implementation(attention)
        if experts is not None:
            model.set_experts_implementation(experts)
        model.train(training)


def _export_graphs(model, folder: Path) -> Path:
    config = model.config
    batch, length, past = torch.export.Dim("batch"), torch.export.Dim("length"), torch.export.Dim("past_length")
    total = torch.export.Dim("total_length")
    example_ids = torch.full((2, 5), 3, dtype=torch.long)
    mask = torch.ones(2, 5, dtype=torch.long)
    if config.is_encoder_decoder:
        kind = "encoder-decoder"
        _export(
            Seq2SeqEncoder(model),
            (example_ids, mask),
            ["input_ids", "attention_mask"],
            ["last_hidden_state"],
            {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}},
            folder / "encoder.onnx",
        )
        layers = config.decoder_layers
        encoder_length = torch.export.Dim("encoder_length")
        hidden = torch.zeros(2, 5, config.hidden_size)
        common = {
            "attention_mask": {0: batch, 1: encoder_length},
            "encoder_hidden_states": {0: batch, 1: encoder_length},
        }
        first_present = _cache_names(PRESENT, layers, cross=True)
        _export(
            Seq2SeqDecoder(model, with_past=False),
            (example_ids[:, :3], mask, hidden),
            ["decoder_input_ids", "attention_mask", "encoder_hidden_states"],
            ["logits", *first_present],
            {"decoder_input_ids": {0: batch, 1: length}, **common},
            folder / "decoder.onnx",
        )
        past_names = _cache_names(PAST, layers, cross=True)
        kv = _kv_shape(config, 2, 3)
        cross_kv = _kv_shape(config, 2, 5)
        past_tensors = [torch.zeros(cross_kv if "cross" in name else kv) for name in past_names]
        dynamic = {"decoder_input_ids": {0: batch}, **common}
        dynamic.update({n: {0: batch, 2: encoder_length if "cross" in n else past} for n in past_names})
        _export(
            Seq2SeqDecoder(model, with_past=True),
            (example_ids[:, :1], mask, hidden, *past_tensors),
            ["decoder_input_ids", "attention_mask", "encoder_hidden_states", *past_names],
            ["logits", *_cache_names(PRESENT, layers)],
            dynamic,
            folder / "decoder_with_past.onnx",
        )
    elif config.is_decoder:
        kind = "decoder"
        layers = config.num_hidden_layers
        past_names = _cache_names(PAST, layers)
        past_tensors = [torch.zeros(_kv_shape(config, 2, 3)) for _ in past_names]
        dynamic = {
            "input_ids": {0: batch, 1: length},
            "attention_mask": {0: batch, 1: total},
            "position_ids": {0: batch, 1: length},
        }
        dynamic.update({name: {0: batch, 2: past} for name in past_names})
        _export(
            DecoderWithPast(model),
            (example_ids, torch.ones(2, 8, dtype=torch.long), torch.arange(3, 8).expand(2, -1), *past_tensors),
            ["input_ids", "attention_mask", "position_ids", *past_names],
            ["logits", *_cache_names(PRESENT, layers)],
            dynamic,
            folder / "model.onnx",
        )
    else:
        kind = "encoder"
        names = encoder_output_names(model, {"input_ids": example_ids, "attention_mask": mask})
        _export(
            EncoderOnly(model, names),
            (example_ids, mask),
            ["input_ids", "attention_mask"],
            names,
            {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}},
            folder / "model.onnx",
        )
    record = {
        "kind": kind,
        "layers": config.decoder_layers if config.is_encoder_decoder else config.num_hidden_layers,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "decoder_start_token_id": getattr(config, "decoder_start_token_id", None),
    }
    (folder / "onnx_export.json").write_text(json.dumps(record, indent=2))
    return folder


class OnnxGreedy:
    """Greedy decoding over onnxruntime with the exported KV cache: the loop `generate()` runs, as a user of the ONNX
    files would write it (left-padded prompts, position ids counted over real tokens)."""

    def __init__(self, folder, providers=("CPUExecutionProvider",)):
        import onnxruntime

        self.folder = Path(folder)
        self.record = json.loads((self.folder / "onnx_export.json").read_text())
        names = {"decoder": ["model"], "encoder-decoder": ["encoder", "decoder", "decoder_with_past"]}
        self.sessions = {
            name: onnxruntime.InferenceSession(str(self.folder / f"{name}.onnx"), providers=list(providers))
            for name in names.get(self.record["kind"], ["model"])
        }

    def _empty_past(self, batch: int) -> dict:
        shape = (batch, self.record["num_key_value_heads"], 0, self.record["head_dim"])
        return {name: np.zeros(shape, np.float32) for name in _cache_names(PAST, self.record["layers"])}

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20) -> torch.Tensor:
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        if self.record["kind"] == "encoder-decoder":
            return torch.from_numpy(self._generate_seq2seq(ids, mask, max_new_tokens))
        if self.record["kind"] != "decoder":
            raise ValueError(f"{self.folder} holds an {self.record['kind']} export: nothing to generate")
        session, layers = self.sessions["model"], self.record["layers"]
        past = self._empty_past(ids.shape[0])
        step_ids, positions, sequence = ids, np.clip(mask.cumsum(-1) - 1, 0, None), ids
        for _ in range(max_new_tokens):
            outputs = session.run(
                None, {"input_ids": step_ids, "attention_mask": mask, "position_ids": positions, **past}
            )
            step_ids = outputs[0][:, -1].argmax(-1)[:, None].astype(np.int64)
            sequence = np.concatenate([sequence, step_ids], axis=-1)
            past = dict(zip(_cache_names(PAST, layers), outputs[1:]))
            positions = positions[:, -1:] + 1
            mask = np.concatenate([mask, np.ones_like(step_ids)], axis=-1)
        return torch.from_numpy(sequence)

    def _generate_seq2seq(self, ids, mask, max_new_tokens: int) -> np.ndarray:
        layers = self.record["layers"]
        hidden = self.sessions["encoder"].run(None, {"input_ids": ids, "attention_mask": mask})[0]
        start = np.full((ids.shape[0], 1), self.record["decoder_start_token_id"], dtype=np.int64)
        inputs = {"decoder_input_ids": start, "attention_mask": mask, "encoder_hidden_states": hidden}
        outputs = self.sessions["decoder"].run(None, inputs)
        sequence = start
        past = dict(zip(_cache_names(PAST, layers, cross=True), outputs[1:]))
        for step in range(max_new_tokens):
            token = outputs[0][:, -1].argmax(-1)[:, None].astype(np.int64)
            sequence = np.concatenate([sequence, token], axis=-1)
            if step == max_new_tokens - 1:
                break
            inputs = {"decoder_input_ids": token, "attention_mask": mask, "encoder_hidden_states": hidden, **past}
            outputs = self.sessions["decoder_with_past"].run(None, inputs)
            present = dict(zip(_cache_names(PAST, layers), outputs[1:]))
            past = {**past, **present}  # cross keys and values stay as the first step made them
        return sequence
