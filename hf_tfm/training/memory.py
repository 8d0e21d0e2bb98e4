"""The memory a training run adds on top of what its process held when training began: gradients, optimizer state
and activations (the weights are already held). `hf-tfm train` records it, `hf-tfm compare` reports it per model.

On a GPU it is the CUDA allocator's high-water mark; on a CPU, Linux's high-water mark of the process's resident set
(reset when training begins), which also counts the allocator's slack: compare CPU figures with each other, not with
GPU ones. Elsewhere it is not measured.
"""

import contextlib
import gc
import re
from pathlib import Path

import torch

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def resident_set(field: str) -> int:
    """`VmRSS` (now) or `VmHWM` (the high-water mark) of this process, in bytes."""
    return int(re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE).group(1)) * 1024


def resident_set_resettable() -> bool:
    try:
        CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set
    except OSError:
        return False
    return True


@contextlib.contextmanager
def peak_memory(device: torch.device):
    """Yields a dict that holds, once the block has run, `bytes` (the most the block held at once beyond what was
    held when it began) and `measure` (how), or nothing where it cannot be measured."""
    measured = {}
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield measured
        torch.cuda.synchronize(device)
        measured.update(bytes=torch.cuda.max_memory_allocated(device) - start, measure="CUDA allocated, high-water")
    elif device.type == "cpu" and STATUS.is_file() and resident_set_resettable():
        start = resident_set("VmRSS")
        yield measured
        # at least 0 by definition: the kernel's resident-set counters are cached per thread, so a block that adds
        # nothing can read a few pages below its start
        added = max(0, resident_set("VmHWM") - start)
        measured.update(bytes=added, measure="process resident set, high-water")
    else:
        yield measured
