"""A run's life in the dashboard, from Start (or Open run folder) to its end: one owner, no widgets.

Three sources report what runs do:

- the torch thread, through the ``Controller``: the core events of the run it
  trains, and its own replies, each on a typed signal (run job ended, pause
  acknowledged, checkpoint read, save or load failed);
- ``ProcessRun``: a torchrun job started here, followed by tailing the
  ``metrics.jsonl`` that its rank 0 writes;
- ``EventTail``: run folders opened from disk (the CLI or another job may still
  be writing them), polled on a timer.

Every event of every source, and the session's own notes about a run (stop
requested, paused, resumed), pass through ``_route``: it updates the run's
``RunRecord`` (``RunRecord.apply``, the only place a run's state changes) and
the plots' numpy buffers, then says what changed through a few past-tense
signals. The window lays out, asks and draws; what a command means for a run
is decided here.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from core.checkpoint import verify_checkpoint
from core.config import ModelConfig, RunConfig
from core.errors import CheckpointError, ConfigError, DataError, SpeedboardError
from core.events import CheckpointSaved, Event, RunFailed, RunStarted, StepMetrics, WarningRaised
from core.launch import prepare_launch
from core.paths import user_path
from core.runs import HEARTBEAT_FILE, METRICS_FILE, EventTail, launcher_starting, run_state, writer_alive
from core.sources import source_location
from gui.controller import Controller, RunJobEnded
from gui.metric_store import MetricStore
from gui.process_run import ProcessRun
from gui.run_record import RunNote, RunRecord, StopRequested, TrainingPaused, TrainingResumed, WriterGone
from gui.window_words import in_window_words

TAIL_INTERVAL_MS = 500
PEER_LOST_WAIT_MS = 10_000
"""How long rank 0's "another process failed" waits for the launcher's end, which names the one that did."""
TAIL_CHUNK_BYTES = 128 * 1024
"""A followed folder's metrics.jsonl is read this much at a time: a long one (100,000 steps, 37 MB) was read
whole on the GUI thread, which froze the window for seconds. About 350 step lines, 10-20 ms to read and show."""
FIRST_EVENT_BYTES = 8 << 20
"""How far into a metrics.jsonl an opened folder's first event is looked for, on the window's thread (about 0.1 s):
a run writes one as its first line, however long (a folder's skipped files listed in it)."""
TAIL_BUDGET_S = 0.04
"""The most one tick of the followers reads for; what is left is read at the next turn of the event loop."""
LIVENESS_EVERY = 10
"""Polls between two looks at whether a followed folder's writer still lives (its heartbeat: every 5 s)."""
NO_FINAL_CHECKPOINT = "The run ended without a final checkpoint, so there is nothing to continue from."
_SNIFF_BYTES = 65_536
"""Of a metrics.jsonl without any event: what is read to say why."""


class RunSession(QObject):
    """Every run of this window: start, stop, continue, save, load, follow; and their records."""

    record_added = Signal(object)
    """A ``RunRecord`` was created (Start, Continue, or a run folder opened)."""
    record_changed = Signal(object)
    """Something the run table shows of a ``RunRecord`` changed, other than progress (see ``take_progressed``)."""
    event_applied = Signal(object, object)
    """``(record, event)``: a core event (steps excepted) or a ``RunNote`` was applied to the record."""
    running_changed = Signal(bool)
    """A run started, or the one that trained has ended (in the torch thread or in torchrun processes)."""
    checkpoint_read = Signal(object)
    """``CheckpointSummary`` of a checkpoint asked for with ``inspect``."""
    load_failed = Signal(str, str)
    """Path and reason: a checkpoint asked for with ``inspect`` cannot be read."""
    save_finished = Signal(str)
    """The model asked for with ``save`` was written to this path."""
    save_failed = Signal(str, str)
    """Path and reason: the model asked for with ``save`` was not written."""
    continue_failed = Signal(str)
    """Continue was pressed during a run, and once that run had ended it could not be continued."""
    job_failed = Signal(str, str)
    """A job of the torch thread failed unexpectedly: its name and the reason."""
    tune_event = Signal(object)
    """A ``core.tune`` event of the speed advisor's trials (they make no records: they are not runs)."""
    tune_ended = Signal()
    tune_failed = Signal(str)
    tuning_changed = Signal(bool)
    """The speed advisor took the torch thread, or gave it back."""
    tune_cancel_requested = Signal()
    """The trials were asked to end (the dialog's Cancel, or the window closing): they end at their next step."""
    record_removed = Signal(object)
    """The user removed a ``RunRecord``'s row: its curves and buffers are gone."""

    def __init__(self, out_dir: str | None = None, parent: QObject | None = None) -> None:
        """``out_dir`` overrides where runs started here write their folders."""
        super().__init__(parent)
        self.out_dir = out_dir
        self.store = MetricStore()
        self.controller = Controller(self)
        self.records: list[RunRecord] = []
        self._by_run_id: dict[str, RunRecord] = {}
        self._active: RunRecord | None = None
        """The record of the run that trains: in the torch thread or in ``_process``."""
        self._process: ProcessRun | None = None
        self._peer_lost: RunFailed | None = None
        """Rank 0's failure that only says another process failed: held until the launcher names that one."""
        self._peer_lost_until = 0.0
        self._tails: dict[int, EventTail] = {}
        self._polls = 0
        self._progressed: set[int] = set()
        self._has_model = False
        self._pending_save: str | None = None
        self._continue_with: tuple[RunConfig, int] | None = None
        """Settings and processes for a run that continues the one being stopped."""
        self._closing = False

        self._tail_timer = QTimer(self)
        self._tail_timer.setInterval(TAIL_INTERVAL_MS)
        self._tail_timer.timeout.connect(self._poll_tails)
        c = self.controller
        c.event.connect(self._on_event)
        c.run_job_ended.connect(self._on_run_job_ended)
        c.training_paused.connect(self._on_training_paused)
        c.training_resumed.connect(self._on_training_resumed)
        c.checkpoint_read.connect(self.checkpoint_read)
        c.load_failed.connect(self.load_failed)
        c.save_failed.connect(self._on_save_failed)
        c.job_failed.connect(self.job_failed)
        c.tune_event.connect(self.tune_event)
        c.tune_ended.connect(self.tune_ended)
        c.tune_ended.connect(lambda: self.tuning_changed.emit(False))
        c.tune_failed.connect(self.tune_failed)

    # ------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        """A run is training: on the torch thread, or in torchrun processes."""
        return self.controller.running or self._process is not None

    @property
    def in_processes(self) -> bool:
        """The run that trains is a torchrun job (it is stopped, never paused)."""
        return self._process is not None

    @property
    def paused(self) -> bool:
        return self.controller.paused

    @property
    def stopping(self) -> bool:
        return self._active is not None and self._active.state == "stopping"

    @property
    def ending(self) -> bool:
        """The run has ended (its finished or failed event was read), and its torchrun processes are exiting:
        nothing is left to stop, pause or save."""
        return self.running and self._active is not None and self._active.ended

    @property
    def closing(self) -> bool:
        """The window closes once the run has stopped."""
        return self._closing

    @property
    def continue_pending(self) -> bool:
        """A Continue waits for the run to stop (``stop_then_continue``)."""
        return self._continue_with is not None

    @property
    def active(self) -> RunRecord | None:
        return self._active

    @property
    def live(self) -> bool:
        """Some run's curves still grow: one trains, or an opened folder is still written."""
        return self.running or any(self.record(key).state == "following" for key in self._tails)

    @property
    def followed(self) -> set[int]:
        """Keys of the opened run folders that are still polled."""
        return set(self._tails)

    @property
    def can_save(self) -> bool:
        """A model exists to save: a run trains, or one got past its set-up."""
        return self.running or self._has_model

    @property
    def pending_save(self) -> str | None:
        """Where the model is being saved, until ``save_finished`` or ``save_failed``."""
        return self._pending_save

    @property
    def inspecting(self) -> bool:
        return self.controller.inspecting

    @property
    def tuning(self) -> bool:
        """The speed advisor's trials hold the torch thread."""
        return self.controller.tuning

    @property
    def tune_cancelling(self) -> bool:
        """Cancel was asked of the trials; they end at their next optimizer step."""
        return self.controller.tune_cancelling

    def record(self, key: int) -> RunRecord:
        return self.records[key - 1]  # keys are 1, 2, … in order of creation

    def take_progressed(self) -> list[RunRecord]:
        """Records whose progress (step, loss, memory) changed since the last call: redrawn on a timer."""
        keys, self._progressed = self._progressed, set()
        return [self.record(key) for key in sorted(keys)]

    def continue_source(self, selected: set[int]) -> RunRecord | None:
        """The selected run if exactly one is selected and can be continued; with none selected, the latest that
        can; with several, None (which to go on from is not said: the latest of all was taken, unselected)."""
        if len(selected) > 1:
            return None
        candidates = [r for r in self.records if r.ended and r.checkpoint and not r.removed]
        chosen = [r for r in candidates if r.key in selected]
        if len(chosen) == 1:
            return chosen[0]
        return candidates[-1] if candidates else None

    def save_name(self) -> str:
        """A name for the next Save: the run and step of the model it writes. A run that is training saves at
        an optimizer step still to come (as many later as the dialog stays open): its name holds no step."""
        last = self._active or next((r for r in reversed(self.records) if r.origin == "live"), None)
        if last is None or not last.run_id:
            return "speedboard-checkpoint"
        if self.controller.running and (last.state != "paused" or last.before_training):
            return f"{last.run_id}-checkpoint"  # (paused before its first step: written after that step)
        return f"{last.run_id}-step{last.step}"

    # ------------------------------------------------------------------ commands
    def start(self, cfg: RunConfig, nproc: int = 1, parent: RunRecord | None = None) -> RunRecord:
        """Start a run (``nproc`` > 1: through torchrun); a SpeedboardError when its processes cannot be set up."""
        assert not self.running, "one run at a time"
        if self.out_dir:
            cfg = cfg.replace(out_dir=self.out_dir)
        if nproc > 1:
            spec = prepare_launch(cfg, nproc)
            # The model this process holds (an earlier run's) is no longer the latest: Save would write it under
            # this run's name and step. The job's own checkpoints hold its weights.
            self._has_model = False
            record = self._new_record(cfg.to_dict(), "live", folder=str(spec.run_dir), parent=parent, nproc=nproc)
            self._active = record
            self._process = ProcessRun(spec, self)
            self._process.event.connect(self._on_event)
            self._process.ended.connect(self._on_process_ended)
            self._process.start()
        else:
            record = self._new_record(cfg.to_dict(), "live", parent=parent)
            self._active = record
            self.controller.start_run(cfg)
        self.running_changed.emit(True)
        return record

    def continue_from(self, parent: RunRecord, settings: RunConfig, nproc: int = 1) -> RunRecord:
        """A new run from ``parent``'s final checkpoint (weights, optimizer, schedule) with ``settings``' training."""
        return self.start(self.continue_config(parent, settings), nproc, parent)

    def continue_config(self, parent: RunRecord, settings: RunConfig) -> RunConfig:
        """The configuration a run continued from ``parent`` with ``settings`` trains with; a SpeedboardError,
        before anything starts, where ``parent`` cannot be continued."""
        if not parent.checkpoint or not Path(parent.checkpoint).exists():  # said now, not as a failed row
            raise CheckpointError(f"{parent.label}'s checkpoint {parent.checkpoint} no longer exists (its folder "
                                  f"was moved or deleted): open the run folder where it is now to continue it")
        # Its files there and whole, said now too (a file deleted or cut short became a failed row); their bytes
        # are compared with their checksums as the run reads them, off this thread.
        verify_checkpoint(parent.checkpoint, hash_files=False)
        if not parent.config:  # its run_started line lost or damaged: the defaults were continued, another model
            raise ConfigError(f"{parent.label} cannot be continued: its run folder does not say its model and data "
                              f"(the first line of its metrics.jsonl is missing or damaged); start a new run from its "
                              f"checkpoint with Load weights… instead")
        try:
            base = RunConfig.from_dict(parent.config)
            cfg = base.replace(train=settings.train, resume=parent.checkpoint, init_from=None,
                               parent=parent.run_id, out_dir=settings.out_dir, name=None)
        except SpeedboardError:
            raise
        except (TypeError, ValueError) as exc:  # a config written by another version
            raise ConfigError(str(exc)) from None
        gone = parent_data_gone(parent)
        if gone:  # said now: it was a failed row at step 0
            raise DataError(gone)
        return cfg

    def start_tune(self, cfg: RunConfig, options, report_path: str | None) -> None:
        """The speed advisor on the torch thread, for ``cfg``'s model, data and effective batch."""
        assert not self.running and not self.tuning, "the torch thread is busy"
        self.controller.start_tune(cfg, options, report_path)
        self.tuning_changed.emit(True)

    def cancel_tune(self) -> None:
        self.controller.cancel_tune()
        self.tune_cancel_requested.emit()

    def close_after_job(self) -> None:
        """The window closes once the save or the read of weights on the torch thread has ended (waiting for it in
        ``shutdown`` froze the window for as long as a large checkpoint takes); a read's question is not asked."""
        self._closing = True

    def cancel_tune_then_close(self) -> None:
        """End the trials at their next optimizer step; ``tuning_changed(False)`` then finds ``closing`` set."""
        self._closing = True
        self.cancel_tune()

    def pause(self) -> None:
        self.controller.pause()

    def resume(self) -> None:
        self.controller.resume()

    def stop(self) -> None:
        """Stop the run after its current optimizer step (every rank of a torchrun job); it saves and ends."""
        if not self.running or self.stopping or self.ending:  # a second interrupt would abort a torchrun job
            return
        active = self._active
        self._route(active, StopRequested(before_training=active is not None and active.before_training))
        if self._process is not None:
            self._process.stop()
        else:
            self.controller.stop()

    def end_processes_now(self) -> None:
        """A torchrun job that is stopping ends now: a hung rank held its stop until the collective timeout."""
        if self._process is not None:
            self._process.end()

    def stop_then_continue(self, settings: RunConfig, nproc: int = 1) -> None:
        """Stop the run; once it has ended, continue from its final checkpoint with ``settings``."""
        self._continue_with = (settings, nproc)
        self.stop()

    def stop_then_close(self) -> None:
        """Stop the run; ``running_changed(False)`` then finds ``closing`` set."""
        self._closing = True
        self._continue_with = None
        self.stop()

    def save(self, path: str) -> bool:
        """Save the current model as a checkpoint folder; True when it waits for the run's next optimizer step
        (a paused run saves at once, where it stands)."""
        assert self._pending_save is None, "one save at a time"
        self._pending_save = str(user_path(path))  # as the run names it when saved: absolute, ``~`` expanded
        active = self._active
        # Paused after a step, it saves where it stands; paused before its first step, it waits for that step (there
        # is no trained model yet), which the window said as "Saving …" at once.
        paused_after_a_step = active is not None and active.state == "paused" and not active.before_training
        deferred = self.controller.running and not paused_after_a_step
        self.controller.save(self._pending_save)
        return deferred

    def inspect(self, path: str, model: ModelConfig | None = None) -> None:
        """Read a checkpoint's summary on the torch thread: ``checkpoint_read`` or ``load_failed`` follows.

        ``model``: the settings' architecture, which a bare state dict without its own must fit."""
        self.controller.inspect(path, model)

    def follow_folder(self, folder: str, number: int | None = None) -> tuple[RunRecord, bool]:
        """Show a run folder's events, and follow it while its run goes on; True when it was not shown yet.
        ``number``: the row's number (a row of the last session keeps the one it had), else the next.

        A folder whose metrics.jsonl holds no event is refused (a ``SpeedboardError`` says why), unless a live
        writer has yet to write its first one."""
        tail = EventTail(folder)
        events = tail.poll(TAIL_CHUNK_BYTES)  # its first event names the run; the rest comes a piece per tick
        searched = TAIL_CHUNK_BYTES
        while not events and tail.behind:  # a first line longer than a piece
            if searched >= FIRST_EVENT_BYTES:
                # A run's first line is its first event: 150 MB of another tool's lines held the window 7 s.
                raise SpeedboardError(f"no event a Speedboard run writes in the first {FIRST_EVENT_BYTES >> 20} MiB "
                                      f"of its {METRICS_FILE} (a run's first line is one)")
            events = tail.poll(TAIL_CHUNK_BYTES)
            searched += TAIL_CHUNK_BYTES
        if not events:
            _check_events_to_come(folder)
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        shown = self._by_run_id.get(started.run_id) if started is not None else None
        if shown is not None and not shown.removed:  # a removed row is opened as a new one
            return shown, False
        record = self._new_record(dict(started.config) if started else {}, "folder", folder=folder, number=number)
        for event in events:
            self._route(record, event)
        if not record.ended:
            if not tail.behind:  # its ending may be in what is still to read: its writer is asked about then
                self._check_writer(record)
            self._tails[record.key] = tail  # followed even when not running: written again, it shows
            self._tail_timer.start(0 if tail.behind else TAIL_INTERVAL_MS)
        return record, True

    def catching_up(self, key: int) -> bool:
        """The row's folder is still being read (a long metrics.jsonl, a piece per turn of the event loop)."""
        tail = self._tails.get(key)
        return tail is not None and tail.behind

    def _check_writer(self, record: RunRecord) -> None:
        """A followed folder without an ending whose writer is gone (killed, its machine stopped) says so."""
        if record.state != "following" or not record.folder:
            return
        if not Path(record.folder).is_dir():
            # Moved or deleted while shown: its heartbeat went with it, so whether a process still writes
            # elsewhere is unknown; say what is known.
            self._route(record, WriterGone(f"its folder {record.folder} was moved or deleted; what was read "
                                           f"stays shown", folder_gone=True))
            return
        state = run_state(record.folder, events=[])  # no ending among its events: only the heartbeat tells
        if state.state == "not running":
            self._route(record, WriterGone(state.message))

    def removable(self, key: int) -> bool:
        """A run can be removed unless it trains here or its folder is still written (``following``): one
        that ended, or whose writer is gone (``not running``), can."""
        record = self.record(key)
        return not record.removed and record is not self._active and not record.active

    def remove(self, keys: set[int]) -> list[RunRecord]:
        """Remove the rows and curves of the ``keys`` that are removable; their folders stay on disk and
        are no longer followed."""
        removed = []
        for key in sorted(keys):
            if not self.removable(key):
                continue
            record = self.record(key)
            record.removed = True
            self._tails.pop(key, None)  # a writer that comes back is no longer shown
            self.store.remove(key)
            self._progressed.discard(key)
            removed.append(record)
            self.record_removed.emit(record)
        if not self._tails:
            self._tail_timer.stop()
        return removed

    def shutdown(self) -> None:
        """Stop following folders; stop any run at its next step and end the torch thread (waits for it)."""
        self._tail_timer.stop()
        self.controller.shutdown()

    # ------------------------------------------------------------------ the one route
    def _new_record(self, config: dict, origin: str, folder: str | None = None, parent: RunRecord | None = None,
                    nproc: int = 1, number: int | None = None) -> RunRecord:
        # The number shown (#4) is the run's for good: one past the highest shown, or the one a row of the last
        # session had (rows deleted before renumbered the rest as the window opened again, its log lines too).
        taken = {r.number for r in self.records}
        if number is None or number in taken:
            number = max(taken, default=0) + 1
        held = {r.slot for r in self.records if r.holds_style}
        slot = next(i for i in range(len(held) + 1) if i not in held)  # the lowest free colour × dash
        record = RunRecord(key=len(self.records) + 1, number=number, config=config, origin=origin, folder=folder,
                           nproc=nproc, state="following" if origin == "folder" else "starting", slot=slot)
        if parent is not None:
            record.parent_id, record.parent_number = parent.run_id, parent.number
        self.records.append(record)
        self.record_added.emit(record)
        return record

    def _route(self, record: RunRecord, event: Event | RunNote) -> None:
        """Where every event and note of every source goes: the record, the plots' buffers, the signals."""
        if isinstance(event, RunStarted):
            self._by_run_id[event.run_id] = record
            parent = self._by_run_id.get(event.parent) if event.parent else None
            if parent is not None:  # a continued run names its parent's row
                record.parent_number = parent.number
            # And its children shown before it (a folder of a continued run opened first) name it now.
            for child in self.records:
                if child is not record and child.parent_id == event.run_id and child.parent_number is None:
                    child.parent_number = record.number
                    self.record_changed.emit(child)
        changed = record.apply(event)
        if isinstance(event, Event):
            self.store.add(record.key, event)
        if changed:
            self.record_changed.emit(record)
        else:
            self._progressed.add(record.key)
        if not isinstance(event, StepMetrics):  # per-step work stays in the buffers
            self.event_applied.emit(record, event)

    # ------------------------------------------------------------------ sources
    def _on_event(self, event: Event) -> None:
        """A core event of the run that trains: from the torch thread, or from the torchrun job's folder."""
        record = self._by_run_id.get(event.run_id) or self._active
        if record is None:
            return
        if isinstance(event, (RunFailed, WarningRaised)):  # a run of this window: its controls, not the CLI's flags
            event = dataclasses.replace(event, message=in_window_words(event.message))
        if isinstance(event, RunFailed) and event.peer_lost and self._process is not None and record is self._active:
            # Said first, it was the job's failure in the log, the row and the status bar, and the launcher's line
            # naming the rank that died came after it as a second one. Held until the launcher ends (it does once
            # its ranks have: torchrun ends the others), or for PEER_LOST_WAIT_MS at most.
            self._peer_lost, self._peer_lost_until = event, time.monotonic() + PEER_LOST_WAIT_MS / 1000
            QTimer.singleShot(PEER_LOST_WAIT_MS, self._route_peer_lost)
            return
        self._route(record, event)
        if (isinstance(event, CheckpointSaved) and self._pending_save is not None
                and user_path(event.path) == Path(self._pending_save)):
            self._pending_save = None
            self.save_finished.emit(event.path)

    def _poll_tails(self) -> None:
        """What the followed folders' files gained: a piece at a time, for ``TAIL_BUDGET_S`` at most, then again
        at the next turn of the event loop while any is behind (the window keeps answering meanwhile)."""
        self._polls += 1
        until = time.perf_counter() + TAIL_BUDGET_S
        behind, read = False, False
        for key, tail in list(self._tails.items()):
            record = self.record(key)
            if read and time.perf_counter() > until:  # the budget is spent: this one is read at the next turn
                behind = True
                continue
            read = True
            try:
                while True:
                    for event in tail.poll(TAIL_CHUNK_BYTES):
                        self._route(record, event)
                    if not tail.behind or time.perf_counter() > until:
                        break
            except OSError as exc:  # replaced by a folder, its permissions taken away: said once, not followed
                del self._tails[key]
                self._route(record, WriterGone(f"its {tail.path.name} cannot be read any more "
                                               f"({exc.strerror or exc}); what was read stays shown",
                                               folder_gone=True))
                continue
            behind = behind or tail.behind
            if record.ended:
                del self._tails[key]
            elif not tail.behind and self._polls % LIVENESS_EVERY == 0:
                self._check_writer(record)
        if not self._tails:
            self._tail_timer.stop()
        else:
            self._tail_timer.setInterval(0 if behind else TAIL_INTERVAL_MS)

    def _on_training_paused(self) -> None:
        if self._active is not None:
            self._route(self._active, TrainingPaused(self._active.step))

    def _on_training_resumed(self) -> None:
        # A paused run that is stopped (Stop, Continue, closing) wakes only to stop: not "resumed" in the log.
        if self._active is not None and self._active.state != "stopping":
            self._route(self._active, TrainingResumed())

    def _on_save_failed(self, path: str, message: str) -> None:
        self._pending_save = None
        self.save_failed.emit(path, message)

    def _on_run_job_ended(self, ended: RunJobEnded) -> None:
        self._has_model = ended.has_model
        self._run_ended()

    def _route_peer_lost(self) -> None:
        """Rank 0's held failure, as it said it: its launcher has not ended in time to name the first one."""
        if self._peer_lost is None or time.monotonic() < self._peer_lost_until - 0.1:  # a later job's is held
            return
        peer, self._peer_lost = self._peer_lost, None
        if peer is not None and self._active is not None and not self._active.ended:
            self._route(self._active, peer)

    def _on_process_ended(self, code: int, message: str) -> None:
        process, self._process = self._process, None
        record = self._active
        peer, self._peer_lost = self._peer_lost, None
        if peer is not None and record is not None and not record.ended:
            # The launcher's line names the rank that failed first and how: the job's one failure.
            self._route(record, dataclasses.replace(peer, message=in_window_words(message)) if message else peer)
        elif record is not None and not record.ended:
            # No final event in the folder (bad settings, or a crash before rank 0 wrote one). A Stop before any
            # rank began is said as such, not by the exit code of a launcher ended in its own start.
            stopped_early = record.state == "stopping" and record.before_training
            reason = in_window_words(message) if message else (
                "stopped before its processes had begun" if stopped_early else
                f"the training processes exited with code {code}")
            self._route(record, RunFailed(record.run_id or process.spec.run_id, 0.0, reason))
        elif record is not None and record.state == "failed" and message and process.crashed:
            # Rank 0 recorded the SIGTERM its torchrun passed on ("by its launcher when another process failed, or
            # by the user"): the launcher itself was what ended, which is the run's failure (row, status bar).
            self._route(record, RunFailed(record.run_id or process.spec.run_id, 0.0,
                                          f"{message} (rank 0: {record.message.removeprefix('rank 0: ')})",
                                          record.step))
        elif record is not None and record.state == "failed" and message:
            # Rank 0 recorded its own failure, often only that another process went away: the launcher's
            # line says which rank died and how.
            self._route(record, WarningRaised(record.run_id or process.spec.run_id, 0.0,
                                              f"launcher: {in_window_words(message)}"))
        if process is not None:
            process.deleteLater()
        self._run_ended()

    def _run_ended(self) -> None:
        """What waits for a run's end, in the torch thread or in torchrun processes: Continue, or closing."""
        record, self._active = self._active, None
        if record is not None:
            self.record_changed.emit(record)
        follow, self._continue_with = self._continue_with, None
        if follow is not None and not self._closing:
            if record is None or not record.checkpoint:
                self.continue_failed.emit(NO_FINAL_CHECKPOINT)
            else:
                try:
                    self.continue_from(record, *follow)
                except SpeedboardError as exc:
                    self.continue_failed.emit(str(exc))
        if not self.running:
            self.running_changed.emit(False)


def parent_data_gone(parent: RunRecord) -> str | None:
    """Why ``parent`` cannot be continued because its own data file or folder no longer exists (a continued run
    trains on its parent's data), or None. Asked before a training parent is stopped for Continue, too."""
    source = (parent.config.get("data") or {}).get("source") if isinstance(parent.config, dict) else None
    if not isinstance(source, str):
        return None
    location = source_location(source)
    if Path(location).is_absolute() and not Path(location).exists():
        return (f"the data of {parent.label}, {location}, no longer exists, and a continued run trains on its "
                f"parent's data: put it back where it was to continue this run")
    return None


def _check_events_to_come(folder: str) -> None:
    """A folder whose metrics.jsonl gave no event is followed only while its run is just starting: a live
    heartbeat, and no whole line written yet. Otherwise a ``SpeedboardError`` names the file and why."""
    path = Path(folder) / METRICS_FILE
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except FileNotFoundError:
        head = None
    lines = head is not None and b"\n" in head.lstrip()  # blank lines are no lines: readers skip them
    # The heartbeat itself, not writer_alive's fallback on the age of metrics.jsonl: one just created is no writer.
    # Or a launcher's claim while its processes start (``--nproc``): it lives while the claim is locked.
    if not lines and ((Path(folder) / HEARTBEAT_FILE).is_file() and writer_alive(folder)
                      or launcher_starting(folder)):
        return
    gone = f"and no process writes this run (no live {HEARTBEAT_FILE})"
    if head is None:
        raise SpeedboardError(f"there is no {METRICS_FILE} {gone}")
    if not head.strip():
        raise SpeedboardError(f"{METRICS_FILE} is empty {gone}: the run recorded no event")
    if b"\0" in head:
        raise SpeedboardError(f"{METRICS_FILE} holds binary data, not events (one JSON object a line)")
    raise SpeedboardError(f"no line of {METRICS_FILE} is an event a Speedboard run writes "
                          f"(one JSON object a line)")
