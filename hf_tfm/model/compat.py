"""What the model code needs that depends on the installed transformers (or torch) release, in one place.

The model bundle runs as remote code on whatever transformers a user has, from the lower bound (pyproject.toml) to the
newest release. Every decision it takes by release, and every transformers internal it touches (an underscore name, a
hook transformers calls by a private name), is here with a row in `TABLE`: what it is, which releases need it, what
replaces it. `hf_tfm/compat.py` adds the rows of the code outside the bundle; `tests/test_compat.py` checks every row
against the installed transformers and `make test-matrix` runs that on every minor release.

Decisions ask the installed transformers what it does (a field, a keyword, an attribute), never a version number.
"""

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import masking_utils
from transformers.distributed import DistributedConfig
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import PreTrainedModel
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


# ---------------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    releases: str
    replaced_by: str
    probe: Callable[[], Any]  # raises, or returns a problem string, when the installed transformers breaks the row


def has_parameters(function, *names) -> str | None:
    missing = [name for name in names if name not in inspect.signature(function).parameters]
    return f"{function.__qualname__} has no parameter {', '.join(missing)}" if missing else None


def _probe_cache_field() -> str | None:
    from transformers.generation import utils as generation

    names = generation.ALL_CACHE_NAMES
    if CACHE_NAME not in names:
        return f"generate() reads the cache as one of {names}, hf_tfm returns it as {CACHE_NAME!r}"
    return has_parameters(masking_utils.create_sliding_window_causal_mask, MASK_CACHE_ARGUMENT) or has_parameters(
        deprecate_kwarg, "old_name", "version", "new_name"
    )


def _probe_experts() -> str | None:
    for name in ("_can_set_experts_implementation", "get_correct_experts_implementation"):
        if not hasattr(PreTrainedModel, name):
            return f"PreTrainedModel.{name} is gone: hf_tfm's experts backend choice is no longer asked"
    if not isinstance(inspect.getattr_static(PreTrainedModel, "_can_set_experts_implementation"), classmethod):
        return "PreTrainedModel._can_set_experts_implementation is no longer a classmethod"
    return None


def _probe_capturing_hooks() -> str | None:
    from transformers.utils import output_capturing

    return None if callable(getattr(output_capturing, "maybe_install_capturing_hooks", None)) else "gone"


def _probe_loading_report() -> str | None:
    folded = fold_layer_numbers(["a.0.b", "a.1.b"])
    return None if folded == ["a.{0, 1}.b"] else f"update_key_name folds a.0.b, a.1.b into {folded}"


def _probe_token_dispatch() -> str | None:
    fields = DistributedConfig.__dataclass_fields__
    return None if "ep_size" in fields or "enable_expert_parallel" in fields else "no expert-parallel option"


def _probe_rope_dict() -> str | None:
    from transformers.configuration_utils import PreTrainedConfig

    for name in ("convert_rope_params_to_dict", "standardize_rope_params", "default_theta"):
        if not hasattr(PreTrainedConfig, name):
            return f"PreTrainedConfig.{name} is gone: nested RoPE dicts are no longer completed"
    return None


TABLE = [
    Row(
        "cache argument",
        "the cache's keyword and output field (`cache` from 5.24, `past_key_values` before): CACHE_NAME, "
        "MASK_CACHE_ARGUMENT, accepts_legacy_cache_argument (transformers' deprecate_kwarg from 5.24)",
        "5.17-5.23 pass `past_key_values`; 5.24+ `cache` (the old name is removed in 5.40)",
        "forwards take `cache` only once the lower bound reaches 5.24",
        _probe_cache_field,
    ),
    Row(
        "slice_logits_to_keep",
        "transformers.modeling_utils.slice_logits_to_keep, copied for releases that lack it",
        "5.17-5.20 (added in 5.21)",
        "the import alone once the lower bound reaches 5.21",
        lambda: None,
    ),
    Row(
        "PreTrainedModel.get_correct_attn_implementation",
        "overridden to ask the capabilities table (capabilities.py) of every backend a model is built with, loaded "
        "with or switched to, and to default to eager where sdpa cannot run the config",
        "all",
        "a public backend-capability hook, if transformers adds one",
        lambda: has_parameters(
            PreTrainedModel.get_correct_attn_implementation, "requested_attention", "is_init_check"
        ),
    ),
    Row(
        "PreTrainedModel._can_set_experts_implementation",
        "a classmethod answering True for every hf_tfm class (any config can have experts): transformers' own greps "
        "the class's file for the experts decorator, which hf_tfm's heads do not hold",
        "all",
        "a public flag for 'this class can have experts'",
        _probe_experts,
    ),
    Row(
        "output_capturing.maybe_install_capturing_hooks",
        "installs the router-logit capture hooks in train(), outside any compiled graph (transformers installs "
        "them on first use under a lock dynamo cannot trace)",
        "all",
        "capture hooks installed at construction",
        _probe_capturing_hooks,
    ),
    Row(
        "loading_report.update_key_name",
        "fold_layer_numbers: layer numbers folded in the weights a loading error lists (modeling_tfm_loading)",
        "all",
        "a local folding function",
        _probe_loading_report,
    ),
    Row(
        "DistributedConfig expert parallelism",
        "TOKEN_DISPATCH: `ep_size` with token dispatch (5.21+) or `enable_expert_parallel` with router masking",
        "5.17-5.20 router masking; 5.21+ token dispatch",
        "token dispatch alone once the lower bound reaches 5.21",
        _probe_token_dispatch,
    ),
    Row(
        "PreTrainedConfig.convert_rope_params_to_dict",
        "nested_rope_params_to_dict: a RoPE dict per layer type gets its defaults per entry (5.17 fails to validate "
        "the nest it completes itself)",
        "5.17 (later releases complete nested dicts themselves)",
        "transformers' own conversion once the lower bound completes nested dicts",
        _probe_rope_dict,
    ),
]
