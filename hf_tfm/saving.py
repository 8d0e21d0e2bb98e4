"""Saves that never damage the previous one, manifests that name a damaged file, and the model card of every save.

A save writes into a hidden sibling `.NAME.partial-HOST-PID`, records the size and SHA-256 of every file in
`hf_tfm_manifest.json` (written last, so a folder without it never finished), then swaps itself in with two renames
(`NAME` -> `.NAME.old-HOST-PID`, partial -> `NAME`). A kill at any point leaves `NAME` as it was, or leaves it missing
with the complete new save or the complete old one under a hidden name. The next save into `NAME` (or
`hf-tfm verify NAME --repair`) puts the newest complete one back and removes the leftovers of processes of this host
that are no longer running; a leftover of another host (a shared file system) is never touched, since this host cannot
tell whether its writer still runs.

A load reads and never writes: `from_pretrained` of a local folder compares its weight files' sizes with the manifest
(`check_file_sizes`: no hashing), and names the repair when the folder is missing after an interrupted save. Hashing
every byte is `hf-tfm verify`'s, and resume's (`hf_tfm.training.checkpoints`).

The models' own `save_pretrained` saves through `replace_folder`, with a model card (`hf_tfm.model_hooks`).
"""

import hashlib
import json
import os
import re
import shutil
import socket
from pathlib import Path

from safetensors import SafetensorError, safe_open
from transformers.utils import logging

logger = logging.get_logger(__name__)

MANIFEST = "hf_tfm_manifest.json"
# the weight files of a save: single file, shards or index; any variant; safetensors or torch; model or adapter
WEIGHT_FILE = re.compile(
    r"^(?P<kind>model|pytorch_model|adapter_model)(?P<variant>\.[^.-]+)?(-\d{5}-of-\d{5})?"
    r"\.(safetensors|bin)(\.index\.json)?$"
)
# a staging or retired folder: `.NAME.partial-HOST-PID`, or `.NAME.partial-PID` as earlier versions named them
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?:(?P<host>[A-Za-z0-9_.]+)-)?(?P<pid>\d+)$")


class CorruptCheckpoint(ValueError):
    pass


def this_host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


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
    """The `{file: {"size", "sha256"}}` entries of the folder's manifest, None when it has none; a manifest that is not
    what `write_manifest` writes raises CorruptCheckpoint naming it."""
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
    """A weight file (or its index): what a load checks against the manifest. Configs, card and tokenizer are not:
    users edit config.json by hand, and an edit that no longer fits the weights is an error naming the field."""
    return WEIGHT_FILE.match(name) is not None


def verify(folder, only=None) -> int:
    """Raise CorruptCheckpoint naming the first missing, truncated or altered file of a manifested folder, hashing
    every file it lists (`only`: a predicate on file names that limits them); the number of files checked."""
    folder = Path(folder)
    files = read_manifest(folder)
    if files is None:
        raise CorruptCheckpoint(f"{folder} has no {MANIFEST}: its save never finished, or other code wrote it")
    checked = 0
    for name, expected in files.items():
        if only is not None and not only(name):
            continue
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path} is missing")
        if path.stat().st_size != expected["size"] or sha256(path) != expected["sha256"]:
            raise CorruptCheckpoint(f"{path} does not match its manifest (truncated or altered after the save)")
        checked += 1
    return checked


def whole_safetensors(path: Path) -> bool:
    """Whether `path` is a safetensors file its header covers exactly (safetensors' own check on opening): rewritten
    whole by other code, not cut short."""
    try:
        with safe_open(path, "pt"):
            return True
    except (OSError, SafetensorError):
        return False


def check_file_sizes(source, subfolder: str = "") -> None:
    """Before `from_pretrained` reads a local folder: its weight files must have the sizes its manifest lists (a stat
    per file, no hashing; a folder without a manifest, saved by other code, is not checked). A safetensors file of
    another size that is whole, rewritten after the save by other code, loads as transformers loads it, with a warning
    that names it; a missing or cut-short file is an error. A folder missing after an interrupted save is named, with
    its repair. Reads only."""
    if not isinstance(source, (str, os.PathLike)):
        return
    folder = Path(os.path.abspath(Path(source) / subfolder))
    if not folder.exists() and leftovers(folder):
        parts = ", ".join(path.name for path, _, _, _ in leftovers(folder))
        raise FileNotFoundError(
            f"{folder} does not exist: a save into it was interrupted before it completed ({parts} left beside it). "
            f"`hf-tfm verify {folder} --repair` puts the newest complete save back, or save the model again."
        )
    files = read_manifest(folder) if folder.is_dir() else None
    for name, expected in (files or {}).items():
        path = folder / name
        if not is_weight_file(path.name) or (path.is_file() and path.stat().st_size == expected["size"]):
            continue
        state = "is missing" if not path.is_file() else f"has {path.stat().st_size} bytes, {expected['size']} saved"
        if path.is_file() and path.suffix == ".safetensors" and whole_safetensors(path):
            logger.warning(
                f"{path} {state}: rewritten after the save by other code, it is loaded as it is now. `hf-tfm verify "
                f"{folder}` compares every file with the save's manifest"
            )
            continue
        raise CorruptCheckpoint(
            f"{path} {state} (truncated or altered after the save): `hf-tfm verify {folder}` checks every file"
        )


# ------------------------------------------------------------------------------------------------- the staged swap


def _sibling(destination: Path, kind: str) -> Path:
    return destination.with_name(f".{destination.name}.{kind}-{this_host()}-{os.getpid()}")


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


def leftovers(destination: Path) -> list[tuple[Path, str, str | None, int]]:
    """(folder, "partial" or "old", host or None for an earlier version's name, pid) of every staging or retired folder
    left next to `destination`, nested ones too (a save inside a staging folder stages beside it)."""
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
            found.append((entry, match["kind"], match["host"], int(match["pid"])))
    return found


def is_staging(folder: Path) -> bool:
    """A staging or retired folder of a save: its writer's alone, so saves into it need no staging of their own."""
    return _LEFTOVER.match(folder.name) is not None


def _complete(folder: Path, kind: str) -> bool:
    """A staging folder is complete when its manifest verifies; a retired one is the previous save renamed whole,
    complete unless its manifest says otherwise (folders saved before manifests have none)."""
    try:
        if kind == "partial" or (folder / MANIFEST).is_file():
            verify(folder)
        return True
    except CorruptCheckpoint:
        return False


def _saved_at(folder: Path) -> float:
    manifest = folder / MANIFEST
    return (manifest if manifest.is_file() else folder).stat().st_mtime


def recover_folder(destination) -> list[Path]:
    """Undo what killed saves of this host left beside `destination`: when `destination` is missing, rename the newest
    complete leftover back to it; then delete the leftovers of this host's processes that are no longer running.
    Returns the leftovers it cannot judge (another host's, or an earlier version's without a host), left in place."""
    destination = Path(destination)
    found = leftovers(destination)
    stale = [(path, kind) for path, kind, host, pid in found if host == this_host() and not _alive(pid)]
    foreign = [path for path, _, host, _ in found if host != this_host()]
    if stale and not destination.exists():
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
    if foreign:
        names = ", ".join(path.name for path in foreign)
        logger.warning(
            f"left beside {destination}: {names}, written by another host or an earlier hf_tfm, which this host "
            "cannot tell finished; remove them once no other host saves there"
        )
    return foreign


def replace_folder(write, destination) -> Path:
    """Run `write(folder)` into a fresh sibling folder, manifest it, then swap it in for `destination`. An exception
    while writing leaves any previous `destination` as it was; a kill at any point leaves it as it was or recoverable
    by the next `replace_folder` (`recover_folder`)."""
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
    previous weights of the kind the save wrote (else a stale `model.safetensors` would shadow new shards), and the old
    manifest (rewritten after)."""
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


# ------------------------------------------------------------------------------------------------- hf-tfm verify


def verify_folder(folder, repair: bool = False) -> str:
    """`hf-tfm verify FOLDER [--repair]`: with `repair`, first what the next save would do (`recover_folder`); then the
    weight files the manifest lists, hashed against it. Returns the report line, which also names the other files
    edited since the save (a config.json or card edited by hand is no damage); raises CorruptCheckpoint naming the
    first damaged weight file, or FileNotFoundError for a missing folder."""
    folder = Path(os.path.abspath(folder))
    foreign = recover_folder(folder) if repair else []
    if not folder.is_dir():
        found = ", ".join(path.name for path, _, _, _ in leftovers(folder))
        hint = f" ({found} left beside it; --repair restores the newest complete one)" if found and not repair else ""
        raise FileNotFoundError(f"{folder} does not exist{hint}")
    checked = verify(folder, only=is_weight_file)
    edited = []
    for name, expected in read_manifest(folder).items():
        path = folder / name
        if not is_weight_file(name) and (not path.is_file() or sha256(path) != expected["sha256"]):
            edited.append(name)
    notes = [f"edited since the save: {', '.join(edited)}"] if edited else []
    notes += [f"left in place: {', '.join(path.name for path in foreign)}"] if foreign else []
    return f"{folder}: {checked} weight files match the manifest" + "".join(f"; {note}" for note in notes)
