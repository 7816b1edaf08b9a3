"""The session without a window: three sources, one route into each run's record, typed replies, saves."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from core.control import Control
from core.errors import CheckpointError
from core.events import (
    CheckpointFailed,
    DataPreparationProgress,
    DataPreparationStarted,
    Event,
    RunFailed,
    RunFinished,
    RunStarted,
    StepMetrics,
    WarningRaised,
)
from core.launch import LaunchSpec
from core.trainer import Trainer
from gui.controller import RunJobEnded
from gui.session import RunSession
from tests.conftest import micro_config
from tests.gui.conftest import RUN_TIMEOUT_MS

LONG = {"train": {"budget": 1_000_000}}  # a run that only ends when stopped


@pytest.fixture
def session(qtbot, tmp_path):
    session = RunSession(out_dir=str(tmp_path / "runs"))
    yield session
    session.stop()
    qtbot.waitUntil(lambda: not session.running, timeout=RUN_TIMEOUT_MS)
    session.shutdown()
    assert session.controller.thread_finished


class Trace:
    """Everything the session says, in order: (signal, payload)."""

    def __init__(self, session: RunSession) -> None:
        self.items: list[tuple[str, object]] = []
        self.states: dict[int, list[str]] = {}
        session.record_added.connect(self._added)
        session.record_changed.connect(self._changed)
        session.event_applied.connect(self._applied)
        session.running_changed.connect(self._running)

    def _added(self, record) -> None:
        self.items.append(("added", record.key))
        self.states[record.key] = [record.state]

    def _changed(self, record) -> None:
        self.items.append(("changed", record.key))
        if self.states[record.key][-1] != record.state:
            self.states[record.key].append(record.state)

    def _applied(self, record, event) -> None:
        self.items.append(("applied", type(event).__name__))

    def _running(self, running: bool) -> None:
        self.items.append(("running", running))

    def applied(self) -> list[str]:
        return [name for kind, name in self.items if kind == "applied"]


# --------------------------------------------------------------------------- source 1: the torch thread
def test_a_run_in_the_torch_thread_pauses_stops_and_its_replies_come_typed(qtbot, session, tmp_path):
    trace = Trace(session)
    core_events: list[object] = []
    ended: list[object] = []
    session.controller.event.connect(core_events.append)
    session.controller.run_job_ended.connect(ended.append)

    with qtbot.waitSignal(session.running_changed) as running:
        record = session.start(micro_config(tmp_path, **LONG))
    assert running.args == [True] and session.running and record.state == "starting"
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)

    with qtbot.waitSignal(session.controller.training_paused, timeout=RUN_TIMEOUT_MS):
        session.pause()
    assert record.state == "paused"
    paused_at = record.step
    with qtbot.waitSignal(session.controller.training_resumed, timeout=RUN_TIMEOUT_MS):
        session.resume()
    assert record.state == "training"
    qtbot.waitUntil(lambda: record.step > paused_at, timeout=RUN_TIMEOUT_MS)

    session.stop()
    assert record.state == "stopping" and session.stopping  # at once, before the trainer has seen it
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS) as running:
        pass
    assert running.args == [False] and not session.running and not session.stopping
    assert record.state == "stopped" and record.checkpoint and session.can_save

    assert trace.states[record.key] == ["starting", "training", "paused", "training", "stopping", "stopped"]
    applied = trace.applied()
    preparing = [a for a in applied if a.startswith("DataPrepar")]
    assert applied[:len(preparing)] == preparing  # the data is prepared before the run starts
    assert applied[len(preparing):][:1] == ["RunStarted"] and applied[-1] == "RunFinished"
    assert applied.index("TrainingPaused") < applied.index("TrainingResumed") < applied.index("StopRequested")
    # The thread's replies never travel with the core events, and the core events hold nothing else.
    assert core_events and all(isinstance(e, Event) for e in core_events)
    assert [type(e) for e in ended] == [RunJobEnded] and ended[0].run_id == record.run_id
    assert ended[0].has_model
    assert [e.step for e in core_events if isinstance(e, StepMetrics)] == list(range(1, record.step + 1))


def test_continue_after_stop_starts_the_child_from_the_parents_checkpoint(qtbot, session, tmp_path):
    cfg = micro_config(tmp_path, **LONG)
    parent = session.start(cfg)
    qtbot.waitUntil(lambda: parent.step >= 1, timeout=RUN_TIMEOUT_MS)
    session.stop_then_continue(cfg.replace(train={"accum_steps": 2}))
    qtbot.waitUntil(lambda: len(session.records) == 2, timeout=RUN_TIMEOUT_MS)
    assert parent.state == "stopped" and session.running
    child = session.records[1]
    assert child.parent_number == parent.number and child.train["accum_steps"] == 2
    qtbot.waitUntil(lambda: child.step > parent.step, timeout=RUN_TIMEOUT_MS)
    assert child.parent_id == parent.run_id and child.start_step == parent.step
    session.stop()
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        pass
    assert child.state == "stopped"


def test_continue_after_a_run_without_a_final_checkpoint_says_why(qtbot, session, tmp_path, monkeypatch):
    cfg = micro_config(tmp_path, **LONG)
    record = session.start(cfg)
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)

    def full_disk(self, path):
        raise CheckpointError("No space left on device")

    monkeypatch.setattr(Trainer, "save", full_disk)  # the final checkpoint cannot be written
    session.stop_then_continue(cfg)
    with qtbot.waitSignal(session.continue_failed, timeout=RUN_TIMEOUT_MS) as failed:
        pass
    assert "without a final checkpoint" in failed.args[0]
    assert record.state == "stopped" and record.checkpoint is None
    assert len(session.records) == 1 and not session.running


def test_continue_from_a_parent_whose_data_is_gone_is_refused_before_any_run(qtbot, session, tmp_path):
    """The parent's own corpus file deleted after it finished: Continue started a child that failed at step 0
    ("data source … does not exist"), a failed row where a dialog was due, as for a checkpoint that is gone."""
    from core.errors import DataError
    from tests.core.checkpoint_helpers import corpus_file

    cfg = micro_config(tmp_path, data={"source": str(corpus_file(tmp_path)), "vocab_size": 300},
                       train={"budget": 2})
    parent = session.start(cfg)
    qtbot.waitUntil(lambda: not session.running and parent.ended, timeout=RUN_TIMEOUT_MS)
    assert parent.state == "finished" and parent.checkpoint
    (tmp_path / "corpus.txt").unlink()
    with pytest.raises(DataError, match=r"the data of #1 eager ×1, .*corpus\.txt, no longer exists, and a "
                                        r"continued run trains on its parent's data: put it back where it was"):
        session.continue_from(parent, cfg)
    assert len(session.records) == 1 and not session.running


# --------------------------------------------------------------------------- saves: failed and written
def test_a_save_the_trainer_cannot_write_is_a_failed_save_and_the_run_goes_on(qtbot, session, tmp_path,
                                                                               monkeypatch):
    original = Trainer.save

    def full_disk(self, path):
        if Path(path).name == "full":
            raise CheckpointError("No space left on device")
        return original(self, path)

    monkeypatch.setattr(Trainer, "save", full_disk)
    applied: list[object] = []
    session.event_applied.connect(lambda record, event: applied.append(event))
    record = session.start(micro_config(tmp_path, **LONG))
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)

    target = tmp_path / "full"
    with qtbot.waitSignal(session.save_failed, timeout=RUN_TIMEOUT_MS) as failed:
        assert session.save(str(target)) is True  # served at the next optimizer step
    assert failed.args == [str(target), "No space left on device"]
    assert session.pending_save is None and not target.exists()
    (event,) = [e for e in applied if isinstance(e, CheckpointFailed)]
    assert event.path == str(target) and record.state == "training"
    step = record.step
    qtbot.waitUntil(lambda: record.step > step, timeout=RUN_TIMEOUT_MS)  # still training

    good = tmp_path / "good"
    with qtbot.waitSignal(session.save_finished, timeout=RUN_TIMEOUT_MS) as saved:
        session.save(str(good))
    assert saved.args == [str(good)] and (good / "config.json").is_file()
    assert str(good) in record.checkpoints and session.pending_save is None


def test_a_save_asked_while_paused_before_the_first_step_waits_for_that_step(qtbot, session, tmp_path):
    """The window said "Saving …" at once, while the trainer waits for the first step (no trained model yet)."""
    record = session.start(micro_config(tmp_path, **LONG))
    with qtbot.waitSignal(session.controller.training_paused, timeout=RUN_TIMEOUT_MS):
        session.pause()  # asked during set-up: the trainer holds before its first step
    assert record.state == "paused" and record.before_training
    target = tmp_path / "first"
    assert session.save(str(target)) is True  # at the next optimizer step
    with qtbot.waitSignal(session.save_finished, timeout=RUN_TIMEOUT_MS):
        session.resume()
    assert (target / "config.json").is_file() and record.step >= 1
    with qtbot.waitSignal(session.controller.training_paused, timeout=RUN_TIMEOUT_MS):
        session.pause()
    qtbot.waitUntil(lambda: record.state == "paused", timeout=RUN_TIMEOUT_MS)
    assert not record.before_training
    with qtbot.waitSignal(session.save_finished, timeout=RUN_TIMEOUT_MS):
        assert session.save(str(tmp_path / "now")) is False  # where it stands
    session.stop()
    qtbot.waitUntil(lambda: not session.running, timeout=RUN_TIMEOUT_MS)


# --------------------------------------------------------------------------- source 2: torchrun processes
def _event_lines(events: list[Event]) -> str:
    return "".join(json.dumps(e.to_dict()) + "\n" for e in events)


def _fake_launch(tmp_path: Path, before: list[Event], on_stop: list[Event], exit_code: int = 0, error: str = "",
                 last_line: str = "", printed: list[Event] = ()):
    """A ``prepare_launch`` whose command prints ``printed`` as the launcher's event lines (its preparation,
    before any run folder), writes ``before`` into the run folder, waits for the stop signal (SIGINT, as the
    launcher gets it), writes ``on_stop``, prints ``last_line`` and exits; or, with ``error``, fails at once."""
    from core.launch import event_line

    run_dir = tmp_path / "runs" / "job"
    script = tmp_path / "job.py"
    lines = "".join(f"{event_line(e)}\n" for e in printed)
    script.write_text(textwrap.dedent(f"""
        import signal, sys, time
        from pathlib import Path
        stopped = []
        signal.signal(signal.SIGINT, lambda *_: stopped.append(1))
        text = {lines!r}  # in two writes, the second starting mid-line: lines are whole when read
        sys.stdout.write(text[:len(text) // 2]); sys.stdout.flush(); time.sleep(0.2)
        sys.stdout.write(text[len(text) // 2:]); sys.stdout.flush()
        while {bool(printed)!r} and not stopped and not Path({str(tmp_path / "go")!r}).exists():
            time.sleep(0.02)
        run_dir = Path({str(run_dir)!r})
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write({_event_lines(before)!r})
        if {error!r}:
            print("speedboard: error: " + {error!r}, flush=True)
            sys.exit({exit_code})
        deadline = time.monotonic() + 120
        while not stopped and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write({_event_lines(on_stop)!r})
        if {last_line!r}:
            print({last_line!r}, flush=True)
        sys.exit({exit_code})
    """))

    def prepare(cfg, nproc):
        config_file = tmp_path / "job-config.json"
        config_file.write_text("{}")
        return LaunchSpec([sys.executable, str(script)], {}, "job", run_dir, config_file, nproc)

    return prepare


def test_a_torchrun_jobs_preparation_shows_before_its_run_folder_exists(qtbot, session, tmp_path, monkeypatch):
    """The launcher prepares the corpus before any process starts (minutes on a large one): its progress,
    printed as event lines, shows as an in-process run's does; the run folder's events follow."""
    run_dir = tmp_path / "runs" / "job"
    progress = DataPreparationProgress("", 1.0, stage="tokens", bytes_done=50, bytes_total=100, documents_done=5,
                                       documents_total=None, tokens_done=500, eta_seconds=1.0)
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [_started(run_dir), _step(1)], [_finished(1, stopped=True)],
        printed=[DataPreparationStarted("", 0.5, source="big.jsonl", source_kind="jsonl", files=1,
                                        bytes_total=100, documents_total=None, train_tokenizer=False), progress]))
    record = session.start(micro_config(tmp_path), nproc=2)
    qtbot.waitUntil(lambda: record.preparation_share == 0.5, timeout=RUN_TIMEOUT_MS)
    assert record.preparing and record.preparation and not run_dir.exists()
    (tmp_path / "go").touch()
    qtbot.waitUntil(lambda: record.step == 1, timeout=RUN_TIMEOUT_MS)
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        session.stop()
    assert record.state == "stopped" and not record.preparing  # rank 0's DataPrepared or the end cleared it


def _started(run_dir: Path, run_id: str = "job", world_size: int = 2) -> RunStarted:
    return RunStarted(run_id, 0.0, run_dir=str(run_dir), config={"train": {"accum_steps": 1}}, device="cpu",
                      precision="fp32", num_parameters=1000, tokens_per_step=128, budget_tokens=12800,
                      total_steps=100, world_size=world_size)


def _step(n: int, run_id: str = "job") -> StepMetrics:
    return StepMetrics(run_id, float(n), step=n, tokens=128 * n, loss=3.0 - n / 10, lr=1e-3, grad_norm=1.0,
                       tokens_per_s=1e4, step_time=0.01, peak_mem_gib=0.1, mem_gib=0.1, mfu=0.0)


def _finished(step: int, stopped: bool, run_id: str = "job", checkpoint: str | None = "/ck") -> RunFinished:
    return RunFinished(run_id, float(step), step=step, tokens=128 * step, stopped=stopped, final_loss=2.0,
                       val_loss=None, median_tokens_per_s=1e4, compile_seconds=None, peak_mem_gib=0.1,
                       checkpoint=checkpoint)


def test_a_torchrun_job_is_followed_through_its_folder_and_stopped(qtbot, session, tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "job"
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [_started(run_dir), _step(1), _step(2)], [_step(3), _finished(3, stopped=True)]))
    trace = Trace(session)
    record = session.start(micro_config(tmp_path), nproc=2)
    assert session.in_processes and session.running and record.nproc == 2 and record.folder == str(run_dir)
    qtbot.waitUntil(lambda: record.step == 2, timeout=RUN_TIMEOUT_MS)
    assert record.state == "training" and record.run_id == "job"

    session.stop()
    assert record.state == "stopping"
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS) as running:
        pass
    assert running.args == [False] and not session.in_processes
    assert trace.states[record.key] == ["starting", "training", "stopping", "stopped"]
    assert record.step == 3 and record.checkpoint == "/ck"
    x, _ = session.store.series(record.key, "train/loss")
    assert list(x) == [1, 2, 3]  # the same buffers as a run in the torch thread


def test_a_torchrun_job_that_has_ended_while_its_processes_exit_is_not_stopped_again(qtbot, session, tmp_path,
                                                                                    monkeypatch):
    """Rank 0 wrote "finished" a second before the launcher exited: meanwhile Stop (or closing the window)
    logged "stopping after the current optimizer step" under the finished run and interrupted the launcher."""
    run_dir = tmp_path / "runs" / "job"
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [_started(run_dir), _step(1), _finished(1, stopped=False)], []))
    record = session.start(micro_config(tmp_path), nproc=2)
    qtbot.waitUntil(lambda: record.ended, timeout=RUN_TIMEOUT_MS)
    assert record.state == "finished" and session.running and session.ending
    interrupts = []
    monkeypatch.setattr(session._process, "stop", lambda: interrupts.append(1))
    session.stop()
    session.stop_then_close()
    assert interrupts == [] and record.state == "finished" and session.closing
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        session._process.process.kill()  # the launcher's own exit, sooner
    assert not session.running and not session.ending and record.state == "finished"


def test_a_torchrun_job_that_dies_without_a_final_event_is_a_failed_run(qtbot, session, tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "job"
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [_started(run_dir), _step(1)], [], exit_code=2, error="the corpus is too small"))
    record = session.start(micro_config(tmp_path), nproc=2)
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        pass
    assert record.state == "failed" and record.message == "the corpus is too small"
    assert record.step == 1 and not session.running


@pytest.mark.parametrize("peer_lost", [True, False])
def test_the_launchers_line_on_which_rank_died_is_the_jobs_one_failure(peer_lost, qtbot, session, tmp_path,
                                                                       monkeypatch):
    """Rank 0 records only that another process went away; the launcher says which rank died and how. Rank 0's
    line was the job's failure first (log, row, status bar), the launcher's a second one after it. A failure of
    rank 0's own stays the job's, the launcher's line after it."""
    run_dir = tmp_path / "runs" / "job"
    failed = (RunFailed("job", 2.0, "rank 0: another process of this job failed or stopped", 1, peer_lost=True)
              if peer_lost else RunFailed("job", 2.0, "rank 0: the corpus went away", 1))
    launcher = "rank 1 died (signal 9, SIGKILL); rank 0 exited with code 1"
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [_started(run_dir), _step(1)], [failed], exit_code=1, last_line=f"speedboard: {launcher}"))
    applied = []
    session.event_applied.connect(lambda record, event: applied.append(event))
    record = session.start(micro_config(tmp_path), nproc=2)
    qtbot.waitUntil(lambda: record.step == 1, timeout=RUN_TIMEOUT_MS)
    session.stop()  # the fake job "fails" once it gets the signal
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        pass
    said = [e for e in applied if isinstance(e, (RunFailed, WarningRaised))]
    assert record.state == "failed" and record.step == 1
    if peer_lost:
        assert record.message == launcher and said == [RunFailed("job", 2.0, launcher, 1, peer_lost=True)]
    else:
        assert record.message == failed.message
        assert said == [failed, WarningRaised("job", 0.0, f"launcher: {launcher}")]


# --------------------------------------------------------------------------- source 3: opened run folders
def test_an_opened_folder_is_followed_until_its_run_ends(qtbot, session, tmp_path):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    metrics = folder / "metrics.jsonl"
    metrics.write_text(_event_lines([_started(folder, "cli-run", 1), _step(1, "cli-run")]))
    trace = Trace(session)
    record, new = session.follow_folder(str(folder))
    assert new and record.origin == "folder" and record.state == "following" and record.step == 1
    assert session.followed == {record.key} and session.live and not session.running

    with open(metrics, "a", encoding="utf-8") as f:
        f.write(_event_lines([_step(2, "cli-run")]))
    qtbot.waitUntil(lambda: record.step == 2, timeout=RUN_TIMEOUT_MS)
    with open(metrics, "a", encoding="utf-8") as f:
        f.write(_event_lines([_finished(2, stopped=False, run_id="cli-run")]))
    with qtbot.waitSignal(session.record_changed, timeout=RUN_TIMEOUT_MS):
        pass
    assert record.state == "finished" and session.followed == set() and not session.live
    assert trace.states[record.key] == ["following", "finished"]
    assert session.take_progressed() == [record] and session.take_progressed() == []

    again, new = session.follow_folder(str(folder))
    assert again is record and not new and len(session.records) == 1


def test_a_followed_folder_moved_away_says_so_not_that_its_process_is_gone(qtbot, session, tmp_path):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(_event_lines([_started(folder, "cli-run", 1), _step(1, "cli-run")]))
    applied = []
    session.event_applied.connect(lambda record, event: applied.append(event))
    record, _ = session.follow_folder(str(folder))
    assert record.state == "following"
    folder.rename(tmp_path / "renamed")
    qtbot.waitUntil(lambda: record.state == "not running", timeout=RUN_TIMEOUT_MS)
    assert "moved or deleted" in record.message and applied[-1].folder_gone
    assert record.step == 1 and session.removable(record.key)  # what was read stays, and can be removed


def test_a_followed_metrics_file_that_cannot_be_read_any_more_says_so_once(qtbot, session, tmp_path):
    """metrics.jsonl replaced by a folder (or its permissions taken away) while followed: an IsADirectoryError
    traceback on every poll, the row still 'following'."""
    folder = tmp_path / "run"
    folder.mkdir()
    metrics = folder / "metrics.jsonl"
    metrics.write_text(_event_lines([_started(folder, "cli-run", 1), _step(1, "cli-run")]))
    applied = []
    session.event_applied.connect(lambda record, event: applied.append(event))
    record, _ = session.follow_folder(str(folder))
    assert record.state == "following"
    metrics.unlink()
    metrics.mkdir()
    qtbot.waitUntil(lambda: record.state == "not running", timeout=RUN_TIMEOUT_MS)
    assert "metrics.jsonl cannot be read any more" in record.message and applied[-1].folder_gone
    assert session.followed == set() and record.step == 1


def test_a_folder_written_by_a_live_trainer_reaches_the_same_record_state(qtbot, session, tmp_path):
    """The folder route and the thread route end in the same record: a real trainer writes, the session reads."""
    control = Control()
    seen = threading.Event()
    run_dir: list[str] = []

    def sink(event):
        if isinstance(event, RunStarted):
            run_dir.append(event.run_dir)
            seen.set()

    cfg = micro_config(tmp_path / "cli", train={"budget": 3})
    control.pause()  # holds the run before its first step until the folder is open
    worker = threading.Thread(target=lambda: Trainer(cfg, control, sink).run(), daemon=True)
    worker.start()
    try:
        qtbot.waitUntil(seen.is_set, timeout=60_000)
        record, _ = session.follow_folder(run_dir[0])
        assert record.state == "following" and record.run_id
    finally:
        control.resume()
        worker.join(timeout=120)
    qtbot.waitUntil(lambda: record.ended, timeout=RUN_TIMEOUT_MS)
    assert record.state == "finished" and record.step == 3 and record.checkpoint


# --------------------------------------------------------------------------- notes only apply to the active run
def test_notes_reach_only_the_run_that_trains(session, tmp_path):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(_event_lines([_started(folder, "cli-run", 1)]))
    record, _ = session.follow_folder(str(folder))
    trace = Trace(session)
    session.stop()  # nothing trains: a followed folder is not stopped from here
    session.controller.training_paused.emit()
    session.controller.training_resumed.emit()
    assert record.state == "following" and session.active is None and trace.items == []


def test_a_second_shutdown_after_the_thread_is_released_answers_without_touching_it(qtbot, tmp_path):
    # The window's close and the application's aboutToQuit both shut the session down; by the second the
    # finished QThread may be deleted, and touching it raised "Internal C++ object already deleted".
    from PySide6.QtCore import QCoreApplication, QEvent

    session = RunSession(out_dir=str(tmp_path / "runs"))
    assert session.controller.shutdown()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # the thread's deleteLater, done now
    assert session.controller.shutdown() and session.controller.thread_finished


def test_a_torchrun_job_stopped_before_any_rank_began_says_so_not_its_exit_code(qtbot, session, tmp_path,
                                                                                  monkeypatch):
    """Stop at once after Start: the row said "stopped before training: the training processes exited with
    code 2", the code of a launcher ended in its own start (2 reads as bad settings)."""
    monkeypatch.setattr("gui.session.prepare_launch", _fake_launch(
        tmp_path, [], [], exit_code=2,
        printed=[DataPreparationStarted("", 0.5, source="big.jsonl", source_kind="jsonl", files=1,
                                        bytes_total=100, documents_total=None, train_tokenizer=False)]))
    record = session.start(micro_config(tmp_path), nproc=2)
    qtbot.waitUntil(lambda: record.preparing, timeout=RUN_TIMEOUT_MS)
    with qtbot.waitSignal(session.running_changed, timeout=RUN_TIMEOUT_MS):
        session.stop()
    assert record.state == "stopped" and record.message == "stopped before its processes had begun"


def test_a_torchrun_job_whose_launcher_cannot_start_is_a_failed_row_and_frees_the_session(qtbot, session, tmp_path,
                                                                                         monkeypatch):
    config_file = tmp_path / "job-config.json"
    config_file.write_text("{}")
    missing = tmp_path / "gone" / "python"
    monkeypatch.setattr("gui.session.prepare_launch", lambda cfg, nproc: LaunchSpec(
        [str(missing), "-m", "core.cli"], {}, "job", tmp_path / "runs" / "job", config_file, nproc))
    record = session.start(micro_config(tmp_path), nproc=2)
    qtbot.waitUntil(lambda: not session.running, timeout=RUN_TIMEOUT_MS)
    assert record.state == "failed" and "the training processes could not be started" in record.message
    assert not config_file.exists()


def test_a_folder_whose_first_line_is_damaged_is_not_continued_with_default_settings(session, tmp_path):
    """Its run_started line cut in half: the row read finished, its Train GiB was the whole process' peak, and
    Continue built a run of the default settings (another model), a failed row."""
    from core.errors import ConfigError
    from core.events import RunFinished
    from core.runs import read_events
    from core.trainer import train

    folder = train(micro_config(tmp_path / "cli", train={"budget": 3})).run_dir
    finished = next(e for e in read_events(folder) if isinstance(e, RunFinished))
    metrics = Path(folder) / "metrics.jsonl"
    lines = metrics.read_text().splitlines(True)
    metrics.write_text(lines[0][: len(lines[0]) // 2] + "\n" + "".join(lines[1:]))
    record, _ = session.follow_folder(str(folder))
    assert record.state == "finished" and record.checkpoint
    assert record.peak_mem_gib == finished.train_mem_gib  # the training's own figure, as the run gave it
    with pytest.raises(ConfigError, match=r"cannot be continued: its run folder does not say its model and data"):
        session.continue_from(record, micro_config(tmp_path))
    assert len(session.records) == 1 and not session.running


def test_a_continued_run_opened_before_its_parent_names_it_once_the_parent_is_shown(qtbot, session, tmp_path):
    """Opened child first (as a restart reopens them), it stayed "(continued)" with its parent's bare run id."""
    import dataclasses

    parent_dir, child_dir = tmp_path / "parent", tmp_path / "child"
    for folder, started in ((parent_dir, _started(parent_dir, "p-run", 1)),
                            (child_dir, dataclasses.replace(_started(child_dir, "c-run", 1), parent="p-run"))):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text(_event_lines([started, _finished(1, False, started.run_id)]))
    child, _ = session.follow_folder(str(child_dir))
    assert child.parent_number is None and child.label.endswith("(continued)")
    with qtbot.waitSignal(session.record_changed, check_params_cb=lambda record: record is child):
        parent, _ = session.follow_folder(str(parent_dir))
    assert child.parent_number == parent.number and child.label.endswith(f"← #{parent.number}")
