"""Push a saved model folder to the Hugging Face Hub (`hf-tfm push FOLDER REPO_ID`).

The folder goes up as saved (`save_pretrained` output: config.json with `auto_map`, the flat modeling code, weights,
tokenizer files, generation_config.json, and the README.md model card if one was written) in one `upload_folder`
call. The client honours `HF_ENDPOINT` and `HF_TOKEN` (or the token saved by `hf auth login`).
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import CommitInfo, HfApi
from huggingface_hub.errors import HfHubHTTPError

from ..training.checkpoints import WEIGHT_FILES


class NotAModelFolderError(FileNotFoundError):
    """The path given to push is not a folder written by `save_pretrained`."""


def check_model_folder(folder: str | Path) -> Path:
    """`folder` as a Path if it holds a saved model (config.json and weights); a clear error naming it otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotAModelFolderError(
            f"{folder} is not a folder: expected a saved model folder (model.save_pretrained(...))"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise NotAModelFolderError(
            f"{folder} is not a saved model folder: it has no config.json (write one with model.save_pretrained)"
        )
    try:
        json.loads(config_file.read_text())
    except ValueError as error:
        raise NotAModelFolderError(
            f"{folder} is not a saved model folder: {config_file} is not valid JSON ({error})"
        ) from error
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise NotAModelFolderError(
            f"{folder} is not a saved model folder: it has config.json but no weights ({', '.join(WEIGHT_FILES)})"
        )
    return folder


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> str:
    """Push the saved model `folder` to `repo_id` and return the commit URL (a `huggingface_hub.CommitInfo`, which is
    a `str` with `.oid` and `.repo_url`).

    Creates the repo if needed (`private` applies to a new repo; pushing with `private=True` to an existing public
    repo is refused rather than publishing), creates the branch `revision` from `main` if it does not exist, and
    uploads every file of the folder in one commit (the client retries a failed commit, a folder of more than 20 files
    in smaller commits). Unchanged files are skipped by the client, so re-running a push
    that failed half-way completes it. An HTTP failure is raised as the client's `HfHubHTTPError`, with the folder,
    repo and revision appended to its message; the local folder is never modified.
    """
    folder = check_model_folder(folder)
    api = HfApi(token=token)
    where = f"{repo_id}" + (f" (revision {revision!r})" if revision else "")
    try:
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if private and not api.repo_info(repo_id).private:
            raise ValueError(
                f"{repo_id} already exists and is public: refusing to push {folder} there with --private. "
                "Make the repo private on the Hub first, or push without --private."
            )
        if revision and revision != "main" and not revision.startswith("refs/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit: CommitInfo = api.upload_folder(
            folder_path=folder,
            repo_id=repo_id,
            revision=revision,
            commit_message=commit_message or f"Upload {folder.name} with hf_tfm",
        )
    except HfHubHTTPError as error:
        error.append_to_message(
            f"\n\nPushing {folder} to {where} failed; the local folder is unchanged. Run the push again to resume: "
            "files the Hub already holds are skipped."
        )
        raise
    return commit
