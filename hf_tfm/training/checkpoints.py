"""Checkpoints that are never mistaken for good ones when they are not, and saves that never destroy good ones.

`Trainer` writes `checkpoint-N/` in place, so a run killed mid-save leaves a half-written folder that its own
`get_last_checkpoint` would pick. `ManifestCallback` writes a manifest (size and SHA-256 of every file) after a save
completes, by write-then-rename; resuming takes the newest checkpoint whose manifest verifies. Old checkpoints are
pruned by the callback only after a newer one is verified, instead of by `save_total_limit` (which deletes first).
"""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

MANIFEST = "hf_tfm_manifest.json"
# what makes a folder a saved model, besides config.json
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# the Auto class that loads a saved head, read off its `architectures` entry: hf_tfm's heads and the converters' sources
AUTO_CLASS_BY_SUFFIX = {
    "ForCausalLM": "AutoModelForCausalLM",
    "LMHeadModel": "AutoModelForCausalLM",
    "ForMaskedLM": "AutoModelForMaskedLM",
    "ForConditionalGeneration": "AutoModelForSeq2SeqLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
    "ForTokenClassification": "AutoModelForTokenClassification",
    "ForQuestionAnswering": "AutoModelForQuestionAnswering",
}
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class CorruptCheckpoint(ValueError):
    pass


def _sha256(path: Path) -> str:
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
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"))
    entries = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    write_json_atomic(folder / MANIFEST, {"files": entries})


def verify(folder: str | Path) -> None:
    """Raise CorruptCheckpoint naming the first missing, truncated or altered file of a manifested folder."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise CorruptCheckpoint(f"{folder} has no {MANIFEST}: its save never finished")
    for name, expected in json.loads(manifest.read_text())["files"].items():
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path} is missing")
        if path.stat().st_size != expected["size"] or _sha256(path) != expected["sha256"]:
            raise CorruptCheckpoint(f"{path} does not match its manifest (truncated or altered after the save)")


def load_saved(folder: str | Path, auto_class=None, **kwargs):
    """The model in a saved folder, verified against its manifest when it has one, loaded with `auto_class` or else
    the Auto class of the head its `architectures` entry names (`AutoModel` for a base model)."""
    import transformers

    import hf_tfm  # noqa: F401  (registers the tfm model types with the Auto classes)

    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a saved model folder: config.json not found in it")
    if (folder / MANIFEST).is_file():
        verify(folder)
    if auto_class is None:
        architecture = (json.loads(config_file.read_text()).get("architectures") or [""])[0]
        name = next((auto for suffix, auto in AUTO_CLASS_BY_SUFFIX.items() if architecture.endswith(suffix)), "AutoModel")
        auto_class = getattr(transformers, name)
    try:
        return auto_class.from_pretrained(folder, **kwargs)
    except Exception as error:  # a damaged or foreign file: say which folder, keep the cause
        raise ValueError(f"could not load the model in {folder}: {type(error).__name__}: {error}") from error


def checkpoints(folder: Path) -> list[Path]:
    """`checkpoint-N` folders, newest first."""
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and _CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(_CHECKPOINT.match(p.name).group(1)), reverse=True)


def step_of(checkpoint: Path) -> int:
    return int(_CHECKPOINT.match(checkpoint.name).group(1))


def last_good_checkpoint(folder: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest verified checkpoint under `folder`, and each newer one passed over with the reason."""
    passed_over = []
    for checkpoint in checkpoints(folder):
        try:
            verify(checkpoint)
            return checkpoint, passed_over
        except CorruptCheckpoint as problem:
            passed_over.append((checkpoint, str(problem)))
    return None, passed_over


class ManifestCallback(TrainerCallback):
    """After each save: manifest the new checkpoint, then keep only the `keep` newest verified ones."""

    def __init__(self, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoint, got {keep}")
        self.keep = keep

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        root = Path(args.output_dir)
        write_manifest(root / f"checkpoint-{state.global_step}")
        good = []
        for checkpoint in checkpoints(root):
            if step_of(checkpoint) > state.global_step:
                continue  # left by an earlier, longer run in the same folder: not ours to judge
            try:
                verify(checkpoint)
                good.append(checkpoint)
            except CorruptCheckpoint:
                shutil.rmtree(checkpoint)  # half-written by a killed run, older than a verified one
        for stale in good[self.keep :]:
            shutil.rmtree(stale)


def replace_folder(write, destination: str | Path) -> Path:
    """Run `write(folder)` into a fresh sibling folder, manifest it, then swap it in for `destination`.

    A crash or an exception while writing leaves any previous `destination` as it was."""
    destination = Path(destination)
    staging = destination.with_name(f".{destination.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write(staging)
        write_manifest(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    if destination.exists():
        os.replace(destination, retired)
    os.replace(staging, destination)
    shutil.rmtree(retired, ignore_errors=True)
    return destination
