"""What every results file carries (device, versions, date, command) and where it is written."""

import datetime
import json
import platform
from pathlib import Path

import torch
import transformers

RESULTS = Path(__file__).parent / "results"


def header(profile: str, command: str, device: torch.device) -> dict:
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    versions = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    return {"profile": profile, "date": datetime.date.today().isoformat(), "command": command, "device": name,
            "versions": versions}


def write(record: dict, stem: str, output: Path | None = None) -> Path:
    """Write `record` to `output`, by default benchmarks/results/<stem>-<date>.json."""
    output = output or RESULTS / f"{stem}-{record['date']}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {output}")
    return output
