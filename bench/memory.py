"""Peak memory of a training process: CUDA max allocated, or the process's peak resident set.

On CPU the peak is ``getrusage(RUSAGE_SELF).ru_maxrss``, read in a fresh process
per measurement (``bench.probe``). Linux lets a process reset that high-water
mark (``/proc/self/clear_refs``), so the steady-state peak of training is read
after the compile warm-up, without the compiler's own memory in it.
"""

from __future__ import annotations

import os
import resource
import sys

import torch

GIB = 1024**3


def current_bytes(device: torch.device) -> int:
    """Memory in use now: CUDA allocated, else the resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    import psutil

    return psutil.Process().memory_info().rss


def peak_bytes(device: torch.device) -> int:
    """High-water mark since the process started or the last ``reset_peak``."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB on Linux


def reset_peak(device: torch.device) -> bool:
    """Restart the high-water mark at the current use; False where the OS cannot (then the peak spans the process)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (Linux ≥ 4.0)
        return True
    except OSError:
        return False
