"""What an hf_tfm model adds to transformers' `from_pretrained` and `save_pretrained`; nothing that writes on a load.

A load refuses weights that do not fit the config built from config.json (missing or unexpected weights of the body)
and freezes BART's head bias. Saving safety (staged saves that never damage the previous model, manifests, model
cards) and the other checks around a load are the hf_tfm package's (`hf_tfm.model_hooks`): these methods hand over to
it when it is loaded, and are transformers' own when this bundle runs as remote code without it. A load reads; it
never writes, renames or deletes.
"""

import sys

from transformers.utils import logging

from .compat import fold_layer_numbers

logger = logging.get_logger(__name__)

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
        "AutoModelForPreTraining": "TfmEncoderForPreTraining",
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
    """What the hf_tfm package adds to saving, loading and publishing (`hf_tfm.model_hooks`) when it is loaded, for
    the installed models and for copies of this bundle running as remote code alike; None without it. Looked up, not
    imported: the package imports this bundle, and remote code must run without the package."""
    return sys.modules.get("hf_tfm.model_hooks")


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
        """transformers' `from_pretrained`, plus: weights that do not fit the config are an error naming the weights
        (transformers logs a report and initialises them); loading into another head (a masked LM into
        `...ForSequenceClassification`) may miss the new head's weights and leave the old head's over, the body's must
        match; `strict=False` (or `ignore_mismatched_sizes=True`) accepts any mismatch, as transformers does. With the
        hf_tfm package loaded, also: a local folder's weight files must have the sizes its manifest lists (a cheap
        check, no hashing), a hand-edited width is named by its config field, and a torchao `quantization_config`
        quantises the MoE experts' 3D weights too."""
        hooks = package_hooks()
        if hooks is not None:
            hooks.check_file_sizes(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
            )
        except RuntimeError as error:  # transformers refuses mismatched sizes after a report: name the field
            if hooks is None:
                raise
            raise hooks.size_mismatch_error(cls, pretrained_model_name_or_path, kwargs, error) from error
        if strict and not kwargs.get("ignore_mismatched_sizes", False):
            check_loaded_weights(model, info, pretrained_model_name_or_path)
        if hooks is not None:
            hooks.finish_loading(model)
        elif getattr(model.config, "quantization_config", None) is not None and model.config.has_moe_layers():
            logger.warning(
                "The MoE experts' weights stay in full precision: quantising them needs the hf_tfm package "
                "(pip install hf_tfm); transformers quantised the Linear layers only"
            )
        output = model.get_output_embeddings()
        if hasattr(output, "freeze_bias"):
            output.freeze_bias()
        return (model, info) if wants_info else model

    def mark_tied_weights_as_initialized(self, loading_info):
        """transformers marks every tied parameter as initialised, since it will be tied to its source; an
        encoder-decoder holds its token table as one module under three names, so the mark reaches the table itself.
        A tied source the checkpoint lacks stays missing, and is initialised (T5 reports its `shared` so)."""
        missing = {source for source in self.all_tied_weights_keys.values() if source in loading_info.missing_keys}
        super().mark_tied_weights_as_initialized(loading_info)
        for source in missing:
            parameter = self.get_parameter(source)
            if hasattr(parameter, "_is_hf_initialized"):
                del parameter._is_hf_initialized
        loading_info.missing_keys = {*loading_info.missing_keys, *missing}

    def push_to_hub(self, repo_id: str, **kwargs):
        """transformers' `push_to_hub` (same keyword arguments), publishing hf_tfm's model card unless the repo already
        has one to keep (a training run's, with its results, or the user's own), when the hf_tfm package is loaded."""
        saving = package_hooks()
        if saving is None:
            return super().push_to_hub(repo_id, **kwargs)
        return saving.push_with_card(self, repo_id, **kwargs)
