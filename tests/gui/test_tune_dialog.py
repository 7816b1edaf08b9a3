"""The speed advisor in the window: live table and chart, Apply, Cancel, a failing cell, a saved report."""

from __future__ import annotations

import json

import pytest

from core.trials import Cell
from gui.widgets.tune_dialog import measured_for_other
from tests.gui.conftest import RUN_TIMEOUT_MS, child, click

CELLS = [Cell("off", "model", 1, 4, "fp32"), Cell("off", "model", 2, 2, "fp32"), Cell("off", "model", 1, 4, "bf16")]


@pytest.fixture(autouse=True)
def three_cells(monkeypatch):
    """The micro preset's current settings and two alternatives (eager: no compile in these tests)."""
    import core.tune

    monkeypatch.setattr(core.tune, "candidate_cells", lambda config, precisions, device, current: (list(CELLS), []))


def open_dialog(window):
    action = child(window, "tuneButton")
    assert action.isEnabled()
    action.trigger()
    dialog = window.tune_dialog
    assert dialog is not None and dialog.isVisible()
    return dialog


def wait_done(qtbot, dialog):
    qtbot.waitUntil(lambda: dialog.report is not None and not dialog.tuning, timeout=RUN_TIMEOUT_MS)


def test_trials_fill_the_table_and_chart_and_apply_sets_the_controls(qtbot, window, dialogs, tmp_path):
    dialog = open_dialog(window)
    dialog.budget.setValue(120)
    click(dialog, "tuneRunButton")
    assert dialog.tuning and not child(window, "startButton").isEnabled()  # one job on the torch thread
    for name in ("startButton", "saveButton", "loadButton"):  # and the greyed buttons say why
        assert child(window, name).toolTip().startswith("Waits for the speed advisor's trials"), name
    qtbot.waitUntil(lambda: dialog.finished_events >= 1, timeout=RUN_TIMEOUT_MS)
    assert dialog.table.rowCount() == 3  # every planned cell has its row from the first result on
    wait_done(qtbot, dialog)
    report = dialog.report
    assert not report["cancelled"] and len(report["trials"]) == 6 and dialog.finished_events == 6
    assert [dialog.table.item(r, 7).text() for r in range(3)] == ["ok", "ok", "ok"]
    assert len(dialog.chart.bars) == 3 and min(dialog.chart.bars) > 0
    # the chart names its bars by the table's row numbers, which the table shows
    assert dialog.chart.ticks == [(0, "1"), (1, "2"), (2, "3")] and dialog.table.verticalHeader().isVisible()
    rec = report["recommendation"]
    assert rec["text"] in child(dialog, "tuneRecommendation").text()
    assert child(dialog, "tuneApplyButton").isEnabled() == (not rec["is_current"])
    assert child(window, "startButton").isEnabled()  # the torch thread is free again
    assert not child(window, "startButton").toolTip().startswith("Waits")
    assert not window.session.records  # trials are not runs: no rows in the run table

    # A saved report reopens; Apply writes its recommendation into the settings panel.
    report["recommendation"] = {**rec, "cell": "off-a2-fp32", "is_current": False,
                                "settings": {"micro_batch": 2, "accum_steps": 2, "compile_mode": "default",
                                             "compile_scope": "block", "precision": "bf16"}}
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(report))
    assert dialog.open_report(str(path))
    click(dialog, "tuneApplyButton")
    panel = window.config_panel
    assert child(panel, "microBatchSpin").value() == 2 and child(panel, "accumStepsSpin").value() == 2
    cfg = panel.config
    assert (cfg.train.micro_batch, cfg.train.accum_steps, cfg.train.compile_mode, cfg.train.compile_scope,
            cfg.train.precision) == (2, 2, "default", "block", "bf16")
    # Applied, the pick is what the panel holds: said, and not offered again (it read as still to apply).
    assert not child(dialog, "tuneApplyButton").isEnabled()
    assert child(dialog, "tuneRecommendation").text().endswith("Applied: the settings panel holds it now.")

    # A budget past the field's range is its bound; a micro-batch the panel does not offer is not clamped
    # (that would change the effective batch): nothing is set (compile and precision were, with the old split:
    # a combination no trial measured), and a dialog says so.
    report["plan"]["budget_seconds"] = 1e15
    report["recommendation"]["settings"] = {"micro_batch": 100_000, "accum_steps": 1, "compile_mode": "off",
                                            "compile_scope": "model", "precision": "fp32"}
    path.write_text(json.dumps(report))
    assert dialog.open_report(str(path)) and dialog.budget.value() == dialog.budget.maximum()
    click(dialog, "tuneApplyButton")
    cfg = panel.config
    assert (cfg.train.micro_batch, cfg.train.accum_steps, cfg.train.compile_mode, cfg.train.precision) == \
        (2, 2, "default", "bf16")
    kind, title, text = dialogs.messages[-1]
    assert title == "Not applied" and "nothing was set" in text


def test_cancel_ends_the_trials_and_keeps_what_they_measured(qtbot, window):
    from gui.main_window import TUNING_STATE

    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    qtbot.waitUntil(lambda: dialog.finished_events >= 1, timeout=RUN_TIMEOUT_MS)
    # The status bar says what holds the torch thread (it showed the last run, "finished").
    assert child(window, "stateLabel").full_text() == TUNING_STATE
    click(dialog, "tuneCancelButton")
    wait_done(qtbot, dialog)
    assert dialog.report["cancelled"] and 1 <= len(dialog.report["trials"]) < 6
    qtbot.waitUntil(lambda: child(window, "stateLabel").full_text() == "idle")
    assert "Cancelled" in child(dialog, "tuneProgressLabel").text()
    # Every setting not run was left for the cancel, not for the time budget, and is counted.
    plan, ran = dialog.report["plan"], {t["cell"] for t in dialog.report["trials"]}
    unrun = [c for c in CELLS if c.name not in ran]
    assert sorted(x["cell"] for x in plan["left_out"]) == sorted(c.name for c in unrun)
    # (the trial running when Cancel came, if one did, is said as cut short)
    reasons = {x["reason"] for x in plan["left_out"]}
    assert reasons <= {"the trials were cancelled first", "the trials were cancelled during its first trial"}
    text = child(dialog, "tunePlanLabel").text()
    assert "cancelled after" in text and "within the budget" not in text
    if unrun:
        assert f"Not tried: {len(unrun)} ({'; '.join(sorted(reasons))})" in text
    assert child(dialog, "tuneRunButton").isEnabled() and child(window, "startButton").isEnabled()


def held_in_planning(qtbot, window, monkeypatch):
    """Start the trials and hold the torch thread in their planning (its first matmul peak) until the returned
    event is set; returns the dialog, the event and the count of peaks measured."""
    import threading

    import core.device

    planning, released = {"peaks": 0}, threading.Event()
    real = core.device.measure_matmul_peak

    def measured(device, precision):  # on the torch thread, while the test clicks
        planning["peaks"] += 1
        released.wait(RUN_TIMEOUT_MS / 1000)
        return real(device, precision)

    monkeypatch.setattr(core.device, "measure_matmul_peak", measured)
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    qtbot.waitUntil(lambda: planning["peaks"] == 1, timeout=RUN_TIMEOUT_MS)
    return dialog, released, planning


def test_cancel_while_planning_ends_at_once_and_says_nothing_was_measured(qtbot, window, monkeypatch):
    dialog, clicked, planning = held_in_planning(qtbot, window, monkeypatch)
    click(dialog, "tuneCancelButton")
    clicked.set()
    qtbot.waitUntil(lambda: not dialog.tuning, timeout=RUN_TIMEOUT_MS)
    assert planning["peaks"] == 1 and dialog.report is None and dialog.finished_events == 0
    assert child(dialog, "tunePlanLabel").text() == "Cancelled while planning: nothing was measured."
    assert child(dialog, "tuneRunButton").isEnabled() and child(window, "startButton").isEnabled()


def test_escape_ends_the_trials_as_closing_does_and_save_and_load_wait_for_them(qtbot, window):
    """The trials hold the torch thread: Save and Load are not offered meanwhile (they would wait unseen);
    Escape, which hides the dialog without a close event, cancels them as closing does."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    qtbot.waitUntil(lambda: dialog.finished_events >= 1, timeout=RUN_TIMEOUT_MS)
    assert not child(window, "saveButton").isEnabled() and not child(window, "loadButton").isEnabled()
    assert not window.actions["Load weights…"].isEnabled()
    QTest.keyClick(dialog, Qt.Key.Key_Escape)
    assert not dialog.isVisible()
    wait_done(qtbot, dialog)
    assert dialog.report["cancelled"] and len(dialog.report["trials"]) < 6
    assert child(window, "startButton").isEnabled() and child(window, "loadButton").isEnabled()


def test_closing_the_window_during_the_trials_ends_them_first_without_holding_the_window(qtbot, window):
    """The close waited for the torch thread inside the close event: a trial's compile of a minute froze the
    window that long. It now ends the trials as Cancel does and closes once they have ended."""
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    qtbot.waitUntil(lambda: dialog.finished_events >= 1, timeout=RUN_TIMEOUT_MS)
    window.close()
    assert window.isVisible() and window.session.closing  # not closed inside the event: the trials end first
    assert window.status.currentMessage().startswith("Stopping the trials: the window closes after")
    # The dialog says so too (it went on showing "Trial 3 of 6 …" with a Cancel that did nothing).
    from gui.widgets.tune_dialog import CANCELLING

    assert child(dialog, "tuneProgressLabel").text() == CANCELLING
    assert not child(dialog, "tuneCancelButton").isEnabled()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=RUN_TIMEOUT_MS)
    assert dialog.report["cancelled"] and len(dialog.report["trials"]) < 6  # what they measured is kept
    assert window.session.controller.thread_finished


def test_a_failing_cell_is_a_row_with_its_reason(qtbot, window, monkeypatch):
    from core import trainer

    real = trainer.Trainer._optimizer_step

    def step(self):
        if self.cfg.train.precision == "bf16":
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(self)

    monkeypatch.setattr(trainer.Trainer, "_optimizer_step", step)
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    wait_done(qtbot, dialog)
    statuses = [dialog.table.item(r, 7).text() for r in range(3)]
    assert statuses[:2] == ["ok", "ok"] and statuses[2].startswith("failed: out of memory")
    # Every cell of its row says why in its tooltip: a narrow dialog scrolls the status column out of sight.
    assert dialog.table.item(2, 1).toolTip().endswith(f"\nstatus: {statuses[2]}")
    assert "status:" not in dialog.table.item(0, 1).toolTip()
    assert dialog.report["recommendation"]["cell"] != "off-a1-bf16"
    assert len(dialog.chart.bars) == 2  # nothing to draw for the failed cell
    # Its reason is read whole: the row grows to the lines it wraps to in the status column, also when that
    # column narrows (it was cut at one line, the cause past the cut).
    from PySide6.QtCore import Qt

    table = dialog.table
    for width in (160, 100):
        table.horizontalHeader().setSectionResizeMode(7, table.horizontalHeader().ResizeMode.Interactive)
        table.setColumnWidth(7, width)
        wrapped = table.fontMetrics().boundingRect(0, 0, width - 8, 10_000, int(Qt.TextFlag.TextWordWrap),
                                                   statuses[2]).height()
        assert table.rowHeight(2) >= wrapped > table.rowHeight(0), (width, wrapped, table.rowHeight(2))


def test_a_file_that_is_not_a_report_is_one_message(qtbot, window, dialogs, tmp_path):
    dialog = open_dialog(window)
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    dialogs.files["getOpenFileName"] = str(bad)
    click(dialog, "tuneOpenButton")
    assert any("not a Speedboard tuning report" in w for w in dialogs.warnings())
    assert dialog.report is None and not child(dialog, "tuneApplyButton").isEnabled()
    # A report of the right kind with fields missing: a message too, never an exception in the window.
    from core.tune import SCHEMA

    bad.write_text(json.dumps({"schema": SCHEMA, "plan": {"budget_seconds": 60}, "summary": {}, "trials": []}))
    click(dialog, "tuneOpenButton")
    assert any("is not a complete tuning report" in w for w in dialogs.warnings())
    assert dialog.report is None


def test_settings_that_may_still_be_tried_are_not_called_not_tried(window):
    dialog = open_dialog(window)
    plan = {"description": "2 settings × 2 interleaved repeats; 1 more setting follows if the trials run faster "
                           "than estimated",
            "left_out": [{"cell": "default-model-a1-fp32", "reason": "left out to stay within the time budget"},
                         {"cell": "micro-batch 8 × 1", "reason": "does not fit in memory"}],
            "spare": ["default-model-a1-fp32"]}
    dialog._show_plan(plan)
    label = child(dialog, "tunePlanLabel").text()
    assert "Not tried: 1 (does not fit in memory)" in label and "follows if" in label
    dialog._show_plan({**plan, "spare": []})  # the end: whatever was not tried is said so
    assert "Not tried: 2" in child(dialog, "tunePlanLabel").text()
    # A reason is said whole: cut at 60 characters it lost what the split needs, and its closing bracket.
    reason = ("does not fit in memory (micro-batch 1,024 × 256 tokens needs at least 31.3 GiB, more than the "
              "22.6 GiB of available RAM)")
    dialog._show_plan({**plan, "left_out": [{"cell": "off-model-a1-fp32", "reason": reason}], "spare": []})
    assert f"Not tried: 1 ({reason})." in child(dialog, "tunePlanLabel").text()
    # With the panel at several processes, the plan keeps saying that the trials time one (it was said while
    # planning only, then replaced by the plan).
    dialog._processes = lambda: 2
    dialog._show_plan(plan)
    assert child(dialog, "tunePlanLabel").text().endswith(
        " The trials measure one process; the panel's 2 processes are not what they time.")


def test_run_trials_is_offered_only_while_no_run_trains(qtbot, make_window):
    from tests.gui.conftest import wait_idle, wait_steps

    window = make_window(train={"budget": 1_000_000})
    dialog = open_dialog(window)
    run_trials = child(dialog, "tuneRunButton")
    assert run_trials.isEnabled()
    click(window, "startButton")
    wait_steps(qtbot, window, 1)
    assert not run_trials.isEnabled() and "A run is training" in run_trials.toolTip()
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert run_trials.isEnabled() and run_trials.toolTip() == ""


def test_in_a_small_window_the_table_keeps_four_rows_in_sight(qtbot, window):
    dialog = open_dialog(window)
    dialog.resize(700, 450)
    qtbot.waitUntil(lambda: dialog.height() <= 460)
    rows = dialog.table.verticalHeader().defaultSectionSize()
    assert dialog.table.height() >= 4 * rows  # the chart gave way (it was one row at 700 × 450)
    assert dialog.minimumSizeHint().height() <= 450


def test_apply_asks_before_setting_a_pick_measured_for_other_settings(qtbot, window, dialogs, tmp_path):
    """A report opened for another effective batch (or model, data, device): Apply set its split silently, and
    a run of 16 sequences per step became one of 4."""
    from PySide6.QtWidgets import QMessageBox

    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    wait_done(qtbot, dialog)
    report = dict(dialog.report)  # its pick made another split, which Apply offers
    report["recommendation"] = {**report["recommendation"], "is_current": False,
                                "settings": {"micro_batch": 2, "accum_steps": 2, "compile_mode": "off",
                                             "compile_scope": "model", "precision": "fp32"}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert dialog.open_report(str(path))
    panel = window.config_panel
    panel.accum.setValue(3)  # 4 × 3 sequences per step here; the trials ran 4
    dialogs.question_answer = QMessageBox.StandardButton.No
    click(dialog, "tuneApplyButton")
    assert dialogs.questions() == ["This report was measured for effective batch 4 sequences (here 12 sequences)."
                                   "\n\nIts pick may not be the fastest for the settings here, and its micro-batch "
                                   "× accumulation, in one process, sets the report's effective batch. Apply it "
                                   "anyway?"]
    assert (panel.micro_batch.value(), panel.accum.value()) == (4, 3)  # No: nothing changed
    dialogs.question_answer = QMessageBox.StandardButton.Yes
    click(dialog, "tuneApplyButton")
    assert (panel.micro_batch.value(), panel.accum.value()) == (2, 2)
    panel.accum.setValue(1)  # the pick is no longer what the panel holds
    child(window, "processesSpin").setValue(2)  # the trials timed one process; 2 × 1 × 2 processes: their batch
    dialogs.question_answer = QMessageBox.StandardButton.No
    click(dialog, "tuneApplyButton")
    assert "measured for processes 1 (here 2)." in dialogs.questions()[-1]  # (the effective batch is the same)
    # Applied, the panel trains the split in one process: kept at 2, it trained twice the batch the report kept.
    dialogs.question_answer = QMessageBox.StandardButton.Yes
    click(dialog, "tuneApplyButton")
    assert (panel.micro_batch.value(), panel.accum.value(), child(window, "processesSpin").value()) == (2, 2, 1)
    panel.preset.setCurrentText("tiny")
    assert measured_for_other(dialog.report["plan"]["config"], panel.config)[0] == "preset micro (here tiny)"
    # Settings the panel cannot give now (its data file empty): asked too, naming why (it applied as if they
    # matched).
    bad = tmp_path / "empty.txt"
    bad.write_text("")
    panel.set_source(str(bad))
    qtbot.waitUntil(lambda: bool(panel.error), timeout=RUN_TIMEOUT_MS)
    click(dialog, "tuneApplyButton")
    assert "This report was measured for settings the panel's may differ from: they cannot be read now (data " \
           "source " in dialogs.questions()[-1], dialogs.questions()[-1]


def test_the_table_has_its_column_titles_before_any_trial_ended(window):
    """Until the first trial's row, the headers read 1 … 8."""
    from core.tune import TABLE_HEADER

    table = open_dialog(window).table
    titles = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert titles == list(TABLE_HEADER) and titles[0] == "setting"
    # ... each in full: "tokens/s median (min–max)" was cut at both ends until a first row sized the columns
    header = table.horizontalHeader()
    for c in range(table.columnCount() - 1):
        assert header.sectionSize(c) >= header.sectionSizeHint(c), titles[c]


def test_a_device_is_compared_as_this_machine_resolves_it():
    """A report measured with device "auto" was said to differ from a panel showing "cpu" (as it does with several
    processes) on a machine where both are the CPU."""
    from core.device import resolve_device
    from tests.conftest import micro_config

    here = micro_config(train={"device": str(resolve_device("auto"))})
    assert measured_for_other({"train": {"device": "auto"}}, here) == []
    assert measured_for_other({"train": {"device": "cuda:7"}}, here) == [f"device cuda:7 (here {here.train.device})"]


def test_a_reports_damaged_settings_are_asked_about_not_a_crash():
    """A hand-edited report with "data": "x" raised AttributeError at Apply (no dialog, nothing set), and one
    whose config was a list was applied without the question other settings get."""
    from tests.conftest import micro_config

    current = micro_config()
    assert measured_for_other({"data": "x", "train": [], "preset": current.preset}, current) == []  # as unknown
    assert measured_for_other([1, 2], current) == ["the settings it was measured with (unreadable in the report)"]
    assert measured_for_other(None, current) == []
    infinite = {"train": {"micro_batch": float("inf"), "accum_steps": 1}}  # raised OverflowError at Apply
    assert measured_for_other(infinite, current) == []


def test_a_report_damaged_past_its_checks_leaves_the_one_shown_and_long_text_keeps_the_dialog_on_screen(
        qtbot, window, dialogs, tmp_path):
    """A hand-edited report (a recommendation without its cell) raised half-way through being shown: the dialog
    held its plan beside the earlier report's table and pick, and Apply applied the earlier one. A report under a
    long path, or with a long unbroken string, made the dialog 2,256 (or 14,215) px wide."""
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    wait_done(qtbot, dialog)
    good, before = dialog.report, child(dialog, "tuneRecommendation").text()
    deep = tmp_path
    for i in range(5):
        deep = deep / f"reports_from_the_build_machine_in_the_lab_{i:02d}"
    deep.mkdir(parents=True)
    long_path = deep / "report.json"
    long_path.write_text(json.dumps({**good, "plan": {**good["plan"], "description": "x" * 2_000}}))
    assert dialog.open_report(str(long_path))
    assert dialog.minimumSizeHint().width() < 1_200 and dialog.width() < 1_600
    assert child(dialog, "tuneProgressLabel").toolTip() == str(long_path)
    damaged = json.loads(json.dumps(good))
    damaged["summary"]["recommendation"].pop("cell")
    damaged["plan"]["budget_seconds"] = 777
    (tmp_path / "damaged.json").write_text(json.dumps(damaged))
    (tmp_path / "good.json").write_text(json.dumps(good))
    assert dialog.open_report(str(tmp_path / "good.json"))
    budget = dialog.budget.value()
    assert not dialog.open_report(str(tmp_path / "damaged.json"))
    assert dialogs.messages[-1][1] == "Cannot open the report" and "damaged.json is damaged" in dialogs.messages[-1][2]
    assert dialog.report == good and dialog.budget.value() == budget  # the earlier report, whole
    assert child(dialog, "tuneRecommendation").text() == before


def test_a_budget_too_short_is_said_in_the_windows_words(qtbot, window, dialogs):
    """The dialog told the user to "give --budget-seconds 21 or more": a flag the window does not have."""
    dialog = open_dialog(window)
    dialog.session.tune_failed.emit("a budget of 10 s is too short to compare two settings here: that takes about "
                                    "16 s; give --budget-seconds 21 or more")  # the engine's words, as it fails
    kind, title, text = dialogs.messages[-1]
    assert title == "Cannot find settings"
    assert text.endswith("that takes about 16 s; set the Time budget to 21 s or more"), text


def test_the_dialog_fits_a_laptop_screen(window, monkeypatch):
    """It always opened at 1100 × 700: on a 1024 × 640 screen Apply and Close were below its bottom edge."""
    from PySide6.QtCore import QPoint, QRect

    laptop = QRect(0, 0, 1024, 640)
    monkeypatch.setattr(window, "screen", lambda: type("Screen", (), {"availableGeometry": lambda self: laptop})())
    dialog = open_dialog(window)
    assert laptop.contains(dialog.frameGeometry())
    for name in ("tuneApplyButton", "tuneCloseButton"):
        button = child(dialog, name)
        corner = button.mapToGlobal(QPoint(button.width() - 1, button.height() - 1))
        assert laptop.contains(corner), (name, corner)


def test_a_pending_cancel_is_not_offered_again_when_the_dialog_is_reopened(qtbot, window, monkeypatch):
    from core.tune import TrialStarted

    dialog, released, _ = held_in_planning(qtbot, window, monkeypatch)
    try:
        dialog.close()  # closing cancels the trials
        assert dialog.tuning and window.session.tune_cancelling
        assert open_dialog(window) is dialog
        assert not child(dialog, "tuneCancelButton").isEnabled()  # it was enabled again, as if nothing was asked
        assert child(dialog, "tuneProgressLabel").text().startswith("Cancelling")
        # A trial's report that arrives meanwhile leaves the line saying the trials are ending.
        dialog._on_event(TrialStarted("off-a1-fp32", "off", 0, 1, 6, 1.0, 240.0))
        assert child(dialog, "tuneProgressLabel").text().startswith("Cancelling")
    finally:
        released.set()
    qtbot.waitUntil(lambda: not dialog.tuning, timeout=RUN_TIMEOUT_MS)
    assert not window.session.tune_cancelling and not child(dialog, "tuneCancelButton").isEnabled()
    assert child(dialog, "tuneRunButton").isEnabled()


def test_a_pick_that_was_the_current_settings_can_be_applied_once_the_panel_holds_others(qtbot, window, dialogs,
                                                                                        tmp_path):
    """The pick was the settings measured with ("Keep the current settings"); set by hand to 2 × 2 since, the
    panel could not get it back: Apply was greyed, and the text still said to keep what the panel no longer had."""
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    wait_done(qtbot, dialog)
    report = dialog.report
    report["recommendation"] = {**report["recommendation"], "cell": CELLS[0].name, "is_current": True,
                                "settings": CELLS[0].settings(), "text": "Keep the current settings (eager)."}
    path = tmp_path / "kept.json"
    path.write_text(json.dumps(report))
    panel = window.config_panel
    child(panel, "microBatchSpin").setValue(2)
    child(panel, "accumStepsSpin").setValue(2)
    assert dialog.open_report(str(path))
    assert child(dialog, "tuneApplyButton").isEnabled()
    assert child(dialog, "tuneRecommendation").text() == (
        "Keep the current settings (eager). The settings panel holds others now: Apply sets these again.")
    click(dialog, "tuneApplyButton")
    assert (panel.config.train.micro_batch, panel.config.train.accum_steps) == (4, 1)
    assert not child(dialog, "tuneApplyButton").isEnabled()
    assert child(dialog, "tuneRecommendation").text() == "Keep the current settings (eager)."


def test_the_table_keeps_four_whole_rows_when_the_dialog_is_made_small(qtbot, window, tmp_path):
    """At 640 × 420 a report of 30 settings showed three rows and a half: the horizontal scroll bar of its many
    columns took the rest of the fourth."""
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    wait_done(qtbot, dialog)
    report = dialog.report
    row = next(iter(report["summary"]["rows"].values()))
    picked = report["recommendation"]["cell"]
    report["summary"]["rows"] = {f"cell-{i}": {**row, "name": f"cell-{i}", "current": i == 0} for i in range(29)}
    report["summary"]["rows"][picked] = {**row, "name": picked, "current": False}  # the pick is one of them
    path = tmp_path / "many.json"
    path.write_text(json.dumps(report))
    assert dialog.open_report(str(path))
    dialog.resize(dialog.minimumSizeHint().width(), 1)  # as small as it goes
    table = dialog.table
    qtbot.waitUntil(lambda: table.height() <= table.minimumHeight() + 1)
    assert table.horizontalScrollBar().isVisible()  # the case: more columns than width
    fourth = table.visualItemRect(table.item(3, 0))
    assert table.viewport().rect().contains(fourth), (fourth, table.viewport().rect())


def test_the_charts_axis_labels_are_whole(qtbot):
    """The left axis' top label ("1.0") was cut in half at the chart's top edge, and the bottom label ran past the
    right edge with a scale prefix "(x0.001)" the setting numbers do not need."""
    from PySide6.QtGui import QFontMetrics

    from gui.widgets.tune_dialog import TuneChart

    chart = TuneChart()
    qtbot.addWidget(chart)
    chart.resize(500, 200)
    chart.show_rows([], None)
    top = chart.getPlotItem().layout.getContentsMargins()[1]
    assert top >= QFontMetrics(chart.getAxis("left").style["tickFont"] or chart.font()).height() / 2
    assert not chart.getAxis("left").autoSIPrefix and not chart.getAxis("bottom").autoSIPrefix


def test_a_report_that_cannot_be_saved_at_the_end_keeps_the_results_shown(qtbot, window, dialogs, monkeypatch):
    """The tune/ folder became unwritable during the trials: the dialog said "The trials could not run" above a
    full table, and the report (its recommendation, what Apply sets) was dropped."""
    import core.tune
    from core.errors import ConfigError

    def full_disk(report, path, keep_existing=False):
        raise ConfigError(f"cannot write the tuning report {path}: No space left on device", "json")

    monkeypatch.setattr(core.tune, "save_report", full_disk)
    dialog = open_dialog(window)
    click(dialog, "tuneRunButton")
    qtbot.waitUntil(lambda: not dialog.tuning and bool(dialogs.messages), timeout=RUN_TIMEOUT_MS)
    kind, title, text = dialogs.messages[-1]
    assert title == "Report not saved"
    assert text.startswith("The trials finished, but their report could not be saved: cannot write the tuning "
                           "report ") and text.endswith("No space left on device"), text
    assert dialog.report is not None and len(dialog.report["trials"]) == 6 and dialog.report["path"] is None
    assert "could not run" not in child(dialog, "tunePlanLabel").text()
    assert child(dialog, "tuneProgressLabel").text().endswith("; not saved")
    assert child(dialog, "tuneRecommendation").text()


def test_enter_in_the_time_budget_starts_nothing(qtbot, window):
    """Run trials was the dialog's default button: Enter after typing a budget started trials, and cleared a
    report just opened."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    dialog = open_dialog(window)
    budget = child(dialog, "tuneBudget")
    budget.setFocus()
    QTest.keyClick(budget, Qt.Key.Key_Return)
    assert not dialog.tuning and not window.session.tuning


def test_settings_that_cannot_run_are_named_in_the_message(qtbot, window, dialogs, tmp_path):
    """"Fix the settings first" named nothing, and the dialog covers the field that says what is wrong."""
    bad = tmp_path / "empty.txt"
    bad.write_text("")
    window.config_panel.set_source(str(bad))
    qtbot.waitUntil(lambda: bool(window.config_panel.error), timeout=RUN_TIMEOUT_MS)
    dialog = open_dialog(window)
    dialog.start()
    kind, title, text = dialogs.messages[-1]
    assert title == "Invalid settings" and "empty.txt" in text and "empty" in text.split("\n\n")[-1], text


def test_the_charts_colour_key_names_the_colours_it_shows():
    """It said "grey: the current settings" when they were the pick (green, no grey bar), and never named the
    blue of the other settings."""
    from gui.widgets.tune_dialog import colour_key

    def row(name, current=False):
        return {"name": name, "current": current}

    assert colour_key([row("a", True), row("b")], "a") == ("setting: its row in the table (green: the pick, the "
                                                           "current settings; blue: the others)")
    assert colour_key([row("a", True), row("b"), row("c")], "b") == (
        "setting: its row in the table (green: the pick; grey: the current settings; blue: the others)")
    assert colour_key([row("b")], None) == "setting: its row in the table (blue: measured)"
    assert colour_key([], None) == "setting: its row in the table"
