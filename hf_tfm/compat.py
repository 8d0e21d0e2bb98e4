"""Everything in hf_tfm that depends on which transformers (or torch) release is installed, in one table.

`TABLE` holds every version decision and every transformers internal hf_tfm touches: the model bundle's own rows
(`hf_tfm/model/compat.py`, which ships with every checkpoint as remote code), then the rows of the code outside it
(training, publishing, conversion). Each row says what it is, which releases need it and what replaces it; its probe
fails naming the row when a release removes or changes what it relies on (`tests/test_compat.py`, run on every minor
release by `make test-matrix`). Decisions ask the installed transformers what it does, never a version number.

Nothing else in hf_tfm imports a transformers underscore name or another model's module: where a small function of
another model was needed (T5's position buckets, Mixtral's balancing loss, BART's label shift, Llama's rotation,
Gemma 2's capped eager attention), hf_tfm owns a copy, tested against the reference in tests/test_compat.py.
"""

import functools

from transformers.modeling_utils import PreTrainedModel

from .model.compat import *  # noqa: F403  (the model bundle's decisions, under the one name the package reads)
from .model.compat import TABLE as MODEL_ROWS
from .model.compat import Row, has_parameters


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


def load_trainer_checkpoint(trainer, checkpoint: str) -> None:
    """Load a Trainer checkpoint's weights into `trainer.model` without training (a run resumed at its last step).
    transformers has no public call for it; `Trainer._load_from_checkpoint` is what `train(resume_from_checkpoint=)`
    uses."""
    trainer._load_from_checkpoint(checkpoint)


# GPT-OSS's experts clamp and scale their SwiGLU by `swiglu_limit` and `swiglu_alpha`. Newer GptOssConfig declares
# both; older releases (5.17 among them) have no such fields and fix them in the experts at these values.
GPT_OSS_FIXED_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


@functools.cache
def gpt_oss_declares_swiglu() -> bool:
    import transformers

    return "swiglu_limit" in transformers.GptOssConfig.__dataclass_fields__


def _probe_trainer_checkpoint() -> str | None:
    from transformers import Trainer

    method = getattr(Trainer, "_load_from_checkpoint", None)
    return (
        "Trainer._load_from_checkpoint is gone" if method is None else has_parameters(method, "resume_from_checkpoint")
    )


def _has_training_field(*names) -> str | None:
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return None if any(name in fields for name in names) else f"TrainingArguments has none of {names}"


def _probe_upload() -> str | None:
    method = getattr(PreTrainedModel, "_upload_modified_files", None)
    if method is None:
        return "PreTrainedModel._upload_modified_files is gone: push_to_hub with hf_tfm's card cannot upload"
    return has_parameters(method, "working_dir", "repo_id", "files_timestamps", "token", "create_pr", "revision")


TABLE = [
    *MODEL_ROWS,
    Row(
        "GptOssConfig swiglu fields",
        "gpt_oss_declares_swiglu: GPT-OSS's SwiGLU clamp and slope, config fields or fixed (GPT_OSS_FIXED_SWIGLU); "
        "the GPT-OSS record converts other values only where the config declares them (convert/decoder.py)",
        "5.17 and other releases before the fields: fixed at 1.702 and 7.0",
        "the fields alone once the lower bound declares them",
        lambda: None if isinstance(gpt_oss_declares_swiglu(), bool) else "no answer",
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
        "PreTrainedModel._upload_modified_files",
        "push_to_hub's one-commit upload, with hf_tfm's model card in the folder (hf_tfm/saving.py)",
        "all",
        "huggingface_hub.upload_folder, once a refused commit may be retried (it retries; transformers fails fast)",
        _probe_upload,
    ),
]
