"""Processes > 1: the window starts the run through torchrun (QProcess), follows its folder, Stop ends every rank."""

from __future__ import annotations

import pytest

from tests.gui.conftest import RUN_TIMEOUT_MS, child, click, read_jsonl


@pytest.mark.slow
def test_two_cpu_processes_from_the_window(qtbot, make_window):
    from tests.gui.conftest import run_once

    window = make_window(train={"budget": 100_000, "micro_batch": 2, "eval_every": 0})
    window.config_panel.budget.setValue(3)
    run_once(qtbot, window)  # a model in this process: an earlier run's, not the job's
    assert child(window, "saveButton").isEnabled()
    window.config_panel.budget.setValue(100_000)
    child(window, "processesSpin").setValue(2)
    assert window.config_panel.config is not None, window.config_panel.error
    click(window, "startButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.step >= 2, timeout=RUN_TIMEOUT_MS)
    assert window.session.in_processes and record.folder
    # Ranks are stopped, never paused; their weights are in their own processes, which save checkpoints.
    assert not child(window, "pauseButton").isEnabled() and not child(window, "saveButton").isEnabled()
    assert "stopped, never paused" in child(window, "pauseButton").toolTip()  # greyed with its reason
    assert "saves its own checkpoints" in child(window, "saveButton").toolTip()
    click(window, "stopButton")
    qtbot.waitUntil(lambda: not window.session.in_processes, timeout=RUN_TIMEOUT_MS)
    assert record.ended and record.checkpoint, record.state
    events = read_jsonl(record.folder)
    assert events[0]["event"] == "run_started" and events[0]["world_size"] == 2
    assert events[-1]["event"] == "finished" and events[-1]["stopped"]
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert record.step == steps[-1]
    x, _ = window.store.series(record.key, "train/loss")
    assert len(x) == len(steps)  # the plots hold every step rank 0 logged
    assert child(window, "startButton").isEnabled()
    # The model this process holds is the earlier run's: Save wrote it under the job's name and step.
    assert not child(window, "saveButton").isEnabled() and not window.session.can_save


@pytest.mark.slow
def test_closing_again_while_a_job_stops_offers_to_end_it_now(qtbot, make_window, monkeypatch, dialogs):
    """A rank that hangs holds the others' stop until the collective timeout (300 s by default): the window said
    "Still stopping" at every close, and there was no way to end the job from it. Here the stop never lands, as
    with a hung rank."""
    from gui.process_run import ProcessRun

    window = make_window(train={"budget": 100_000, "micro_batch": 2, "eval_every": 0})
    child(window, "processesSpin").setValue(2)
    click(window, "startButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)
    monkeypatch.setattr(ProcessRun, "stop", lambda self: None)  # the stop is held
    window.close()
    assert window.isVisible() and window.session.closing
    asked = len(dialogs.questions())
    window.close()  # again: the question, answered Yes
    assert len(dialogs.questions()) == asked + 1 and "End every process now" in dialogs.questions()[-1]
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=RUN_TIMEOUT_MS)
    assert record.state == "failed" and "terminated" in record.message, (record.state, record.message)


@pytest.mark.slow
def test_a_killed_launcher_is_the_jobs_failure_in_the_row_and_status_bar(qtbot, make_window):
    """kill -9 on the launcher: rank 0 recorded torchrun's SIGTERM ("by its launcher when another process failed,
    or by the user"), and only the log said the launcher itself had gone."""
    import os
    import signal

    window = make_window(train={"budget": 100_000, "micro_batch": 2, "eval_every": 0})
    child(window, "processesSpin").setValue(2)
    click(window, "startButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)
    os.kill(window.session._process.process.processId(), signal.SIGKILL)
    qtbot.waitUntil(lambda: not window.session.running, timeout=RUN_TIMEOUT_MS)
    assert record.state == "failed"
    # Whether rank 0 recorded torchrun's SIGTERM before the window saw the launcher end is a race: where it did,
    # its line follows in brackets; the launcher's comes first either way.
    launcher = "the launcher of the job was killed or crashed, and its processes ended with it"
    assert record.message == launcher or record.message.startswith(f"{launcher} (rank 0: "), record.message
    assert "rank 0: rank 0:" not in record.message
    assert "the launcher of the job was killed" in window.status.state.full_text()
