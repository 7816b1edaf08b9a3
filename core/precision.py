"""What ``auto`` precision means on this machine, and the matmul peak that MFU divides by.

Both are measured, never guessed from a CPU's name, and kept per machine in the
cache folder (``<cache>/machine/<key>/``): the key is the CPU's model name and
flags (or the GPU's name and capability) and the torch version, so a new
machine, a new torch or a changed BIOS setting measures again.

- ``decide_precision``: an explicit fp32/bf16/fp16 is used as given (bf16 where
  the device lacks it is a ``ConfigError``); ``auto`` is bf16 on CUDA where
  supported, and on a CPU bf16 only when the one-time probe (a training pass
  through one decoder layer and the output head at the model's shapes, fp32
  against bf16 autocast, ``probe_bf16_speedup``) shows bf16 at least
  ``BF16_MIN_SPEEDUP`` times faster; otherwise fp32. Timing the whole pass and
  not the GEMMs alone matters: on a CPU with native bf16 matrix units (Intel
  AMX) tiny's GEMMs run 4× faster in bf16, yet its training step does not (the
  casts, attention and the elementwise rest eat the gain), while small's runs
  about 2× faster. Nor does the CPU's name decide: an AMD EPYC without AMX but
  with ``avx512_bf16`` trains small 2.5× faster in bf16 (docs/benchmarks.md).
- ``matmul_peak``: the best FLOP/s of square GEMMs of several sizes, in the
  run's precision, repeated; the cache keeps the highest figure measured for
  the machine, precision and thread count (by the first runs there, a short
  measurement at the start of each later process, every benchmark, and the
  speed advisor when a trial comes near it), so a figure taken on a busy
  machine is raised by a later quieter one and MFU does not exceed 100% by
  timing noise. A cached figure outside ``PLAUSIBLE_FLOPS`` (or a probe's
  bf16 ÷ fp32 outside ``PLAUSIBLE_SPEEDUP``) is damaged: measured again.

``python -m core.precision`` measures both afresh and prints them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from core.config import ModelConfig
from core.errors import ConfigError
from core.json_text import parse_json

BF16_MIN_SPEEDUP = 1.3
"""bf16 changes the numerics; below this speedup of the probe's training pass it is not worth it (the optimizer,
in fp32 either way, makes a whole step gain a little less than the probe)."""
PROBE_ROWS = 2048
"""Tokens per probe pass: a micro-batch's worth (tiny's 16 × 128, small's 8 × 256), so the casts autocast pays
per weight weigh as much against the GEMMs as in a training step."""
PROBE_SEQ_LEN = 128
"""Sequence length of the probe's samples (at most the model's positions)."""
_PROBE_SECONDS = 0.3
"""Time spent repeating each precision's probe (after one warm-up pass); at least one timed pass."""
_PEAK_SECONDS = 0.25
"""Time spent repeating each GEMM size of the peak measurement; at least two timed GEMMs."""
PEAK_MEASUREMENTS = 3
"""Runs that measure the peak on a new machine before the cached (highest) figure is simply read."""
PROBE_MEASUREMENTS = 3
"""Runs that measure the bf16 probe at a model's shapes before its cached (best) figures are simply read."""
_PEAK_SIZES = {"cpu": (1024, 2048), "cuda": (4096, 8192), "mps": (2048, 4096)}
_QUICK_PEAK_SECONDS = 0.05
"""A later run's added peak measurement: its smallest size, this long (a tenth of a second on a CPU)."""
PLAUSIBLE_FLOPS = (1e8, 1e17)
"""FLOP/s that a CPU or GPU can reach (a slow CPU core to well beyond any GPU): a cached figure outside this range
was not measured here (a hand edit, a broken file) and is measured again, never divided by."""
PLAUSIBLE_SPEEDUP = (0.01, 100.0)
"""bf16 ÷ fp32 of the probe: a cached ratio outside this range is damaged likewise."""


# ---------------------------------------------------------------------- machine identity and cache
def _cpu_identity() -> dict[str, str]:
    """Model name and feature flags from /proc/cpuinfo (Linux); the platform's processor string elsewhere."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    except OSError:
        pass
    return {"cpu": model or platform.processor() or platform.machine(), "flags": flags}


def machine_identity(device: torch.device) -> dict[str, str]:
    """What a measurement on ``device`` depends on, besides the thread count."""
    ident = {"device": device.type, "torch": torch.__version__, **_cpu_identity()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ident.update(gpu=props.name, capability=f"{props.major}.{props.minor}", cuda=str(torch.version.cuda))
    return ident


def machine_cpu_flags() -> set[str]:
    return set(_cpu_identity()["flags"].split())


def _machine_dir(device: torch.device) -> Path:
    from core.tokenizer import cache_dir

    ident = json.dumps(machine_identity(device), sort_keys=True)
    return cache_dir() / "machine" / hashlib.sha256(ident.encode()).hexdigest()[:20]


def _read_cache(path: Path) -> dict | None:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read for good
            return None
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or damaged: measured again, never trusted
    return data if isinstance(data, dict) else None


def _flops(value) -> float:
    """A cached throughput: a finite number within ``PLAUSIBLE_FLOPS``, else ValueError (the entry is damaged:
    ``1e-300`` would make MFU infinite, and a probe's speedup too)."""
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite or not PLAUSIBLE_FLOPS[0] <= value <= PLAUSIBLE_FLOPS[1]:
        raise ValueError("not a throughput")
    return float(value)


def _measurements(data: dict) -> int:
    """How many measurements a cached entry keeps the best of: an integer ≥ 1, else ValueError."""
    value = data.get("measurements", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"not a count: {value!r}")
    return value


def _write_cache(path: Path, data: dict) -> None:
    """Atomically, and best-effort: a cache folder that cannot be written costs a measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, data)
    except OSError:
        pass


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk, a folder in the entry's place: no temporary file left per run
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# ---------------------------------------------------------------------- the bf16 probe
@dataclass(frozen=True)
class ProbeResult:
    """fp32 and bf16 (autocast) training throughput, in FLOP/s, of the probe's pass at a model's shapes."""

    fp32_flops: float
    bf16_flops: float
    shapes: tuple[tuple[int, int, int], ...] = ()
    """(rows, in, out) of the pass's largest GEMMs (MLP up and down, the output head): the cache key."""

    @property
    def speedup(self) -> float:
        """bf16 ÷ fp32; 0.0 where that is no finite number (a probe that could not be timed): bf16 is not taken."""
        try:
            ratio = self.bf16_flops / self.fp32_flops if self.fp32_flops > 0 else 0.0
        except (OverflowError, ZeroDivisionError):
            return 0.0
        return ratio if math.isfinite(ratio) else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": round(self.speedup, 3)}

    @classmethod
    def from_dict(cls, d: dict) -> ProbeResult:
        """A cached result; a damaged one (a throughput outside ``PLAUSIBLE_FLOPS``, a speedup outside
        ``PLAUSIBLE_SPEEDUP``) is ValueError."""
        found = cls(_flops(d["fp32_flops"]), _flops(d["bf16_flops"]), tuple(tuple(s) for s in d.get("shapes", ())))
        if not PLAUSIBLE_SPEEDUP[0] <= found.speedup <= PLAUSIBLE_SPEEDUP[1]:
            raise ValueError(f"not a plausible speedup: {found.speedup!r}")
        return found


def probe_shapes(model: ModelConfig, rows: int = PROBE_ROWS) -> tuple[tuple[int, int, int], ...]:
    """The GEMMs that dominate a step: MLP up and down, and the output head over the vocabulary."""
    d, f, v = model.hidden_size, model.intermediate_size, model.vocab_size
    return (rows, d, f), (rows, f, d), (rows, d, v)


def _best_seconds(one_pass: Callable[[], float], seconds: float, min_runs: int) -> float:
    """The fastest of repeated timed passes, after one warm-up pass (kernel selection, oneDNN's JIT,
    first-touch of the buffers); passes are repeated for ``seconds``, at least ``min_runs`` of them."""
    return best_interleaved((one_pass,), seconds, min_runs)[0]


def best_interleaved(passes: tuple[Callable[[], float], ...], seconds: float, min_runs: int) -> list[float]:
    """The fastest time of each pass, the passes taken in turn (A, B, A, B, …) after one warm-up each, for
    ``seconds`` per pass and at least ``min_runs`` rounds. Taking them in turn lets a load that comes and goes
    (another process on a shared machine) hit each alike, so their ratio holds where their figures drift."""
    for one_pass in passes:
        one_pass()
    best, spent, rounds = [float("inf")] * len(passes), 0.0, 0
    while spent < seconds * len(passes) or rounds < min_runs:
        for i, one_pass in enumerate(passes):
            elapsed = one_pass()
            best[i], spent = min(best[i], elapsed), spent + elapsed
        rounds += 1
    return best


def _time_gemms(shapes, dtype: torch.dtype, device: torch.device, seconds: float, min_runs: int = 1) -> float:
    """FLOP/s of the fastest pass over ``shapes`` (``F.linear`` as the model calls it) in ``dtype``."""
    from core.device import synchronize

    pairs = [(torch.randn(r, i, device=device, dtype=dtype), torch.randn(o, i, device=device, dtype=dtype))
             for r, i, o in shapes]
    flops = sum(2 * r * i * o for r, i, o in shapes)

    def one_pass() -> float:
        t0 = time.perf_counter()
        for x, w in pairs:
            F.linear(x, w)
        synchronize(device)  # CPU–GPU sync: the timer is read after the kernels ran
        return time.perf_counter() - t0

    return flops / _best_seconds(one_pass, seconds, min_runs)


def _training_passes(model: ModelConfig, device: torch.device, rows: int,
                     precisions: tuple[torch.dtype | None, ...]) -> tuple[float, list[Callable[[], float]]]:
    """The FLOPs of one forward + backward of one decoder layer, the final norm, the output head and the loss
    at ``model``'s widths over ``rows`` tokens, and a timed pass of it per entry of ``precisions``: fp32
    weights, with a dtype under autocast as training runs it (casts paid), with None in fp32."""
    from dataclasses import replace

    from core.device import training_flops_per_token

    seq = max(1, min(PROBE_SEQ_LEN, model.max_position_embeddings, rows))
    batch = max(1, rows // seq)
    one_layer = replace(model, num_layers=1)
    net, (x,) = seeded_net(one_layer, device, [(batch, seq)])
    return training_flops_per_token(one_layer, seq) * batch * seq, [timed_pass(net, x, device, p) for p in precisions]


def seeded_net(model: ModelConfig, device: torch.device, token_shapes: list[tuple[int, int]]):
    """A model of ``model``'s config with fresh weights, and random token batches of ``token_shapes``, from an
    RNG of their own: a run that measures must start from the same weights as one that did not."""
    from core.model import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = LlamaForCausalLM(model).to(device)
        return net, [torch.randint(0, model.vocab_size, shape, device=device) for shape in token_shapes]


def timed_pass(net: torch.nn.Module, x: torch.Tensor, device: torch.device,
               autocast: torch.dtype | None) -> Callable[[], float]:
    """A forward and backward of ``net`` on ``x`` (its loss against itself) that returns its seconds: fp32
    weights, with ``autocast``'s dtype as training runs it (casts paid), with None in fp32."""
    from core.device import synchronize

    def one_pass() -> float:
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = net(x, targets=x)
        loss.backward()
        synchronize(device)  # CPU–GPU sync: the timer is read after the kernels ran
        elapsed = time.perf_counter() - t0
        net.zero_grad(set_to_none=True)
        return elapsed

    return one_pass


def probe_bf16_speedup(model: ModelConfig, device: torch.device | None = None, *,
                       rows: int = PROBE_ROWS, seconds: float = _PROBE_SECONDS) -> ProbeResult:
    """Time a training pass at ``model``'s shapes in fp32 and under bf16 autocast now (a second or two for
    small on a 2-core CPU, several for base). The pass (``_training_passes``) holds what a step spends
    beside its GEMMs, the casts included, which decides for small models whose GEMMs are cheap. The two
    precisions are timed in turn, so a machine that is busy part of the time does not tilt their ratio."""
    device = device or torch.device("cpu")
    flops, passes = _training_passes(model, device, rows, (None, torch.bfloat16))
    fp32_s, bf16_s = best_interleaved(tuple(passes), seconds, min_runs=1)
    return ProbeResult(flops / fp32_s, flops / bf16_s, probe_shapes(model, rows))


def _probe_path(model: ModelConfig, device: torch.device, rows: int = PROBE_ROWS, threads: int | None = None) -> Path:
    shape = "-".join(f"{r}x{i}x{o}" for r, i, o in probe_shapes(model, rows))
    shape += f"-h{model.num_heads}kv{model.num_kv_heads}"  # attention is part of the pass
    # The probe's method is part of the key, so a result measured another way (bare GEMMs, or with attention
    # in bf16 before core.model ran it in fp32 on a CPU: "a32") is not reused.
    return _machine_dir(device) / f"bf16-training-probe-a32-{shape}-{threads or torch.get_num_threads()}t.json"


def _probe_entry(model: ModelConfig, device: torch.device,
                 threads: int | None = None) -> tuple[ProbeResult, int] | None:
    """The cached probe and how many measurements it keeps the best of; None when absent or damaged."""
    data = _read_cache(_probe_path(model, device, threads=threads))
    try:
        return (ProbeResult.from_dict(data), _measurements(data)) if data else None
    except (KeyError, TypeError, ValueError):
        return None


def cached_probe(model: ModelConfig, device: torch.device | None = None,
                 threads: int | None = None) -> ProbeResult | None:
    """The probe's result for these shapes on this machine at ``threads`` intra-op threads (this process's by
    default), if it was measured before (a file read, no tensors)."""
    entry = _probe_entry(model, device or torch.device("cpu"), threads)
    return entry[0] if entry else None


_PROBED_HERE: set[Path] = set()
"""Probe files this process has measured: each run measures at most once."""


def measured_probe(model: ModelConfig, device: torch.device | None = None) -> ProbeResult:
    """The cached probe result; the first ``PROBE_MEASUREMENTS`` calls for these shapes on a machine measure
    again and keep each precision's best throughput, so one probe taken while the machine was busy (the
    memory-bound casts of bf16 lose most under load) does not decide for good."""
    device = device or torch.device("cpu")
    path = _probe_path(model, device)
    found, count = _probe_entry(model, device) or (None, 0)
    if found is not None and (count >= PROBE_MEASUREMENTS or path in _PROBED_HERE):
        return found  # a second measurement in one process (launcher, then trainer) would tell nothing new
    _PROBED_HERE.add(path)
    fresh = probe_bf16_speedup(model, device)
    result = fresh if found is None else ProbeResult(max(found.fp32_flops, fresh.fp32_flops),
                                                     max(found.bf16_flops, fresh.bf16_flops), fresh.shapes)
    _write_cache(path, {**result.to_dict(), "measurements": count + 1, "identity": machine_identity(device),
                        "threads": torch.get_num_threads(), "measured": time.time()})
    return result


# ---------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses, and why."""

    requested: str
    precision: str
    reason: str
    bf16_speedup: float | None = None
    """The probe's bf16 ÷ fp32 training throughput, where ``auto`` measured it."""

    def to_dict(self) -> dict:
        return asdict(self)


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse what the device lacks (a query, no tensors: safe on any thread)."""
    from core.device import bf16_supported

    if precision == "bf16" and not bf16_supported(device):
        raise ConfigError(f"bf16 is not supported on {device}; use fp16 or fp32", "precision")


def _processor(device: torch.device) -> str:
    return "this CPU" if device.type == "cpu" else "this GPU" if device.type == "cuda" else str(device)


def choice_from_probe(result: ProbeResult, device: torch.device | None = None) -> PrecisionChoice:
    """``auto`` on a CPU, given the probe's result."""
    where = _processor(device or torch.device("cpu"))
    s = result.speedup
    if s >= BF16_MIN_SPEEDUP:
        return PrecisionChoice("auto", "bf16", f"bf16: training {s:.1f}× faster than fp32 on {where}", s)
    shown = math.floor(s * 100) / 100  # rounded down: 1.2996 read "only 1.30× (auto takes bf16 from 1.3×)"
    return PrecisionChoice("auto", "fp32", f"fp32: bf16 trains only {shown:.2f}× fp32's speed on {where} "
                                           f"(auto takes bf16 from {BF16_MIN_SPEEDUP}×)", s)


def lineage_choice(parent_precision: object, parent_device_type: object,
                   device: torch.device) -> PrecisionChoice | None:
    """``auto`` on resume: the precision the parent trained in (its checkpoint's ``precision`` and
    ``device_type``), on the same kind of device. ``auto`` is decided once per lineage, so a resume continues
    exactly: the probe read again could switch bf16 to fp32 midway (a busy machine's reading). None where it is
    decided as for a new run (a checkpoint that does not record it, another kind of device, a precision this
    device lacks). The trainer, the launcher's checks and the dashboard's ``auto`` item all ask this."""
    if parent_precision not in ("fp32", "bf16", "fp16") or parent_device_type != device.type:
        return None
    try:
        check_precision(str(parent_precision), device)
    except ConfigError:  # another GPU, without bf16
        return None
    return PrecisionChoice("auto", str(parent_precision),
                           f"{parent_precision}: as its parent trained (auto is decided once per lineage)")


Probe = Callable[[], ProbeResult]


def decide_precision(requested: str, device: torch.device, probe: Probe | ProbeResult | None = None, *,
                     model: ModelConfig | None = None) -> PrecisionChoice:
    """The run's precision. ``probe`` (a result, or a function that measures one) is asked only for ``auto``
    on a CPU; by default it is the cached or freshly measured probe at ``model``'s shapes (small's if none)."""
    from core.device import bf16_supported

    if requested != "auto":
        check_precision(requested, device)
        return PrecisionChoice(requested, requested, f"{requested}: as set")
    if device.type == "cuda":
        if bf16_supported(device):
            return PrecisionChoice("auto", "bf16", "bf16: this GPU supports it")
        return PrecisionChoice("auto", "fp32", "fp32: this GPU lacks bf16")
    if device.type != "cpu":
        return PrecisionChoice("auto", "fp32", f"fp32: auto measures bf16 on CPUs and takes it on CUDA, not on "
                                               f"{device.type}")
    if probe is None:
        from core.config import preset

        shapes = model or preset("small").model
        result = measured_probe(shapes, device)
    else:
        result = probe if isinstance(probe, ProbeResult) else probe()
    return choice_from_probe(result, device)


def cached_choice(requested: str, device: torch.device, model: ModelConfig, threads: int | None = None,
                  lineage: tuple[object, object] | None = None) -> PrecisionChoice | None:
    """What ``decide_precision`` would say without measuring anything, in a process of ``threads`` intra-op
    threads (this one's by default; a CPU job of several processes shares the cores out); None where ``auto``
    on a CPU has no cached probe for them yet (it is decided when the run starts). ``lineage``: the
    ``(precision, device_type)`` a resumed parent's checkpoint records, which ``auto`` keeps
    (``lineage_choice``). For the dashboard's GUI thread."""
    if requested == "auto" and lineage is not None and (kept := lineage_choice(*lineage, device)) is not None:
        return kept
    if requested == "auto" and device.type == "cpu":
        found = cached_probe(model, device, threads)
        return None if found is None else choice_from_probe(found, device)
    return decide_precision(requested, device, model=model)


# ---------------------------------------------------------------------- the matmul peak
def _peak_path(device: torch.device, precision: str) -> Path:
    threads = f"-{torch.get_num_threads()}t" if device.type == "cpu" else ""
    return _machine_dir(device) / f"matmul-peak-{precision}{threads}.json"


def measure_gemm_peak(device: torch.device, precision: str, sizes: tuple[int, ...] | None = None,
                      seconds: float = _PEAK_SECONDS) -> float:
    """Best FLOP/s of square GEMMs of ``sizes`` in ``precision`` (fp16/bf16 tensors, as autocast runs them)."""
    from core.device import DTYPES

    dtype = DTYPES[precision]
    sizes = sizes or _PEAK_SIZES.get(device.type, (1024, 2048))
    best = 0.0
    with torch.no_grad():
        for n in sizes:
            # Two timed GEMMs at least: the first after warm-up can still pay a page fault or a clock ramp.
            best = max(best, _time_gemms([(n, n, n)], dtype, device, seconds, min_runs=2))
    return best


def _peak_entry(device: torch.device, precision: str) -> tuple[float, int] | None:
    data = _read_cache(_peak_path(device, precision))
    try:
        return (_flops(data["flops"]), _measurements(data)) if data else None
    except (KeyError, TypeError, ValueError):
        return None


def cached_peak(device: torch.device, precision: str) -> float | None:
    """The cached peak (a file read, no tensors), or None."""
    entry = _peak_entry(device, precision)
    return entry[0] if entry else None


_PEAK_MEASURED_HERE: set[Path] = set()
"""Peak files this process has measured: after the first ``PEAK_MEASUREMENTS``, each process adds one."""


def matmul_peak(device: torch.device, precision: str, *, refresh: bool = False,
                measure: Callable[[], float] | None = None) -> float:
    """The MFU denominator for this machine, precision and thread count.

    The first ``PEAK_MEASUREMENTS`` calls on a machine measure (a second or
    so) and keep the highest figure, so one measurement on a busy machine does
    not stay the denominator. Later, each process's first call adds a short
    measurement (the smallest size, ``_QUICK_PEAK_SECONDS``) that raises the kept
    figure where the machine is quieter now than when it was taken; its other
    calls read it. ``refresh`` measures again in full (the benchmark does,
    between repeats; the speed advisor, when a trial comes near the peak).
    ``measure`` replaces the GEMM timing.
    """
    precision = "fp32" if precision not in ("bf16", "fp16") else precision
    path = _peak_path(device, precision)
    entry = _peak_entry(device, precision)
    settled = entry is not None and entry[1] >= PEAK_MEASUREMENTS
    if settled and not refresh and path in _PEAK_MEASURED_HERE:
        return entry[0]
    _PEAK_MEASURED_HERE.add(path)
    if measure is not None:
        flops = measure()
    elif settled and not refresh:
        sizes = _PEAK_SIZES.get(device.type, (1024, 2048))[:1]
        flops = measure_gemm_peak(device, precision, sizes, seconds=_QUICK_PEAK_SECONDS)
    else:
        flops = measure_gemm_peak(device, precision)
    best, count = (max(entry[0], flops), entry[1] + 1) if entry else (flops, 1)
    _write_cache(path, {"flops": best, "measurements": count, "precision": precision,
                        "threads": torch.get_num_threads(), "identity": machine_identity(device),
                        "measured": time.time()})
    return best


def main(argv: list[str] | None = None) -> int:
    """Measure the bf16 probe at each preset's shapes and the matmul peaks afresh, and print them."""
    import argparse

    from core.config import PRESETS
    from core.device import resolve_device

    p = argparse.ArgumentParser(prog="python -m core.precision", description=main.__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch threads, 1 or more (default: torch's)")
    args = p.parse_args(argv)
    try:
        if args.threads is not None and args.threads < 1:
            raise ConfigError(f"--threads must be 1 or more, got {args.threads}")
        device = resolve_device(args.device)
    except ConfigError as exc:
        print(f"python -m core.precision: error: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    ident = machine_identity(device)
    print(f"{ident.get('gpu', ident['cpu'])}, torch {ident['torch']}, {torch.get_num_threads()} threads; "
          f"amx_bf16={'amx_bf16' in ident['flags']}, avx512_bf16={'avx512_bf16' in ident['flags']}")
    for name, pre in PRESETS.items():
        r = probe_bf16_speedup(pre.model, device)
        print(f"probe {name:5s} {r.shapes}: fp32 {r.fp32_flops / 1e9:8,.1f} GFLOP/s, "
              f"bf16 {r.bf16_flops / 1e9:8,.1f} GFLOP/s, bf16 ÷ fp32 {r.speedup:.2f}× -> "
              f"{choice_from_probe(r, device).precision}")
    for precision in ("fp32", "bf16"):
        fresh = measure_gemm_peak(device, precision)
        kept = matmul_peak(device, precision, refresh=True, measure=lambda f=fresh: f)
        print(f"matmul peak {precision}: {fresh / 1e9:,.1f} GFLOP/s now, {kept / 1e9:,.1f} GFLOP/s kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
