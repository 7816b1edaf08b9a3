"""The torch thread and the commands sent to it.

One ``TorchThread`` lives as long as the window. Its ``run()`` takes jobs from a
thread-safe queue (start a run, save the current model, inspect a checkpoint,
quit), so every tensor is created and touched on that one thread. During a run
the thread is inside ``Trainer.run()`` and has no Qt event loop: commands reach
the trainer through its ``Control`` (checked between optimizer steps), never
through queued slots.

What comes back travels as plain data through queued signals, delivered to the
GUI thread in the order it was emitted: the run's core events through
``event``, and the thread's own replies (a run job ended, a pause acknowledged,
a checkpoint read, a job failed) each through a signal of its own, so no
receiver sorts one kind from the other.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal

from core.checkpoint import (
    STATE_FILE,
    check_finite,
    check_weight_dtypes,
    embedding_rows,
    infer_model_config,
    peek_checkpoint,
    peek_schedule,
    read_checkpoint,
    shape_problem,
    verify_checkpoint,
)
from core.checkpoint.read import tensor_shapes
from core.config import MIN_VOCAB_SIZE, ModelConfig, RunConfig
from core.control import Control
from core.errors import Cancelled, CheckpointError, NotFinite, SpeedboardError, describe_exception
from core.events import CheckpointFailed, CheckpointSaved, Event, RunFailed, RunFinished
from core.memory_budget import check_allocatable
from core.paths import user_path
from core.tokenizer import TOKENIZER_FILE
from core.trainer import Trainer
from core.tune import ReportNotSaved, TuneOptions, plan_tune, run_tune
from gui.gc_pin import pin_collection_to_gui_thread, unpin_collection

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
    model: ModelConfig | None = None
    """The settings' architecture: a bare state dict that does not carry its own must fit it."""


@dataclass(frozen=True)
class StartTune:
    """The speed advisor's trials (``core.tune``), on this thread like any run."""

    config: RunConfig
    options: TuneOptions
    report_path: str | None
    control: Control
    """Its stop request cancels the tune between two optimizer steps."""


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
class JobFailed:
    job: str
    """``run``, ``save`` or ``inspect``."""
    message: str
    path: str = ""


@dataclass(frozen=True)
class CheckpointSummary:
    """What Load needs to know of a checkpoint, read cheaply on the torch thread: its config.json and the
    names and shapes of its tensors (a safetensors header; no tensor data)."""

    path: str
    kind: str
    """``speedboard``, ``state_dict`` or ``huggingface``."""
    num_parameters: int
    resumable: bool
    """It holds trainer state (optimizer, schedule): the next run can resume it exactly."""
    step: int | None = None
    tokens: int | None = None
    run_id: str | None = None
    model_config: dict[str, Any] | None = field(default=None, compare=False)
    """The checkpoint's own architecture (None for a bare state dict)."""
    run_config: dict[str, Any] | None = field(default=None, compare=False)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    """Every tensor's clean name and shape (what an architecture must match to load it)."""
    architecture: str = "own"
    """Where ``model_config`` comes from: ``own`` (the checkpoint's config.json), ``inferred`` (a bare state
    dict's tensor shapes), ``settings`` (the settings' model, which its tensors fit), ``unknown`` (none)."""
    fit_problem: str | None = None
    """Why its weights cannot load into that architecture, naming the first differing keys and shapes."""
    start_problem: str | None = None
    """Why no run of the dashboard can start from it though its weights fit (a vocabulary no trained tokenizer
    fits, with no tokenizer of its own)."""
    lineage: tuple[object, object] | None = None
    """The precision and device type it was trained in (a Speedboard checkpoint's): ``auto`` keeps them on resume."""
    schedule: dict[str, Any] | None = field(default=None, compare=False)
    """A resumable checkpoint's learning-rate schedule and training settings (``core.checkpoint.peek_schedule``):
    a resume's budget is checked against them at Start, as the run would check it."""


def _architecture(shapes: dict[str, tuple[int, ...]], name: str,
                  settings: ModelConfig | None) -> tuple[ModelConfig | None, str, str | None]:
    """A bare state dict's architecture: read from its shapes where they tell it, else the settings' model
    (with the vocabulary of its embedding, as the trainer builds it) if its tensors fit that."""
    try:
        inferred = infer_model_config(shapes, name)
    except CheckpointError:
        inferred = None
    if inferred is not None and shape_problem(inferred, shapes, name) is None:
        return inferred, "inferred", None
    if settings is None:
        return None, "unknown", None
    candidate = replace(settings, vocab_size=embedding_rows(shapes) or settings.vocab_size)
    problem = shape_problem(candidate, shapes, name)
    return (None, "unknown", problem) if problem else (candidate, "settings", None)


def summarize_checkpoint(path: str, settings_model: ModelConfig | None = None) -> CheckpointSummary:
    """Resolve ``path`` (a run folder means its newest checkpoint) and summarise it without loading weights.

    The fit is checked here, from the shapes alone: a checkpoint against its own config, a bare state
    dict against what its shapes tell or else ``settings_model``. A pickled state dict is unpickled
    whole (there is no header to read). A Speedboard checkpoint's files are compared with their recorded
    sizes and checksums (every byte read, on the torch thread): a damaged one is refused here, at Load.
    """
    info = peek_checkpoint(path)
    verify_checkpoint(info.path)
    shapes = tensor_shapes(info.path)
    if not shapes:
        raise CheckpointError(f"{info.path} holds no weights")
    name = info.path.name
    if info.model_config is not None:
        model, architecture = info.model_config, "own"
        problem = shape_problem(model, shapes, name)
    else:
        model, architecture, problem = _architecture(shapes, name, settings_model)
    if model is not None:  # a config of absurd sizes (10**12 positions) is said at Load, not at Start
        check_allocatable(model)
    if info.kind != "speedboard" and problem is None:
        # Weights no run can train from (integers, NaN) are said at Load too. A Speedboard checkpoint's were
        # checked when saved, and its bytes against their checksums above; other files are read whole here.
        state = read_checkpoint(info.path).state_dict
        check_weight_dtypes(state, name)
        check_finite(state, name, "load other weights")
    meta = info.meta
    run = meta.get("run") if info.kind == "speedboard" else None
    start_problem = None
    if (model is not None and model.vocab_size < MIN_VOCAB_SIZE
            and not (info.path.is_dir() and (info.path / TOKENIZER_FILE).is_file())):
        # A run from it trains a tokenizer to its vocabulary, and none is that small; the dashboard has no
        # tokenizer picker, the command line does.
        start_problem = (f"{name} has a vocabulary of {model.vocab_size} tokens and no tokenizer of its own: a "
                         f"tokenizer trained for a run needs at least {MIN_VOCAB_SIZE} (its 256 bytes and special "
                         f"tokens). Start from it on the command line with the tokenizer it was trained with "
                         f"(speedboard train --init-from {info.path} --tokenizer FILE)")
    resumable = info.kind == "speedboard" and (info.path / STATE_FILE).is_file()
    return CheckpointSummary(
        path=str(info.path), kind=info.kind, num_parameters=sum(math.prod(s) for s in shapes.values()),
        resumable=resumable, schedule=peek_schedule(info.path / STATE_FILE) if resumable else None,
        step=meta.get("step"), tokens=meta.get("tokens"), run_id=meta.get("run_id"),
        model_config=model.to_dict() if model is not None else None,
        run_config=run if isinstance(run, dict) else None, shapes=shapes,
        architecture=architecture, fit_problem=problem, start_problem=start_problem,
        lineage=(meta.get("precision"), meta.get("device_type")) if info.kind == "speedboard" else None)


class RunControl(Control):
    """``Control`` that also reports when the trainer really waits in a pause."""

    def __init__(self, on_paused, on_resumed) -> None:
        super().__init__()
        self._on_paused, self._on_resumed = on_paused, on_resumed
        self._waiting = False

    def wait_while_paused(self, timeout: float | None = None) -> bool:
        if not self._waiting:
            self._waiting = True
            self._on_paused()
        running = super().wait_while_paused(timeout)
        if running:
            self._waiting = False
            self._on_resumed()
        return running


_JOB_NAMES = {StartRun: "run", SaveModel: "save", InspectCheckpoint: "inspect", StartTune: "tune"}


class TorchThread(QThread):
    """The one thread that runs the core. Never touches a widget."""

    event = Signal(object)
    """A core event of the run (``core.events.Event``)."""
    run_job_ended = Signal(object)
    """``RunJobEnded``."""
    training_paused = Signal()
    training_resumed = Signal()
    checkpoint_read = Signal(object)
    """``CheckpointSummary``."""
    job_failed = Signal(object)
    """``JobFailed``."""
    tune_event = Signal(object)
    """A ``core.tune`` event (``TuneStarted``, ``TrialStarted``, ``TrialFinished``, ``TuneFinished``)."""
    tune_ended = Signal()
    """The torch thread has left the tune (finished, cancelled or failed); the next job may start."""

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
                    self._inspect(job.path, job.model)
                elif isinstance(job, StartTune):
                    self._tune(job)
            except Exception as exc:  # the thread outlives any job; the GUI shows what went wrong
                log.exception("torch thread job %s failed", type(job).__name__)
                self.job_failed.emit(JobFailed(_JOB_NAMES.get(type(job), "job"), describe_exception(exc)))
        self._trainer = None

    def _run(self, job: StartRun) -> None:
        # Let the previous model go before the next is built: the trainer gives its freed pages back to the
        # OS before it takes its memory baseline, which would else be the last run's leftovers.
        self._trainer = None
        ended = False
        trainer: Trainer | None = None

        def sink(event: Event) -> None:  # on this thread; returns at once (queued signal)
            nonlocal ended
            ended = ended or isinstance(event, (RunFinished, RunFailed))
            self.event.emit(event)

        diverged = False
        try:
            trainer = Trainer(job.config, job.control, sink)
            trainer.run()
        except Exception as exc:  # the trainer has reported RunFailed; make sure of it
            run_id = trainer.run_id if trainer is not None else ""
            if not ended:
                self.event.emit(RunFailed(run_id, 0.0, describe_exception(exc)))
            if isinstance(exc, Cancelled):  # stopped on request (Stop, or closing during set-up): no failure
                log.info("run %s stopped: %s", run_id or "(not started)", describe_exception(exc))
            else:
                log.warning("run %s failed: %s", run_id or "(not started)", describe_exception(exc),
                            exc_info=not isinstance(exc, SpeedboardError))
            # A diverged run's weights are not finite: no model to save (Save greyed, not a folder asked for and
            # then refused).
            diverged = isinstance(exc, NotFinite)
        finally:
            if trainer is not None and trainer.has_model and not diverged:  # set-up finished: a model to save
                self._trainer = trainer
            # Saves asked for after the trainer's last step check: do them now.
            for path in job.control.take_save_requests():
                if path and self._trainer is None:  # stopped or failed in its set-up, or diverged
                    why = ("the run diverged: its weights are not finite, there is no model to save" if diverged
                           else "the run ended before its first step: there is no model to save")
                    self.job_failed.emit(JobFailed("save", why, path))
                elif path:
                    self._save(path)
            self.run_job_ended.emit(RunJobEnded(trainer.run_id if trainer is not None else "",
                                                self._trainer is not None))

    def _tune(self, job: StartTune) -> None:
        """Plan (a bad setting or budget is a ``JobFailed``), then the trials; ``tune_ended`` always follows."""
        cancelled = lambda: job.control.stop_requested  # noqa: E731 - asked between measurements and steps
        try:
            plan = plan_tune(job.config, job.options, cancelled=cancelled)
            run_tune(plan, self.tune_event.emit, cancelled=cancelled, report_path=job.report_path,
                     keep_existing=True)  # the dialog's default name: a report there (the same second) is kept
        except Cancelled:
            pass  # while planning: nothing was measured, no report; ``tune_ended`` says the thread is free
        except ReportNotSaved as exc:  # its TuneFinished came first: the results are shown, this says why unsaved
            self.job_failed.emit(JobFailed("tune", f"the trials finished, but their report could not be saved: "
                                                   f"{exc}"))
        except Exception as exc:  # trials never raise; this is planning, the data, or writing the report
            if not isinstance(exc, SpeedboardError):
                log.exception("tune failed")
            self.job_failed.emit(JobFailed("tune", describe_exception(exc)))
        finally:
            self.tune_ended.emit()

    def _save(self, path: str) -> None:
        if self._trainer is None:
            self.job_failed.emit(JobFailed("save", "there is no model to save yet: start a run first", path))
            return
        try:
            self._trainer.save(Path(path))  # plain module: no _orig_mod. keys, even when compiled
        except Exception as exc:  # a full disk, a permission, a bug: reported, the app goes on
            if not isinstance(exc, (OSError, SpeedboardError)):
                log.exception("saving %s failed", path)
            self.job_failed.emit(JobFailed("save", describe_exception(exc), path))

    def _inspect(self, path: str, model: ModelConfig | None) -> None:
        try:
            summary = summarize_checkpoint(path, model)
        except Exception as exc:  # CheckpointError for bad files; anything else is reported the same way
            if not isinstance(exc, (OSError, SpeedboardError)):
                log.exception("reading %s failed", path)
            self.job_failed.emit(JobFailed("inspect", describe_exception(exc), path))
            return
        self.checkpoint_read.emit(summary)


def _same_path(path: str) -> str:
    """``path`` as the run names it in its events: absolute, ``~`` expanded."""
    return str(user_path(path))


class Controller(QObject):
    """The GUI thread's handle on the torch thread: start, pause, stop, save, inspect, shut down.

    Its signals arrive in the GUI thread, after the controller has updated its own state.
    """

    event = Signal(object)
    """A core event of the run in the torch thread."""
    run_job_ended = Signal(object)
    """``RunJobEnded``: the thread has left the run (``running`` is now False)."""
    training_paused = Signal()
    """The trainer waits between two optimizer steps."""
    training_resumed = Signal()
    checkpoint_read = Signal(object)
    """``CheckpointSummary`` of a checkpoint asked for with ``inspect``."""
    load_failed = Signal(str, str)
    """A checkpoint asked for with ``inspect`` cannot be read: its path and the reason."""
    save_failed = Signal(str, str)
    """A save asked for with ``save`` was not written: its path and the reason."""
    job_failed = Signal(str, str)
    """Any other job failed unexpectedly: its name and the reason."""
    tune_event = Signal(object)
    """A ``core.tune`` event of the tune in the torch thread."""
    tune_ended = Signal()
    """The torch thread has left the tune (``tuning`` is now False)."""
    tune_failed = Signal(str)
    """The tune could not start or its report could not be written: the reason."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        # No parent: a running QThread must not be destroyed with its owner; ``shutdown`` ends it first.
        self.thread = TorchThread()
        # Queued connections (emitted on the torch thread), delivered in the order emitted.
        self.thread.event.connect(self._on_event)
        self.thread.run_job_ended.connect(self._on_run_job_ended)
        self.thread.training_paused.connect(self.training_paused)
        self.thread.training_resumed.connect(self.training_resumed)
        self.thread.checkpoint_read.connect(self._on_checkpoint_read)
        self.thread.job_failed.connect(self._on_job_failed)
        self.thread.tune_event.connect(self.tune_event)
        self.thread.tune_ended.connect(self._on_tune_ended)
        self._control: RunControl | None = None
        self._tune_control: Control | None = None
        self._run_saves: set[str] = set()
        self._inspecting = False
        self._shut_down = False
        self._pinned = True
        pin_collection_to_gui_thread()  # from now on cyclic garbage is collected on this thread only
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
    def thread_finished(self) -> bool:
        """The torch thread has ended (``shutdown`` saw it finish and released it)."""
        return not self._pinned

    @property
    def inspecting(self) -> bool:
        return self._inspecting

    @property
    def tuning(self) -> bool:
        """A tune was submitted and the torch thread has not yet left it."""
        return self._tune_control is not None

    @property
    def tune_cancelling(self) -> bool:
        """The tune was cancelled and the torch thread has not yet left it (it ends at its next optimizer step)."""
        return self._tune_control is not None and self._tune_control.stop_requested

    # ------------------------------------------------------------------ commands
    def start_run(self, config: RunConfig) -> None:
        if self.running:
            raise RuntimeError("a run is already active")
        self._control = RunControl(self.thread.training_paused.emit, self.thread.training_resumed.emit)
        self.thread.submit(StartRun(config, self._control))

    def start_tune(self, config: RunConfig, options: TuneOptions, report_path: str | None) -> None:
        """Run the speed advisor on the torch thread: ``tune_event``s, then ``tune_ended``."""
        if self.running or self.tuning:
            raise RuntimeError("the torch thread is busy")
        self._tune_control = Control()
        self.thread.submit(StartTune(config, options, report_path, self._tune_control))

    def cancel_tune(self) -> None:
        """End the tune between two optimizer steps; its report holds what was measured."""
        if self._tune_control is not None:
            self._tune_control.stop()

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
        path = _same_path(path)
        if self._control is not None:
            self._run_saves.add(path)
            self._control.request_save(path)
        else:
            self.thread.submit(SaveModel(path))

    def inspect(self, path: str, model: ModelConfig | None = None) -> None:
        """Read a checkpoint's summary on the torch thread: ``checkpoint_read`` or ``load_failed`` follows.

        ``model``: the settings' architecture, which a bare state dict without its own must fit."""
        self._inspecting = True
        self.thread.submit(InspectCheckpoint(str(path), model))

    def shutdown(self, timeout_ms: int = -1) -> bool:
        """Stop any run at its next step, end the thread and wait for it; True once it has finished.

        Called again (the window's close, then the application's ``aboutToQuit``), it answers at once: the
        finished thread may already be deleted."""
        if not self._pinned:
            return True
        if not self._shut_down:
            self._shut_down = True
            self.stop()
            self.cancel_tune()
            self.thread.submit(Quit())
        finished = self.thread.wait() if timeout_ms < 0 else self.thread.wait(timeout_ms)
        if finished and self._pinned:
            self._pinned = False
            unpin_collection()
            self.thread.deleteLater()  # a finished QThread, released on the thread that owns it
        return finished

    # ------------------------------------------------------------------ from the torch thread
    def _on_event(self, event: Event) -> None:
        self.event.emit(event)
        if isinstance(event, CheckpointSaved):
            self._run_saves.discard(_same_path(event.path))
        elif isinstance(event, CheckpointFailed) and _same_path(event.path) in self._run_saves:
            self._run_saves.discard(_same_path(event.path))  # a save asked for during the run; the run went on
            self.save_failed.emit(event.path, event.message)

    def _on_run_job_ended(self, ended: RunJobEnded) -> None:
        self._control = None
        # Asked for too late for the run to see it: save the model the run left.
        for path in sorted(self._run_saves):
            self.thread.submit(SaveModel(path))
        self._run_saves.clear()
        self.run_job_ended.emit(ended)

    def _on_tune_ended(self) -> None:
        self._tune_control = None
        self.tune_ended.emit()

    def _on_checkpoint_read(self, summary: CheckpointSummary) -> None:
        self._inspecting = False
        if not self._shut_down:  # read for a window that has closed since: no question to ask after it
            self.checkpoint_read.emit(summary)

    def _on_job_failed(self, failed: JobFailed) -> None:
        if failed.job == "inspect":
            self._inspecting = False
            if not self._shut_down:
                self.load_failed.emit(failed.path, failed.message)
        elif failed.job == "save":
            self._run_saves.discard(_same_path(failed.path))  # answered: not asked again when the run has ended
            self.save_failed.emit(failed.path, failed.message)
        elif failed.job == "tune":
            self.tune_failed.emit(failed.message)
        else:
            self.job_failed.emit(failed.job, failed.message)
