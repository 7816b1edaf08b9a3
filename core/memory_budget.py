"""How much memory a training step needs, estimated from the model config before anything is allocated.

``estimate_training_memory`` counts, per process:

- weights, gradients and AdamW's two moments: 16 bytes per parameter in fp32
  (divided over the ranks under FSDP);
- activations kept for the backward pass of one micro-batch: per token and
  layer the block inputs, the normalised inputs, q/k/v, the attention output
  and the MLP's gate, up and product (about 6·hidden + 2·kv + 3·intermediate
  values), plus the fp32 logits and their gradient (2·vocab values per token).

It is a lower bound: the real peak adds attention workspaces, the allocator's
slack and the framework itself. So ``check_fits`` refuses only what cannot
fit (an estimate above all of the device's memory) and never a configuration
that might; it is meant to turn a 50 GB allocation failure deep in the first
step into one line before the run starts, and to serve a search for the
largest micro-batch that fits (``fit_split``, for ``auto_micro_batch``): the
same test, so ``auto`` never picks what ``check_fits`` would refuse. Being a
lower bound, it can pass a micro-batch that still runs out of memory on a
GPU; the trainer then halves it during the run (``core.split``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import CUDA_GRAPH_MODES, ModelConfig
from core.errors import ConfigError

GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    """Of one micro-batch (gradient accumulation does not multiply it)."""
    tables: int = 0
    """The rotary cos/sin tables, sized by the model's positions (10**12 positions at tiny's head size: 256 TB)."""

    @property
    def states(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.tables

    @property
    def total(self) -> int:
        return self.states + self.activations


def activation_bytes_per_token(model: ModelConfig, precision: str = "fp32") -> int:
    """Bytes kept for the backward pass per token of a micro-batch (a lower bound)."""
    size = 2 if precision in ("bf16", "fp16") else 4
    kv = model.num_kv_heads * model.head_dim
    per_layer = (6 * model.hidden_size + 2 * kv + 3 * model.intermediate_size) * size
    logits = 2 * model.vocab_size * 4  # fp32 logits for the loss, and their gradient
    return model.num_layers * per_layer + logits


def table_bytes(model: ModelConfig) -> int:
    """The rotary tables a model holds whatever it trains on: cos and sin, fp32, a row per position."""
    return 2 * model.max_position_embeddings * model.head_dim * 4


def estimate_training_memory(model: ModelConfig, micro_batch: int, seq_len: int, precision: str = "fp32",
                             shards: int = 1) -> MemoryEstimate:
    """Memory of one process training ``model`` on micro-batches of ``micro_batch × seq_len`` tokens;
    ``shards`` > 1 divides the parameter states (FSDP)."""
    params = model.num_parameters()
    per = -(-params // max(1, shards))
    return MemoryEstimate(weights=4 * per, gradients=4 * per, optimizer=8 * per,
                          activations=micro_batch * seq_len * activation_bytes_per_token(model, precision),
                          tables=table_bytes(model))


def device_memory(device: torch.device) -> tuple[int | None, str]:
    """Bytes a run can use on ``device`` and what they are: CUDA's total memory, else the available RAM, or less
    where the process' memory cgroup (a container's, a ``systemd-run -p MemoryMax=`` scope's) allows less: the
    machine's free RAM alone let a run past its container's limit, to be killed (exit 137) instead of fitted."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"memory of {torch.cuda.get_device_name(index)}"
    try:
        import psutil
    except ImportError:  # pragma: no cover - a hard dependency
        return None, "RAM"
    available = psutil.virtual_memory().available
    room = cgroup_room()
    if room is not None and room < available:
        return max(room, 0), "RAM the process' memory limit (cgroup) leaves"
    return available, "available RAM"


_NO_LIMIT = 1 << 60
"""cgroup v1 writes "no limit" as the largest page-aligned 64-bit number."""


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the memory cgroups of this process (v2, or v1's memory controller) still allow it: the least of its
    own and its ancestors' limit minus their usage (less the page cache the kernel reclaims first); None where no
    limit is set or none can be read (not Linux)."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="ascii").splitlines()
    except (OSError, ValueError):
        return None
    rooms: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":  # the unified hierarchy (v2)
            base, names = Path(root), ("memory.max", "memory.current", "inactive_file")
            if not (base / "cgroup.controllers").is_file():  # v1's systemd leftover "0::/" on a hybrid machine
                base = Path(root) / "unified"
        elif "memory" in parts[1].split(","):
            base, names = Path(root) / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                  "total_inactive_file")
        else:
            continue
        folder = base / parts[2].lstrip("/")
        while True:
            if (room := _room_in(folder, *names)) is not None:
                rooms.append(room)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(rooms) if rooms else None


def _room_in(folder: Path, limit_file: str, usage_file: str, reclaimable: str) -> int | None:
    try:
        limit_text = (folder / limit_file).read_text(encoding="ascii").strip()
        if limit_text == "max" or int(limit_text) >= _NO_LIMIT:
            return None
        usage = int((folder / usage_file).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
    cache = 0
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == reclaimable:
                cache = int(value)
                break
    return int(limit_text) - max(0, usage - cache)


def _need_text(estimate: MemoryEstimate, micro_batch: int, seq_len: int, processes: int, limit: str) -> str:
    per = f" per process × {processes:,}" if processes > 1 else ""
    return (f"micro-batch {micro_batch:,} × {seq_len} tokens needs at least {estimate.total / GIB:,.1f} "
            f"GiB{per} ({estimate.activations / GIB:,.1f} GiB of activations), more than {limit}")


def _check_states_fit(estimate: MemoryEstimate, processes: int, available: int, limit: str,
                      overhead: int = 0) -> None:
    if (estimate.states + overhead) * processes > available:
        per = f" per process × {processes:,}" if processes > 1 else ""
        libraries = f", and each process {overhead / GIB:,.2f} GiB for itself (Python, torch)" if overhead else ""
        fewer = "use fewer processes, or " if processes > 1 else ""
        parts = "weights, gradients and AdamW state"
        if estimate.tables > estimate.weights:  # max_position_embeddings is what is too large
            parts = (f"weights, gradients, AdamW state and rotary tables; the tables of its positions alone "
                     f"{estimate.tables / GIB:,.2f} GiB")
        raise ConfigError(f"the model alone needs about {estimate.states / GIB:,.2f} GiB{per} ({parts}){libraries}, "
                          f"more than {limit}; {fewer}choose a smaller model", "preset")


def check_model_fits(model: ModelConfig, device: torch.device, shards: int = 1, processes: int = 1) -> None:
    """Refuse, in one line, a model whose weights, gradients, AdamW state and tables alone exceed the device's
    memory: asked before any model is built (the precision probe builds one)."""
    estimate = estimate_training_memory(model, 0, 0, shards=shards)
    available, what = device_memory(device)
    if available is not None:
        _check_states_fit(estimate, processes, available, f"the {available / GIB:.1f} GiB of {what}",
                          process_overhead(device, processes))


def check_allocatable(model: ModelConfig) -> None:
    """Refuse, in one line, a model whose weights and tables alone exceed the available RAM, where every model
    is built before it moves to its device: a config or checkpoint of absurd sizes (10**12 positions, a hidden
    size of 2**20) was an allocation failure's traceback, or worse, an allocation the OS granted and then
    killed the process for touching."""
    if torch.get_default_device().type == "meta":  # shapes only (``model_shapes``): nothing is allocated
        return
    estimate = estimate_training_memory(model, 0, 0)
    need = estimate.weights + estimate.tables
    available, what = device_memory(torch.device("cpu"))
    if available is not None and need > available:
        raise ConfigError(f"the model's weights and rotary tables alone need about {need / GIB:,.2f} GiB, more than "
                          f"the {available / GIB:.1f} GiB of {what}; choose a smaller model", "preset")


def process_overhead(device: torch.device, processes: int) -> int:
    """Bytes each CPU process of a multi-process job holds before any model: its Python and torch, as this
    process (the launcher, torch imported) holds them. 0 for one process, already running, and on GPUs."""
    if device.type != "cpu" or processes <= 1:
        return 0
    import psutil

    return psutil.Process().memory_info().rss


CPU_RAM_SHARE = 0.5
"""The share of the available RAM a split is fitted to on a CPU (``--micro-batch auto``, the split a refusal
names, the dashboard's offer). The estimate is a lower bound: tiny's measured peaks reached 1.3-1.5x it at
micro-batches 256 and 4,096 (sequence 128) and up to 2.7x at sequence 32 with a 300-token vocabulary, where
fixed costs weigh more; and a CPU process that runs out of RAM is killed by the OS (in the dashboard, the
window with every run it shows), with no out-of-memory error to recover from."""


def _fitting_limit(device: torch.device, available: int, what: str) -> tuple[int, str]:
    """The bytes a split is fitted to, and how to say it: on a CPU ``CPU_RAM_SHARE`` of the available RAM."""
    if device.type != "cpu":
        return available, f"the {available / GIB:.1f} GiB of {what}"
    return (int(available * CPU_RAM_SHARE),
            f"half of the {available / GIB:.1f} GiB of {what}, what a CPU run is fitted to (the estimate is a "
            f"lower bound)")


def _more_than_all(estimate: MemoryEstimate, device: torch.device, processes: int, available: int,
                   overhead: int | None = None) -> bool:
    """``processes`` of ``estimate`` (each with its own Python and torch) surely cannot fit in ``available``:
    what ``check_fits`` refuses, and what the dashboard's question says cannot start as set."""
    overhead = process_overhead(device, processes) if overhead is None else overhead
    return (estimate.total + overhead) * processes > available


def check_fits(model: ModelConfig, micro_batch: int, seq_len: int, precision: str, device: torch.device,
               shards: int = 1, processes: int = 1, accum_steps: int | None = None,
               compile_mode: str = "off") -> MemoryEstimate:
    """Refuse, in one line, a run whose estimate exceeds the device's memory (``processes`` ranks sharing it).

    Only what surely cannot fit is refused (the estimate is a lower bound). The split the message names, with
    ``accum_steps`` keeping the effective batch, is fitted as ``fit_split`` fits one (on a CPU to half the RAM);
    under a ``compile_mode`` that refuses accumulation (CUDA graphs) the message says so instead of naming a
    split the same command would refuse.
    """
    estimate = estimate_training_memory(model, micro_batch, seq_len, precision, shards)
    available, what = device_memory(device)
    overhead = process_overhead(device, processes)
    if available is None or not _more_than_all(estimate, device, processes, available, overhead):
        return estimate
    all_of_it = f"the {available / GIB:.1f} GiB of {what}"
    _check_states_fit(estimate, processes, available, all_of_it, overhead)
    need = _need_text(estimate, micro_batch, seq_len, processes, all_of_it)
    if overhead:
        need += f" with the {overhead / GIB:,.2f} GiB each process holds for itself (Python, torch)"
    limit, _ = _fitting_limit(device, available, what)
    limit -= overhead * processes
    micro = largest_fitting_micro_batch(model, micro_batch, accum_steps or 1, seq_len, precision, limit, shards,
                                        processes)
    if micro >= micro_batch:
        # No smaller split helps (it would name the one refused): fewer processes, or a smaller model.
        fewer = "use fewer processes, or " if processes > 1 else ""
        raise ConfigError(f"{need}; {fewer}choose a smaller model or sequence length", "micro_batch")
    if accum_steps is not None:
        per_process = micro_batch * accum_steps
        cpu = "; on a CPU a split is fitted to half the available RAM, the estimate being a lower bound"
        split = f"--micro-batch {micro} --accum {per_process // micro}"
        if compile_mode in CUDA_GRAPH_MODES:
            raise ConfigError(f"{need}; micro-batch {micro:,} × accumulation {per_process // micro:,} would keep the "
                              f"effective batch, but compile mode {compile_mode!r} uses CUDA graphs, refused with "
                              f"accumulation: use {split} with --compile max-autotune-no-cudagraphs or default, "
                              f"or --micro-batch {micro} alone (a smaller effective batch)", "micro_batch")
        raise ConfigError(f"{need}; micro-batch {micro:,} × accumulation {per_process // micro:,} fits with the "
                          f"same effective batch ({split}){cpu if device.type == 'cpu' else ''}", "micro_batch")
    fitting = max(0, (limit // processes - estimate.states) // max(1, estimate.activations // micro_batch))
    raise ConfigError(f"{need}; use --micro-batch {max(1, fitting):,} or less (and --accum to keep the "
                      f"effective batch)", "micro_batch")


def why_it_does_not_fit(model: ModelConfig, micro_batch: int, seq_len: int, precision: str, device: torch.device,
                        shards: int = 1, processes: int = 1) -> str:
    """"" when a micro-batch fits as ``fit_split`` fits one (on a CPU in half the RAM), else why not."""
    estimate = estimate_training_memory(model, micro_batch, seq_len, precision, shards)
    available, what = device_memory(device)
    if available is None:
        return ""
    limit, said = _fitting_limit(device, available, what)
    return "" if estimate.total * processes <= limit else _need_text(estimate, micro_batch, seq_len, processes, said)


def largest_fitting_micro_batch(model: ModelConfig, micro_batch: int, accum_steps: int, seq_len: int,
                                precision: str, available: int, shards: int = 1, processes: int = 1) -> int:
    """The largest micro-batch ≤ ``micro_batch`` that divides ``micro_batch × accum_steps`` (so the effective
    batch stays exact) and whose estimate fits in ``available`` bytes; 1 when none does."""
    one = estimate_training_memory(model, 1, seq_len, precision, shards)  # activations grow linearly
    limit = min(micro_batch, (available // processes - one.states) // max(1, one.activations))
    return largest_divisor_at_most(micro_batch * accum_steps, limit)


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is ≤ ``limit`` (1 when ``limit`` < 1).

    Tries at most about ``min(limit, √n)`` candidates, never all up to √n: ``limit``
    comes from memory, ``n`` from the user (a micro-batch of 10²³ must not hang the check).
    """
    if limit < 1:
        return 1
    if limit >= n:
        return n
    root = math.isqrt(n)
    best = max((d for d in range(1, min(limit, root) + 1) if n % d == 0), default=1)
    # A divisor above √n is n // s for a divisor s below it; the smallest such s gives the largest.
    for s in range(-(-n // limit), root + 1):
        if n % s == 0:
            return max(best, n // s)
    return best


@dataclass(frozen=True)
class Fit:
    """The split a run trains with: the one set, or a smaller micro-batch with more accumulation."""

    micro_batch: int
    accum_steps: int
    reason: str = ""
    """Why the set split was changed (its memory estimate against the device's); empty when it fits."""
    refused: bool = False
    """The set split needs more than all the device's memory: a run as set is refused (``check_fits``)."""

    @property
    def changed(self) -> bool:
        return bool(self.reason)


def fit_run_config(config, nproc: int = 1, lineage: tuple[object, object] | None = None) -> Fit:
    """``fit_split`` for a run's settings (a ``RunConfig``) before it starts, with the device the trainer will
    resolve; the model's vocabulary as set (a tokenizer can only make it smaller). For the dashboard's window
    thread: the precision probe never runs here, so ``auto`` on a CPU is the cached decision at the processes'
    thread count, or fp32 (whose estimate is the larger) until a run has decided it; on a resume, ``lineage``
    (the parent checkpoint's precision and device type) decides it, as it decides the run's."""
    from core.device import resolve_device
    from core.launch import worker_threads
    from core.precision import cached_choice

    tc = config.train
    device = resolve_device(tc.device)
    shards = nproc if tc.fsdp and nproc > 1 else 1
    choice = cached_choice(tc.precision, device, config.expected_model(), worker_threads(nproc, str(device)),
                           lineage if config.resume else None)
    precision = choice.precision if choice is not None else "fp32"
    return fit_split(config.model, tc.micro_batch, tc.accum_steps, config.data.seq_len, precision, device, shards,
                     nproc if device.type != "cuda" else 1)


def fit_split(model: ModelConfig, micro_batch: int, accum_steps: int, seq_len: int, precision: str,
              device: torch.device, shards: int = 1, processes: int = 1) -> Fit:
    """``--micro-batch auto``: the set split when it fits, else the largest micro-batch that does, with
    accumulation raised so micro-batch × accumulation (the effective batch per process) is unchanged.
    On a CPU a split fits in ``CPU_RAM_SHARE`` of the available RAM.

    A model whose states alone cannot fit, or whose micro-batch 1 cannot, is a ``ConfigError``.
    """
    estimate = estimate_training_memory(model, micro_batch, seq_len, precision, shards)
    available, what = device_memory(device)
    if available is None:
        return Fit(micro_batch, accum_steps)
    limit, said = _fitting_limit(device, available, what)
    if estimate.total * processes <= limit:
        return Fit(micro_batch, accum_steps)
    _check_states_fit(estimate, processes, limit, said)
    micro = largest_fitting_micro_batch(model, micro_batch, accum_steps, seq_len, precision, limit, shards,
                                        processes)
    if estimate_training_memory(model, micro, seq_len, precision, shards).total * processes > limit:
        one = estimate_training_memory(model, 1, seq_len, precision, shards)
        raise ConfigError(f"{_need_text(one, 1, seq_len, processes, said)}; choose a smaller model or sequence "
                          f"length", "micro_batch")
    refused = _more_than_all(estimate, device, processes, available)  # a run as set: check_fits refuses it
    return Fit(micro, micro_batch * accum_steps // micro,
               _need_text(estimate, micro_batch, seq_len, processes, said), refused)
