"""What an hf_tfm model's `save_pretrained`, `from_pretrained` and `push_to_hub` hand over to when the hf_tfm
package is loaded (`hf_tfm.model.modeling_tfm_loading.package_hooks`): saves staged and swapped in whole with a model
card and a manifest (`hf_tfm.saving`); before a load the cheap size check of a local folder, and after it the MoE
experts quantised as torchao or bitsandbytes quantised the Linear layers; a hand-edited width named by its config
field; pushes that publish hf_tfm's card unless the Hub holds one to keep. Without the package (a checkpoint's remote
code alone) the models save, load and push as transformers does.
"""

import inspect
import itertools
import os
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging

from .compat import upload_folder
from .quantization import finish_bitsandbytes_loading, finish_torchao_loading, refuse_unloadable_experts
from .saving import carry_over, check_file_sizes, is_staging, replace_folder

__all__ = ["check_file_sizes", "finish_loading", "push_with_card", "save_staged", "size_mismatch_error"]

logger = logging.get_logger(__name__)


# ------------------------------------------------------------------------------------------- saving and publishing


def _write_card(model, folder: Path, name: str | None, tags=None) -> None:
    """The model card (README.md). A card that cannot be written is a warning: it must never cost the save."""
    from .hub import card  # here: the card reads the training package's records, which `import hf_tfm` does not load

    try:
        card.write_card_on_save(folder, model, repo_id=name, tags=tags)
    except Exception as error:  # noqa: BLE001  (any failure of the card; the weights are what matters)
        logger.warning(
            f"the model card in {folder} was not written ({type(error).__name__}: {error}); the model is saved"
        )


def _hub_card_to_keep(repo_id: str, token, revision=None) -> bool:
    from .hub import card

    try:
        return card.hub_card_to_keep(repo_id, token=token, revision=revision)
    except Exception as error:  # noqa: BLE001  (an unreadable card on the Hub is replaced, not an error)
        logger.warning(f"could not read the model card of {repo_id} ({type(error).__name__}: {error}); replacing it")
        return False


def save_staged(model, save, save_directory, *args, **kwargs):
    """`save(save_directory, *args, **kwargs)` (transformers' `save_pretrained`) into a staging folder next to
    `save_directory`, plus the files of a previous save there that it does not replace (`carry_over`), a model card and
    the manifest, then swapped in whole: an interrupted save never damages the previous one.

    Saved in place as transformers does on processes that do not write (not the main one, not rank 0), with
    `distributed_checkpoint` (every rank writes), into a folder that holds the working directory (it cannot be renamed
    away), and into another save's staging folder (`is_staging`: that save swaps it in whole). `push_to_hub=True`
    pushes the swapped-in folder afterwards."""
    refuse_unloadable_experts(model)
    arguments = inspect.signature(save).bind(save_directory, *args, **kwargs)
    arguments.apply_defaults()
    options = dict(arguments.arguments)
    destination = Path(os.path.abspath(save_directory))
    cwd = Path.cwd()
    in_place = (
        not model.should_save_on_this_rank(options["is_main_process"])
        or options["distributed_checkpoint"]
        or destination.is_file()
        or destination == cwd
        or destination in cwd.parents
        or is_staging(destination)
    )
    if in_place:
        return save(save_directory, *args, **kwargs)
    extra = options.pop("kwargs")
    options.pop("save_directory")
    push = options.pop("push_to_hub")

    def write(staging: Path) -> None:
        save(staging, push_to_hub=False, **options, **extra)
        if destination.is_dir():
            carry_over(destination, staging)
        _write_card(model, staging, destination.name)

    replace_folder(write, destination)
    if push:  # as transformers' save_pretrained(push_to_hub=True): repo named after the folder unless given
        from huggingface_hub import create_repo

        token = options["token"] if options["token"] is not None else extra.pop("token", None)
        repo_id = extra.pop("repo_id", destination.name)
        commit = {"commit_message": extra.pop("commit_message", None), "create_pr": extra.pop("create_pr", False)}
        repo_id = create_repo(repo_id, exist_ok=True, token=token, **extra).repo_id
        upload(model, destination, repo_id, token=token, keep_hub_card=_hub_card_to_keep(repo_id, token), **commit)


def upload(model, folder, repo_id: str, **kwargs):
    return upload_folder(model, folder, repo_id, **kwargs)


def push_with_card(
    model,
    repo_id: str,
    *,
    commit_message=None,
    commit_description=None,
    private=None,
    token=None,
    revision=None,
    create_pr: bool = False,
    max_shard_size="50GB",
    tags=None,
):
    """`push_to_hub` as transformers does it (create the repo, save into a temporary folder, upload it in one commit),
    with hf_tfm's model card instead of transformers' stub, unless the Hub already holds a card to keep (a training
    run's, with its results, or the user's own): that one is left as it is."""
    from huggingface_hub import create_repo

    repo_id = create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
    keep = _hub_card_to_keep(repo_id, token, revision)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        if not keep:
            tags = [*(model.model_tags or []), *(tags or [])]  # as transformers: the model's tags, then the caller's
            _write_card(model, Path(folder), repo_id, tags)  # named after the repo, not the temporary folder
        return upload(
            model,
            folder,
            repo_id,
            token=token,
            keep_hub_card=keep,
            commit_message=commit_message,
            create_pr=create_pr,
            revision=revision,
            commit_description=commit_description,
        )


# ----------------------------------------------------------------------------------------------------------- loading


def finish_loading(model) -> None:
    """After every `from_pretrained`: the MoE experts quantised as torchao or bitsandbytes quantised the Linear
    layers."""
    finish_torchao_loading(model)
    finish_bitsandbytes_loading(model)


def size_mismatch_error(model_class, source, kwargs: dict, error: RuntimeError) -> Exception:
    """transformers' refusal of mismatched sizes (after a report), as an error naming the config.json field a hand edit
    changed, when `source` is a local folder whose weights it explains; else transformers' own."""
    folder = Path(source) / (kwargs.get("subfolder") or "")
    if "ignore_mismatched_sizes" not in str(error) or not folder.is_dir():
        return error
    message = size_mismatch_message(model_class, model_class.config_class.from_pretrained(folder), folder)
    return error if message is None else ValueError(message)


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
