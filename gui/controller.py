"""The torch thread and the commands sent to it.

One ``TorchThread`` lives as long as the window. Its ``run()`` takes jobs from a
thread-safe queue (start a run, save the current model, inspect a checkpoint,
quit), so every tensor is created and touched on that one thread. During a run
the thread is inside ``Trainer.run()`` and has no Qt event loop: commands reach
the trainer through its ``Control`` (checked between optimizer steps), never
through queued slots. Everything comes back as plain data through one signal,
``TorchThread.event``, delivered to the GUI thread by Qt's queued connection.
"""

from __future__ import annotations

import logging
import queue
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal

from core.checkpoint import read_checkpoint
from core.config import RunConfig
from core.control import Control
from core.errors import SpeedboardError
from core.events import CheckpointSaved, Event, RunFailed, RunFinished, WarningRaised
from core.trainer import Trainer

GIL_SWITCH_INTERVAL_S = 0.0005
"""How long a thread may hold the GIL while another waits for it (Python's default: 5 ms).

The torch thread takes the GIL back after every operator; while the GUI thread
runs Python (a plot redraw), each of those takes waits up to the interval. A
short interval keeps training at full speed beside a busy window."""

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- jobs (GUI -> torch thread)
@dataclass(frozen=True)
class StartRun:
    config: RunConfig
    control: Control


@dataclass(frozen=True)
class SaveModel:
    path: str


@dataclass(frozen=True)
class InspectCheckpoint:
    path: str


@dataclass(frozen=True)
class Quit:
    pass


# --------------------------------------------------------------------------- replies (torch thread -> GUI)
@dataclass(frozen=True)
class RunJobEnded:
    """The torch thread has left ``Trainer.run()``; the next job may start."""

    run_id: str
    has_model: bool
    """A model exists that Save can write (the run got past its set-up)."""


@dataclass(frozen=True)
class TrainingPaused:
    """The trainer is waiting between optimizer steps."""


@dataclass(frozen=True)
class TrainingResumed:
    pass


@dataclass(frozen=True)
class JobFailed:
    job: str
    """``save`` or ``inspect``."""
    message: str
    path: str = ""


@dataclass(frozen=True)
class CheckpointSummary:
    """A plain summary of a checkpoint read on the torch thread (for Load)."""

    path: str
    kind: str
    """``speedboard``, ``state_dict`` or ``huggingface``."""
    num_tensors: int
    num_parameters: int
    has_model_config: bool
    has_tokenizer: bool
    resumable: bool
    """It holds trainer state (optimizer, schedule): the next run can resume it exactly."""
    step: int | None = None
    tokens: int | None = None
    run_id: str | None = None
    model_config: dict[str, Any] | None = field(default=None, compare=False)
    """The checkpoint's own architecture (None for a bare state dict)."""
    run_config: dict[str, Any] | None = field(default=None, compare=False)


class RunControl(Control):
    """``Control`` that also reports when the trainer really waits in a pause."""

    def __init__(self, notify) -> None:
        super().__init__()
        self._notify = notify
        self._waiting = False

    def wait_while_paused(self, timeout: float | None = None) -> bool:
        if not self._waiting:
            self._waiting = True
            self._notify(TrainingPaused())
        running = super().wait_while_paused(timeout)
        if running:
            self._waiting = False
            self._notify(TrainingResumed())
        return running


def _message(exc: BaseException) -> str:
    if isinstance(exc, SpeedboardError):
        return str(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_JOB_NAMES = {StartRun: "run", SaveModel: "save", InspectCheckpoint: "inspect"}


class TorchThread(QThread):
    """The one thread that runs the core. Never touches a widget."""

    event = Signal(object)
    """Every core event and every reply above, as plain data."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("torchThread")
        self._jobs: queue.Queue = queue.Queue()
        self._trainer: Trainer | None = None
        """The last run's trainer: its model is what Save writes after a run."""

    def submit(self, job: Any) -> None:
        self._jobs.put(job)

    def run(self) -> None:
        while True:
            job = self._jobs.get()
            if isinstance(job, Quit):
                break
            try:
                if isinstance(job, StartRun):
                    self._run(job)
                elif isinstance(job, SaveModel):
                    self._save(job.path)
                elif isinstance(job, InspectCheckpoint):
                    self._inspect(job.path)
            except Exception as exc:  # the thread outlives any job; the GUI shows what went wrong
                log.exception("torch thread job %s failed", type(job).__name__)
                self.event.emit(JobFailed(_JOB_NAMES.get(type(job), "job"), _message(exc)))
        self._trainer = None

    def _run(self, job: StartRun) -> None:
        self._trainer = None  # let the previous model go before the next is built
        ended = False
        trainer: Trainer | None = None

        def sink(event: Event) -> None:  # on this thread; returns at once (queued signal)
            nonlocal ended
            ended = ended or isinstance(event, (RunFinished, RunFailed))
            self.event.emit(event)

        try:
            trainer = Trainer(job.config, job.control, sink)
            trainer.run()
        except Exception as exc:  # the trainer has reported RunFailed; make sure of it
            run_id = trainer.run_id if trainer is not None else ""
            if not ended:
                self.event.emit(RunFailed(run_id, 0.0, _message(exc)))
            log.warning("run %s failed: %s", run_id or "(not started)", _message(exc),
                        exc_info=not isinstance(exc, SpeedboardError))
        finally:
            if trainer is not None and trainer.has_model:  # set-up finished: a model to save
                self._trainer = trainer
            # Saves asked for after the trainer's last step check: do them now.
            for path in job.control.take_save_requests():
                if path:
                    self._save(path)
            self.event.emit(RunJobEnded(trainer.run_id if trainer is not None else "", self._trainer is not None))

    def _save(self, path: str) -> None:
        if self._trainer is None:
            self.event.emit(JobFailed("save", "there is no model to save yet: start a run first", path))
            return
        try:
            self._trainer.save(Path(path))  # plain module: no _orig_mod. keys, even when compiled
        except Exception as exc:  # a full disk, a permission, a bug: reported, the app goes on
            if not isinstance(exc, (OSError, SpeedboardError)):
                log.exception("saving %s failed", path)
            self.event.emit(JobFailed("save", _message(exc), path))

    def _inspect(self, path: str) -> None:
        try:
            loaded = read_checkpoint(path)  # a run folder means its newest checkpoint; tensors: this thread only
        except Exception as exc:  # CheckpointError for bad files; anything else is reported the same way
            if not isinstance(exc, (OSError, SpeedboardError)):
                log.exception("reading %s failed", path)
            self.event.emit(JobFailed("inspect", _message(exc), path))
            return
        meta = loaded.meta
        self.event.emit(CheckpointSummary(
            path=str(loaded.source), kind=loaded.kind, num_tensors=len(loaded.state_dict),
            num_parameters=sum(int(t.numel()) for t in loaded.state_dict.values()),
            has_model_config=loaded.model_config is not None, has_tokenizer=loaded.tokenizer is not None,
            resumable=loaded.trainer_state_path is not None, step=meta.get("step"), tokens=meta.get("tokens"),
            run_id=meta.get("run_id"),
            model_config=loaded.model_config.to_dict() if loaded.model_config is not None else None,
            run_config=meta.get("run") if isinstance(meta.get("run"), dict) else None))


class Controller(QObject):
    """The GUI thread's handle on the torch thread: start, pause, stop, save, inspect, shut down."""

    event = Signal(object)
    """Re-emitted in the GUI thread after the controller has updated its own state."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self.thread = TorchThread()
        self.thread.event.connect(self._on_thread_event)  # queued: emitted on the torch thread
        self._control: RunControl | None = None
        self._run_saves: set[str] = set()
        self._inspecting = False
        self._shut_down = False
        self.thread.start()
        app = QCoreApplication.instance()
        if app is not None:  # however the app ends, the torch thread ends first
            app.aboutToQuit.connect(self.shutdown)

    # ------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        """A run job was submitted and the torch thread has not yet left it."""
        return self._control is not None

    @property
    def paused(self) -> bool:
        return self._control is not None and self._control.paused

    @property
    def inspecting(self) -> bool:
        return self._inspecting

    # ------------------------------------------------------------------ commands
    def start_run(self, config: RunConfig) -> None:
        if self.running:
            raise RuntimeError("a run is already active")
        self._control = RunControl(self.thread.event.emit)
        self.thread.submit(StartRun(config, self._control))

    def pause(self) -> None:
        if self._control is not None:
            self._control.pause()

    def resume(self) -> None:
        if self._control is not None:
            self._control.resume()

    def stop(self) -> None:
        if self._control is not None:
            self._control.stop()

    def save(self, path: str) -> None:
        """Save the current model: at the next optimizer step during a run, else at once."""
        path = str(Path(path))
        if self._control is not None:
            self._run_saves.add(path)
            self._control.request_save(path)
        else:
            self.thread.submit(SaveModel(path))

    def inspect(self, path: str) -> None:
        """Read a checkpoint on the torch thread; a ``CheckpointSummary`` or ``JobFailed`` comes back."""
        self._inspecting = True
        self.thread.submit(InspectCheckpoint(str(path)))

    def shutdown(self, timeout_ms: int = -1) -> bool:
        """Stop any run at its next step, end the thread and wait for it; True once it has finished."""
        if not self._shut_down:
            self._shut_down = True
            self.stop()
            self.thread.submit(Quit())
        if timeout_ms < 0:
            return self.thread.wait()
        return self.thread.wait(timeout_ms)

    # ------------------------------------------------------------------ replies
    def _on_thread_event(self, event: object) -> None:
        follow_ups: list[object] = []
        if isinstance(event, CheckpointSaved):
            self._run_saves.discard(str(Path(event.path)))
        elif isinstance(event, WarningRaised):
            for path in [p for p in self._run_saves if p in event.message]:
                self._run_saves.discard(path)  # a save during the run failed; the run went on
                follow_ups.append(JobFailed("save", event.message, path))
        elif isinstance(event, RunJobEnded):
            self._control = None
            # Asked for too late for the run to see it: save the model the run left.
            for path in sorted(self._run_saves):
                self.thread.submit(SaveModel(path))
            self._run_saves.clear()
        elif isinstance(event, CheckpointSummary) or (isinstance(event, JobFailed) and event.job == "inspect"):
            self._inspecting = False
        self.event.emit(event)
        for reply in follow_ups:
            self.event.emit(reply)
