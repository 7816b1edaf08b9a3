"""``speedboard bench``: the compile × precision × accumulation matrix, its references, and the report.

The cells and the Trainer's runs are the core's (``core.trials``), the ones the
speed advisor (``speedboard tune``) trains.

Phases:
1. the matmul peak of this device per precision (``core.device.measure_matmul_peak``: the figure the
   CLI and the dashboard divide by);
2. probes, one fresh process per measurement: compile seconds cold (empty
   Inductor cache) and warm (the same cache, a second process), and the
   steady-state peak memory of every cell, plus the extra cells of the memory table;
3. the matrix, interleaved: every repeat runs every cell once (A B C A B C …),
   and within a cell Speedboard's Trainer and the bare loop run back to back
   (their order alternating between repeats), then the HF model where it is measured;
4. summary and targets, printed as a table, then ``bench.json``, ``bench.md``, ``bench.png`` in
   ``--out``, all three or none (``bench.report.write_reports``): a report already there survives a
   write that fails.

Ctrl-C (exit code 130), SIGTERM (143) or SIGHUP (129) stops the measurements; the temporary folders and any probe
process go, and what was measured is printed and written as partial results (``"interrupted"`` in
``bench.json``), in ``--out`` unless that holds a finished bench's report, which they never replace: then in
``<out>-partial``. A run that wrote nothing leaves no folder behind.

Run ``python -m bench.run --help`` or ``speedboard bench --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from bench.module_cli import int_at_least
from core.cli import EXIT_USAGE, OneLineParser, console_writes_every_line, path_arg, silence_stream
from core.interrupts import install_start_handlers


def _check_gemm_fits(size: int, device) -> None:
    """A peak-measuring GEMM of side ``size`` (two fp32 inputs and the output) fits the device's memory."""
    from bench.cells import BenchError
    from core.memory_budget import GIB, device_memory

    need = 3 * size * size * 4
    available, what = device_memory(device)
    if available is not None and need > available:
        raise BenchError(f"--matmul-size {size:,}: its GEMMs need {need / GIB:,.1f} GiB, more than the "
                         f"{available / GIB:.1f} GiB of {what}")


def _check_batch_fits(model, micro_batches: list[int], seq_len: int, precisions, device) -> None:
    """The largest micro-batch of the matrix fits the device: an accumulation-1 cell (and the untimed warm-up)
    trains the whole effective batch at once. Said before the first run, not as a failed allocation."""
    from bench.cells import BenchError
    from core.memory_budget import GIB, device_memory, estimate_training_memory

    available, what = device_memory(device)
    largest = max(micro_batches)
    need = max(estimate_training_memory(model, largest, seq_len, p).total for p in precisions)
    if available is not None and need > available:
        raise BenchError(f"--effective-batch: a micro-batch of {largest:,} sequences of {seq_len:,} tokens (its "
                         f"accumulation-1 cells train the whole batch at once) needs at least {need / GIB:,.1f} GiB, "
                         f"more than the {available / GIB:.1f} GiB of {what}; give a smaller --effective-batch")


def _items(text: str, what: str) -> tuple[str, ...]:
    """A comma-separated option's items: stripped, empty ones dropped, each once; none at all is refused."""
    items = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not items:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return items


def _modes(text: str) -> tuple[tuple[str, str], ...]:
    from core.trials import TrialError, parse_modes

    try:
        return parse_modes(",".join(_items(text, "compile setting")))
    except TrialError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _accums(text: str) -> tuple[int, ...]:
    items = _items(text, "accumulation")
    try:
        values = tuple(int(v) for v in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"accumulation steps must be integers ≥ 1, got {text!r}")
    return tuple(sorted(set(values)))


def _precisions(text: str) -> tuple[str, ...]:
    values = _items(text, "precision")
    if values == ("auto",):
        return values
    if any(v not in ("fp32", "bf16") for v in values):
        raise argparse.ArgumentTypeError(f"expected auto, or fp32 and/or bf16 separated by commas, got {text!r}")
    return values


def _cells(text: str) -> str:
    return ",".join(_items(text, "cell"))


def build_parser() -> argparse.ArgumentParser:
    from core.config import PRESETS

    p = OneLineParser(prog="speedboard bench", description="Tokens/s, MFU, compile seconds, peak memory and loss of "
                "compile modes × gradient accumulation, against a bare loop and Hugging Face's Llama.")
    p.add_argument("--preset", choices=list(PRESETS), help="model (default: small; tiny with --quick)")
    p.add_argument("--steps", type=int_at_least(1), help="timed optimizer steps per run after warm-up (default 4)")
    p.add_argument("--repeats", type=int_at_least(1), help="interleaved repeats of the matrix (default 3)")
    p.add_argument("--effective-batch", type=int_at_least(1),
                   help="sequences per optimizer step, the same in every cell (default: 8)")
    p.add_argument("--accum", type=_accums, default=None, help="accumulation steps to cross (default 1,4,8)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--precision", type=_precisions, default=("auto",),
                   help="precisions crossed with the cells: fp32, bf16 or fp32,bf16 (default auto: bf16 on CUDA; "
                        "fp32 and bf16 on a CPU that runs bf16, else fp32)")
    p.add_argument("--modes", type=_modes, default=None,
                   help="compile settings to cross: off, MODE-model, MODE-block (MODE: default, "
                        "max-autotune-no-cudagraphs; default: off,default-model,default-block; on CUDA "
                        "reduce-overhead and max-autotune are added at accumulation 1)")
    p.add_argument("--cells", type=_cells,
                   help="comma-separated cell names or patterns, e.g. 'off-*,default-model-a1'")
    p.add_argument("--out", type=path_arg,
                   help="folder for bench.json, bench.md, bench.png (default: "
                        "bench/<date>-<time>-<preset>-<device> in the per-user data folder)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny preset, eager cells, 1 timed step, 1 repeat (options given still win)")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face reference")
    p.add_argument("--no-probes", action="store_true",
                   help="skip the fresh-process measurements (cold/warm compile, peak memory)")
    p.add_argument("--loss-tol", type=float, help="absolute tolerance of the final-loss agreement, every precision "
                                                 "(default 2e-3 in fp32, 3e-2 in bf16)")
    p.add_argument("--matmul-size", type=int_at_least(64), help="side of the GEMMs of this run's peak "
                                                                 "measurement (default: the core's sizes, "
                                                                 "1024 and 2048 on CPU, 4096 and 8192 on a GPU)")
    p.add_argument("--probe-timeout", type=float, default=1200.0, help="seconds before a probe process is abandoned")
    p.add_argument("--seed", type=int_at_least(0), default=1337)
    return p


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    from bench.hf_reference import transformers_version
    from core.runs import library_versions

    versions = library_versions()
    versions["transformers"] = transformers_version() or "not installed"
    try:
        import matplotlib

        versions["matplotlib"] = matplotlib.__version__
    except ImportError:
        versions["matplotlib"] = "not installed"
    return versions


def _load() -> float | None:
    from core.device import load_average

    load = load_average()
    return load[0] if load else None


_console = {"stdout": True, "stderr": True}
"""Which streams can still be written: a closed pipe (``| tee`` gone at Ctrl-C) or a closed terminal (EIO)
silences one for the rest of the bench."""


def _say(text: str) -> None:
    """A line on stdout, best-effort: the table printed before the report's files raised BrokenPipeError or EIO
    when the reader or the terminal had gone, and the partial results a Ctrl-C or SIGHUP keeps were never written."""
    _best_effort("stdout", text)


def _best_effort(name: str, text: str) -> None:
    if not _console[name]:
        return
    stream = getattr(sys, name)
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        _console[name] = False
        silence_stream(stream)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the process is, so that it ends as Ctrl-C does (exit code 143)."""


class HungUp(KeyboardInterrupt):
    """SIGHUP (the terminal closed), as Ctrl-C: what was measured is kept (exit code 129). Its default action
    killed the bench with no report and its temporary folders left behind."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during the measurements, once they are cleaned up: what happened to the results."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _interruption(exc: KeyboardInterrupt) -> str:
    if isinstance(exc, HungUp):
        return "the terminal was closed (SIGHUP)"
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"


def _exit_code(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM: 128 + the signal, as a shell reports a process the signal ended."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    if isinstance(exc, HungUp):
        return 128 + signal.SIGHUP
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def _check_device(name: str) -> None:
    """A name that is no device Speedboard runs on: refused with the devices this machine has.

    A known kind the machine lacks (``cuda`` without a GPU) is left to ``core.device.resolve_device``,
    whose message says what is missing.
    """
    import torch

    from bench.cells import BenchError
    from core.device import unknown_device_message

    if name == "auto":
        return
    try:
        kind = torch.device(name).type
    except (RuntimeError, TypeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise BenchError(unknown_device_message(name))


def _make_folder(out: Path) -> list[Path]:
    """Create ``out`` and its missing parents; return the folders this created, outermost first.

    A folder that cannot be made is a ``BenchError`` naming it and why.
    """
    from bench.cells import BenchError

    missing = []
    folder = out
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_if_empty(missing[::-1])
        raise BenchError(f"cannot create the output folder {out} ({exc.strerror or exc})") from None
    return missing[::-1]


def _remove_if_empty(created: list[Path]) -> None:
    """Remove the folders ``_make_folder`` created, innermost first, while they are empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): it and the folders above it stay
            return


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    from bench import cells as cells_mod
    from bench.cells import BenchError, Cell
    from bench.hf_reference import transformers_version
    from bench.probe import run_probe
    from bench.report import median_step_rate, report_files, summarise
    from bench.runners import model_config_for, run_reference, run_speedboard
    from core.config import config_from_preset
    from core.data import prepare_data
    from core.device import (
        device_name,
        measure_matmul_peak,
        resolve_device,
        resolve_precision,
        training_flops_per_token,
    )
    from core.errors import SpeedboardError
    from core.event_text import counted
    from core.paths import not_a_file, remove_tree, temp_folder_name, why_not_writable
    from core.precision import cached_peak, matmul_peak, measure_gemm_peak
    from core.trials import loss_tolerance
    from core.tune import default_precisions

    t_start = time.perf_counter()
    preset = args.preset or ("tiny" if args.quick else "small")
    steps = args.steps or (1 if args.quick else 4)
    repeats = args.repeats or (1 if args.quick else 3)
    effective = args.effective_batch or 8
    accums = args.accum or cells_mod.DEFAULT_ACCUMS
    _check_device(args.device)
    device = resolve_device(args.device)
    if args.precision == ("auto",):
        precisions = default_precisions(device) if device.type == "cpu" else (resolve_precision("auto", device),)
    else:
        precisions = tuple(resolve_precision(p, device) for p in args.precision)  # bf16 the device lacks: one line
    precision = precisions[0]
    if args.loss_tol is not None and not (args.loss_tol > 0 and math.isfinite(args.loss_tol)):
        raise BenchError(f"--loss-tol must be a finite number > 0, got {args.loss_tol}")
    if not 0 < args.probe_timeout <= threading.TIMEOUT_MAX:  # the most a wait on a process can be given
        raise BenchError(f"--probe-timeout must be a number of seconds > 0 and ≤ {threading.TIMEOUT_MAX:.0f}, "
                         f"got {args.probe_timeout}")
    if args.matmul_size:
        _check_gemm_fits(args.matmul_size, device)
    loss_tols = {p: args.loss_tol if args.loss_tol is not None else loss_tolerance(p) for p in precisions}
    matmul_sizes = (args.matmul_size,) if args.matmul_size else (512,) if args.quick else None

    matrix = cells_mod.build_matrix(effective, accums, precisions, cuda=device.type == "cuda",
                                    modes=args.modes or cells_mod.BENCH_MODES)
    # --quick's eager cells are a default like its others: --modes given chose compiled ones, and its filter
    # refused them in the words of a --cells the user never gave.
    quick_cells = "off-*" if args.quick and not args.modes else None
    cells = cells_mod.select_cells(matrix, args.cells or quick_cells)
    extra = cells_mod.memory_cells(cells, effective) if not args.no_probes else []
    total_steps = max(c.warmup_steps for c in cells) + steps
    use_hf = not args.no_hf
    notes = []
    if use_hf and transformers_version() is None:
        use_hf = False
        notes.append("transformers is not installed: the Hugging Face reference was skipped "
                     "(pip install -e '.[bench]' in the project folder)")
        _say(f"note: {notes[-1]}")
    hf_cells = {f"off-a1-{precision}", f"default-model-a1-{precision}"} if use_hf else set()

    base = config_from_preset(preset, train={"device": str(device), "precision": precision, "seed": args.seed,
                                             "warmup_ratio": 0.0})
    data = prepare_data(base.data)
    model_cfg = model_config_for(base, data)
    _check_batch_fits(model_cfg, [c.micro_batch for c in cells + extra] + [effective], base.data.seq_len,
                      precisions, device)
    tokens_per_step = effective * base.data.seq_len
    out = Path(args.out).expanduser() if args.out else default_report_folder(preset, device.type)
    # The folder as the user knows it: the --out given, or the default one (which --out replaces).
    named, hint = (f"--out {out}", "") if args.out else (f"the report folder {out}",
                                                           "; give --out FOLDER to write the report elsewhere")
    if out.exists() and not out.is_dir():
        raise BenchError(f"{named} is a file, not a folder{hint}")
    problem = why_not_writable(out)  # said now, not after the whole matrix has been measured
    if problem is not None:
        raise BenchError(f"{named}: {problem}{hint}")
    for target in report_files(out / "bench.json"):
        if (what := not_a_file(target)) is not None:
            raise BenchError(f"{named}: its {target.name} is {what}, not a file the report can replace{hint}")
    # Made now so that a folder that cannot be made is said before the measurements, and removed
    # again until the report is written: a run that ends without one leaves no empty folder.
    _remove_if_empty(_make_folder(out))

    raw: dict = {
        "schema": "speedboard-bench/1",
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "speedboard bench " + shlex.join(argv),
        "device": {"type": device.type, "name": device_name(device) if device.type != "cpu"
                   else f"{_cpu_model()}, {torch.get_num_threads()} threads", "threads": torch.get_num_threads()},
        "versions": _versions(),
        "config": {"preset": preset, "model": model_cfg.to_dict(), "num_parameters": model_cfg.num_parameters(),
                   "seq_len": base.data.seq_len, "effective_batch": effective, "tokens_per_step": tokens_per_step,
                   "accums": list(accums),
                   "modes": [m if m == "off" else f"{m}-{s}" for m, s in (args.modes or cells_mod.BENCH_MODES)],
                   "steps": steps, "repeats": repeats, "total_steps": total_steps,
                   "precision": precision, "precisions": list(precisions), "seed": args.seed, "lr": base.train.lr,
                   "hf": use_hf, "probes": not args.no_probes, "loss_tolerance": loss_tols[precision],
                   "loss_tolerances": loss_tols},
        "flops_per_token": training_flops_per_token(model_cfg, base.data.seq_len),
        "matmul_peak": {"sizes": list(matmul_sizes or ()), "measurements": {p: [] for p in precisions}},
        "cells": [c.to_dict() for c in cells + extra],
        "probes": {},
        "runs": [],
        "load_average": [],
        "notes": notes,
    }

    def measure_peak() -> None:
        # Measured anew, per precision; the machine's cached peak keeps the highest, and that one
        # figure is what the CLI, the dashboard and this report divide by.
        for p in precisions:
            flops = measure_gemm_peak(device, p, matmul_sizes)
            matmul_peak(device, p, refresh=True, measure=lambda f=flops: f)
            raw["matmul_peak"]["measurements"][p].append(flops)
        raw["load_average"].append(_load())

    def gflops(figures: dict[str, float]) -> str:
        return ", ".join(f"{p} {v / 1e9:,.1f} GFLOP/s" for p, v in figures.items())

    runs_planned = repeats * sum(2 + (c.name in hf_cells) for c in cells)
    # Eager cells, warm sooner, time the steps compiled ones spend compiling: every cell trains total_steps.
    eager_timed = {total_steps - c.warmup_steps for c in cells if not c.compiled} - {steps}
    _say(f"speedboard bench: {preset} ({model_cfg.num_parameters() / 1e6:.1f}M params) on {raw['device']['name']}, "
         f"{', '.join(precisions)}, {counted(len(cells), 'cell')} × {counted(repeats, 'repeat')}, "
         f"{counted(total_steps, 'step')} per run ({steps:,} timed"
         + "".join(f", {n:,} in eager cells" for n in eager_timed) + f"), {tokens_per_step:,} tokens/step → {out}")
    saved_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    scratch = temp_folder_name("speedboard-bench-")  # made inside the block that removes it
    matrix_cache = scratch / "inductor-matrix"
    interrupted: KeyboardInterrupt | None = None
    peaks: dict[str, float] = {}
    try:
        scratch.mkdir(mode=0o700)
        measure_peak()
        # The denominator of MFU is the machine's highest figure, not this one measurement (at --quick's
        # 512 × 512 GEMMs, well below it): both are said, the denominator first.
        peaks = {p: measure_matmul_peak(str(device), p) for p in precisions}
        _say(f"matmul peak (MFU's denominator, this machine's highest): {gflops(peaks)}; measured now"
             + (f" at {' and '.join(map(str, matmul_sizes))}²" if matmul_sizes else "") + ": "
             + gflops({p: v[-1] for p, v in raw["matmul_peak"]["measurements"].items()}))
        # ---------------------------------------------------------------- probes
        if not args.no_probes:
            spec_base = {"config": base.to_dict()}
            for cell in cells + extra:
                spec = {**spec_base, "cell": cell.to_dict(), "total_steps": cell.warmup_steps + 1}
                if cell.compiled:
                    cache = scratch / f"inductor-{cell.name}"  # empty: a cold compile
                    result = {"cold": run_probe(spec, cache, args.probe_timeout, scratch)}
                    result["warm"] = run_probe(spec, cache, args.probe_timeout, scratch)
                    shutil.copytree(cache, matrix_cache, dirs_exist_ok=True)  # the matrix starts warm
                else:
                    result = {"memory": run_probe(spec, scratch / "inductor-eager", args.probe_timeout, scratch)}
                raw["probes"][cell.name] = result
                _say("probe " + cell.name + ": " + "; ".join(_probe_line(k, v) for k, v in result.items()))
        # ---------------------------------------------------------------- matrix
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(matrix_cache)
        # One untimed eager run first, so no cell pays this process's first-use costs
        # (allocator growth, thread pools, lazy initialisation).
        run_reference("bare", base, data, Cell("off", "model", 1, effective, precision), 2, -1, device)
        for repeat in range(repeats):
            for cell in cells:
                runners = ["speedboard", "bare"] if repeat % 2 == 0 else ["bare", "speedboard"]
                if cell.name in hf_cells:
                    runners.append("hf")
                for runner in runners:
                    if runner == "speedboard":
                        record = run_speedboard(base, cell, total_steps, repeat)
                    else:
                        record = run_reference(runner, base, data, cell, total_steps, repeat, device)
                    raw["runs"].append(record.to_dict())
                    if record.error is not None:
                        _say(f"[{repeat + 1}/{repeats}] {cell.name:<27} {runner:<10} FAILED: {record.error}")
                        continue
                    extra_note = f", compile {record.compile_seconds:.1f} s" if record.compile_seconds else ""
                    rate = median_step_rate(record.to_dict(), tokens_per_step)  # as the tables give it
                    _say(f"[{repeat + 1}/{repeats}] {cell.name:<27} {runner:<10} {rate:10,.0f} tok/s"
                         f"  loss {record.final_loss:.5f}{extra_note}"
                         + "".join(f"\n  warning: {w}" for w in record.warnings))
            measure_peak()  # between repeats and at the end: a figure taken while the machine was busy is raised
        if device.type == "cuda":  # the combination the Trainer refuses: is it still wrong in this release?
            from bench.cuda_graph_grads import gradient_check
            from core.config import CUDA_GRAPH_MODES

            k = max(accums)
            raw["cuda_graph_grads"] = [gradient_check(model_cfg, mode, k, max(1, effective // k), base.data.seq_len,
                                                      device, precision) for mode in CUDA_GRAPH_MODES]
            for r in raw["cuda_graph_grads"]:
                _say(f"CUDA-graph gradients, {r['mode']} × accum {r['accum']}: max relative difference "
                     f"{r['max_relative_difference']:.2e} → {'ok' if r['ok'] else 'WRONG'}")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: what was measured is still reported, as partial
        interrupted = exc
    finally:
        if saved_cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_cache
        remove_tree(scratch)

    if interrupted is not None:
        done = len(raw["runs"])
        if not done and not raw["probes"]:
            raise Interrupted(f"{_interruption(interrupted)} before anything was measured; nothing was written",
                              _exit_code(interrupted)) from None
        raw["interrupted"] = (f"{_interruption(interrupted)} after {done} of {runs_planned} runs"
                              + (f" and {counted(len(raw['probes']), 'probed cell')}" if raw["probes"] else ""))
    # The figure the CLI and the dashboard divide by now (a file read): the highest, should a run have raised it.
    raw["matmul_peak"]["flops"] = {p: cached_peak(device, p) or peaks.get(p) or 0.0 for p in precisions}
    if interrupted is None and raw["matmul_peak"]["flops"] != peaks:
        _say(f"matmul peak (MFU's denominator) is now {gflops(raw['matmul_peak']['flops'])}, measured again during "
             f"the runs: the report divides by this figure")
    raw["wall_seconds"] = time.perf_counter() - t_start
    raw["summary"] = summarise(raw)
    fresh = not args.out  # a default folder (a time stamp): another bench's of the same second is kept
    if interrupted is None:
        _report(raw, out, fresh)
        return 0
    kept = ""
    if not fresh and _holds_a_finished_report(out):
        # Partial results never replace a finished bench's report: they take a folder of their own beside it.
        kept, out, fresh = f" ({out} keeps its finished report)", out.with_name(out.name + "-partial"), True
    try:
        out = _report(raw, out, fresh)
    except SpeedboardError as exc:
        raise Interrupted(f"{raw['interrupted']}; the partial results were not written: {exc}",
                          _exit_code(interrupted)) from None
    raise Interrupted(f"{raw['interrupted']}; partial results written to {out}{kept}",
                      _exit_code(interrupted)) from None


def _holds_a_finished_report(out: Path) -> bool:
    """``out/bench.json`` is the report of a bench that ran to its end (no ``"interrupted"`` in it)."""
    try:
        raw = json.loads((out / "bench.json").read_bytes())
    except (OSError, ValueError):  # none, unreadable or not JSON: nothing finished to keep
        return False
    return isinstance(raw, dict) and "runs" in raw and not raw.get("interrupted")


def _report(raw: dict, out: Path, fresh: bool = False) -> Path:
    """The table on the terminal first, then the three files in ``out``, all or none (``write_reports``);
    returns the folder written. ``fresh``: ``out`` is a default name, and a folder there (another bench of the
    same second) is never written into: this report takes ``out-2``, ``out-3``, …"""
    from bench.report import markdown, write_reports

    _say("\n" + markdown(raw))
    if fresh:
        out, created = _claim_folder(out)
    else:
        created = _make_folder(out)
    try:
        written = write_reports(raw, out / "bench.json")
    except BaseException:
        _remove_if_empty(created)
        raise
    if out / "bench.png" not in written:
        _say("note: matplotlib is not installed: no bench.png (pip install -e '.[bench]' in the project folder)")
    kind = "partial results" if raw.get("interrupted") else "results"
    _say(f"wrote {kind} {written[0]}, {', '.join(p.name for p in written[1:])} "
         f"in {raw['wall_seconds'] / 60:.1f} min")
    return out


def default_report_folder(preset: str, device_type: str, now: _dt.datetime | None = None) -> Path:
    """``<data>/bench/<date>-<time>-<preset>-<device>``, or its first free numbered name (``-2``, …) where a bench of
    the same second has one: the start line named the other bench's folder, and only the end line this one's.
    (``_claim_folder`` still claims it, should another take it meanwhile.)"""
    from core.paths import numbered
    from core.runs import default_out_dir

    out = default_out_dir().parent / "bench" / f"{now or _dt.datetime.now():%Y%m%d-%H%M%S}-{preset}-{device_type}"
    return next((candidate for candidate in numbered(out) if not candidate.exists()), out)


def _claim_folder(out: Path) -> tuple[Path, list[Path]]:
    """A new folder ``out`` (or ``out-2``, ``out-3``, … where one is there): made by this process alone (an
    exclusive mkdir), so two benches of the same second never share one. Its parents as ``_make_folder``."""
    from core.paths import numbered

    created = _make_folder(out.parent)
    for candidate in numbered(out):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError:
            break
        return candidate, [*created, candidate]
    _remove_if_empty(created)
    return out, _make_folder(out)  # said as _make_folder says it


def _probe_line(kind: str, result: dict) -> str:
    if "error" in result:
        return f"{kind} failed ({result['error']})"
    parts = [kind]
    if result.get("compiler_seconds") is not None:
        parts.append(f"compile {result['compiler_seconds']:.1f} s")
    elif result.get("compile_seconds") is not None:
        parts.append(f"compile ≈ {result['compile_seconds']:.1f} s")
    if result.get("fallback"):
        parts.append("FELL BACK TO EAGER")
    parts.append(f"peak {result['peak_bytes'] / 1024**3:.2f} GiB")
    return " ".join(parts)


@contextlib.contextmanager
def _signals_as_interrupts():
    """While the benchmark runs, SIGTERM raises ``Terminated`` and SIGHUP ``HungUp`` (KeyboardInterrupts), as
    Ctrl-C does: probes stopped, temporary folders removed, what was measured kept. A SIGHUP that nohup set to
    be ignored stays ignored. The previous handlers are back after."""

    def terminate(signum, frame):
        raise Terminated()

    def hang_up(signum, frame):
        raise HungUp()

    handlers = {signal.SIGTERM: terminate}
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        handlers[hangup] = hang_up
    try:
        previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    from core.errors import SpeedboardError

    argv = list(sys.argv[1:] if argv is None else argv)
    install_start_handlers()
    console_writes_every_line()
    _console.update(stdout=True, stderr=True)
    try:
        args = build_parser().parse_args(argv)
        with _signals_as_interrupts():
            return run(args, argv)
    except SpeedboardError as exc:
        _best_effort("stderr", f"speedboard bench: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        _best_effort("stderr", f"speedboard bench: {exc if isinstance(exc, Interrupted) else _interruption(exc)}")
        return _exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
