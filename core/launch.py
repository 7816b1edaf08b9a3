"""Starting a run in other processes: the torchrun command line, and the launcher around it.

One run of N processes is ``torchrun --nproc-per-node N -m core.cli train …``.
``speedboard train --nproc N`` wraps that command (``run_torchrun``): it checks
the configuration first (a bad flag costs one line, not N tracebacks), names
the run folder in advance, passes stop signals on to the workers, and reports
the run's outcome from its folder.

Another program (the dashboard) starts a run with ``prepare_launch``: an argv
for a subprocess, the environment it needs, and the run folder to follow.
Signals, for every way of starting a run:

- SIGINT: stop after the current optimizer step; all ranks agree on the step,
  rank 0 saves a final checkpoint and records ``finished`` (stopped).
- SIGHUP (the terminal closed): the same as SIGINT.
- SIGTERM: end now; rank 0 records ``failed`` ("terminated").

The launcher's exit code follows this job alone: only an ending recorded by
this job's run (its run id, written after the launch) counts, and when rank 0
died without recording one (kill -9), the launcher records it for it.

Importing this module loads no torch (only ``check_nproc`` and ``process_capacity`` do).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.config import BUILTIN_CORPUS
from core.errors import ConfigError
from core.events import RunFailed, RunFinished
from core.runs import HEARTBEAT_FILE, METRICS_FILE, EventTail, JsonlSink, check_run_root, plan_run_dir


def torchrun_argv(nproc: int, train_args: list[str], *, python: str | None = None) -> list[str]:
    """The torchrun command for one machine: N workers of ``python -m core.cli train_args…``."""
    assert nproc >= 1, nproc  # checked by check_nproc before anything is launched
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "core.cli", *train_args]


def worker_env(nproc: int, device: str = "auto", cpu_count: int | None = None) -> dict[str, str]:
    """Variables to add to the environment of a run of ``nproc`` processes."""
    env = {"PYTHONUNBUFFERED": "1"}  # rank 0's progress lines arrive as they are printed
    if nproc > 1 and device.startswith("cpu") and "OMP_NUM_THREADS" not in os.environ:
        # CPU processes share the cores (torchrun would give each a single thread).
        env["OMP_NUM_THREADS"] = str(max(1, (cpu_count or os.cpu_count() or 1) // nproc))
    return env


def check_nproc(nproc: int, device: str | None = None) -> None:
    """At least one process; on GPUs one process per GPU (NCCL cannot run two ranks on one device)."""
    if nproc < 1:
        raise ConfigError(f"--nproc must be ≥ 1, got {nproc}", "nproc")
    if device is None or nproc == 1 or device.startswith(("cpu", "mps")):
        return
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda") and gpus == 0:
        raise ConfigError(f"--nproc {nproc} on {device}: no CUDA device is present")
    if gpus and nproc > gpus:
        raise ConfigError(f"--nproc {nproc} asks for more processes than the {gpus} GPU(s) here "
                          f"(one process per GPU); use --device cpu for CPU processes")
    if device.startswith("cuda:"):
        raise ConfigError(f"--device {device} names one GPU; with --nproc each process takes its own "
                          f"(use --device cuda or auto)")


def process_capacity() -> tuple[str, int]:
    """What a "Processes" setting can offer here: ``("cuda", GPUs)`` when there are several, else ``("cpu", cores)``.

    With ``"cpu"``, the run's device must be ``cpu`` (NCCL cannot put two ranks on one GPU).
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ("cuda", gpus) if gpus > 1 else ("cpu", os.cpu_count() or 1)


def check_data_source(source: str) -> None:
    """Before starting N processes: a missing, unreadable or mixed corpus is one line here, not one per process."""
    if source == BUILTIN_CORPUS or source.startswith("hf:"):
        return
    from core.sources import resolve_source

    resolve_source(source)


def check_before_launch(config, nproc: int, *, sink=None, should_stop=None) -> None:
    """What a run's set-up checks before its first step, done in the launcher before N processes start.

    The corpus is prepared into its token store here (once, with progress
    through ``sink``; ``should_stop`` cancels it), so the workers only map it;
    then the samples, the model's positions and vocabulary, and the memory of a
    micro-batch are checked as the trainer would. Every failure is a one-line
    ``SpeedboardError``.
    """
    import dataclasses

    from core.checkpoint import check_tokenizer_fits, peek_checkpoint
    from core.data import build_views, prepare_data
    from core.device import resolve_device, resolve_precision
    from core.memory_budget import check_fits, fit_split
    from core.tokenizer import TOKENIZER_FILE, BPETokenizer

    tc = config.train
    device = resolve_device(tc.device)
    precision = resolve_precision(tc.precision, device, config.model)  # measures auto on a CPU once
    source = config.resume or config.init_from
    info = peek_checkpoint(source) if source else None
    tokenizer, origin = None, "given"
    if info is not None and info.path.is_dir() and (info.path / TOKENIZER_FILE).is_file():
        tokenizer, origin = BPETokenizer.load(info.path), f"checkpoint {info.path}"
    data = prepare_data(config.data, tokenizer, tokenizer_origin=origin, sink=sink, should_stop=should_stop)
    build_views(data.store, config.data, data.tokenizer)
    model_cfg = (info.model_config if info is not None and info.model_config is not None
                 else dataclasses.replace(config.model, vocab_size=data.tokenizer.vocab_size))
    if config.data.seq_len > model_cfg.max_position_embeddings:
        raise ConfigError(f"sequence length {config.data.seq_len} is beyond the model's "
                          f"{model_cfg.max_position_embeddings} positions", "seq_len")
    check_tokenizer_fits(data.tokenizer, model_cfg)
    shards, processes = nproc if tc.fsdp else 1, nproc if device.type != "cuda" else 1
    if tc.auto_micro_batch:  # each process picks the split (refused only when not even micro-batch 1 fits)
        fit_split(model_cfg, tc.micro_batch, tc.accum_steps, config.data.seq_len, precision, device, shards, processes)
    else:
        check_fits(model_cfg, tc.micro_batch, config.data.seq_len, precision, device, shards=shards,
                   processes=processes, accum_steps=tc.accum_steps)


@dataclass(frozen=True)
class LaunchSpec:
    """How to start a run in a subprocess and where to follow it."""

    argv: list[str]
    """Program and arguments (QProcess: ``argv[0]``, ``argv[1:]``)."""
    env: dict[str, str]
    """Variables to add to the current environment."""
    run_id: str
    run_dir: Path
    """Rank 0 creates it and appends ``metrics.jsonl`` there; follow it with ``runs.EventTail``."""
    config_file: Path
    """The run's configuration, read by every process at start; delete it when the run has ended."""
    nproc: int = 1

    @property
    def metrics_file(self) -> Path:
        """What to follow (``runs.EventTail``); it appears once rank 0 has set the run up."""
        return self.run_dir / METRICS_FILE


def prepare_launch(config, nproc: int, *, run_id: str | None = None, python: str | None = None) -> LaunchSpec:
    """Write ``config`` (a RunConfig) to a file and return the command that trains it in ``nproc`` processes.

    The command is ``python -m core.cli train --config FILE --run-id ID --nproc N``;
    with N > 1 it hands over to torchrun (``run_torchrun``). Its exit code is 0
    when the run finished or was stopped, 1 when it failed, 2 for a bad setting.
    """
    check_nproc(nproc, config.train.device)
    check_data_source(config.data.source)
    check_run_root(config.out_dir)
    run_id, run_dir = plan_run_dir(config, nproc, run_id)
    if run_dir.exists():
        raise ConfigError(f"run folder {run_dir} already exists")
    fd, name = tempfile.mkstemp(prefix=f"speedboard-{run_id}-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f, indent=2)
    argv = [python or sys.executable, "-m", "core.cli", "train", "--config", name, "--run-id", run_id,
            "--nproc", str(nproc), "--no-progress"]
    return LaunchSpec(argv, worker_env(nproc, config.train.device), run_id, run_dir, Path(name), nproc)


def stop_launch(pid: int) -> None:
    """Stop a run started from a ``LaunchSpec`` after its current step (final checkpoint, ``finished``/stopped)."""
    os.kill(pid, signal.SIGINT)


def end_launch(pid: int) -> None:
    """End a run started from a ``LaunchSpec`` now (every rank, recorded as ``failed``: terminated)."""
    os.kill(pid, signal.SIGTERM)


def run_outcome(run_dir: str | Path, run_id: str | None = None, offset: int = 0) -> str | None:
    """``finished``, ``stopped`` or ``failed`` from a run folder's last ending; None before it has one.

    With ``run_id``, only that run's endings count, and only those written after
    byte ``offset`` of its ``metrics.jsonl`` (its size when a job was launched).
    """
    for event in reversed(EventTail(run_dir, offset).poll()):
        if run_id is not None and event.run_id != run_id:
            continue
        if isinstance(event, RunFinished):
            return "stopped" if event.stopped else "finished"
        if isinstance(event, RunFailed):
            return "failed"
    return None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: torchrun gets SIGTERM if this launcher dies, so no worker is ever orphaned."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _children(pid: int) -> list[int]:
    """The direct children of torchrun: its workers (none yet while it starts them)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children()]
    except Exception:  # psutil missing or the process gone: signal torchrun itself
        return []


def _record_lost_ending(run_dir: Path, run_id: str, offset: int, code: int) -> None:
    """Rank 0 ended without recording how (kill -9, out of memory): record it in its stead."""
    events = [e for e in EventTail(run_dir, offset).poll() if e.run_id == run_id]
    last = events[-1] if events else None
    step = max((getattr(e, "step", 0) or 0 for e in events), default=0)
    try:
        sink = JsonlSink(run_dir / METRICS_FILE)
    except OSError:  # the folder is gone or cannot be written: readers judge by the heartbeat
        return
    try:
        sink(RunFailed(run_id, last.time if last else 0.0, f"rank 0 ended without recording an ending (killed?); "
                                                           f"torchrun exited with code {code}", step))
    finally:
        sink.close()
    try:
        (run_dir / HEARTBEAT_FILE).unlink()  # its process is gone
    except OSError:
        pass


def run_torchrun(nproc: int, train_args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> int:
    """Run torchrun with ``nproc`` workers and wait; the exit code follows this job's run.

    torchrun runs in its own session, so a terminal's Ctrl-C (or its closing,
    SIGHUP) reaches this launcher alone. The first SIGINT or SIGHUP goes
    straight to torchrun's workers (stop after this step): they end cleanly and
    torchrun with them, as after a run that reached its budget. A second one or
    a SIGTERM goes to torchrun as SIGTERM, which it passes on to every worker
    (end now).

    Only an ending of this job's run (``run_dir.name``), written after the launch,
    decides the exit code; a run folder that an earlier run left is never
    taken for this job's outcome.
    """
    run_id = run_dir.name
    metrics = run_dir / METRICS_FILE
    existed = run_dir.exists()
    offset = metrics.stat().st_size if metrics.is_file() else 0
    argv = torchrun_argv(nproc, train_args)
    child_env = {**os.environ, **(env or {})}
    posix = os.name == "posix"
    proc = subprocess.Popen(argv, env=child_env, start_new_session=posix,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    forwarded: list[int] = []

    stops = (signal.SIGINT, getattr(signal, "SIGHUP", signal.SIGINT))

    def forward(signum, frame):
        stop = signum in stops and not forwarded  # rank 0 says it is stopping
        forwarded.append(signum)
        targets = (_children(proc.pid) if stop else []) or [proc.pid]
        for pid in targets:
            try:
                os.kill(pid, signal.SIGINT if stop else signal.SIGTERM)
            except ProcessLookupError:
                pass

    handled = {*stops, signal.SIGTERM}
    previous = {s: signal.signal(s, forward) for s in handled  # nohup's ignored SIGHUP stays ignored
                if s == signal.SIGINT or s == signal.SIGTERM or signal.getsignal(s) is not signal.SIG_IGN}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    outcome = run_outcome(run_dir, run_id, offset) if run_dir.is_dir() else None
    if outcome in ("finished", "stopped"):
        return 0  # torchrun exits 1 when it passed a signal on, even if every rank then stopped cleanly
    if outcome == "failed":
        return code or 1
    if metrics.is_file() and (not existed or metrics.stat().st_size > offset):
        _record_lost_ending(run_dir, run_id, offset, code)  # this job's rank 0 started the run and died
    return code or 1  # no ending of this job: it did not succeed
