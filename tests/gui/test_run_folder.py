"""Open a run folder that another trainer (here: one in a plain thread) is still writing."""

from __future__ import annotations

import threading

import numpy as np

from core.control import Control
from core.events import RunStarted, StepMetrics
from core.trainer import Trainer
from tests.conftest import micro_config
from tests.gui.conftest import child, read_jsonl


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
        dialogs.files["getExistingDirectory"] = run_dir[0]
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
    dialogs.files["getExistingDirectory"] = str(tmp_path)
    window.open_run_folder()
    (message,) = dialogs.warnings()
    assert "no metrics.jsonl" in message
    assert window.session.records == []
