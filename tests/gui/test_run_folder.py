"""Open a run folder that another trainer (here: one in a plain thread) is still writing."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from core.control import Control
from core.events import RunStarted, StepMetrics
from core.trainer import Trainer
from tests.conftest import micro_config
from tests.gui.conftest import child, drop_paths, read_jsonl


def test_open_a_folder_being_written_and_watch_it_grow(qtbot, window, dialogs, tmp_path):
    control = Control()
    started = threading.Event()
    run_dir: list[str] = []

    def sink(event):  # on the trainer's thread
        if isinstance(event, RunStarted):
            run_dir.append(event.run_dir)
            started.set()
        elif isinstance(event, StepMetrics) and event.step == 3:
            control.pause()  # holds the run after step 3 until the window has seen it

    cfg = micro_config(tmp_path / "elsewhere", train={"budget": 8})
    worker = threading.Thread(target=lambda: Trainer(cfg, control, sink).run(), daemon=True)
    worker.start()
    try:
        qtbot.waitUntil(started.is_set, timeout=60_000)
        dialogs.files["pick_run_folders"] = [run_dir[0]]
        window.open_run_folder()
        record = window.session.records[-1]
        assert record.origin == "folder" and record.folder == run_dir[0]
        qtbot.waitUntil(lambda: record.step == 3, timeout=60_000)
        assert record.state == "following"
        state = child(window, "runTable").item(0, 2)
        qtbot.waitUntil(lambda: state.text() == "following 3/8")  # the table refreshes on the timer
    finally:
        control.resume()
        worker.join(timeout=120)
    assert not worker.is_alive()
    qtbot.waitUntil(lambda: record.ended, timeout=10_000)
    assert record.state == "finished" and record.step == 8
    window.plots.refresh()
    steps = [e for e in read_jsonl(run_dir[0]) if e["event"] == "step"]
    x, y = child(window, "lossPlot").curve(record.key, "train").getOriginalDataset()
    np.testing.assert_array_equal(x, [e["step"] for e in steps])
    np.testing.assert_array_equal(y, [e["loss"] for e in steps])
    assert record.key not in window.session.followed  # no longer polled once finished

    assert window.open_run_folder(run_dir[0]) is record  # opening it again shows the same row
    assert len(window.session.records) == 1


def test_a_folder_without_metrics_is_refused_with_a_message(window, dialogs, tmp_path):
    dialogs.files["pick_run_folders"] = [str(tmp_path)]
    window.open_run_folder()
    (message,) = dialogs.warnings()
    assert "no metrics.jsonl" in message
    assert window.session.records == []


def _finished_run(tmp_path, name: str, **train) -> str:
    from core.trainer import train as run

    result = run(micro_config(tmp_path / name, train={"budget": 3, **train}))
    return str(result.run_dir)


def test_several_folders_open_at_once_and_a_runs_folder_opens_its_runs(window, dialogs, tmp_path):
    first, second = _finished_run(tmp_path, "a"), _finished_run(tmp_path, "b")
    dialogs.files["pick_run_folders"] = [first, second]
    records = window.open_run_folders()
    assert [r.folder for r in records] == [first, second]
    assert [r.state for r in records] == ["finished", "finished"]
    assert "(finished)" in window.log.toPlainText()

    third = _finished_run(tmp_path, "c")
    dialogs.files["pick_run_folders"] = [str(tmp_path / "c" / "runs")]  # the folder that holds it
    (record,) = window.open_run_folders()
    assert record.folder == third and len(window.session.records) == 3
    assert not dialogs.warnings()

    # A good folder, one that holds no run and one whose metrics.jsonl is binary: one message for one Open.
    empty, binary = tmp_path / "empty", tmp_path / "binary"
    empty.mkdir()
    binary.mkdir()
    (binary / "metrics.jsonl").write_bytes(bytes(range(256)) * 8)
    fourth = _finished_run(tmp_path, "d")
    dialogs.files["pick_run_folders"] = [str(empty), str(binary), fourth]
    (record,) = window.open_run_folders()
    assert record.folder == fourth
    (message,) = dialogs.warnings()
    assert "no metrics.jsonl" in message and str(binary) in message, message

    # Opened again, all of them: one word for the Open (only the last run's "is already shown" was said).
    dialogs.files["pick_run_folders"] = [first, second, first, fourth]
    assert len(window.open_run_folders()) == 4 and len(window.session.records) == 4
    labels = [r.label for r in records]
    assert window.status.currentMessage() == (f"3 of these runs are already shown ({labels[0]} … "
                                              f"{window.session.records[-1].label})")
    dialogs.files["pick_run_folders"] = [second]
    window.open_run_folders()
    assert window.status.currentMessage() == f"{labels[1]} is already shown"


def test_a_long_metrics_file_is_read_a_piece_per_tick_and_its_ending_still_counts(qtbot, window, tmp_path):
    """A folder of 100,000 steps was read whole on the GUI thread: the window froze for seconds. Its pieces come
    one turn of the event loop after another; its writer's liveness is asked only once its ending could be read."""
    import json
    from pathlib import Path

    from gui.session import TAIL_CHUNK_BYTES

    folder = Path(_finished_run(tmp_path, "long"))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    head = [e for e in lines if e["event"] not in ("step", "finished", "failed")]
    step = next(e for e in lines if e["event"] == "step")
    ending = next(e for e in lines if e["event"] == "finished")
    steps = 4_000
    body = [{**step, "step": n, "loss": 5.0 + 1 / n} for n in range(1, steps + 1)]
    text = "".join(json.dumps(e) + "\n" for e in [*head, *body, {**ending, "step": steps}])
    assert len(text) > 4 * TAIL_CHUNK_BYTES
    (folder / "metrics.jsonl").write_text(text)
    record = window.open_run_folder(str(folder))
    assert record.state == "following" and record.step < steps  # the first piece only: the window goes on
    assert "reading its metrics.jsonl" in window.log.toPlainText()  # not "being written: followed live"
    qtbot.waitUntil(lambda: record.ended, timeout=60_000)
    assert record.state == "finished" and record.step == steps
    window.plots.refresh()
    x, _ = child(window, "lossPlot").curve(record.key, "train").getOriginalDataset()
    assert len(x) == steps and x[-1] == steps


def _long_run(tmp_path, name: str, steps: int = 4_000) -> str:
    """A finished run folder whose metrics.jsonl holds ``steps`` step lines (several pieces of a read)."""
    import json
    from pathlib import Path

    folder = Path(_finished_run(tmp_path, name))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    head = [e for e in lines if e["event"] not in ("step", "finished", "failed")]
    step = next(e for e in lines if e["event"] == "step")
    ending = next(e for e in lines if e["event"] == "finished")
    body = [{**step, "step": n, "loss": 5.0 + 1 / n} for n in range(1, steps + 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [*head, *body, {**ending,
                                                                                                "step": steps}]))
    return str(folder)


def test_one_turn_of_the_followers_reads_within_its_budget_over_all_long_folders(window, tmp_path, monkeypatch):
    """Each folder behind read one piece at least per turn: two long folders took two pieces' time, fifty (the
    last session's rows) fifty."""
    first, second = (window.open_run_folder(_long_run(tmp_path, name)) for name in ("a", "b"))
    monkeypatch.setattr("gui.session.TAIL_BUDGET_S", 0.0)
    before = (first.step, second.step)
    window.session._poll_tails()
    assert (first.step > before[0]) + (second.step > before[1]) == 1  # one piece, then the turn ends
    assert window.session._tail_timer.interval() == 0  # the rest at the next turn


def test_a_folder_moved_while_it_is_read_stops_being_read(qtbot, window, tmp_path):
    """Its file gone while behind, the followers read nothing for their whole budget at every turn, the timer at
    0 ms (the GUI thread busy for good), and the row never said the folder had gone."""
    from gui.session import TAIL_INTERVAL_MS

    folder = _long_run(tmp_path, "moved")
    record = window.open_run_folder(folder)
    assert window.session.catching_up(record.key)
    moved = tmp_path / "elsewhere"
    (tmp_path / "moved").rename(moved)
    window.session._poll_tails()
    assert not window.session.catching_up(record.key)
    assert window.session._tail_timer.interval() == TAIL_INTERVAL_MS
    qtbot.waitUntil(lambda: record.state == "not running", timeout=30_000)
    assert "moved or deleted" in record.message


def test_a_folder_whose_writer_was_killed_says_not_running(window, tmp_path):
    """No ending recorded and no heartbeat (kill -9): 'not running', not 'following' for ever."""
    import json
    import os
    import time
    from pathlib import Path

    folder = Path(_finished_run(tmp_path, "killed"))
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["event"] not in ("finished", "failed")]
    (folder / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    assert not (folder / "heartbeat.json").exists()  # a run of long ago: judged by its metrics' age
    long_ago = time.time() - 3600
    os.utime(folder / "metrics.jsonl", (long_ago, long_ago))
    record = window.open_run_folder(str(folder))
    assert record.state == "not running" and "process is gone" in record.message
    assert "not running" in window.log.toPlainText()
    assert not window.session.live  # nothing grows


def test_runs_of_the_last_session_come_back(qtbot, make_window, tmp_path):
    from tests.gui.conftest import run_once

    window = make_window()
    live = run_once(qtbot, window)
    opened = window.open_run_folder(_finished_run(tmp_path, "cli"))
    window.close()

    again = make_window()
    assert [r.folder for r in again.session.records] == [live.folder, opened.folder]
    assert [r.state for r in again.session.records] == ["finished", "finished"]
    assert again.session.records[0].final_loss == live.final_loss
    assert "from the last session" in again.log.toPlainText()
    assert again.session.continue_source(set()) is again.session.records[-1]  # they can be continued


def test_a_window_that_never_closed_still_gives_back_its_runs_and_settings(qtbot, make_window):
    """Its rows and settings were kept only at close: a window killed (or a machine that stopped) lost them."""
    from tests.gui.conftest import run_once

    window = make_window()
    window.config_panel.seed.setValue(1234.0)
    live = run_once(qtbot, window)
    again = make_window()  # the first one still open: nothing was saved by closing it
    assert [r.folder for r in again.session.records] == [live.folder]
    assert again.config_panel.seed.number() == 1234


def test_rows_of_the_last_session_keep_their_numbers(qtbot, make_window, tmp_path):
    """Rows #1 and #2 deleted, #3 and #4 came back as #1 and #2, their log lines too: the numbers a user wrote
    down no longer named the runs. A folder kept by an earlier version (no number) takes the next free one."""
    window = make_window()
    for name in ("a", "b", "c", "d"):
        window.open_run_folder(_finished_run(tmp_path, name))
    window.session.remove({1, 2})
    assert [r.number for r in window.session.records if not r.removed] == [3, 4]
    window.close()

    again = make_window()
    assert [(r.number, r.label.split()[0]) for r in again.session.records] == [(3, "#3"), (4, "#4")]
    assert "#3" in again.log.toPlainText() and "#1 " not in again.log.toPlainText()
    assert again.open_run_folder(_finished_run(tmp_path, "e")).number == 5  # one past the highest shown
    again.close()

    settings = again.settings
    rows = json.loads(settings.value("session/run_folders"))
    settings.setValue("session/run_folders", json.dumps([rows[0][0], *rows[1:]]))  # the first as a bare folder
    third = make_window()
    assert [r.number for r in third.session.records] == [1, 4, 5]


def test_the_run_folder_dialog_selects_several_folders(qtbot, tmp_path):
    from PySide6.QtWidgets import QAbstractItemView, QFileDialog

    from gui.dialogs import run_folder_dialog

    dialog = run_folder_dialog(None, str(tmp_path))
    qtbot.addWidget(dialog)
    views = dialog.findChildren(QAbstractItemView)
    assert views and all(v.selectionMode() == QAbstractItemView.SelectionMode.ExtendedSelection for v in views)
    assert dialog.fileMode() == QFileDialog.FileMode.Directory


def test_a_folder_opened_later_shows_when_its_events_happened(window, tmp_path):
    """Each metrics.jsonl line holds when it happened (``at``); the log shows that time, the date too when it
    is not today, and not the time the folder was read. A damaged time falls back to now."""
    import json
    import time
    from pathlib import Path

    folder = Path(_finished_run(tmp_path, "old"))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(line["at"] - time.time()) < 600 for line in lines)  # written as it happened
    two_days_ago = time.time() - 2 * 86400
    for line in lines:
        line["at"] = two_days_ago if line["event"] != "finished" else "damaged"
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    window.open_run_folder(str(folder))
    log = window.log.messages()
    then = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(two_days_ago))
    assert any(line.startswith(then) and "started" in line for line in log)
    (finished,) = [line for line in log if ": finished at step" in line]
    assert finished[:8].count(":") == 2 and finished[8] == " "  # the damaged time: now, today's clock alone



def test_lines_with_values_of_the_wrong_type_are_skipped_not_a_traceback_per_refresh(window, tmp_path):
    """Valid JSON whose values have the wrong types (a step as text, a sample's text as a number, a config's
    train section as a string) raised out of Open run folders, then again on every tick of the window."""
    import json
    from pathlib import Path

    folder = Path(_finished_run(tmp_path, "typed", sample_every=1))
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["event"] == "step"]
    steps[0]["loss"], steps[1]["step"] = "x", "two"
    for line in lines:
        if line["event"] == "sample":
            line["text"] = 5
    lines.append({**[line for line in lines if line["event"] == "run_started"][0], "run_id": "other",
                  "config": {"train": "fast"}})  # a second, damaged start: skipped
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    record = window.open_run_folder(str(folder))
    window._on_tick()
    assert record.state == "finished" and record.label.startswith("#1 eager")
    assert len(window.session.store.run(record.key).steps) == len(steps) - 2  # the two damaged steps are not shown


def test_a_folder_whose_path_is_too_long_for_the_system_is_a_message(qtbot, window, dialogs, tmp_path):
    """A dropped (or picked) folder whose path nears PATH_MAX (4,096 bytes: its metrics.jsonl's path is past it)
    raised "File name too long" out of the drop's slot: no message, and the other folders dropped did not open."""
    import os

    deep = tmp_path
    while len(str(deep)) < 3800:
        deep = deep / ("d" * 200)
    deep = deep / ("e" * (4088 - len(str(deep)) - 1))
    os.makedirs(deep)
    good = _finished_run(tmp_path, "good")
    assert drop_paths(window, [deep, good])
    qtbot.waitUntil(lambda: bool(dialogs.warnings()))
    assert [r.folder for r in window.session.records] == [good]
    (message,) = dialogs.warnings()
    assert "File name too long" in message or "no metrics.jsonl" in message, message

    gone = tmp_path / "gone"  # dropped, then deleted before the drop was handled
    window.open_run_folders([str(gone)])
    assert dialogs.warnings()[-1].endswith(f"{gone}: it does not exist (moved or deleted)")


def test_steps_that_took_no_time_measure_no_speed_not_a_division_by_zero(window, tmp_path):
    """A folder whose steady steps record a step time of 0.0 (well-typed, so read) raised ZeroDivisionError in the
    speedup column on opening and in every refresh."""
    import shutil

    base = Path(_finished_run(tmp_path, "base"))
    odd = tmp_path / "odd"
    shutil.copytree(base, odd)
    lines = [json.loads(line) for line in (odd / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        if line["event"] == "step" and not line["warmup"]:
            line["step_time"] = 0.0
        if line["event"] == "run_started":
            line["run_id"] = "odd"
    (odd / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second = window.open_run_folders([str(base), str(odd)])
    window._on_tick()
    assert second.step == first.step and second.step_seconds == []  # its losses shown, no speed from its steps
    window.table.item(window.table.row_of(second.key), window.table.column("Speedup")).text()  # drawn, no raise


# --------------------------------------------------------------------------- writers gone, folders without events
def _strip_ending(folder: str) -> None:
    """Take the recorded ending out of a run folder's metrics.jsonl, as a kill -9 leaves it."""
    import json
    from pathlib import Path

    metrics = Path(folder) / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(line for line in lines if json.loads(line)["event"] not in ("finished", "failed")))


def _leave_stale_heartbeat(folder: str) -> None:
    """The heartbeat.json a trainer killed with SIGKILL leaves: its pid gone, untouched for an hour."""
    import json
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # reaped: its pid no longer lives
    beat = Path(folder) / "heartbeat.json"
    beat.write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "every_s": 5.0}))
    long_ago = time.time() - 3600
    os.utime(beat, (long_ago, long_ago))


def _select_and_delete(qtbot, window, record) -> None:
    from PySide6.QtCore import Qt

    table = window.table
    table.clearSelection()
    table.selectRow(table.keys.index(record.key))
    table.setFocus()
    qtbot.keyClick(table, Qt.Key.Key_Delete)


def test_a_killed_runs_folder_is_removed_and_does_not_come_back(qtbot, make_window, tmp_path):
    """A CLI run killed with SIGKILL reads 'not running': nothing will write it, so Delete removes its row (its
    folder stays), it is no longer polled, and the next window does not bring it back."""
    from pathlib import Path

    killed = _finished_run(tmp_path, "killed")
    _strip_ending(killed)
    _leave_stale_heartbeat(killed)
    kept_folder = _finished_run(tmp_path, "kept")

    window = make_window()
    kept = window.open_run_folder(kept_folder)
    record = window.open_run_folder(killed)
    assert record.state == "not running" and record.key in window.session.followed
    assert window.session.removable(record.key)

    _select_and_delete(qtbot, window, record)
    assert record.removed and window.table.keys == [kept.key]
    assert record.key not in window.session.followed  # its tail is no longer read
    assert "cannot be removed" not in window.status.currentMessage()
    assert "removed " + record.label in window.log.toPlainText() and Path(killed).is_dir()
    window.close()

    again = make_window()
    assert [r.folder for r in again.session.records] == [kept_folder]


def test_a_folder_being_written_is_removable_once_its_writer_is_gone(qtbot, window, tmp_path):
    """A row a live process still writes stays (the status bar says why); once that process is killed, the
    row reads 'not running' and the context menu removes it."""
    from core.runs import Heartbeat

    folder = _finished_run(tmp_path, "cli")
    _strip_ending(folder)
    heartbeat = Heartbeat(folder).start()  # a live writer: this process
    try:
        record = window.open_run_folder(folder)
        assert record.state == "following" and not window.session.removable(record.key)
        _select_and_delete(qtbot, window, record)
        assert not record.removed and window.table.keys == [record.key]
        assert "still being written cannot be removed" in window.status.currentMessage()
    finally:
        heartbeat.stop()
    _leave_stale_heartbeat(folder)  # killed: the file stays, and goes stale

    qtbot.waitUntil(lambda: record.state == "not running", timeout=15_000)
    window.table.selectRow(0)
    menu = window.table.context_menu()
    remove = next(a for a in menu.actions() if a.text() == "Remove from the table")
    remove.trigger()
    assert record.removed and window.table.rowCount() == 0 and window.session.followed == set()


@pytest.mark.parametrize("content, why", [
    (b"", "is empty and no process writes this run"),
    (b"\x7fELF\x02\x01\x01\x00" * 64, "holds binary data"),
    (b'not json\n{"event": "weird"}\nstep 3 loss 2.1\n', "no line of metrics.jsonl is an event"),
    # Another tool's log, long: read whole on the window's thread before it was refused (7 s for 150 MB).
    ((b'{"event": "train_log", "loss": 2.5, "note": "' + b"x" * 200 + b'"}\n') * 70_000,
     "no event a Speedboard run writes in the first 8 MiB of its metrics.jsonl"),
], ids=["empty", "binary", "not-events", "long-foreign"])
def test_a_folder_whose_metrics_hold_no_event_is_refused_with_a_message(window, dialogs, tmp_path, content, why):
    """Nothing to show and nothing to come: refused in a message box naming the file and why, as a folder
    without metrics.jsonl is; the other folders picked with it still open."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_bytes(content)  # just written: its age alone must not pass for a writer
    good = _finished_run(tmp_path, "good")
    dialogs.files["pick_run_folders"] = [str(bad), good]
    (record,) = window.open_run_folders()
    assert record.folder == good and len(window.session.records) == 1
    (message,) = dialogs.warnings()
    assert message.startswith(f"Cannot open run folder: {bad}: ") and why in message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
@pytest.mark.parametrize("kind", ["named pipe", "folder", "device", "broken link"])
def test_a_metrics_file_that_is_no_file_is_said_as_such_not_as_missing(window, dialogs, tmp_path, kind):
    """A metrics.jsonl that is a named pipe, a folder, a link to a device or a broken link was refused with
    "no metrics.jsonl here or in the folders inside", which sent the user looking for a file that is there."""
    bad = tmp_path / "bad"
    bad.mkdir()
    metrics = bad / "metrics.jsonl"
    {"named pipe": lambda: os.mkfifo(metrics), "folder": metrics.mkdir,
     "device": lambda: metrics.symlink_to("/dev/zero"),
     "broken link": lambda: metrics.symlink_to(tmp_path / "gone")}[kind]()
    dialogs.files["pick_run_folders"] = [str(bad)]
    assert window.open_run_folders() == []
    (message,) = dialogs.warnings()
    what = {"named pipe": "a named pipe, not a file", "folder": "a folder, not a file",
            "device": "a character device, not a file", "broken link": "a broken symbolic link"}[kind]
    assert message.startswith(f"Cannot open run folder: {bad}: its metrics.jsonl is {what}"), message
    assert "no metrics.jsonl" not in message


def test_a_run_whose_first_event_is_a_long_line_still_opens(window, dialogs, tmp_path):
    """A first event longer than the window's piece of reading (its data's skipped files listed in it) is read
    whole to find the run."""
    from core.events import DataPreparationStarted

    folder = Path(_finished_run(tmp_path, "run"))
    first = DataPreparationStarted("x", 0.0, source="corpus", source_kind="text", files=1, bytes_total=10,
                                   documents_total=None, train_tokenizer=False,
                                   skipped=tuple(f"image_{i:06d}.png" for i in range(60_000)))
    metrics = folder / "metrics.jsonl"
    metrics.write_text(json.dumps(first.to_dict()) + "\n" + metrics.read_text())
    assert metrics.stat().st_size > 1 << 20
    record = window.open_run_folder(str(folder))
    assert record is not None and not dialogs.warnings()


def test_an_empty_metrics_file_of_a_live_writer_is_followed(qtbot, window, dialogs, tmp_path):
    """A run just starting (its heartbeat beats, no event written yet) is followed, and shows its run once
    it writes."""
    from pathlib import Path

    from core.runs import Heartbeat

    folder = _finished_run(tmp_path, "starting", compile_mode="default")
    metrics = Path(folder) / "metrics.jsonl"
    lines = metrics.read_bytes()
    metrics.write_bytes(b"")
    heartbeat = Heartbeat(folder).start()
    try:
        record = window.open_run_folder(folder)
        assert not dialogs.warnings() and record.state == "following"
        assert record.key in window.session.followed and not window.session.removable(record.key)
        with open(metrics, "ab") as f:
            f.write(lines)
        qtbot.waitUntil(lambda: record.state == "finished", timeout=10_000)
    finally:
        heartbeat.stop()
    assert record.step == 3 and record.label.startswith(f"#{record.number} default ")
    assert window.session.followed == set()


@pytest.mark.parametrize("picked", ["run", "parent"])
def test_a_run_folder_picked_before_its_first_event_is_followed(qtbot, window, dialogs, tmp_path, picked):
    """The first moments of a run: its heartbeat and no metrics.jsonl yet. Picked then (the folder, or the
    folder of runs above it), it was refused as "Not a run folder" while the run went on."""
    import shutil
    from pathlib import Path

    from core.runs import Heartbeat

    folder = Path(_finished_run(tmp_path / "runs", "starting"))
    metrics = folder / "metrics.jsonl"
    lines = metrics.read_bytes()
    metrics.unlink()
    shutil.rmtree(folder / "checkpoints")  # saved at its end: not there yet
    heartbeat = Heartbeat(folder).start()
    try:
        dialogs.files["pick_run_folders"] = [str(folder if picked == "run" else folder.parent)]
        (record,) = window.open_run_folders()
        assert not dialogs.warnings() and record.state == "following"
        metrics.write_bytes(lines)
        qtbot.waitUntil(lambda: record.state == "finished", timeout=10_000)
    finally:
        heartbeat.stop()
    assert record.step == 3


@pytest.mark.parametrize("picked", ["run", "parent"])
def test_a_job_folder_picked_while_its_processes_start_is_followed(qtbot, window, dialogs, tmp_path, picked):
    """`speedboard train --nproc N`: for the seconds its processes take to start, its folder holds only the
    launcher's claim. Picked then, it was refused as "Not a run folder" (or skipped in the runs folder above)."""
    import shutil
    from pathlib import Path

    from core.runs import CLAIM_FILE, claim_run_dir, release_run_dir

    written = Path(_finished_run(tmp_path / "elsewhere", "job"))
    folder = tmp_path / "runs" / written.name
    token = claim_run_dir(folder)  # held by this process: a launcher that lives
    try:
        dialogs.files["pick_run_folders"] = [str(folder if picked == "run" else folder.parent)]
        (record,) = window.open_run_folders()
        assert not dialogs.warnings() and record.state == "following"
        for path in written.iterdir():  # its rank 0 writes, and takes the claim over
            shutil.move(path, folder / path.name)
        (folder / CLAIM_FILE).unlink()
        qtbot.waitUntil(lambda: record.state == "finished", timeout=10_000)
    finally:
        release_run_dir(folder, token)
    assert record.step == 3


def test_a_removed_row_opened_again_shows_again(window, tmp_path):
    folder = _finished_run(tmp_path, "twice")
    first = window.open_run_folder(folder)
    assert window.session.remove({first.key}) == [first]
    again = window.open_run_folder(folder)
    assert again is not first and not again.removed and window.table.keys == [again.key]


def test_a_folder_moved_after_its_run_is_shown_and_continued_where_it_is_now(qtbot, window, dialogs, tmp_path):
    """Its events name the path it was written at; the row, its checkpoint, Continue and the next session
    use the path it was opened from (a folder copied to another machine, a share mounted elsewhere)."""
    import shutil
    from pathlib import Path

    from tests.gui.conftest import click, wait_idle

    written = Path(_finished_run(tmp_path, "there"))
    moved = tmp_path / "here" / written.name
    moved.parent.mkdir()
    shutil.move(str(written), str(moved))
    record = window.open_run_folder(str(moved))
    assert record.folder == str(moved) and record.state == "finished"
    assert record.checkpoint is not None and Path(record.checkpoint).parent.parent == moved
    window.table.selectRow(0)
    click(window, "continueButton")
    wait_idle(qtbot, window)
    continued = window.session.records[-1]
    assert not dialogs.warnings() and continued.state == "finished", continued.message
    assert continued.parent_id == record.run_id and continued.started_from == record.checkpoint


def test_run_folders_dropped_on_the_window_open_as_open_run_folders_opens_them(qtbot, window, dialogs, tmp_path):
    """A drop on the plots, most of the window, reaches it: the plots and read-only texts take no drops."""
    first, second = _finished_run(tmp_path, "a"), _finished_run(tmp_path, "b")
    for plot in window.plots.plots:
        assert not plot.acceptDrops() and not plot.viewport().acceptDrops()
    assert not window.log.viewport().acceptDrops()
    assert drop_paths(window, [first, f"{second}/metrics.jsonl"])  # a dropped metrics.jsonl: its run folder
    qtbot.waitUntil(lambda: len(window.session.records) == 2)
    assert sorted(r.folder for r in window.session.records) == sorted([first, second])

    (tmp_path / "notes").mkdir()
    assert drop_paths(window, [tmp_path / "notes"])
    qtbot.waitUntil(lambda: bool(dialogs.warnings()))
    assert "no metrics.jsonl" in dialogs.warnings()[0] and len(window.session.records) == 2
    assert not drop_paths(window, [], enter_only=True)  # a drag of text, not files, is not taken


def test_open_run_folders_starts_where_run_folders_were_opened_not_where_load_picked(qtbot, window, dialogs,
                                                                                     tmp_path, monkeypatch):
    """It opened inside the checkpoint folder Load had picked last (an empty folder of weights)."""
    import gui.dialogs

    starts = []
    monkeypatch.setattr(gui.dialogs, "pick_run_folders", lambda parent, start: starts.append(start) or [])
    window.folders.remember(str(tmp_path / "ckpts" / "model.safetensors"))  # what Load keeps
    (tmp_path / "ckpts").mkdir()
    window.open_run_folders()
    assert starts[-1] != str(tmp_path / "ckpts")
    run = _finished_run(tmp_path, "a")
    dialogs_pick = lambda parent, start: starts.append(start) or [run]  # noqa: E731
    monkeypatch.setattr(gui.dialogs, "pick_run_folders", dialogs_pick)
    window.open_run_folders()
    window.open_run_folders()
    assert starts[-1] == str(Path(run).parent)  # the folder of the run folders opened last
    assert window.folders.last() == str(tmp_path / "ckpts")  # Load's own stays
