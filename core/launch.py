"""Starting a run in other processes: the torchrun command line, and the launcher around it.

One run of N processes is ``torchrun --nproc-per-node N -m core.cli train …``.
``speedboard train --nproc N`` wraps that command (``run_torchrun``): it checks
the configuration first (a bad flag, data or start checkpoint costs one line,
not N tracebacks), claims the run folder before anything starts (of two jobs
with one run id, one runs and the other is refused), passes signals on to the
workers, and reports the run's outcome from its folder.

Another program (the dashboard) starts a run with ``prepare_launch``: an argv
for a subprocess, the environment it needs, and the run folder to follow.
Signals, for every way of starting a run:

- SIGINT: stop after the current optimizer step; all ranks agree on the step,
  rank 0 saves a final checkpoint and records ``finished`` (stopped).
- SIGHUP (the terminal closed): the same as SIGINT.
- SIGTERM: end now; rank 0 records ``failed`` ("terminated").

The launcher's exit code follows this job alone: 0 when its run finished or
was stopped, 128 + the signal's number when a signal to the launcher ended it
(130 Ctrl-C twice, 143 SIGTERM; one line says so), else torchrun's. When rank 0
died without recording an ending (kill -9), the launcher records it for it.

Importing this module loads no torch (only ``check_nproc`` and ``process_capacity`` do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.config import BUILTIN_CORPUS
from core.errors import ConfigError
from core.events import DataPrepared, RunFailed, RunFinished, event_from_dict
from core.json_text import finite_json, parse_json
from core.runs import (
    CLAIM_ENV,
    HEARTBEAT_FILE,
    METRICS_FILE,
    EventTail,
    JsonlSink,
    check_run_root,
    claim_run_dir,
    plan_run_dir,
    release_run_dir,
)


def torchrun_argv(nproc: int, train_args: list[str], *, python: str | None = None,
                  log_dir: str | None = None) -> list[str]:
    """The torchrun command for one machine: N workers of ``python -m core.cli train_args…``.

    torchrun runs through ``core.launch_torchrun`` (then torchrun's own ``main``), which
    sends torchrun's own messages to the launcher apart from its workers' output
    (``TORCHRUN_STDERR_ENV``) and ends quietly when stopped before its workers exist.
    """
    assert nproc >= 1, nproc  # checked by check_nproc before anything is launched
    logs = ["--log-dir", log_dir] if log_dir else []
    return [python or sys.executable, "-m", "core.launch_torchrun", "--standalone",
            f"--nproc-per-node={nproc}", *logs, "-m", "core.cli", *train_args]


def worker_env(nproc: int, device: str = "auto", cpu_count: int | None = None) -> dict[str, str]:
    """Variables to add to the environment of a run of ``nproc`` processes."""
    env = {"PYTHONUNBUFFERED": "1"}  # rank 0's progress lines arrive as they are printed
    # Every process of the run starts as ``python -m``, which puts the working folder first on the import path: a
    # folder of the user's own named core/ or gui/ would hide Speedboard's. Inherited by torchrun's workers.
    env["PYTHONSAFEPATH"] = "1"
    if (root := _found_through_working_folder()) is not None:  # a checkout run without installing it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    threads = worker_threads(nproc, device, cpu_count)
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        # CPU processes share the cores (torchrun would give each a single thread).
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _found_through_working_folder() -> str | None:
    """The folder holding Speedboard's packages, where this process may have found them only through its working
    folder (which PYTHONSAFEPATH takes off the import path of the processes it starts), else None: an installed
    copy (site-packages) is on every process's path anyway."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cwd = os.getcwd()
    listed = {os.path.abspath(p) for p in sys.path if p and os.path.abspath(p) != cwd}
    return None if root in listed else root


@contextlib.contextmanager
def _intra_op_threads(threads: int | None) -> Iterator[None]:
    """This process' torch threads set to ``threads`` for the block (None: unchanged)."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def worker_threads(nproc: int, device: str = "auto", cpu_count: int | None = None) -> int | None:
    """The intra-op threads each process of a CPU job of ``nproc`` processes trains with (what auto precision's
    probe and the matmul peak are measured at: per thread count); None for one process or on a GPU."""
    from core.device import resolve_device

    if nproc <= 1:
        return None
    try:
        on_cpu = (device if device != "auto" else str(resolve_device("auto"))).startswith("cpu")
    except ConfigError:
        return None
    if not on_cpu:
        return None
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else max(1, (cpu_count or os.cpu_count() or 1) // nproc)


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


def crowded_cpu(nproc: int, device: str | None) -> str | None:
    """A warning when CPU processes outnumber the cores: each gets less than one, and the job trains slower
    than fewer processes would (a job of more processes than cores still runs: a test of the set-up)."""
    cores = os.cpu_count() or 1
    if nproc <= cores or not (device in (None, "auto") or device.startswith("cpu")):
        return None
    import torch

    if device in (None, "auto") and torch.cuda.is_available():
        return None
    return (f"{nproc} processes on {cores} CPU cores: each has less than one core, and the job trains slower "
            f"than {cores} processes would")


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

    The start checkpoint is read as the trainer reads it, with the trainer's own
    checks (``Trainer.read_start_checkpoint``: a truncated or damaged file, a
    resume from weights without a trainer state). The corpus is prepared into
    its token store here (once, with progress through ``sink``; ``should_stop``
    cancels it), so the workers only open it; then the samples, the model's
    positions and vocabulary, the memory of a micro-batch and, on resume, the
    budget left (``core.schedule.make_schedule``) are checked as the trainer would.
    Every failure is a one-line ``SpeedboardError``.

    The data's summary (``DataPrepared``: the "data …" and "tokenizer …" lines)
    is not passed to ``sink``: the run's rank 0 reports it once it has opened the store.
    """
    from core.checkpoint import check_tokenizer_fits
    from core.data import build_views, prepare_data
    from core.device import resolve_device, resolve_precision
    from core.distributed import collective_timeout
    from core.memory_budget import check_fits, fit_split
    from core.schedule import Position, make_schedule
    from core.trainer import Trainer

    tc = config.train
    collective_timeout()  # read by every rank: a bad value is said once, here, before any process starts
    config.check_tokens_per_step(nproc)  # the configuration checked one process's share; the counters hold all
    device = resolve_device(tc.device)
    if tc.precision != "auto":
        resolve_precision(tc.precision, device)  # bf16 where the device lacks it: before the data is read
    probe = Trainer(config)  # a trainer's checks without a device, a model or a run folder
    loaded, trainer_state = probe.read_start_checkpoint()
    tokenizer, origin = None, "given"
    if loaded is not None and loaded.tokenizer is not None:
        tokenizer, origin = loaded.tokenizer, f"checkpoint {loaded.source}"
    model_config = loaded.model_config if loaded is not None else None
    # auto on resume: the parent's precision, as every worker will take it (and no probe measured for nothing)
    lineage = probe.lineage_precision(loaded, device)
    del loaded  # its weights: the workers read them again

    def progress(event) -> None:
        if sink is not None and not isinstance(event, DataPrepared):
            sink(event)

    data = prepare_data(config.data, tokenizer, tokenizer_origin=origin, sink=progress, should_stop=should_stop)
    build_views(data.store, config.data, data.tokenizer)
    model_cfg = model_config or dataclasses.replace(config.model, vocab_size=data.tokenizer.vocab_size)
    if lineage is not None:
        precision = lineage.precision
    else:
        # auto on a CPU: probed once, at these shapes and at the thread count each worker trains with (the
        # launcher's own, all the cores, measured a probe no process of the job reads)
        with _intra_op_threads(worker_threads(nproc, str(device))):
            precision = resolve_precision(tc.precision, device, model_cfg)
    if config.data.seq_len > model_cfg.max_position_embeddings:
        raise ConfigError(f"sequence length {config.data.seq_len} is beyond the model's "
                          f"{model_cfg.max_position_embeddings} positions", "seq_len")
    check_tokenizer_fits(data.tokenizer, model_cfg)
    shards, processes = nproc if tc.fsdp else 1, nproc if device.type != "cuda" else 1
    if tc.auto_micro_batch:  # each process picks the split (refused only when not even micro-batch 1 fits)
        fit_split(model_cfg, tc.micro_batch, tc.accum_steps, config.data.seq_len, precision, device, shards, processes)
    else:
        check_fits(model_cfg, tc.micro_batch, config.data.seq_len, precision, device, shards=shards,
                   processes=processes, accum_steps=tc.accum_steps, compile_mode=tc.compile_mode)
    # A budget already used up on resume, or one beyond the 64-bit counters (--tokens 1e23): one line.
    done = (0, 0) if trainer_state is None else (int(trainer_state["step"]), int(trainer_state["tokens"]))
    make_schedule(tc, Position(*done, config.tokens_per_step(nproc), len(data.train) * data.train.seq_len),
                  trainer_state)


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


LAUNCH_EVENTS_ENV = "SPEEDBOARD_LAUNCH_EVENTS"
"""Set (to 1) by the dashboard for the launcher it starts: the launcher's own events, from the checks before any
process starts (preparing the corpus: minutes on a large one), are written to its stdout as well, one line each
(``event_line``), as no run folder exists yet to write them into."""
EVENT_LINE_PREFIX = "speedboard-event: "


def event_line(event) -> str:
    """``event`` as one line of the launcher's output: ``EVENT_LINE_PREFIX`` and its JSON."""
    return EVENT_LINE_PREFIX + finite_json(event.to_dict(), default=str)


def event_from_line(line: str):
    """The event of a line that ``event_line`` wrote, or None (any other line, or a damaged one)."""
    if not line.startswith(EVENT_LINE_PREFIX):
        return None
    try:
        return event_from_dict(parse_json(line[len(EVENT_LINE_PREFIX):]))
    except (ValueError, TypeError):
        return None


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
    env = {**worker_env(nproc, config.train.device), LAUNCH_EVENTS_ENV: "1", DASHBOARD_PID_ENV: str(os.getpid())}
    return LaunchSpec(argv, env, run_id, run_dir, Path(name), nproc)


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


def _prctl(option: int, value: int) -> bool:
    """Linux's ``prctl(option, value)``; False where it failed or cannot be called."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


DASHBOARD_PID_ENV = "SPEEDBOARD_DASHBOARD_PID"
"""The process id of the dashboard that started a launcher (``prepare_launch``): ``follow_the_dashboard``."""


def follow_the_dashboard() -> None:
    """The launcher of a job started from the dashboard, bound to its window's process.

    In a process group of its own: a Ctrl-C typed in the terminal the window was started from reached the
    launcher too (its group's), which stopped the job while the window still asked "Stop the run and quit?"; the
    window alone answers it, and stops the job itself. And stopped as by Ctrl-C (after the current step, saved)
    once the window's process is gone (kill -9, a crash): the job trained on, unseen, with no window left to stop
    it (Linux, ``PR_SET_PDEATHSIG``; a window gone before that was set is found by its process id).
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if not sys.platform.startswith("linux"):
        return
    _prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    try:
        window = int(os.environ.get(DASHBOARD_PID_ENV, ""))
    except ValueError:
        return
    if os.getppid() != window:  # already gone: adopted by init or a subreaper
        os.kill(os.getpid(), signal.SIGINT)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: torchrun gets SIGTERM if this launcher dies, so no worker is ever orphaned."""
    _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


ORPHAN_GRACE_S = 30.0
"""How long the workers of a torchrun that was killed get to notice it at their next step (``launcher_gone``) and
record their ending, before the launcher ends them."""


def _adopt_orphans(on: bool) -> bool:
    """Linux: make this launcher the one that inherits torchrun's workers should torchrun die before them (a
    child subreaper), so that it can wait for them; False where that cannot be done."""
    return sys.platform.startswith("linux") and _prctl(36, int(on))  # PR_SET_CHILD_SUBREAPER


def _end_orphans(known: set[int], grace_s: float = ORPHAN_GRACE_S) -> None:
    """Wait for the workers of a killed torchrun, adopted by this launcher (its children other than ``known``),
    to end; end those still running after ``grace_s`` (SIGTERM, then SIGKILL). Its line then comes last and is
    true: the run has ended with torchrun."""
    try:
        import psutil

        orphans = [p for p in psutil.Process().children() if p.pid not in known]
        _, alive = psutil.wait_procs(orphans, timeout=grace_s)
        for signum, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signum)
            _, alive = psutil.wait_procs(alive, timeout=wait_s)
    except ImportError:
        return


def _children(pid: int) -> list[int]:
    """The direct children of torchrun: its workers (none yet while it starts them)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children()]
    except Exception:  # psutil missing or the process gone: signal torchrun itself
        return []


def _record_lost_ending(run_dir: Path, run_id: str, code: int, signals: list[int] | None = None,
                        summary: str | None = None) -> None:
    """Rank 0 ended without recording how (kill -9, out of memory, or the end of a job the user signalled before
    its ending could be written): record it in its stead, with the ranks that failed and how (``summary``,
    ``failure_summary``) where torchrun said it: "rank 0 died (signal 9, SIGKILL)" was said on the terminal
    only, and the run folder read "killed?"."""
    events = [e for e in EventTail(run_dir).poll() if e.run_id == run_id]
    last = events[-1] if events else None
    step = max((getattr(e, "step", 0) or 0 for e in events), default=0)
    why = (f"the job was ended by {_signal_name(signals[-1])} before rank 0 recorded its ending" if signals else
           summary.removeprefix("speedboard: ") if summary else "rank 0 ended without recording an ending (killed?)")
    try:
        sink = JsonlSink(run_dir / METRICS_FILE)
    except OSError:  # the folder is gone or cannot be written: readers judge by the heartbeat
        return
    try:
        sink(RunFailed(run_id, last.time if last else 0.0, f"{why}; torchrun exited with code {code}", step))
    finally:
        sink.close()
    try:
        (run_dir / HEARTBEAT_FILE).unlink()  # its process is gone
    except OSError:
        pass


def _record_failed_ranks(run_dir: Path, run_id: str, summary: str) -> None:
    """The ranks that failed, and how (``failure_summary``), recorded as the run's ending: rank 0, ended by
    torchrun as another rank died, recorded only that it was terminated "by its launcher when another process
    failed, or by the user", and a run folder read later never said which rank died."""
    events = [e for e in EventTail(run_dir).poll() if e.run_id == run_id]
    last = events[-1] if events else None
    if not isinstance(last, RunFailed) or last.message.startswith(summary.removeprefix("speedboard: ")):
        return
    try:
        sink = JsonlSink(run_dir / METRICS_FILE)
    except OSError:  # the folder is gone or cannot be written: the line on the terminal says it
        return
    said = last.message if last.message.startswith("rank 0:") else f"rank 0: {last.message}"
    try:
        sink(RunFailed(run_id, last.time, f"{summary.removeprefix('speedboard: ')}; the job ended with it ({said})",
                       last.step))
    finally:
        sink.close()


# ----------------------------------------------------------------------------- torchrun's own messages
TORCHRUN_STDERR_ENV = "SPEEDBOARD_TORCHRUN_STDERR"
"""A file descriptor for torchrun's own messages (its ``sys.stderr``); its workers keep the launcher's stderr."""

_ECHO_LOGS = ("death signal, shutting down workers", "closing signal SIG", "failed (exitcode:",
              "Unable to shutdown process")  # a worker past its shutdown time: killed, as the one line says
"""torchrun's log lines about a signal it got or passed on, or a worker that failed: the echo of how a job ended."""
_ECHO_ERRORS = re.compile(r"^[\w.]*\b(SignalException|ChildFailedError)\b", re.MULTILINE)
_FAILED_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def _signal_name(number: int) -> str:
    """``signal 9, SIGKILL`` (the number alone for one Python does not name)."""
    try:
        return f"signal {number}, {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


FAILURE_SUMMARY = re.compile(r"^speedboard: rank \d+ (died|exited)")
"""The launcher's line on the ranks that failed (``failure_summary``), among the job's other output."""


def failure_summary(report: str) -> str | None:
    """One line for torchrun's report of failed workers (``ChildFailedError``): each rank that failed, and how.

    Ranks a signal ended come first: torchrun's "first observed failure" is often a
    rank that only ended because another died (its clock has whole seconds). Of
    those, SIGTERM last: it is how torchrun stops the survivors of a rank that
    died, which a rank killed during set-up leaves before their first collective.
    """
    failed = {int(rank): int(code) for rank, code in _FAILED_RANK.findall(report)}
    if not failed:
        return None

    def how(rank: int, code: int) -> str:
        if code > 128:  # a signal the rank handled, ending as a shell reports it (143: SIGTERM): say which
            with contextlib.suppress(ValueError):  # (a number Python names no signal by is a plain code)
                return f"rank {rank} exited with code {code} ({signal.Signals(code - 128).name})"
        if code >= 0:
            return f"rank {rank} exited with code {code}"
        return f"rank {rank} died ({_signal_name(-code)})"

    order = sorted(failed, key=lambda rank: (failed[rank] >= 0, failed[rank] == -signal.SIGTERM, rank))
    return "speedboard: " + "; ".join(how(rank, failed[rank]) for rank in order)


class TorchrunOutput:
    """torchrun's own stderr, read from a pipe: passed on line by line, except its echo of how the job ended.

    Its log lines about a signal or a failed worker are dropped, and the
    traceback it ends with is held back: after a signal (``SignalException``)
    or a failed worker (``ChildFailedError``) it says nothing the launcher and
    the ranks do not say better (``failure_summary``: the failed workers in one line);
    any other is written out whole when torchrun has ended (``finish``).
    """

    def __init__(self, fd: int, out=None) -> None:
        self._file = os.fdopen(fd, "rb")
        self._out = out
        self._held: list[str] = []
        self._thread = threading.Thread(target=self._read, name="speedboard-torchrun-output", daemon=True)
        self._thread.start()

    def _write(self, text: str) -> None:
        out = self._out or sys.stderr
        try:
            out.write(text)
            out.flush()
        except (OSError, ValueError):  # the terminal is gone: keep draining the pipe, so torchrun never blocks
            pass

    def _read(self) -> None:
        with self._file:
            for raw in self._file:
                line = raw.decode("utf-8", errors="replace")
                if self._held or line.startswith("Traceback (most recent call last):"):
                    self._held.append(line)  # the end of torchrun's output: judged once it is all there
                elif not any(echo in line for echo in _ECHO_LOGS):
                    self._write(line)

    def finish(self, quiet: bool = False) -> str | None:
        """After torchrun has ended: its held traceback written out unless it is an echo; the summary line of
        failed workers (None if there is none, or when ``quiet``: a signal to the launcher ended the job)."""
        self._thread.join()
        text = "".join(self._held)
        match = _ECHO_ERRORS.search(text)
        if match is None:
            self._write(text)
            return None
        if match[1] == "SignalException" or quiet:
            return None
        summary = failure_summary(text)
        if summary is None:
            self._write(text)  # a report this version words otherwise: nothing is lost
        return summary


# ----------------------------------------------------------------------------- the launcher
_STOPS = (signal.SIGINT, getattr(signal, "SIGHUP", signal.SIGINT))
"""Signals whose first arrival asks the run to stop after its current step."""
_ENDINGS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}
if hasattr(signal, "SIGHUP"):
    _ENDINGS[signal.SIGHUP] = "the terminal was closed (SIGHUP)"


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the terminal is gone
        pass


def run_torchrun(nproc: int, train_args: list[str], run_dir: Path, env: dict[str, str] | None = None) -> int:
    """Claim ``run_dir``, run torchrun with ``nproc`` workers and wait; the exit code follows this job's run.

    The run folder is created here first (``runs.claim_run_dir``), and the
    workers' rank 0 takes it over: a folder that exists, another job's with the
    same run id, is refused in one line (``ConfigError``) before anything starts
    and never written to. A claim no worker took is removed again.

    torchrun runs in its own session, so a terminal's Ctrl-C (or its closing,
    SIGHUP) reaches this launcher alone. Once rank 0 has announced the run, the
    first SIGINT or SIGHUP goes straight to torchrun's workers (stop after this
    step): they end cleanly and torchrun with them, as after a run that reached
    its budget (exit 0); before, it ends the job as below (set-up has no step to
    stop after, and a worker still starting Python would print a traceback). A
    second one goes to the workers as well: they abort, as one process does on a
    second Ctrl-C, and record that. A third or a SIGTERM goes to torchrun as
    SIGTERM, which it passes on to every worker (end now); once they have ended, the launcher says so in one
    line and exits with 128 + the signal's number (130 Ctrl-C, 143 SIGTERM),
    as a single process does. So does a signal that ends the job before its run
    could stop cleanly (during set-up).

    The ranks' output goes straight to this process's stdout and stderr;
    torchrun's own messages pass through ``TorchrunOutput`` (POSIX), which
    keeps back its traceback when that is only the echo of a signal or of a
    failed worker (which ranks failed, and how, is then said in one line).
    Only an ending of this job's run decides the exit code; when rank 0 died
    without recording one (kill -9), it is recorded for it.
    """
    job = _Job(nproc, train_args, env or {}, run_dir)
    handled = {*_STOPS, signal.SIGTERM}
    previous = {s: signal.signal(s, job.on_signal) for s in handled  # nohup's ignored SIGHUP stays ignored
                if s == signal.SIGINT or s == signal.SIGTERM or signal.getsignal(s) is not signal.SIG_IGN}
    summary = None
    try:
        token = claim_run_dir(run_dir)
        try:
            code = job.run(token)
            outcome = run_outcome(run_dir, run_dir.name) if run_dir.is_dir() else None
            ending = job.ending(stopped_cleanly=outcome in ("finished", "stopped"))
            summary = job.output.finish(quiet=ending is not None) if job.output is not None else None
            if outcome is None and (run_dir / METRICS_FILE).is_file():
                if job.received and not job.began():
                    # Interrupted in rank 0's set-up, before a step (its clean-up cut short by torchrun's SIGTERM
                    # to the workers): nothing was trained, so nothing is kept, as in a single process.
                    shutil.rmtree(run_dir, ignore_errors=True)
                else:  # this job's rank 0 started the run and died
                    _record_lost_ending(run_dir, run_dir.name, code, job.received, summary)
            elif outcome == "failed" and summary:
                _record_failed_ranks(run_dir, run_dir.name, summary)
        finally:
            release_run_dir(run_dir, token)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if summary:
        _say(summary)
    if outcome in ("finished", "stopped"):
        return 0  # torchrun exits 1 when it passed a signal on, even if every rank then stopped cleanly
    if ending is not None:
        _say(f"speedboard: {_ENDINGS.get(ending, 'ended by a signal')}")
        return 128 + ending
    if code < 0:  # torchrun itself was ended by a signal another process sent (kill -9): its workers follow
        _say(f"speedboard: torchrun, the launcher of the processes, was ended by {_signal_name(-code)}; the run "
             f"ended with it")
        return 128 - code
    return code or 1  # failed, or no ending of this job: it did not succeed


class _Job:
    """One torchrun job of the launcher: torchrun once started, and the signals the launcher got."""

    def __init__(self, nproc: int, train_args: list[str], env: dict[str, str], run_dir: Path | None = None) -> None:
        self.nproc, self.train_args, self.env, self.run_dir = nproc, train_args, env, run_dir
        self._began = False
        self.received: list[int] = []
        self.proc: subprocess.Popen | None = None
        self.output: TorchrunOutput | None = None
        self._passed_on = False
        self._stopping = False
        """The workers were asked to stop (the first Ctrl-C): a second one goes to them too."""

    def on_signal(self, signum, frame) -> None:
        """The launcher's handler: the first SIGINT/SIGHUP to the workers as SIGINT (stop after this step), a second
        one to the workers as itself (they abort as one process does on a second Ctrl-C, and record it as such),
        any other to torchrun as SIGTERM. Before torchrun has started, it only counts (``run`` then starts nothing,
        or ends it)."""
        # The first Ctrl-C: rank 0 says it is stopping. Before the run began (its workers starting Python, its set-up)
        # there is no step to stop after: the job ends, as one process aborts its set-up; a SIGINT to a worker still
        # starting printed a KeyboardInterrupt traceback from its interpreter's start-up.
        if signum in _STOPS and not self.received and self.began():
            to_workers = signal.SIGINT
        elif signum in _STOPS and self._stopping and len(self.received) == 1:
            # Not to torchrun as SIGTERM: the run recorded "terminated (SIGTERM)" for a second Ctrl-C.
            to_workers = signum
        else:
            to_workers = None
        self.received.append(signum)
        if self.proc is not None:
            self._pass_on(to_workers)

    def began(self) -> bool:
        """Rank 0 has announced the run (``run_started`` in its metrics.jsonl): its workers handle a stop."""
        if not self._began and self.run_dir is not None:
            try:
                with open(self.run_dir / METRICS_FILE, encoding="utf-8", errors="replace") as f:
                    self._began = any('"event": "run_started"' in line for line in f)
            except OSError:  # not written yet
                pass
        return self._began or self.run_dir is None

    def _pass_on(self, to_workers: int | None) -> None:
        """``to_workers``: the signal for torchrun's workers themselves; None: SIGTERM to torchrun, which ends them."""
        self._passed_on = True
        self._stopping = to_workers is not None
        targets = (_children(self.proc.pid) if to_workers is not None else []) or [self.proc.pid]
        for pid in targets:
            try:
                os.kill(pid, signal.SIGTERM if to_workers is None else to_workers)
            except ProcessLookupError:
                pass

    def ending(self, stopped_cleanly: bool) -> int | None:
        """The signal that ended the job: a SIGTERM or a second signal, or a first stop the run could not
        follow (it did not stop cleanly); None when no signal did."""
        forced = next((s for i, s in enumerate(self.received) if i > 0 or s not in _STOPS), None)
        if forced is None and self.received and not stopped_cleanly:
            return self.received[0]
        return forced

    def run(self, claim: str) -> int:
        """Start torchrun (unless a signal came first) with the run folder's claim, and wait for it."""
        if self.received:
            return 128 + self.received[0]
        env = {**os.environ, **self.env, CLAIM_ENV: claim}
        posix = os.name == "posix"
        read_fd = write_fd = None
        if posix:  # torchrun's own messages come through a pipe (TorchrunOutput); its workers inherit fd 1 and 2
            read_fd, write_fd = os.pipe()
            env[TORCHRUN_STDERR_ENV] = str(write_fd)
        # torchrun's log folder (one per job, empty unless asked to redirect): its own default, a torchelastic_*
        # folder in the temporary folder, stayed there after every run.
        logs = tempfile.mkdtemp(prefix="speedboard-torchrun-")
        adopting = _adopt_orphans(True)
        known = set(_children(os.getpid()))
        try:
            try:
                proc = subprocess.Popen(torchrun_argv(self.nproc, self.train_args, log_dir=logs), env=env,
                                        start_new_session=posix, pass_fds=(write_fd,) if posix else (),
                                        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
            except BaseException:
                for fd in (read_fd, write_fd):
                    if fd is not None:
                        os.close(fd)
                raise
            if posix:
                os.close(write_fd)
                self.output = TorchrunOutput(read_fd)
            self.proc = proc  # from here on, on_signal passes signals on
            if self.received and not self._passed_on:  # one came while torchrun was being started: end it
                self._pass_on(None)
            code = proc.wait()
            if code < 0 and adopting:  # killed before its workers, which are this launcher's now
                _end_orphans(known | {proc.pid})
            return code
        finally:
            if adopting:
                _adopt_orphans(False)
            shutil.rmtree(logs, ignore_errors=True)
