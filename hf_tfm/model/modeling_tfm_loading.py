"""What an hf_tfm model adds to transformers' `from_pretrained` and `save_pretrained`; nothing that writes on a load.

A load refuses weights that do not fit the config built from config.json (missing or unexpected weights of the body, a
hand-edited width: the field is named), quantises MoE experts as torchao quantised the Linear layers, and freezes
BART's head bias. Saving safety (staged saves that never damage the previous model, manifests, model cards) is the
hf_tfm package's (`hf_tfm.hub.model_hooks`): these methods hand over to it when it is loaded, and are transformers' own
when this bundle runs as remote code without it. A load reads; it never writes, renames or deletes.
"""

import itertools
import sys
from pathlib import Path

import torch
from torch import nn

from .compat import fold_layer_numbers

# every Auto class a paradigm answers to, with the model class (in modeling_tfm.py) it builds: what the package
# registers (hf_tfm/__init__.py) and what `save_pretrained` writes into `auto_map`
AUTO_CLASSES = {
    "tfm_decoder": {
        "AutoModel": "TfmDecoderModel",
        "AutoModelForCausalLM": "TfmDecoderForCausalLM",
        "AutoModelForSequenceClassification": "TfmDecoderForSequenceClassification",
        "AutoModelForTokenClassification": "TfmDecoderForTokenClassification",
        "AutoModelForQuestionAnswering": "TfmDecoderForQuestionAnswering",
    },
    "tfm_encoder": {
        "AutoModel": "TfmEncoderModel",
        "AutoModelForMaskedLM": "TfmEncoderForMaskedLM",
        "AutoModelForSequenceClassification": "TfmEncoderForSequenceClassification",
        "AutoModelForTokenClassification": "TfmEncoderForTokenClassification",
        "AutoModelForQuestionAnswering": "TfmEncoderForQuestionAnswering",
    },
    "tfm_encoder_decoder": {
        "AutoModel": "TfmEncoderDecoderModel",
        "AutoModelForSeq2SeqLM": "TfmEncoderDecoderForConditionalGeneration",
    },
}
# modules a head adds on top of the body, and the pooler only the classification heads use: loading a saved model into
# another head may legitimately miss or leave over their weights, never the body's. Each head class adds its task
# layer's name as it is defined (modeling_tfm.TfmHead.__init_subclass__), so none can be left out.
HEAD_MODULES = {"pooler"}


def package_hooks():
    """hf_tfm's saving and publishing code (`hf_tfm.hub.model_hooks`) when the hf_tfm package is loaded, for the
    installed models and for copies of this bundle running as remote code alike; None without it. Looked up, not
    imported: the package imports this bundle, and remote code must run without the package."""
    return sys.modules.get("hf_tfm.hub.model_hooks")


# ------------------------------------------------------------------------------------------- weights that do not fit


def body_weights(model, keys) -> list[str]:
    """The keys that belong to the model's body, not to a head: those under the base model prefix for a head class;
    for a base class any key (a head checkpoint's body keys it has no place for keep their prefix); the head modules
    (HEAD_MODULES) excepted."""
    prefix = f"{model.base_model_prefix}."
    is_base = model.base_model is model
    body = [key for key in keys if key.startswith(prefix) or is_base]
    return sorted(key for key in body if key.removeprefix(prefix).split(".", 1)[0] not in HEAD_MODULES)


def _modules_of(keys, most: int = 12) -> str:
    """The modules the weights belong to, layer numbers folded (`model.layers.{0, 1}.mlp.gate_proj`)."""
    names = fold_layer_numbers({key.rsplit(".", 1)[0] for key in keys})
    more = f" (and {len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def check_loaded_weights(model, info: dict, source) -> None:
    """Raise when the loaded weights do not fit the model built from its config: any missing or unexpected weight when
    the checkpoint was saved from this very class, the body's when it was saved from another head (whose own weights
    are then legitimately missing or left over)."""
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    if (getattr(model.config, "architectures", None) or [None])[0] != type(model).__name__:
        missing, unexpected = body_weights(model, missing), body_weights(model, unexpected)
    problems = [f"missing from the checkpoint (they would be random): {_modules_of(missing)}"] if missing else []
    problems += [f"in the checkpoint but not in the model: {_modules_of(unexpected)}"] if unexpected else []
    if problems:
        raise ValueError(
            f"the weights in {source} do not match {type(model).__name__} built from its config; weights "
            + "; weights ".join(problems)
            + ". Check the config fields that shape the model (num_hidden_layers, ffn_type, position_embedding_type, "
            "num_experts, ...) against the saved model, or pass strict=False to load it anyway (the missing weights "
            "are freshly initialised)."
        )


def saved_shapes(folder: Path) -> dict[str, tuple]:
    """Each weight's shape in the folder's safetensors files, read from their headers (no tensor is loaded)."""
    from safetensors import safe_open

    shapes = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(path, "pt") as weights:
            shapes.update((key, tuple(weights.get_slice(key).get_shape())) for key in weights.keys())
    return shapes


def shape_mismatches(model_class, config, saved: dict) -> list[tuple[str, tuple, tuple]]:
    """(weight, saved shape, shape `config` makes) wherever they differ; the model is built on the meta device."""
    with torch.device("meta"):
        built = {key: tuple(value.shape) for key, value in model_class(config).state_dict().items()}
    return [(key, shape, built[key]) for key, shape in saved.items() if key in built and built[key] != shape]


def size_mismatch_message(model_class, config, folder: Path) -> str | None:
    """Name the config.json field (a hand edit) that makes the weights' shapes differ: the field which, put back to the
    width the weights have, makes the most of them fit; then the weights themselves. None when no shape differs."""
    saved = saved_shapes(folder)
    mismatched = shape_mismatches(model_class, config, saved)
    if not mismatched:
        return None
    values = config.to_dict()
    widths = {(was, now) for _, saved_shape, built in mismatched for was, now in zip(saved_shape, built) if was != now}
    candidates = {}  # (field, saved width) -> mismatches left with the field set to it
    for (field, value), (was, now) in itertools.product(values.items(), widths):
        if type(value) is int and value == now:
            try:
                trial = type(config)(**{**values, field: was})
            except Exception:  # noqa: BLE001  (a value the config refuses is not the culprit)
                continue
            candidates[field, was] = len(shape_mismatches(model_class, trial, saved))
    best = min(candidates.values(), default=len(mismatched))
    culprits = [
        f"{field}={values[field]} in config.json, {was}-wide weights"
        for (field, was), left in candidates.items()
        if left == best and best < len(mismatched)
    ]
    shown = [f"{key}: saved {shape}, config makes {built}" for key, shape, built in mismatched[:4]]
    more = f" (and {len(mismatched) - 4} more)" if len(mismatched) > 4 else ""
    return (
        f"the weights in {folder} do not fit its config.json: {'; '.join(culprits) or 'shapes differ'} "
        f"({'; '.join(shown)}{more}). Put the field back to what the weights were trained with, or pass "
        "strict=False (or ignore_mismatched_sizes=True) to load the mismatched weights freshly initialised."
    )


# ------------------------------------------------------------------------------------ torchao and the MoE experts

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def expert_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules holding fused 3D expert weights (hf_tfm's `TfmExperts`, transformers' Mixtral-style ones), by name."""
    return {
        name: module
        for name, module in model.named_modules()
        if all(getattr(getattr(module, weight, None), "ndim", 0) == 3 for weight in EXPERT_WEIGHTS)
    }


def is_quantized(weight: torch.Tensor) -> bool:
    return type(weight) not in (nn.Parameter, torch.Tensor)  # torchao's weights are tensor subclasses


def experts_quantized(module: nn.Module) -> bool:
    return all(is_quantized(getattr(module, weight)) for weight in EXPERT_WEIGHTS)


def quantize_expert_weights(model: nn.Module, quant_type, skip=()) -> None:
    """Quantise every expert module's 3D weights with the torchao configuration `quant_type` (torchao's parameter
    quantisation, keyed by parameter name), except modules whose name contains an entry of `skip` and weights already
    quantised. transformers quantises only `nn.Linear` weights: the experts, most of an MoE model's bytes, would stay
    in full precision, silently. A configuration torchao cannot apply to a parameter is refused naming the module."""
    from torchao.quantization import FqnToConfig, quantize_

    for name, module in expert_modules(model).items():
        if any(entry in name for entry in skip or ()) or experts_quantized(module):
            continue
        reason = "torchao skipped them"  # as it skips shapes its kernels cannot take, with a log line only
        try:
            quantize_(module, FqnToConfig({weight: quant_type for weight in EXPERT_WEIGHTS}), filter_fn=None)
        except (NotImplementedError, AssertionError, ValueError) as error:
            reason = str(error)
        if not experts_quantized(module):
            raise ValueError(
                f"{name}: torchao's {type(quant_type).__name__} cannot quantise the experts' 3D weights "
                f"{EXPERT_WEIGHTS} ({reason}). Use Int8WeightOnlyConfig or Int8DynamicActivationInt8WeightConfig, or "
                f"keep the experts in full precision with TorchAoConfig(..., modules_to_not_convert=['experts'])."
            )


def unquantized_linears(model: nn.Module, quantizer) -> list[str]:
    """Linear layers the quantiser was to quantise that still hold full-precision weights: torchao skips, with a log
    line only, shapes its kernels cannot take. A head tied to the token table is the table, which stays."""
    tied = model.get_input_embeddings().weight
    return [
        f"{name} (weight {list(module.weight.shape)})"
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and not is_quantized(module.weight)
        and module.weight is not tied
        and quantizer.param_needs_quantization(model, f"{name}.weight")
    ]


def finish_torchao_loading(model: nn.Module) -> None:
    """After `from_pretrained` with a torchao quantisation config: quantise the experts as the Linear layers were, run
    quantised experts in the eager loop (torchao's int8 tensors support indexing one expert and `F.linear`, not the
    batched backends), and refuse a model that torchao left partly unquantised, naming the layers."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.quantization_config.quant_method != "torchao":
        return
    from torchao.quantization import FqnToConfig

    quant_type = quantizer.quantization_config.get_apply_tensor_subclass()
    if not isinstance(quant_type, FqnToConfig):  # a per-name plan is the user's own: transformers applied it
        quantize_expert_weights(model, quant_type, quantizer.quantization_config.modules_to_not_convert)
        skipped = unquantized_linears(model, quantizer)
        if skipped:
            raise ValueError(
                f"torchao's {type(quant_type).__name__} left {len(skipped)} Linear layers unquantised, first "
                f"{skipped[0]}: torchao skips weights its kernels cannot take. Choose a configuration that fits these "
                f"shapes (for int4, a group_size dividing in_features) or list the layers in "
                f"TorchAoConfig(..., modules_to_not_convert=[...])."
            )
    if any(experts_quantized(module) for module in expert_modules(model).values()):
        model.set_experts_implementation("eager")


# ------------------------------------------------------------------------------------------- the model's methods


class TfmLoadingMixin:
    """A base of TfmPreTrainedModel, before PreTrainedModel, whose methods these call."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers writes `auto_map` only for the saved class; every Auto class of the paradigm is listed, so that
        # AutoModel, AutoModelFor... all load the folder with trust_remote_code
        classes = AUTO_CLASSES.get(self.config.model_type, {})
        if self._auto_class is not None and classes:
            auto_map = {"AutoConfig": f"configuration_tfm.{type(self.config).__name__}"}
            auto_map.update({auto: f"modeling_tfm.{name}" for auto, name in classes.items()})
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **auto_map}
        saving = package_hooks()
        if saving is None:
            return super().save_pretrained(save_directory, *args, **kwargs)
        return saving.save_staged(self, super().save_pretrained, save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs):
        """transformers' `from_pretrained`, plus: weights that do not fit the config are an error naming the field or
        the weights (transformers logs a report and initialises them); loading into another head (a masked LM into
        `...ForSequenceClassification`) may miss the new head's weights and leave the old head's over, the body's must
        match; `strict=False` (or `ignore_mismatched_sizes=True`) accepts any mismatch, as transformers does. With a
        torchao `quantization_config` the MoE experts' 3D weights are quantised too. With the hf_tfm package loaded, a
        local folder's weight files must have the sizes its manifest lists (a cheap check: no hashing)."""
        if (saving := package_hooks()) is not None:
            saving.check_file_sizes(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
            )
        except RuntimeError as error:  # transformers refuses mismatched sizes after a report: name the field
            folder = Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or "")
            if "ignore_mismatched_sizes" not in str(error) or not folder.is_dir():
                raise
            message = size_mismatch_message(cls, cls.config_class.from_pretrained(folder), folder)
            if message is None:
                raise
            raise ValueError(message) from error
        if strict and not kwargs.get("ignore_mismatched_sizes", False):
            check_loaded_weights(model, info, pretrained_model_name_or_path)
        finish_torchao_loading(model)
        output = model.get_output_embeddings()
        if hasattr(output, "freeze_bias"):
            output.freeze_bias()
        return (model, info) if wants_info else model

    def push_to_hub(self, repo_id: str, **kwargs):
        """transformers' `push_to_hub` (same keyword arguments), publishing hf_tfm's model card unless the repo already
        has one to keep (a training run's, with its results, or the user's own), when the hf_tfm package is loaded."""
        saving = package_hooks()
        if saving is None:
            return super().push_to_hub(repo_id, **kwargs)
        return saving.push_with_card(self, repo_id, **kwargs)
