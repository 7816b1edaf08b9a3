"""Devices, precision, memory readings and the FLOP arithmetic behind MFU."""

from __future__ import annotations

import contextlib
import os

import torch

from core.config import ModelConfig
from core.errors import ConfigError

GIB = 1024**3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def available_devices() -> list[str]:
    """Devices present on this machine, best first (what the GUI offers)."""
    devices = []
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        devices.append("mps")
    devices.append("cpu")
    return devices


def unknown_device_message(name: str) -> str:
    """A device name that is none of this machine's: the line names only those present (no ``mps`` here)."""
    choices = ["auto", *available_devices()]
    return f"unknown device {name!r}; use {', '.join(choices[:-1])} or {choices[-1]}"


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; a named device must be present."""
    if name == "auto":
        return torch.device(available_devices()[0] if torch.cuda.is_available() or _mps_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(unknown_device_message(name)) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested, but no CUDA device is present")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r} requested, but only {torch.cuda.device_count()} CUDA device(s) exist")
        return torch.device("cuda", index)
    if device.type == "mps" and not _mps_available():
        raise ConfigError("device 'mps' requested, but Apple's MPS backend is not available")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(unknown_device_message(name))
    if device.type == "cpu" and device.index:  # torch would ignore it: cpu:1 is no second CPU device
        raise ConfigError(f"device {name!r}: the CPU is one device, use cpu (its threads are its cores)")
    return device


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "mps":
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True  # CPU autocast implements bf16 on every x86/Arm build of PyTorch


def resolve_precision(precision: str, device: torch.device, model: ModelConfig | None = None) -> str:
    """The run's precision (``core.precision.decide_precision``): ``auto`` is bf16 on CUDA where supported,
    and on a CPU bf16 only where a one-time probe at ``model``'s shapes measured it fast; refuse what the
    device lacks."""
    from core.precision import decide_precision

    return decide_precision(precision, device, model=model).precision


def autocast(device: torch.device, precision: str):
    """Mixed-precision context: parameters stay fp32, matmuls run in bf16/fp16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def load_average() -> tuple[float, float, float] | None:
    """The OS's 1-, 5- and 15-minute load averages, recorded beside every speed figure (a busy machine's
    figures are not its own); None where the OS has none."""
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return None


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels; needed before reading a wall-clock timer on a GPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> bool:
    """Restart the peak at the memory in use now: CUDA's allocator statistics, or on Linux the process's peak
    resident set (``/proc/self/clear_refs``); False where the OS cannot (a CPU peak is then sampled)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (Linux ≥ 4.0)
        return True
    except OSError:
        return False


def import_training_libraries() -> None:
    """Import what torch imports at a process' first training step, before a run's memory baseline is read: those
    modules are the process', not the run's. An optimizer's constructor imports ``torch._dynamo`` and with it
    sympy and ``torch.distributed``, about 800 modules and 70 MB of resident memory, which the first run of a
    process (every command-line run, every benchmark probe, the dashboard's first) read as its own training
    memory (tiny, micro-batch 8: 0.19 GiB, where a second run in the same process read 0.12).

    Importing it makes torch.compile's cache folder (``TORCHINDUCTOR_CACHE_DIR``), with compile off too: one
    that cannot be made is a ``ConfigError`` naming it, not an ``OSError`` traceback."""
    try:
        import torch._dynamo  # noqa: F401
    except OSError as exc:
        where = exc.filename or os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
        raise ConfigError(f"cannot make torch.compile's cache folder {where}: {exc.strerror or exc}; set "
                          f"TORCHINDUCTOR_CACHE_DIR to a folder that can be written") from exc


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    On CPU a run's memory figure is its peak resident set minus the process's before its model exists.
    The last run's tensors, freed, stay resident in the allocator's free lists: without this a later run
    reuses them and reads far less than the same run alone (identical runs read 0.30, 0.19, 0.00 GiB).
    """
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # another C library (musl)
        return
    trim(0)


def memory_gib(device: torch.device) -> float:
    """Current memory: CUDA allocated, else the process's resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / GIB
    import psutil

    return psutil.Process().memory_info().rss / GIB


def peak_memory_gib(device: torch.device) -> float | None:
    """The high-water mark since ``reset_peak_memory``: CUDA max allocated, or the kernel's peak resident set
    (``VmHWM``, where that reset works: activations and gradients freed before a step ends are in it, where a
    sample after the step missed 15-22% of the peak); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024 / GIB  # kB
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'' if threads == 1 else 's'})"
    return str(device)


def training_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6 × the non-embedding parameters (the matmuls' weights, and the few
    RMSNorm weights, as nanoGPT's estimate counts them) + causal attention.

    Attention scores and weighted values cost 2 × 2 × T × H FLOPs per layer per
    token in the forward pass over all T keys (×3 for backward), halved because
    causal attention only needs the lower triangle; the embedding lookup is not a matmul.
    """
    n = cfg.num_parameters() - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    attention = 6 * cfg.num_layers * cfg.hidden_size * seq_len
    return 6.0 * n + attention


def measure_matmul_peak(device_str: str, precision: str = "fp32") -> float:
    """Achieved FLOP/s of square GEMMs in the run's precision on this device: the MFU denominator.

    Measured, not a datasheet number, so it reflects this machine's threads and
    clocks; the best of several sizes and repeats, cached per machine, precision
    and thread count (``core.precision.matmul_peak``), so the CLI, the dashboard
    and the benchmark divide by the same figure.
    """
    from core.precision import matmul_peak

    return matmul_peak(torch.device(device_str), precision)
