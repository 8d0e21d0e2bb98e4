"""Saves that never damage the previous one, and loads that notice damaged or mismatched weights.

A save writes into a hidden sibling `.NAME.partial-PID`, records the size and SHA-256 of every file in
`hf_tfm_manifest.json` (written last, so a folder without it never finished), then swaps itself in with two renames
(`NAME` -> `.NAME.old-PID`, partial -> `NAME`). A kill at any point leaves `NAME` as it was, or leaves it missing with
the complete new save or the complete old one under a hidden name: the next save or load into `NAME` puts the newest
complete one back and removes what killed saves left behind (only those of processes that are no longer running).

This module is shipped as remote code with the models: it imports only the standard library and transformers.
"""

import hashlib
import inspect
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

MANIFEST = "hf_tfm_manifest.json"
# the weight files of a save: single file, shards or index; any variant; safetensors or torch; model or adapter
WEIGHT_FILE = re.compile(
    r"^(?P<kind>model|pytorch_model|adapter_model)(?P<variant>\.[^.-]+)?(-\d{5}-of-\d{5})?"
    r"\.(safetensors|bin)(\.index\.json)?$"
)
# modules a head adds on top of the body, and the pooler that only the classification heads use: loading a saved
# model into another head may legitimately miss or leave over their weights, never the body's. Each head class adds
# the name of its task layer here as it is defined (modeling_tfm.TfmHead), so no head can be left out.
HEAD_MODULES = {"pooler"}
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)$")


class CorruptCheckpoint(ValueError):
    pass


# ---------------------------------------------------------------------------------------------------- the manifest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json_atomic(path: Path, payload) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w") as handle:
        json.dump(payload, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def write_manifest(folder: Path) -> None:
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"))
    entries = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256(p)} for p in files}
    write_json_atomic(folder / MANIFEST, {"files": entries})


def read_manifest(folder: Path) -> dict | None:
    """The `{file: {"size", "sha256"}}` entries of the folder's manifest, None when it has none; a manifest that is
    not what `write_manifest` writes raises CorruptCheckpoint naming it."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        if not all(isinstance(e["size"], int) and isinstance(e["sha256"], str) for e in files.values()):
            raise TypeError("entries need an integer size and a sha256 string")
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # JSONDecodeError is a ValueError
        raise CorruptCheckpoint(
            f"{path} is damaged ({type(error).__name__}: {error}): its folder cannot be trusted"
        ) from error
    return files


def is_weight_file(name: str) -> bool:
    """A weight file (or its index): what a load checks against the manifest. Configs, card and tokenizer are not
    checked: users edit config.json by hand (a longer max_position_embeddings, another rope_parameters), and an
    edit that no longer fits the weights is an error naming the field (`check_loaded_weights`)."""
    return WEIGHT_FILE.match(name) is not None


def verify(folder, only=None) -> None:
    """Raise CorruptCheckpoint naming the first missing, truncated or altered file of a manifested folder; `only`
    (a predicate on file names) limits the check to some of the files the manifest lists."""
    folder = Path(folder)
    files = read_manifest(folder)
    if files is None:
        raise CorruptCheckpoint(f"{folder} has no {MANIFEST}: its save never finished")
    for name, expected in files.items():
        if only is not None and not only(name):
            continue
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path} is missing")
        if path.stat().st_size != expected["size"] or sha256(path) != expected["sha256"]:
            raise CorruptCheckpoint(f"{path} does not match its manifest (truncated or altered after the save)")


# ------------------------------------------------------------------------------------------------- the staged swap


def _sibling(destination: Path, kind: str) -> Path:
    return destination.with_name(f".{destination.name}.{kind}-{os.getpid()}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, from an earlier save in this process that did not finish
    if os.name == "nt":
        return True  # os.kill would terminate it: never judge another process's folder there
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(destination: Path) -> list[tuple[Path, str, int]]:
    """(folder, "partial" or "old", pid) of every staging or retired folder left next to `destination`, nested ones
    too: a save into a staging folder (a save of its own inside a bigger save, such as a run's final model) stages
    beside it as `..NAME.partial-PID.partial-PID`."""
    if not destination.parent.is_dir():
        return []
    found = []
    for entry in destination.parent.iterdir():
        match = _LEFTOVER.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        name = match["name"]
        while name != destination.name and (inner := _LEFTOVER.match(name)):
            name = inner["name"]
        if name == destination.name:
            found.append((entry, match["kind"], int(match["pid"])))
    return found


def is_staging(folder: Path) -> bool:
    """A staging or retired folder of a save (`.NAME.partial-PID`): its writer's alone, so saves into it need no
    staging of their own."""
    return _LEFTOVER.match(folder.name) is not None


def _complete(folder: Path, kind: str) -> bool:
    """A staging folder is complete when its manifest verifies; a retired one is the previous `destination` renamed
    whole, complete unless its manifest says otherwise (folders saved before manifests have none)."""
    try:
        if kind == "partial" or (folder / MANIFEST).is_file():
            verify(folder)
        return True
    except CorruptCheckpoint:
        return False


def _saved_at(folder: Path) -> float:
    manifest = folder / MANIFEST
    return (manifest if manifest.is_file() else folder).stat().st_mtime


def recover_folder(destination) -> None:
    """Undo what killed saves into `destination` left behind: when `destination` is missing, rename the newest
    complete leftover back to it; then delete the leftovers of processes that are no longer running."""
    destination = Path(destination)
    stale = [(path, kind) for path, kind, pid in leftovers(destination) if not _alive(pid)]
    if not stale:
        return
    if not destination.exists():
        # only a direct leftover can be the model folder; a nested one was a save inside a staging folder
        direct = [(path, kind) for path, kind in stale if _LEFTOVER.match(path.name)["name"] == destination.name]
        complete = [path for path, kind in direct if _complete(path, kind)]
        if complete:
            newest = max(complete, key=_saved_at)
            try:
                os.replace(newest, destination)
                logger.warning(f"{destination} was missing after an interrupted save: restored it from {newest.name}")
            except OSError as error:  # another process restored it first, or a read-only folder
                if not destination.exists():
                    raise FileNotFoundError(
                        f"{destination} is missing and {newest} could not be restored: {error}"
                    ) from error
    for path, _ in stale:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)


def replace_folder(write, destination) -> Path:
    """Run `write(folder)` into a fresh sibling folder, manifest it, then swap it in for `destination`.

    An exception while writing leaves any previous `destination` as it was; a kill at any point leaves it as it was
    or recoverable by the next `replace_folder` or load (`recover_folder`)."""
    destination = Path(os.path.abspath(destination))
    if destination.is_symlink():
        destination = destination.resolve()  # keep the link, update the folder it points to
    if destination.exists() and not destination.is_dir():
        raise NotADirectoryError(f"{destination} is a file, not a folder: cannot save a model there")
    recover_folder(destination)
    staging = _sibling(destination, "partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write(staging)
        write_manifest(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = _sibling(destination, "old")
    if destination.exists():
        os.replace(destination, retired)
    os.replace(staging, destination)
    shutil.rmtree(retired, ignore_errors=True)
    return destination


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target)  # the new folder shares the unchanged file: no copy, and nothing written in place
    except OSError:
        shutil.copy2(source, target)


def _weight_family(name: str):
    match = WEIGHT_FILE.match(name)
    if match is None:
        return None
    return ("adapter" if match["kind"] == "adapter_model" else "model", match["variant"])


def carry_over(old: Path, new: Path) -> None:
    """Give the staged save in `new` every file of the previous folder `old` that the save did not write itself (a
    tokenizer, the model card, the run record, sub-folders), by hard link where the file system allows. Left out: the
    previous weights of the kind the save wrote (else a stale `model.safetensors` would shadow new shards), and the
    old manifest (rewritten after)."""
    written = set(os.listdir(new))
    superseded = {_weight_family(name) for name in written} - {None}
    for entry in os.scandir(old):
        if entry.name in written or entry.name == MANIFEST or _weight_family(entry.name) in superseded:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.copytree(entry.path, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry.path), new / entry.name)
        else:
            _link_or_copy(entry.path, new / entry.name)


def _card_code():
    """hf_tfm's card code (hf_tfm.hub.card) when hf_tfm is loaded (its __init__ imports it), for these modules in the
    package and for their copies running as remote code alike; None without hf_tfm (transformers' card is kept).
    Looked up, not imported: the card code reads the models, so importing it here would make them import each other."""
    return sys.modules.get("hf_tfm.hub.card")


def _write_card(model, folder: Path, name: str | None, tags=None) -> None:
    """The model card (README.md) from hf_tfm's card code. A card that cannot be written is a warning: it must never
    cost the save."""
    card = _card_code()
    if card is None:
        return
    try:
        card.write_card_on_save(folder, model, repo_id=name, tags=tags)
    except Exception as error:  # noqa: BLE001  (any failure of the card; the weights are what matters)
        logger.warning(
            f"the model card in {folder} was not written ({type(error).__name__}: {error}); the model is saved"
        )


def _hub_card_to_keep(repo_id: str, token, revision=None) -> bool:
    card = _card_code()
    try:
        return card is not None and card.hub_card_to_keep(repo_id, token=token, revision=revision)
    except Exception as error:  # noqa: BLE001  (an unreadable card on the Hub is replaced, not an error)
        logger.warning(f"could not read the model card of {repo_id} ({type(error).__name__}: {error}); replacing it")
        return False


def upload(model, folder, repo_id: str, **kwargs):
    from .compat import upload_folder  # imported here: this module also runs alone, loaded from its file

    return upload_folder(model, folder, repo_id, **kwargs)


def save_staged(model, save, save_directory, *args, **kwargs):
    """`save(save_directory, *args, **kwargs)` (transformers' `save_pretrained`) into a staging folder next to
    `save_directory`, plus the files of a previous save there that it does not replace (`carry_over`), a model card
    and the manifest, then swapped in whole: an interrupted save never damages the previous one.

    Saved in place as transformers does on processes that do not write (not the main one, not rank 0), with
    `distributed_checkpoint` (every rank writes), into a folder that holds the working directory (it cannot be
    renamed away), and into another save's staging folder (`is_staging`: that save swaps it in whole).
    `push_to_hub=True` pushes the swapped-in folder afterwards."""
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


def push_with_card(
    model,
    fallback,
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
    """`push_to_hub` as transformers does it (create the repo, save into a temporary folder, upload it in one
    commit), with hf_tfm's model card instead of transformers' stub, unless the Hub already holds a card to keep (a
    training run's, with its results, or the user's own): that one is left as it is. Without hf_tfm installed (remote
    code), `fallback` (transformers' push_to_hub) does it all."""
    if _card_code() is None:
        return fallback(
            repo_id,
            commit_message=commit_message,
            commit_description=commit_description,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
            max_shard_size=max_shard_size,
            tags=tags,
        )
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


# ---------------------------------------------------------------------------------------------------------- loading


def local_folder(source, subfolder: str = "") -> Path | None:
    """The local folder `from_pretrained(source)` reads, or None for a Hub repo id (or a state dict without one)."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    folder = Path(os.path.abspath(Path(source) / subfolder))
    if folder.is_dir() or leftovers(folder):
        return folder
    return None


def check_local_folder(folder: Path) -> None:
    """Before loading a local folder: restore it after an interrupted save, and check the model files its manifest
    lists (a folder without a manifest, saved before hf_tfm wrote them or by other code, loads unchecked)."""
    recover_folder(folder)
    if not folder.exists():
        parts = ", ".join(path.name for path, _, _ in leftovers(folder))
        raise FileNotFoundError(
            f"{folder} does not exist: a save into it was interrupted before it completed ({parts} left incomplete"
            " or still being written). Save the model again."
        )
    if (folder / MANIFEST).is_file():
        verify(folder, only=is_weight_file)


def body_weights(model, keys) -> list[str]:
    """The keys that belong to the model's body, not to a head: those under the base model prefix for a head class;
    for a base class any key (a head checkpoint's body keys it has no place for keep their prefix); the head modules
    (HEAD_MODULES) excepted."""
    prefix = f"{model.base_model_prefix}."
    is_base = model.base_model is model
    body = []
    for key in keys:
        if not (key.startswith(prefix) or is_base):
            continue
        if key.removeprefix(prefix).split(".", 1)[0] not in HEAD_MODULES:
            body.append(key)
    return sorted(body)


def _modules_of(keys, most: int = 12) -> str:
    """The modules the weights belong to, layer numbers folded (`model.layers.{0, 1}.mlp.gate_proj`)."""
    from .compat import fold_layer_numbers  # imported here: this module also runs alone, loaded from its file

    names = fold_layer_numbers({key.rsplit(".", 1)[0] for key in keys})
    more = f" (and {len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


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
    import torch

    with torch.device("meta"):
        built = {key: tuple(value.shape) for key, value in model_class(config).state_dict().items()}
    return [(key, shape, built[key]) for key, shape in saved.items() if key in built and built[key] != shape]


def size_mismatch_message(model_class, config, folder: Path) -> str | None:
    """Name the config.json field (a hand edit) that makes the weights' shapes differ: the field which, put back to
    the width the weights have, makes the most of them fit (`hidden_size=64 in config.json, 32-wide weights`); then
    the weights themselves. None when no saved shape differs."""
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


def check_loaded_weights(model, info: dict, source) -> None:
    """Raise when the loaded weights do not fit the model built from its config: any missing or unexpected weight
    when the checkpoint was saved from this very class, the body's when it was saved from another head (whose own
    weights are then legitimately missing or left over)."""
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    saved_as = (getattr(model.config, "architectures", None) or [None])[0]
    if saved_as != type(model).__name__:
        missing, unexpected = body_weights(model, missing), body_weights(model, unexpected)
    if not missing and not unexpected:
        return
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint (they would be random): {_modules_of(missing)}")
    if unexpected:
        problems.append(f"in the checkpoint but not in the model: {_modules_of(unexpected)}")
    raise ValueError(
        f"the weights in {source} do not match {type(model).__name__} built from its config; weights "
        + "; weights ".join(problems)
        + ". Check the config fields that shape the model (num_hidden_layers, ffn_type, position_embedding_type, "
        "num_experts, ...) against the saved model, or pass strict=False to load it anyway (the missing weights are "
        "freshly initialised)."
    )


def load_checked(load, source, *model_args, strict: bool = True, **kwargs):
    """`load(source, ...)` (transformers' `from_pretrained`) after `check_local_folder`, then `check_loaded_weights`
    unless `strict=False` or `ignore_mismatched_sizes=True`. Hub repo ids are not checked against a manifest: the Hub
    client already checks each downloaded file's hash."""
    folder = local_folder(source, kwargs.get("subfolder") or "")
    if folder is not None:
        check_local_folder(folder)
    want_info = kwargs.pop("output_loading_info", False)
    try:
        model, info = load(source, *model_args, output_loading_info=True, **kwargs)
    except RuntimeError as error:  # transformers refuses mismatched sizes after printing a report: name the field
        if folder is None or "ignore_mismatched_sizes" not in str(error):
            raise
        model_class = load.__self__
        message = size_mismatch_message(model_class, model_class.config_class.from_pretrained(folder), folder)
        if message is None:
            raise
        raise ValueError(message) from error
    if strict and not kwargs.get("ignore_mismatched_sizes", False):
        check_loaded_weights(model, info, source)
    return (model, info) if want_info else model


# ------------------------------------------------------------------------------------------------- the model's methods


class TfmSavingMixin:
    """What an hf_tfm model adds to transformers' saving, loading and publishing (a base of TfmPreTrainedModel, before
    PreTrainedModel, whose methods these call): staged saves with a manifest and a model card, checked loads, and
    pushes that keep a card worth keeping."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers writes `auto_map` only for the saved class; list every Auto class of this paradigm so that
        # AutoModel, AutoModelFor... all load the folder with trust_remote_code.
        classes = getattr(self.config, "auto_classes", {})
        if self._auto_class is not None and classes:
            auto_map = {"AutoConfig": f"configuration_tfm.{type(self.config).__name__}"}
            auto_map.update({auto: f"modeling_tfm.{name}" for auto, name in classes.items()})
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **auto_map}
        # staged and swapped in whole, with a manifest and a model card (modeling_tfm_saving.save_staged)
        return save_staged(self, super().save_pretrained, save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs):
        """transformers' `from_pretrained`, plus for hf_tfm: a local folder is restored if a killed save left it
        missing and its manifest must verify (altered weights are an error naming the file), and weights that do not
        fit the config are an error instead of a logged report. Loading into another head (a masked LM into
        `...ForSequenceClassification`) may miss the new head's weights and leave the old head's over; the body's
        must match. `strict=False` (or `ignore_mismatched_sizes=True`) accepts any mismatch, as transformers does.
        With a torchao `quantization_config` the MoE experts' 3D weights are quantised too (modeling_tfm_quantization).
        """
        load = super().from_pretrained
        loaded = load_checked(load, pretrained_model_name_or_path, *model_args, strict=strict, **kwargs)
        from .modeling_tfm_layers import freeze_lm_head_bias  # here: this module also runs alone
        from .modeling_tfm_quantization import finish_torchao_loading

        model = loaded[0] if isinstance(loaded, tuple) else loaded
        finish_torchao_loading(model)
        freeze_lm_head_bias(model.config, model.get_output_embeddings())
        return loaded

    def push_to_hub(self, repo_id: str, **kwargs):
        """transformers' `push_to_hub` (same keyword arguments), publishing hf_tfm's model card unless the repo
        already has a card to keep (a training run's with its results, or the user's own)."""
        return push_with_card(self, super().push_to_hub, repo_id, **kwargs)
