"""Launching the multi-process tests: torchrun and `accelerate launch` start workers of their own."""

import os
import signal
import subprocess


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
