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


class ChildPeak:
    """The peak resident set of a child process, read from outside: its ``VmHWM`` (``/proc/PID/status``), polled.

    A child's ``wait4`` ``ru_maxrss`` is not its own: Linux starts a new process's peak at the high-water mark
    of the memory it replaces at ``exec``, which is its parent's (``vfork``) or a copy of it (``fork``), so a
    bench that had once held a GiB reported a GiB for every process it started. ``VmHWM`` belongs to the
    child's own memory; kept at its highest over polls every ``interval`` seconds, it also spans the trainer's
    reset of it after its warm-up (``core.device.reset_peak_memory``). Where ``/proc`` is not there, the
    resident set itself is sampled (``psutil``).
    """

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        import threading

        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self.reads = 0  # polls so far
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="child-peak", daemon=True)
        self._thread.start()

    def _read_kib(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("VmHWM:", "VmRSS:")))
            if not fields:
                return None  # a zombie: its memory is gone
            return max(int(v.split()[0]) for v in fields.values())
        except FileNotFoundError:
            return None
        except OSError:  # no /proc here
            import psutil

            try:
                return psutil.Process(self.pid).memory_info().rss // 1024
            except psutil.Error:
                return None

    def _poll(self) -> None:
        while True:
            kib = self._read_kib()
            if kib is None:
                return
            self.peak_kib = max(self.peak_kib, kib)
            self.reads += 1
            if self._done.wait(self.interval):
                return

    def stop_mib(self) -> float:
        """Call once the child has ended (or is about to): its peak in MiB."""
        self._done.set()
        self._thread.join()
        return self.peak_kib / 1024
