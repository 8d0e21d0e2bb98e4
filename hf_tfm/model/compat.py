"""What the model code decides by the installed transformers (or torch) release, in one place.

The model bundle runs as remote code on whatever transformers a user has, from the lower bound (pyproject.toml) to the
newest release. Each decision asks the installed transformers what it does (a field, a keyword, an attribute), never a
version number. Each one, and every transformers internal the bundle touches, is a row of `hf_tfm/compat.py`'s table
(what it is, which releases need it, what replaces it), checked against the installed release by tests/test_compat.py.
"""

import functools
import inspect
import os
from collections.abc import Callable

import torch
from transformers import masking_utils
from transformers.distributed import DistributedConfig
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.auto import modeling_auto
from transformers.utils.deprecation import deprecate_kwarg

# ------------------------------------------------------------------------------------------- the cache's name

# transformers 5.24 renamed `past_key_values` to `cache`: the keyword generate() passes to forward, the output field
# it reads back, and the keyword of the mask helpers. 5.17-5.23 use `past_key_values` throughout.
CACHE_NAME = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
LEGACY_CACHE_ARGUMENT = "past_key_values"
MASK_CACHE_ARGUMENT = (
    "cache" if "cache" in inspect.signature(masking_utils.create_causal_mask).parameters else "past_key_values"
)
# names under which transformers looks for the cache among a model's inputs and outputs: both, for either release
CACHE_NAMES = ["cache", "past_key_values"]


def accepts_legacy_cache_argument(forward: Callable) -> Callable:
    """A forward whose cache parameter is `cache` also takes it as `past_key_values`: from transformers 5.24 by
    transformers' own `deprecate_kwarg` (a FutureWarning, `cache` wins), on 5.17-5.23 (whose generate() passes
    `past_key_values` at every step) silently, both at once being an error there."""
    if CACHE_NAME == "cache":
        return deprecate_kwarg(LEGACY_CACHE_ARGUMENT, "5.40.0", new_name="cache")(forward)

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if LEGACY_CACHE_ARGUMENT in kwargs:
            legacy = kwargs.pop(LEGACY_CACHE_ARGUMENT)
            if kwargs.get("cache") is not None and legacy is not None:
                raise ValueError("pass the cache as `cache` or as `past_key_values`, not both")
            if legacy is not None or "cache" not in kwargs:
                kwargs["cache"] = legacy
        return forward(self, *args, **kwargs)

    return wrapper


# ------------------------------------------------------------------------------------- the task tables' names

# transformers tells some tasks apart by a class's name alone, in its per-task tables of names (model type -> class
# name): Trainer shifts the labels of a label-smoothed loss only for a class named in the causal-LM table, and a model
# card's task tag comes from the same tables. Registering with an Auto class does not name a class there.
TASK_NAME_TABLES = {  # Auto class -> its table in transformers.models.auto.modeling_auto
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForSeq2SeqLM": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "AutoModelForPreTraining": "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
}


def task_name_table(auto_name: str) -> dict | None:
    """The installed transformers' table of names for Auto class `auto_name`'s task; None for an Auto class without
    one (AutoModel), or where a release no longer has it (the compat row says so)."""
    table = getattr(modeling_auto, TASK_NAME_TABLES[auto_name], None) if auto_name in TASK_NAME_TABLES else None
    return table if isinstance(table, dict) else None


def name_in_task_tables(auto_classes: dict[str, dict[str, str]]) -> None:
    """Name each head class in its task's table, under its model type (`auto_classes`: model type -> Auto class ->
    class name). A model type no transformers config declares is invisible to the Auto mappings built on the tables,
    so this changes what name lookups answer and nothing else. A table a release no longer has is skipped, so that
    the bundle still loads there."""
    for model_type, classes in auto_classes.items():
        for auto_name, class_name in classes.items():
            if (table := task_name_table(auto_name)) is not None:
                table.setdefault(model_type, class_name)


# ----------------------------------------------------------------------------------------- functions that moved

# transformers >= 5.21 (`DistributedConfig(ep_size=N)`): each token is sent to the rank of its experts, beside the
# tensor-parallel plan; 5.17-5.20 (`enable_expert_parallel=True`): the router masks other ranks' experts
TOKEN_DISPATCH = "ep_size" in DistributedConfig.__dataclass_fields__

try:  # transformers >= 5.21
    from transformers.modeling_utils import slice_logits_to_keep
except ImportError:  # transformers 5.17-5.20: the same function, as 5.21 added it

    def slice_logits_to_keep(hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.ndim == 2:
            if logits_to_keep.dtype == torch.bool:
                return hidden_states[logits_to_keep]
            return torch.take_along_dim(hidden_states, logits_to_keep[..., None], dim=1)
        if isinstance(logits_to_keep, int):
            logits_to_keep = slice(-logits_to_keep, None)
        return hidden_states[:, logits_to_keep, :]


def nested_rope_params_to_dict(config, kwargs: dict) -> dict:
    """`PreTrainedConfig.convert_rope_params_to_dict` for RoPE dicts nested per layer type: transformers 5.17 gives the
    nest a top-level `rope_theta` and then fails to validate it; each nested dict gets the defaults it lacks instead,
    as 5.17's ModernBertConfig does it."""
    kwargs.pop("rope_scaling", None)
    theta = kwargs.pop("rope_theta", config.default_theta)
    for rope in config.rope_parameters.values():
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", theta)
    config.standardize_rope_params()
    return kwargs


def fold_layer_numbers(names) -> list[str]:
    """Weight or module names with their layer numbers folded (`model.layers.{0, 1}.mlp`), as transformers' loading
    report prints them."""
    from transformers.utils.loading_report import update_key_name

    return sorted(update_key_name(dict.fromkeys(names, "")))


# vLLM's Transformers backend fuses hf_tfm's latent attention into its MLA layer but sizes the MLA cache only for
# DeepSeek's own model types; with VLLM_MLA_DISABLE=1 (read as vLLM reads it) it runs full attention over the
# expanded keys and values, which serves the same tokens.
def vllm_mla_disabled() -> bool:
    return bool(int(os.getenv("VLLM_MLA_DISABLE", "0")))
