"""Clear errors for mistakes in an hf_tfm folder's config.json, raised before transformers reads it.

Every saved hf_tfm config carries `auto_map`, so transformers answers a misspelled or missing `model_type` with
"pass trust_remote_code=True" (after an interactive prompt in a terminal), and an Auto class of another paradigm
with a list of every model type it knows. One wrapper around the Auto classes' `from_pretrained` reads a local
folder's config.json first and, only when its auto_map names one of hf_tfm's config classes, names the mistake;
everything else goes to transformers unchanged. Not remote code: installed with hf_tfm, applied on `import hf_tfm`.
"""

import json
import os
import re

import transformers

from .compat import run_before_from_pretrained
from .configuration_tfm import TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig

_PARADIGMS = {config.model_type: config for config in (TfmDecoderConfig, TfmEncoderConfig, TfmEncoderDecoderConfig)}
_TFM_AUTO_CONFIG = re.compile(r"(?:^|--)configuration_tfm\.(Tfm\w+Config)$")  # "repo--" when pushed elsewhere


def check_config_json(folder, auto_class: str = "AutoConfig") -> None:
    """Raise a ValueError naming `model_type` when the hf_tfm folder's config.json has an unknown or no model type,
    or one whose paradigm `auto_class` cannot load. Folders that are not local hf_tfm folders pass."""
    path = os.path.join(folder, "config.json") if isinstance(folder, (str, os.PathLike)) else ""
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
        names = _TFM_AUTO_CONFIG.search(config["auto_map"]["AutoConfig"]).group(1)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return  # not a local hf_tfm folder (or not readable): transformers reports on it as usual
    paradigm = next((c for c in _PARADIGMS.values() if c.__name__ == names), None)
    if paradigm is None:
        return
    model_type = config.get("model_type")
    if model_type not in _PARADIGMS:
        written = f"model_type {model_type!r}" if "model_type" in config else "no model_type"
        raise ValueError(
            f"{path} has {written}: the valid hf_tfm model types are {', '.join(map(repr, _PARADIGMS))} "
            f"(its auto_map names {names}, whose model_type is {paradigm.model_type!r})"
        )
    supported = _PARADIGMS[model_type].auto_classes
    if auto_class != "AutoConfig" and auto_class not in supported:
        raise ValueError(
            f"{path} holds model_type {model_type!r}, which {auto_class} cannot load; model_type {model_type!r} "
            f"loads with {', '.join(supported)}"
        )


def _check_before_load(auto_class, pretrained_model_name_or_path, *args, **kwargs) -> None:
    if not isinstance(kwargs.get("config"), transformers.PreTrainedConfig):  # a given config replaces the file's
        check_config_json(pretrained_model_name_or_path, auto_class.__name__)


def check_config_json_on_load() -> None:
    auto_names = {"AutoConfig"}.union(*(c.auto_classes for c in _PARADIGMS.values()))
    for auto_class in (getattr(transformers, name) for name in sorted(auto_names)):
        run_before_from_pretrained(auto_class, _check_before_load)
