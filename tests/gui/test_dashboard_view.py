"""The dashboard's plots, run table, status bar and layout, as a user reads and clicks them.

Most runs here are run folders written from events (opened as the user opens
one), so each figure is known exactly; a few are real micro runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QCoreApplication, QEvent, QItemSelectionModel, QPoint, QRect, Qt
from PySide6.QtGui import QKeySequence

from core.events import (
    CheckpointSaved,
    CompileFinished,
    CompileStarted,
    RunFailed,
    RunFinished,
    RunStarted,
    StepMetrics,
)
from gui.run_record import DASHES, PALETTE
from gui.widgets.plot_panel import MIN_MEMORY_SPAN_GIB
from gui.widgets.settings_toggle import SETTINGS_MIN_WIDTH
from tests.gui.conftest import child, click, run_once, wait_idle, wait_steps

PLOTS = ("lossPlot", "lrPlot", "throughputPlot", "memoryPlot")
MIB = 1 / 1024


def write_run(folder: Path, run_id: str, *, step_times=(0.1,) * 8, warmup: int = 1, compile_mode: str = "off",
              compile_seconds: float | None = None, precision: str = "fp32", device: str = "cpu",
              preset: str = "micro", seq_len: int = 32, tokens_per_step: int = 128, baseline_gib: float = 0.5,
              mem_gib: float = 0.6, fail: str | None = None, init_from: str | None = None,
              world_size: int = 1) -> Path:
    """A run folder with the events a trainer writes; ``fail`` ends it failed before its first step."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"preset": preset, "data": {"seq_len": seq_len}, "init_from": init_from,
              "train": {"compile_mode": compile_mode, "compile_scope": "model", "accum_steps": 1,
                        "micro_batch": 4, "precision": precision, "device": device}}
    events = [RunStarted(run_id, 0.0, run_dir=str(folder), config=config, device=device, precision=precision,
                         num_parameters=1000, tokens_per_step=tokens_per_step,
                         budget_tokens=tokens_per_step * len(step_times), total_steps=len(step_times),
                         mem_baseline_gib=baseline_gib, world_size=world_size)]
    if fail:
        events.append(RunFailed(run_id, 0.1, fail))
    else:
        if compile_mode != "off":
            events.append(CompileStarted(run_id, 0.0, compile_mode, "model"))
        now = 0.0
        for i, seconds in enumerate(step_times, start=1):
            now += seconds
            events.append(StepMetrics(run_id, now, step=i, tokens=tokens_per_step * i, loss=5.0 - 0.1 * i, lr=1e-3,
                                      grad_norm=1.0, tokens_per_s=tokens_per_step / seconds, step_time=seconds,
                                      peak_mem_gib=mem_gib + 0.01, mem_gib=mem_gib + 1e-5 * (i % 2), mfu=0.0,
                                      warmup=i <= warmup))
            if compile_mode != "off" and i == warmup + 5:
                events.append(CompileFinished(run_id, now, compile_mode, "model", compile_seconds, warmup))
        steady = sorted(step_times[warmup:])
        median = steady[len(steady) // 2]
        events.append(RunFinished(run_id, now, step=len(step_times), tokens=tokens_per_step * len(step_times),
                                  stopped=False, final_loss=4.0, val_loss=None,
                                  median_tokens_per_s=tokens_per_step / median, compile_seconds=compile_seconds,
                                  peak_mem_gib=mem_gib + 0.01, checkpoint=None))
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event.to_dict()) + "\n")
    return folder


def open_runs(window, tmp_path, count: int, **kwargs):
    records = []
    for _ in range(count):
        folder = write_run(tmp_path / "opened" / f"run{len(window.session.records) + 1}",
                           f"r{len(window.session.records) + 1}", **kwargs)
        records.append(window.open_run_folder(str(folder)))
    window.plots.refresh(force=True)
    return records


def cell(window, key: int, column: str):
    table = window.table
    return table.item(table.row_of(key), table.column(column))


# --------------------------------------------------------------------------- bug 1: one compile figure
def test_table_log_and_shaded_region_show_one_compile_figure(window, tmp_path):
    steps = (8.35, 1.95, 0.13, 3.38, 0.13, 0.12, 0.14, 0.13, 0.13)
    (record,) = open_runs(window, tmp_path, 1, step_times=steps, warmup=3, compile_mode="default",
                          compile_seconds=10.04)
    assert cell(window, record.key, "Compile s").text() == "10.0"
    assert any("compile warm-up 10.0 s" in line for line in window.log.messages())
    region = window.plots.throughput.region(record.key)
    assert region is not None and region.label.format == "compile 10.0 s"
    assert "10.0 s" in region.toolTip() and "run table" in region.toolTip()


# --------------------------------------------------------------------------- bug 2: one notion of visible
def test_the_legend_is_reached_by_tab_and_space_ticks_an_entry(qtbot, window, tmp_path):
    """It took no focus: a run could be hidden or shown only with the mouse."""
    first, second = open_runs(window, tmp_path, 2)
    legend = child(window, "runLegend")
    window.activateWindow()
    toggle = child(window, "settingsToggle")
    toggle.setFocus()
    for _ in range(12):  # Tab from the plots' first control reaches the legend
        if legend.hasFocus():
            break
        qtbot.keyClick(window.focusWidget(), Qt.Key.Key_Tab)
    assert legend.hasFocus() and legend.currentRow() == 0
    qtbot.keyClick(legend, Qt.Key.Key_Right)
    qtbot.keyClick(legend, Qt.Key.Key_Space)
    assert not legend.is_checked(second.key) and legend.is_checked(first.key)
    assert window.plots.hidden_runs == {second.key}
    qtbot.keyClick(legend, Qt.Key.Key_Space)
    assert window.plots.hidden_runs == set()


def test_a_click_on_a_legend_entrys_name_ticks_it_as_its_box_does(qtbot, window, tmp_path):
    """Only the small box ticked: a click on the run's name, what a user aims at, did nothing."""
    first, second = open_runs(window, tmp_path, 2)
    legend = child(window, "runLegend")
    rect = legend.visualItemRect(legend.item_of(second.key))
    name = rect.center() + QPoint(rect.width() // 4, 0)  # on its text, right of the box and the swatch
    qtbot.mouseClick(legend.viewport(), Qt.MouseButton.LeftButton, pos=name)
    assert not legend.is_checked(second.key) and window.plots.hidden_runs == {second.key}
    qtbot.mouseClick(legend.viewport(), Qt.MouseButton.LeftButton, pos=name)
    assert legend.is_checked(second.key) and window.plots.hidden_runs == set()
    box = QPoint(rect.left() + 10, rect.center().y())  # the box itself: one tick, not a tick and its undoing
    qtbot.mouseClick(legend.viewport(), Qt.MouseButton.LeftButton, pos=box)
    assert not legend.is_checked(second.key) and window.plots.hidden_runs == {second.key}


def test_legend_table_selection_and_every_plot_share_one_visibility(window, tmp_path):
    first, second = open_runs(window, tmp_path, 2)
    legend = child(window, "runLegend")
    plots = [child(window, name) for name in PLOTS]

    legend.item_of(second.key).setCheckState(Qt.CheckState.Unchecked)  # the user unticks run 2
    for plot in plots:
        assert all(c.isVisible() for c in plot.curves_of(first.key).values()), plot.objectName()
        assert not any(c.isVisible() for c in plot.curves_of(second.key).values()), plot.objectName()
    assert window.table.item(1, window.table.column("Run")).foreground().color().name() == "#a0a0a0"

    window.table.selectRow(0)  # selecting run 1 hides run 2: the legend says so
    assert not legend.is_checked(second.key) and legend.is_checked(first.key)
    legend.item_of(second.key).setCheckState(Qt.CheckState.Checked)  # and ticking it brings it back
    for plot in plots:
        assert all(c.isVisible() for c in plot.curves_of(second.key).values()), plot.objectName()
    assert window.plots.hidden_runs == set()

    window.table.clearSelection()
    assert legend.is_checked(first.key) and legend.is_checked(second.key)


def test_the_tables_selection_follows_the_legend_and_takes_in_a_new_run(window, tmp_path):
    """Unticking a selected run left its row selected, its curves hidden; ticking a run left it unselected,
    its curves shown; and a run opened while a row was selected was drawn beside it, unselected."""
    first, second, third = open_runs(window, tmp_path, 3)
    legend = child(window, "runLegend")
    window.table.selectRow(0)
    window.table.selectionModel().select(window.table.model().index(1, 0),
                                         QItemSelectionModel.SelectionFlag.Select
                                         | QItemSelectionModel.SelectionFlag.Rows)
    assert window.table.selected_keys() == {first.key, second.key}
    legend.item_of(first.key).setCheckState(Qt.CheckState.Unchecked)
    assert window.table.selected_keys() == {second.key} and window.plots.hidden_runs == {first.key, third.key}
    legend.item_of(third.key).setCheckState(Qt.CheckState.Checked)
    assert window.table.selected_keys() == {second.key, third.key} and window.plots.hidden_runs == {first.key}
    (fourth,) = open_runs(window, tmp_path, 1)
    assert window.table.selected_keys() == {second.key, third.key, fourth.key}
    assert window.plots.hidden_runs == {first.key}


def test_hovering_any_plot_reads_out_a_point_with_its_runs_legend_label(window, tmp_path):
    """The readout names a run as the legend does, and follows the x axis chosen."""
    (record,) = open_runs(window, tmp_path, 1)
    label = child(window, "runLegend").item_of(record.key).text()
    window.plots.fit_tight()
    loss, memory = child(window, "lossPlot"), child(window, "memoryPlot")
    assert loss.show_readout_at(3.0, 4.7)
    assert loss.shown_readout() == f"{label} (train)\nloss: 4.7\noptimizer step: 3"
    assert memory.show_readout_at(2.0, 0.1)  # 0.6 GiB above a 0.5 GiB baseline
    assert memory.shown_readout() == f"{label}\nGiB: 0.1\noptimizer step: 2"
    window.plots.set_x_axis("tokens")
    window.plots.fit_tight()
    assert loss.show_readout_at(384.0, 4.7)
    assert loss.shown_readout().endswith("\ntokens seen: 384")


# --------------------------------------------------------------------------- bug 3: 20 runs told apart
def test_twenty_runs_are_distinguishable_and_failed_runs_give_their_colour_back(window, tmp_path):
    records = open_runs(window, tmp_path, 3)
    (failed,) = open_runs(window, tmp_path, 1, fail="ValueError: bad data")
    records += open_runs(window, tmp_path, 18)
    assert failed.state == "failed"
    marks = [(r.color, r.dash) for r in records]
    assert len(records) == 21 and len(set(marks)) == 21
    assert records[3].color == failed.color and records[3].dash == failed.dash  # the next run took its place
    # ... and only it shows that mark: the failed run's entry and row show none (two identical orange lines)
    from gui.widgets.run_table import MARK_ROLE

    legend = child(window, "runLegend")
    shown = {r.key: legend.item_of(r.key).icon().pixmap(30, 12).toImage() for r in (failed, records[3])}
    assert failed.mark == ("", "") and records[3].mark == (records[3].color, records[3].dash)
    assert shown[failed.key].pixelColor(15, 6).alpha() == 0 and shown[records[3].key].pixelColor(15, 6).alpha() > 0
    run_cell = window.table.item(window.table.row_of(failed.key), 1)
    assert run_cell.data(MARK_ROLE) == ("", "")
    assert run_cell.icon().pixmap(30, 12).toImage().pixelColor(15, 6).alpha() == 0
    assert records[10].color == records[0].color and records[10].dash != records[0].dash
    assert {r.color for r in records} == set(PALETTE) and {r.dash for r in records} == set(DASHES[:3])
    loss = child(window, "lossPlot")
    pen = loss.curve(records[10].key, "train").opts["pen"]
    assert pen.style() == Qt.PenStyle.DashLine and pen.color().name() == records[0].color


def test_the_legend_is_as_high_as_the_rows_its_entries_wrap_to_at_every_width(qtbot):
    """At some widths (about 590 px for these four runs) the legend counted one row where its entries wrapped to
    two: the last run's entry was out of sight, with no scroll bar to reach it (seen at 1024 × 640)."""
    from PySide6.QtWidgets import QApplication, QVBoxLayout, QWidget

    from gui.widgets.run_legend import RunLegend

    host = QWidget()
    qtbot.addWidget(host)
    layout = QVBoxLayout(host)
    layout.setContentsMargins(0, 0, 0, 0)
    legend = RunLegend()
    layout.addWidget(legend)
    layout.addStretch(1)
    host.resize(1200, 300)
    host.show()
    for key, label in enumerate(["#1 off ×1", "#2 default ×4 ← #1", "#3 off ×1", "#4 default ×4"]):
        legend.set_run(key, PALETTE[key], "solid", label)
    hidden = []
    for width in range(800, 250, -3):
        host.resize(width, 300)
        qtbot.waitUntil(lambda width=width: legend.width() == width)
        QApplication.processEvents()  # the view's own relayout, which it does a turn later
        rects = [legend.visualItemRect(legend.item(i)) for i in range(legend.count())]
        rows = len({r.top() for r in rects})
        if rows <= RunLegend.ROWS and not all(legend.viewport().rect().contains(r) for r in rects):
            hidden.append(width)
    assert hidden == []


# --------------------------------------------------------------------------- bug 5: 1024 × 640
def test_window_is_usable_at_1024_by_640(qtbot, window, tmp_path):
    open_runs(window, tmp_path, 12)
    assert window.minimumSizeHint().width() <= 1024 and window.minimumSizeHint().height() <= 640
    window.resize(1024, 640)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 640)
    for name in PLOTS:
        plot = child(window, name)
        assert plot.width() >= 150 and plot.height() >= 100, name
        assert plot.mapTo(window, QPoint(plot.width(), 0)).x() <= 1024
    table = window.table
    shown = [c for c in range(table.columnCount()) if not table.isColumnHidden(c)]
    assert sum(table.columnWidth(c) for c in shown) <= table.viewport().width()  # no sideways scrolling
    assert {"Run", "State", "Tokens/s", "Speedup"} <= {table.horizontalHeaderItem(c).text() for c in shown}
    legend = child(window, "runLegend")
    assert legend.height() <= 2 * legend.sizeHintForRow(0) + 20  # twelve runs do not push the plots away
    # The settings fit their column: no sideways scrolling, even with auto's long reason in the precision box
    panel = window.config_panel
    panel.precision.setItemText(panel.precision.findData("auto"), "auto (bf16: training 5.6× faster than fp32 on "
                                                                   "this CPU)")
    viewport = panel.parentWidget()
    qtbot.waitUntil(lambda: panel.width() <= viewport.width())
    assert panel.minimumSizeHint().width() <= viewport.width()

    plots_width = window.plots.width()
    compact = [child(window, f"compact{name}Button") for name in ("Start", "Pause", "Stop")]
    assert not any(b.isVisible() for b in compact)  # the column's own buttons are in sight
    click(window, "settingsToggle")  # the settings collapse: the plots take their room
    assert not window.settings_shown() and window.plots.width() > plots_width
    # Start, Pause and Stop stay at hand beside the settings button, enabled as the Run menu is.
    assert all(b.isVisible() for b in compact)
    assert [b.isEnabled() for b in compact] == [window.actions[n].isEnabled() for n in ("Start", "Pause", "Stop")]
    assert compact[0].isEnabled() and not compact[2].isEnabled()
    # Collapsing never widens the window: the splitter counted the collapsed column's minimum (1,032 px with
    # "Resume" beside the settings button, past a 1024 px screen).
    window.actions["Pause"].setText("Resume")
    qtbot.waitUntil(lambda: window.minimumSizeHint().width() <= 900)
    window.resize(900, 640)
    qtbot.waitUntil(lambda: window.width() == 900)
    click(window, "settingsToggle")
    assert window.settings_shown() and not any(b.isVisible() for b in compact)
    shown_minimum = window.minimumSizeHint().width()
    click(window, "settingsToggle")
    assert not window.settings_shown()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)  # the layouts take the new minimum
    assert window.minimumSizeHint().width() <= shown_minimum and window.width() == 900
    click(window, "settingsToggle")
    assert window.settings_shown() and window.config_panel.parentWidget().width() >= 200
    click(window, "settingsToggle")
    window.main_splitter.moveSplitter(3, 1)  # a drag out of the collapse by a few pixels: the column's minimum
    assert window.settings_shown() and window.main_splitter.sizes()[0] >= SETTINGS_MIN_WIDTH


# --------------------------------------------------------------------------- bug 6: long messages elide
def test_a_first_start_fits_the_window_on_a_small_screen_and_a_later_one_keeps_its_size(qtbot, make_window):
    laptop = QRect(0, 24, 1366, 744)  # a 1366 × 768 screen less its top bar
    first = make_window()
    assert not first.geometry_restored and first.width() > laptop.width()
    first.fit_on(laptop)
    assert laptop.contains(first.frameGeometry()) and first.width() > 1300 and first.height() > 700
    assert first.frameGeometry().center() == laptop.center()
    first.resize(1100, 700)
    first.save_settings()
    later = make_window()  # the same settings file: the size the user left
    assert later.geometry_restored and later.height() == 700  # (Qt fits a restored width to the screen)
    left = later.geometry()
    later.fit_on(QRect(0, 0, 1024, 600))
    assert later.geometry() == left


def test_long_failure_message_elides_before_the_state_label(qtbot, window):
    window.resize(1024, 640)
    reason = "RuntimeError: " + "a very long failure message that goes on " * 12
    window.status.showMessage(reason, 15_000)
    message, state = window.status.message, child(window, "stateLabel")
    qtbot.waitUntil(lambda: message.text().endswith("…"))
    assert message.full_text() == " ".join(reason.split()) and message.toolTip() == reason
    right = message.x() + message.fontMetrics().horizontalAdvance(message.text())
    assert right + 8 <= state.x()  # a gap before "idle"
    assert state.text() == "idle"


def test_a_long_state_takes_the_bars_room_while_no_message_shares_it(qtbot):
    """"compiling 0:05 (the whole model, mod…" was cut at 360 px with most of the bar empty beside it."""
    from PySide6.QtWidgets import QMainWindow

    from gui.widgets.status_bar import MAX_STATE_PX, StatusBar

    window, status = QMainWindow(), StatusBar()  # (a window's refresh would show its own run in the bar)
    qtbot.addWidget(window)
    window.setStatusBar(status)
    window.resize(1400, 300)
    window.show()
    state = status.state
    long = "#1 default ×1: compiling 0:05 (the whole model, mode default; a cold compile takes a while)"
    status.show_idle(long)
    qtbot.waitUntil(lambda: state.text() == long)  # whole: the bar has room for it
    status.showMessage("Stopping at the next optimizer step …")
    qtbot.waitUntil(lambda: state.width() <= MAX_STATE_PX and state.text().endswith("…"))
    status.clearMessage()
    qtbot.waitUntil(lambda: state.text() == long)


def test_a_failed_runs_later_message_replaces_its_first_in_the_status_bar(qtbot):
    """A torchrun job's rank 0 fails first ("another process of this job failed"), then its launcher names the
    rank that died: the table said so, the status bar kept the first line."""
    from gui.run_record import RunRecord
    from gui.widgets.status_bar import StatusBar

    record = RunRecord(key=1, number=1, config={"train": {}})
    record.apply(RunStarted("j", 0.0, run_dir="/runs/j", config={"train": {}}, device="cpu", precision="fp32",
                            num_parameters=1, tokens_per_step=1, budget_tokens=9, total_steps=9))
    status = StatusBar()
    qtbot.addWidget(status)
    for message in ("rank 0: another process of this job failed", "rank 1 died (signal 9, SIGKILL)"):
        record.apply(RunFailed("j", 1.0, message, 1))
        status.show_run(record, None)
        assert message in status.state.full_text(), status.state.full_text()


# --------------------------------------------------------------------------- honest figures
def test_speedup_shows_its_spread_and_marks_runs_that_cannot_be_compared(window, tmp_path):
    rng = np.random.default_rng(0)
    slow = tuple(0.2 + 0.02 * rng.random(20))
    fast = tuple(0.1 + 0.01 * rng.random(20))
    base, same, other = (open_runs(window, tmp_path, 1, step_times=slow)[0],
                         open_runs(window, tmp_path, 1, step_times=fast)[0],
                         open_runs(window, tmp_path, 1, step_times=fast, precision="bf16")[0])
    assert window.table.baseline == base.key
    text = cell(window, same.key, "Speedup").text()
    value = window.table.speedup(same)
    lo, hi = (float(v) for v in text.split("(")[1].rstrip(")").split("–"))
    assert text.startswith(f"{value:.2f}×") and lo < value < hi and "≠" not in text
    tip = cell(window, same.key, "Speedup").toolTip()
    assert "not interleaved" in tip and "Median tokens/s" in tip and f"{len(same.step_seconds)} steady" in tip
    marked = cell(window, other.key, "Speedup")
    assert marked.text().endswith("≠") and "precision bf16 vs fp32" in marked.toolTip()
    assert "spans 1×" not in tip and cell(window, same.key, "Speedup").foreground().color().name() == "#202020"
    # A run as fast as the baseline, within the noise: grey, and its tooltip says why.
    (twin,) = open_runs(window, tmp_path, 1, step_times=tuple(0.2 + 0.02 * rng.random(20)))
    noisy = cell(window, twin.key, "Speedup")
    assert "The range spans 1×" in noisy.toolTip() and noisy.foreground().color().name() == "#8c8c8c"


def test_memory_is_the_trainings_own_with_a_sensible_range(window, tmp_path):
    (record,) = open_runs(window, tmp_path, 1, baseline_gib=0.5, mem_gib=0.78501)
    assert cell(window, record.key, "Train GiB").text() == "0.30"  # 0.79501 peak − 0.5 before the model
    window.table.selectRow(0)  # the status bar follows it: now and peak, named, the peak the table's figure
    assert window.status.memory.text() == f"mem {record.mem_gib:.2f} GiB · peak 0.30 GiB"
    assert "before the model existed" in window.table.horizontalHeaderItem(
        window.table.column("Train GiB")).toolTip()
    memory = child(window, "memoryPlot")
    (y0, y1) = memory.getPlotItem().getViewBox().viewRange()[1]
    assert y1 - y0 >= MIN_MEMORY_SPAN_GIB * 0.999  # a 10 KB wobble is not a cliff


def test_the_last_runs_freed_memory_is_released_before_the_next_run_measures_its_baseline(
        qtbot, window, monkeypatch):
    # On CPU the figure is peak RSS minus the RSS before the model: memory the allocator kept from the last
    # run made identical runs read 0.30, 0.19 and 0.00 GiB.
    import core.trainer

    thread = window.session.controller.thread
    calls: list[bool] = []
    release = core.trainer.release_freed_memory
    monkeypatch.setattr(core.trainer, "release_freed_memory",
                        lambda: calls.append(thread._trainer is None) or release())
    first = run_once(qtbot, window)
    assert thread._trainer is not None  # kept for Save model… until the next run
    second = run_once(qtbot, window)
    assert first.state == second.state == "finished"
    assert calls == [True, True]  # before each run's set-up, with the last run's model already let go


def test_throughput_axis_fits_steady_steps_and_marks_warm_up_outliers(window, tmp_path):
    steps = (8.0, 2.0, 0.5) + (0.1,) * 10  # warm-up steps 80× slower: 16 tok/s vs 1,280 tok/s
    steps = (0.001,) + steps[1:]  # and one warm-up step far above the steady ones
    (record,) = open_runs(window, tmp_path, 1, step_times=steps, warmup=3)
    plot = child(window, "throughputPlot")
    (y0, y1) = plot.getPlotItem().getViewBox().viewRange()[1]
    assert y1 < 128 / 0.001 / 10 and y0 <= 1280 <= y1  # the steady curve fills the plot
    assert plot.outliers(record.key, "warmup") >= 1
    _, inside = plot.curve(record.key, "warmup").getData()
    _, edge = plot.edge_points(record.key, "warmup")
    assert (0 if inside is None else len(inside)) + len(edge) == 3 and len(edge) >= 1
    assert y0 <= edge.min() and edge.max() <= y1  # drawn at the edge, as triangles


def test_status_bar_follows_the_run_in_focus_and_says_stopping(qtbot, make_window):
    window = make_window(train={"budget": 1_000_000})
    first = window.session.records
    click(window, "startButton")
    record = wait_steps(qtbot, window, 2)
    click(window, "stopButton")
    assert "stopping…" in child(window, "stateLabel").full_text()
    assert cell(window, record.key, "State").text() == "stopping…"
    assert window.status.currentMessage() == ""  # the state says it alone: a message beside it repeated it
    wait_idle(qtbot, window)
    assert record.state == "stopped"

    window.config_panel.set_from_config(window.config_panel.config.replace(train={"budget": 4}))
    click(window, "startButton")  # the next run: nothing of the first one is shown
    second = window.session.records[-1]
    assert second is not record and first[-1] is second
    assert child(window, "stateLabel").full_text().startswith(f"{second.label}: starting")
    assert child(window, "progressBar").format() == "setting up"
    wait_idle(qtbot, window)
    window.table.selectRow(0)  # the first run in focus: its own step
    assert child(window, "progressBar").format() == f"step {record.step:,} / {record.total_steps:,}"


def test_the_progress_of_a_budget_past_a_c_int_of_steps_is_shown(window, tmp_path):
    """A budget of 5e9 steps (accepted, as the README says) raised OverflowError in the progress bar's range at
    every refresh of the status bar, which then showed neither progress nor ETA."""
    (record,) = open_runs(window, tmp_path, 1)
    record.total_steps = 5_000_000_000
    record.step = 2_500_000_000
    window.status.show_run(record, 0.1)
    bar = child(window, "progressBar")
    assert bar.format() == "step 2,500,000,000 / 5,000,000,000"
    assert bar.maximum() == 2**31 - 1 and abs(bar.value() / bar.maximum() - 0.5) < 1e-9


# --------------------------------------------------------------------------- expected, and missing
def test_empty_plots_say_what_to_do(window, tmp_path):
    hint = child(window, "lossPlotHint")
    assert hint.isVisible() and "press Start" in hint.text()
    open_runs(window, tmp_path, 1)
    assert not hint.isVisible()


def test_compile_warm_up_shows_elapsed_time_and_what_compiles(qtbot):
    from gui.run_record import RunRecord, StopRequested
    from gui.widgets.run_table import RunTable
    from gui.widgets.status_bar import StatusBar

    record = RunRecord(key=1, number=1, config={"train": {"compile_mode": "default"}})
    record.apply(RunStarted("c1", 0.0, run_dir="/runs/c1", config={"train": {"compile_mode": "default"}},
                            device="cpu", precision="fp32", num_parameters=1, tokens_per_step=1, budget_tokens=9,
                            total_steps=9))
    record.apply(CompileStarted("c1", 0.1, "default", "model"))
    assert record.state == "compiling"
    record.compile_started -= 42  # as if it had compiled for 42 s
    table, status = RunTable(), StatusBar()
    qtbot.addWidget(table)
    qtbot.addWidget(status)
    table.add_record(record)
    status.resize(1600, 30)
    status.show()
    status.show_run(record, None)
    text = "compiling 0:42 (the whole model, mode default)"
    # The table says how long, its tooltip and the status bar what: the whole text widened the State column
    # past the room of Loss and Train GiB, which went until the run ended.
    state = table.item(0, table.column("State"))
    assert state.text() == "compiling 0:42" and state.toolTip() == text
    assert text in status.state.full_text()
    # The elapsed time is what moves: it stays in sight where the State column and the label cut the text
    # (once the table has fitted its columns: on the next turn of the event loop, for all changes until then).
    qtbot.waitUntil(lambda: table.columnWidth(table.column("State"))
                    >= table.fontMetrics().horizontalAdvance(state.text()))
    qtbot.waitUntil(lambda: status.state.width() > 100)  # laid out
    assert "0:42" in status.state.text(), status.state.text()
    # A long run label gives way first: "#1 max-autotune-no-cudagraphs/block ×1: compiling …" lost the time.
    train = {"compile_mode": "max-autotune-no-cudagraphs", "compile_scope": "block"}
    long = RunRecord(key=2, number=2, config={"train": train})
    long.apply(RunStarted("c2", 0.0, run_dir="/runs/c2", config={"train": train}, device="cpu", precision="fp32",
                          num_parameters=1, tokens_per_step=1, budget_tokens=9, total_steps=9))
    long.apply(CompileStarted("c2", 0.1, "max-autotune-no-cudagraphs", "block"))
    long.compile_started -= 42
    status.show_run(long, None)
    qtbot.waitUntil(lambda: "compiling 0:42" in status.state.text())
    assert status.state.text().startswith("#2 max") and long.label in status.state.full_text()
    long.apply(StopRequested())  # the stop waits for the compile, and says so
    status.show_run(long, None)
    assert status.state.full_text().endswith("stopping… (after the compile in progress and its step)")


def test_rows_are_removed_with_delete_and_failed_runs_cleared(qtbot, window, tmp_path):
    records = open_runs(window, tmp_path, 2)
    failed = open_runs(window, tmp_path, 2, fail="ValueError: no data")
    table = window.table
    assert table.item(2, table.column("State")).text() == "failed: ValueError: no data"
    menu = table.context_menu()
    clear = next(a for a in menu.actions() if a.text().startswith("Clear failed"))
    assert clear.text() == "Clear failed runs (2)" and clear.isEnabled()
    window.plots.set_run_visible(records[0].key, False)  # hidden in the legend, nothing selected
    clear.trigger()
    assert table.rowCount() == 2 and all(r.removed for r in failed)
    assert not window.plots.loss.run_visible(records[0].key)  # clearing other rows showed it again
    window.plots.set_run_visible(records[0].key, True)

    table.selectRow(0)
    table.setFocus()
    assert table.remove_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Delete)
    qtbot.keyClick(table, Qt.Key.Key_Delete)
    assert table.rowCount() == 1 and records[0].removed
    assert records[0].key not in window.store and window.plots.loss.curve(records[0].key, "train") is None
    assert window.table.baseline == records[1].key  # the baseline moved to a run still shown
    assert Path(records[0].folder).is_dir()  # the folder stays on disk


def test_a_run_stopped_before_its_first_step_shows_no_training_memory(qtbot):
    from gui.run_record import RunRecord
    from gui.widgets.run_table import RunTable

    record = RunRecord(key=1, number=1, config={"train": {"compile_mode": "default"}})
    record.apply(RunStarted("c1", 0.0, run_dir="/runs/c1", config={"train": {"compile_mode": "default"}},
                            device="cpu", precision="fp32", num_parameters=1, tokens_per_step=1, budget_tokens=9,
                            total_steps=9, mem_baseline_gib=0.5))
    record.apply(RunFinished("c1", 1.0, 0, 0, True, None, None, None, None, 0.52, None, train_mem_gib=0.02))
    table = RunTable()
    qtbot.addWidget(table)
    table.add_record(record)
    assert record.state == "stopped" and table.item(0, table.column("Train GiB")).text() == "—"


def test_removing_a_row_before_others_keeps_every_row_its_own_run(qtbot, window, tmp_path):
    """Removing a selected row changes the selection while the table shrinks: every row left still shows
    its own run's name and figures (the row after a removed one once showed the run after it)."""
    records = open_runs(window, tmp_path, 4)
    table = window.table
    table.selectRow(1)
    table.setFocus()
    qtbot.keyClick(table, Qt.Key.Key_Delete)
    kept = [records[0], records[2], records[3]]
    assert table.rowCount() == 3 and records[1].removed
    assert [table.item(row, table.column("Run")).text() for row in range(3)] == [r.label for r in kept]
    assert [table.record_at(row).key for row in range(3)] == [r.key for r in kept]
    assert [table.item(row, table.column("Loss")).text() for row in range(3)] == \
        [f"{r.final_loss:.4f}" for r in kept]


def test_new_rows_scroll_into_view(qtbot, window, tmp_path):
    window.resize(1024, 640)
    records = open_runs(window, tmp_path, 25)
    table = window.table
    last = table.item(table.row_of(records[-1].key), 1)
    # Whole, once the table has laid the rows out (it was a sliver: scrolled to before the range had grown).
    qtbot.waitUntil(lambda: table.viewport().rect().contains(table.visualItemRect(last)))


def test_processes_and_started_from_columns(qtbot, window, tmp_path):
    (loaded,) = open_runs(window, tmp_path, 1, init_from="/data/weights/model.safetensors")
    assert cell(window, loaded.key, "Started from").text() == "weights/model.safetensors"
    assert cell(window, loaded.key, "Procs").text() == "1"
    (two,) = open_runs(window, tmp_path, 1, world_size=2)  # a job of 2 processes, reopened: it said 1
    assert cell(window, two.key, "Procs").text() == "2" and two.label.endswith("on 2 processes")
    parent = run_once(qtbot, window)
    click(window, "continueButton")
    wait_idle(qtbot, window)
    child_run = window.session.records[-1]
    assert child_run.parent_number == parent.number
    assert cell(window, child_run.key, "Started from").text() == f"#{parent.number}"
    assert parent.run_id in cell(window, child_run.key, "Started from").toolTip()


def test_layout_and_vocabulary_make_throughputs_incomparable():
    from gui.run_record import RunRecord
    from gui.widgets.run_table import not_comparable

    def record(key, layout, vocab):
        return RunRecord(key=key, number=key, config={"preset": "tiny", "data": {"seq_len": 128, "layout": layout},
                                                      "model": {"vocab_size": vocab}, "train": {}})

    assert not_comparable(record(1, "packed", 2048), record(2, "packed", 2048)) == []
    assert not_comparable(record(1, "document", 8192), record(2, "packed", 2048)) == \
        ["layout document vs packed", "vocabulary 8192 vs 2048"]
    # A checkpoint's own architecture trains under the preset's name: its sizes are compared too (a 4× smaller
    # model's "3.47×" was shown as a speedup).
    small, tiny = record(3, "packed", 2048), record(4, "packed", 2048)
    small.config["model"].update(hidden_size=64, num_layers=2)
    tiny.config["model"].update(hidden_size=128, num_layers=4)
    assert not_comparable(small, tiny) == ["model hidden 64, 2 layers vs hidden 128, 4 layers"]


def test_continue_of_a_selected_run_without_a_checkpoint_says_so_not_another_runs(qtbot, window, tmp_path, dialogs):
    """With a failed row selected, Continue took the latest run that had a checkpoint, and said so only in
    the log."""
    from tests.gui.conftest import click, run_once

    good = run_once(qtbot, window)
    (failed,) = open_runs(window, tmp_path, 1, fail="ValueError: no data")
    window.table.selectRow(window.table.row_of(failed.key))
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: {failed.label} cannot be continued: it saved no checkpoint "
                                  f"(it failed or was stopped before its first one). Select a run that has a "
                                  f"final checkpoint, or none to continue the latest."]
    assert window.session.records[-1] is failed and good.state == "finished"  # nothing started


def test_continue_of_a_failed_run_with_periodic_checkpoints_names_its_last_one(qtbot, window, tmp_path, dialogs):
    """A run that diverged at step 9 after saving step 5 was said to have "saved no checkpoint"."""
    run_once(qtbot, window)  # a run Continue could take instead: the button is offered
    folder = write_run(tmp_path / "diverged", "d1", step_times=(0.1,) * 9)
    lines = (folder / "metrics.jsonl").read_text().splitlines()[:-1]  # without its RunFinished
    saved = str(folder / "checkpoints" / "step_0000005")
    for event in (CheckpointSaved("d1", 0.5, 5, 640, saved), RunFailed("d1", 0.9, "loss became nan", 9)):
        lines.append(json.dumps(event.to_dict()))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    failed = window.open_run_folder(str(folder))
    assert failed.state == "failed" and failed.checkpoints == [saved]
    window.table.selectRow(window.table.row_of(failed.key))
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: {failed.label} cannot be continued: it failed at step 9 "
                                  f"without a final checkpoint; its last one, {saved}, can be resumed (File, Load "
                                  f"weights…). Select a run that has a final checkpoint, or none to continue the "
                                  f"latest."]


def test_continue_of_a_killed_run_says_it_is_not_running_not_still_training(qtbot, window, tmp_path, dialogs):
    """A run killed with kill -9 ("not running") was said to be "still training"."""
    run_once(qtbot, window)
    folder = write_run(tmp_path / "killed", "k1", step_times=(0.1,) * 9)
    lines = (folder / "metrics.jsonl").read_text().splitlines()[:-1]  # no ending: the process was killed
    saved = str(folder / "checkpoints" / "step_0000006")
    lines.append(json.dumps(CheckpointSaved("k1", 0.6, 6, 768, saved).to_dict()))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    long_ago = time.time() - 3600  # no heartbeat and an old file: its writer is gone
    os.utime(folder / "metrics.jsonl", (long_ago, long_ago))
    killed = window.open_run_folder(str(folder))
    assert killed.state == "not running"
    window.table.selectRow(window.table.row_of(killed.key))
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: {killed.label} cannot be continued: it is not running and "
                                  f"recorded no ending (killed, or its machine stopped), so it has no final "
                                  f"checkpoint; its last one, {saved}, can be resumed (File, Load weights…). "
                                  f"Select a run that has a final checkpoint, or none to continue the latest."]


def test_the_empty_plots_say_the_listed_runs_ended_before_a_step_not_no_runs_yet(window, tmp_path):
    """A run stopped while it prepared its data is a row of the table, while the loss plot said "No runs yet"."""
    from gui.widgets.plot_panel import EMPTY_HINT, NO_STEPS_HINT

    hint = child(window, "lossPlotHint")
    assert hint.text() == EMPTY_HINT and hint.isVisible()
    (record,) = open_runs(window, tmp_path, 1, fail="cannot read the corpus")
    assert record.key in window.table.keys and record.step == 0
    assert hint.text() == NO_STEPS_HINT and hint.isVisible()
    open_runs(window, tmp_path, 1)  # a run with steps: its curves, no hint
    assert not hint.isVisible()


def test_a_run_with_steps_whose_curve_is_not_drawn_yet_is_not_said_to_have_ended_before_its_first_step(window,
                                                                                                   tmp_path):
    """The hint follows the runs at once, the curves at the plots' next redraw: in between it said the listed
    runs had ended before their first step while one was at step 29."""
    from gui.widgets.plot_panel import NO_STEPS_HINT

    hint = child(window, "lossPlotHint")
    open_runs(window, tmp_path, 1, fail="cannot read the corpus")
    assert hint.text() == NO_STEPS_HINT
    folder = write_run(tmp_path / "opened" / "stepped", "stepped")
    record = window.open_run_folder(str(folder))  # not redrawn yet
    assert record.step and hint.text() != NO_STEPS_HINT and not hint.isVisible()


def test_the_run_table_is_used_from_the_keyboard_a_lone_row_too(qtbot, window, tmp_path):
    """Tabbed into, its current cell was the Base checkbox: Space changed the baseline, and a lone row could not be
    selected (nor deleted) from the keyboard."""
    (record,) = open_runs(window, tmp_path, 1)
    table = window.table
    baseline = table.baseline
    window.activateWindow()
    table.setFocus(Qt.FocusReason.TabFocusReason)
    assert table.currentColumn() == 1 and table.selected_keys() == set()  # arriving selects nothing
    qtbot.keyClick(table, Qt.Key.Key_Space)
    assert table.selected_keys() == {record.key} and table.baseline == baseline
    qtbot.keyClick(table, Qt.Key.Key_Delete)
    assert record.removed and table.keys == []


def test_every_control_a_screen_reader_reaches_has_a_name(window):
    from PySide6.QtGui import QAccessible

    named = ["runTable", "lossPlot", "lrPlot", "throughputPlot", "memoryPlot", "logView", "runLegend",
             "smoothingSlider", "xAxisCombo", "dataSourceEdit", "budgetSpin"]
    for name in named:
        widget = child(window, name)
        assert QAccessible.queryAccessibleInterface(widget).text(QAccessible.Text.Name), name
    # A combo box is named by its value on Linux ("optimizer step"): the x axis' says what it is for through
    # the label it is labelled by.
    combo = QAccessible.queryAccessibleInterface(child(window, "xAxisCombo"))
    labels = [iface.text(QAccessible.Text.Name) for iface, _ in combo.relations(QAccessible.RelationFlag.Label)]
    assert labels == ["x axis"], labels
    # The upper right plot's name follows what it shows.
    lr = QAccessible.queryAccessibleInterface(child(window, "lrPlot"))
    window.plots.grad_norm.setChecked(True)
    assert lr.text(QAccessible.Text.Name) == "Gradient norm (before clipping) plot"
    window.plots.grad_norm.setChecked(False)
    assert lr.text(QAccessible.Text.Name) == "Learning rate plot"
    assert window.settings_scroll.focusPolicy() == Qt.FocusPolicy.NoFocus  # no Tab stop that says nothing


def test_a_micro_models_memory_is_not_shown_as_zero():
    """3 MiB read "mem 0.00 GiB · peak 0.00" in the status bar and "0.00" in the table, as if not measured."""
    from gui.widgets.run_table import _gib
    from gui.widgets.status_bar import memory_text

    assert [memory_text(g) for g in (0.003, 0.05, 0.3, 1.234)] == ["3.1 MiB", "51 MiB", "0.30 GiB", "1.23 GiB"]
    assert [_gib(g) for g in (None, 0.0, 0.003, 0.3)] == ["—", "0.00", "<0.01", "0.30"]


def test_a_compile_before_the_runs_first_event_is_not_called_setting_up_beside_it(qtbot):
    """The state said "compiling 0:01" and the progress box beside it "setting up"."""
    from gui.run_record import RunRecord
    from gui.widgets.status_bar import StatusBar

    record = RunRecord(key=1, number=1, config={"train": {"compile_mode": "default"}})
    record.apply(CompileStarted("c1", 0.1, "default", "model"))  # its RunStarted comes after
    status = StatusBar()
    qtbot.addWidget(status)
    status.show_run(record, None)
    assert record.state == "compiling" and status.progress.format() == "compiling"
