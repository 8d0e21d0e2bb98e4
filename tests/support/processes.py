"""Launching the multi-process tests: torchrun and `accelerate launch` start workers of their own."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_process_group(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)` in a process group of its own, the whole group killed
    on a timeout: killing the launcher alone would leave its ranks running, spinning in their collectives, long after
    the tests."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_workers(worker: Path, out: Path, processes: int = 2, timeout: float = 600, **env: str) -> dict:
    """`torchrun --standalone --nproc_per_node PROCESSES WORKER OUT` from the repository root, offline, one thread a
    process, `env` added to the environment; returns the OUT/results.json the worker wrote. A failed launch fails the
    caller with the command and the ends of its output."""
    import json
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    run = run_process_group([*command, str(worker), str(out)], cwd=REPO, env={**environment, **env}, timeout=timeout)
    assert run.returncode == 0, f"{' '.join(command)} {worker} {out}\n{run.stdout[-3000:]}\n{run.stderr[-8000:]}"
    return json.loads((Path(out) / "results.json").read_text())


def run_without_hf_tfm(script: str, tmp_path) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter where `import hf_tfm` fails, with an empty remote-code cache."""
    prelude = "import sys\nsys.modules['hf_tfm'] = None  # as if the package were not installed\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
