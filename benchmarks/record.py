"""What every results file carries (device, versions, date, command) and where it is written."""

import datetime
import json
import platform
import subprocess
from pathlib import Path

import torch
import transformers

import hf_tfm

RESULTS = Path(__file__).parent / "results"


def commit() -> str:
    """The checked-out commit, "+dirty" when the working tree differs from it (results of uncommitted code)."""
    root = Path(__file__).parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "hf_tfm", "benchmarks/*.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def header(profile: str, command: str, device: torch.device) -> dict:
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_tfm": hf_tfm.__version__,
        "commit": commit(),
    }
    return {
        "profile": profile,
        "date": datetime.date.today().isoformat(),
        "command": command,
        "device": name,
        "versions": versions,
    }


def write(record: dict, stem: str, output: Path | None = None) -> Path:
    """Write `record` to `output`, by default benchmarks/results/<stem>-<date>.json."""
    output = output or RESULTS / f"{stem}-{record['date']}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {output}")
    return output
