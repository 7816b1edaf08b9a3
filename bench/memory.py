"""Peak memory of a training process: CUDA max allocated, or the process's peak resident set.

On CPU the peak is the kernel's high-water mark of the resident set, read in a
fresh process per measurement (``bench.probe``). Linux lets a process reset it
(``/proc/self/clear_refs``), so the steady-state peak of training is read after
the compile warm-up, without the compiler's own memory in it. The Trainer reads
its peak the same way (``core.device``); elsewhere the peak spans the process
(``ru_maxrss``).
"""

from __future__ import annotations

import resource
import sys

import torch

from core.device import GIB, peak_memory_gib, reset_peak_memory


def current_bytes(device: torch.device) -> int:
    """Memory in use now: CUDA allocated, else the resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    import psutil

    return psutil.Process().memory_info().rss


def peak_bytes(device: torch.device) -> int:
    """High-water mark since the process started or the last ``reset_peak``."""
    peak = peak_memory_gib(device)
    if peak is not None:
        return int(peak * GIB)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB on Linux


def reset_peak(device: torch.device) -> bool:
    """Restart the high-water mark at the current use; False where the OS cannot (then the peak spans the process)."""
    return reset_peak_memory(device)
