"""What an hf_tfm model's `save_pretrained`, `from_pretrained` and `push_to_hub` hand over to when the hf_tfm
package is loaded (`hf_tfm.model.modeling_tfm_loading.package_hooks`): saves staged and swapped in whole with a model
card and a manifest (`hf_tfm.saving`), the cheap size check of a local folder before a load, and pushes that publish
hf_tfm's card unless the Hub holds one to keep. Without the package (a checkpoint's remote code alone) the models
save, load and push as transformers does.
"""

import inspect
import os
import tempfile
from pathlib import Path

from transformers.utils import logging

from ..compat import upload_folder
from ..saving import carry_over, check_file_sizes, is_staging, replace_folder
from . import card

__all__ = ["check_file_sizes", "push_with_card", "save_staged"]

logger = logging.get_logger(__name__)


# ------------------------------------------------------------------------------------------- saving and publishing


def _write_card(model, folder: Path, name: str | None, tags=None) -> None:
    """The model card (README.md). A card that cannot be written is a warning: it must never cost the save."""
    try:
        card.write_card_on_save(folder, model, repo_id=name, tags=tags)
    except Exception as error:  # noqa: BLE001  (any failure of the card; the weights are what matters)
        logger.warning(
            f"the model card in {folder} was not written ({type(error).__name__}: {error}); the model is saved"
        )


def _hub_card_to_keep(repo_id: str, token, revision=None) -> bool:
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
