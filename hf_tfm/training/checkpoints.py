"""Checkpoints that are never mistaken for good ones when they are not, and saves that never destroy good ones.

`Trainer` writes `checkpoint-N/` in place, so a run killed mid-save leaves a half-written folder that its own
`get_last_checkpoint` would pick. `ManifestCallback` writes a manifest (size and SHA-256 of every file) after a save
completes, by write-then-rename; resuming takes the newest checkpoint whose manifest verifies and whose optimizer
state loads. Old checkpoints are pruned by the callback only after a newer one is verified, instead of by
`save_total_limit` (which deletes first). The manifest, the staged folder swap and their recovery after a kill live in
`hf_tfm.saving`, shared with the models' own `save_pretrained`.
"""

import json
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

from ..saving import (  # noqa: F401  (re-exported: the training code's names for them)
    MANIFEST,
    CorruptCheckpoint,
    check_file_sizes,
    replace_folder,
    verify,
    write_json_atomic,
    write_manifest,
)
from .tasks import head_for_architecture

# what makes a folder a saved model, besides config.json
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# what Trainer loads with torch.load(weights_only=True) when it resumes from a checkpoint
TRAINER_STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def load_saved(folder: str | Path, auto_class=None, **kwargs):
    """The model in a saved folder, its weight files' sizes checked against its manifest when it has one, loaded with
    `auto_class` or else the Auto class of the head its `architectures` entry names (`AutoModel` for a base model).
    A folder missing after an interrupted save is named with its repair (`hf-tfm verify --repair`): a load writes
    nothing."""
    import transformers

    import hf_tfm  # noqa: F401  (registers the tfm model types with the Auto classes)

    folder = Path(folder)
    check_file_sizes(folder)  # hf_tfm's models check again: a stat per file
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a saved model folder: config.json not found in it")
    config = json.loads(config_file.read_text())
    if auto_class is None:
        architecture = (config.get("architectures") or [""])[0]
        head = head_for_architecture(architecture)
        auto_class = getattr(transformers, head.auto_class if head else "AutoModel")
    try:
        return auto_class.from_pretrained(folder, **kwargs)
    except CorruptCheckpoint:
        raise  # names the file already
    except Exception as error:  # a damaged or foreign file: say which folder, keep the cause
        raise ValueError(f"could not load the model in {folder}: {type(error).__name__}: {error}") from error


def checkpoints(folder: Path) -> list[Path]:
    """`checkpoint-N` folders, newest first."""
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and _CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(_CHECKPOINT.match(p.name).group(1)), reverse=True)


def step_of(checkpoint: Path) -> int:
    return int(_CHECKPOINT.match(checkpoint.name).group(1))


def check_trainer_state(checkpoint: Path) -> None:
    """Raise CorruptCheckpoint naming a state file Trainer would fail to load on resume: it loads them with
    `torch.load(weights_only=True)`, which refuses pickled objects it does not allow."""
    import torch

    for name in TRAINER_STATE_FILES:
        path = checkpoint / name
        if path.is_file():
            try:
                torch.load(path, map_location="cpu", weights_only=True)
            except Exception as error:  # noqa: BLE001  (UnpicklingError, a truncated zip, ...: all unusable)
                reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise CorruptCheckpoint(
                    f"{path} cannot be loaded safely ({type(error).__name__}: {reason})"
                ) from error


def last_good_checkpoint(folder: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint under `folder` whose manifest verifies and whose optimizer state loads, and each newer
    one passed over with the reason."""
    passed_over = []
    for checkpoint in checkpoints(folder):
        try:
            verify(checkpoint)
            check_trainer_state(checkpoint)  # only for the one about to be chosen: cheap at our sizes
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
        newest = root / f"checkpoint-{state.global_step}"
        write_manifest(newest)
        good = []
        for checkpoint in checkpoints(root):
            if step_of(checkpoint) > state.global_step:
                continue  # left by an earlier, longer run in the same folder: not ours to judge
            try:
                if checkpoint != newest:  # its manifest was just computed from its files: no second hashing
                    verify(checkpoint)
                good.append(checkpoint)
            except CorruptCheckpoint:
                shutil.rmtree(checkpoint)  # half-written by a killed run, older than a verified one
        for stale in good[self.keep :]:
            shutil.rmtree(stale)
