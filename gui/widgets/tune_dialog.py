"""The speed advisor's dialog: "Find fastest settings…".

It asks the session to run ``core.tune`` on the torch thread for the config
panel's current settings, and shows what comes back through the session's
``tune_event`` signal: a live table (the same rows as ``speedboard tune``), a
small chart of tokens/s with its spread per setting, and the recommendation.
**Apply** writes the recommended settings into the config panel's controls;
**Cancel** ends the trials between two optimizer steps (the report keeps what
was measured); **Open report…** shows a report saved earlier (by the dashboard
or the command line). The dialog never touches a tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from core.config import RunConfig
from core.errors import SpeedboardError
from core.event_text import counted
from core.tune import (
    DEFAULT_BUDGET_SECONDS,
    TABLE_HEADER,
    TrialFinished,
    TrialStarted,
    TuneFinished,
    TuneOptions,
    TuneStarted,
    default_report_path,
    load_report,
    not_tried,
    reports_dir,
    table_rows,
    time_taken,
)
from gui import dialogs
from gui.window_words import in_window_words

RECOMMENDED = QColor("#d8f0d8")
FAILED = QColor("#b00020")
CURRENT = QColor("#eeeeee")
CANCELLING = "Cancelling after the current optimizer step (a compile in progress finishes first) …"
RANKING = ("Settings are ranked by their speed against the current settings, trial by trial in the same repeat (the "
           "median of those ratios: drift between repeats hits both sides alike). The chart's bars are each "
           "setting's median tokens/s over all its timed steps, so a bar can stand a little below another's while "
           "its setting ranks above it.")

# The config panel's controls, by object name, for each setting Apply writes.
PANEL_SPINS = {"micro_batch": "microBatchSpin", "accum_steps": "accumStepsSpin"}
PANEL_COMBOS = {"compile_mode": "compileModeCombo", "compile_scope": "compileScopeCombo",
                "precision": "precisionCombo"}


def apply_settings(panel: QWidget, settings: dict) -> list[str]:
    """Set the config panel's controls to ``settings`` (TrainConfig fields); return the ones it could not set.
    A batch split the panel cannot hold sets nothing: the other settings with the current split would be a
    combination no trial measured."""
    spins = {key: panel.findChild(QSpinBox, name) for key, name in PANEL_SPINS.items()}
    try:
        batch_fits = all(spin is not None and key in settings and spin.minimum() <= int(settings[key]) <= spin.maximum()
                         for key, spin in spins.items())
    except (TypeError, ValueError):  # a hand-edited report's "4 x 2"
        batch_fits = False
    if not batch_fits:
        return [*PANEL_COMBOS, *spins]
    missed = []
    for key, name in PANEL_COMBOS.items():
        combo = panel.findChild(QComboBox, name)
        index = combo.findData(settings[key]) if combo is not None and key in settings else -1
        if index < 0:
            missed.append(key)
        else:
            combo.setCurrentIndex(index)
    # Micro-batch and accumulation together (never clamped): either alone, or a value the field would clamp,
    # changes the effective batch. Micro-batch first: the effective batch is the same at the end.
    for key, spin in spins.items():
        spin.setValue(int(settings[key]))
    return missed


def _resolved(device: object) -> object:
    """A device setting as this machine resolves it: "auto" and "cpu" are one device on a machine without a GPU
    (a panel with several processes shows "cpu" for "auto"). Anything unreadable stays as written."""
    from core.device import resolve_device  # queries only: no tensors

    try:
        return str(resolve_device(device)) if isinstance(device, str) else device
    except (SpeedboardError, RuntimeError, ValueError):  # a device this machine lacks: compared as written
        return device


def measured_for_other(measured_for: dict | None, current: RunConfig | None, processes: int = 1) -> list[str]:
    """What a report's trials ran with (its plan's config, one process) that differs from ``current`` trained by
    ``processes`` processes, in words ("preset micro (here tiny)"); empty when they match, or when either is
    unknown."""
    if measured_for is None or current is None:
        return []
    if not isinstance(measured_for, dict):  # a damaged report: its settings are unknown, which is asked about
        return ["the settings it was measured with (unreadable in the report)"]
    data, train = measured_for.get("data"), measured_for.get("train")
    data, train = data if isinstance(data, dict) else {}, train if isinstance(train, dict) else {}
    try:
        sequences = int(train["micro_batch"]) * int(train["accum_steps"])
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: an infinite number
        sequences = None
    here = current.train.sequences_per_step() * processes  # the panel's effective batch: all its processes'
    pairs = [
        ("preset", measured_for.get("preset"), current.preset),
        ("data", data.get("source"), current.data.source),
        ("sequence length", data.get("seq_len"), current.data.seq_len),
        ("device", _resolved(train.get("device")), _resolved(current.train.device)),
        ("effective batch", sequences and f"{sequences:,} sequences", f"{here:,} sequences"),
    ]
    differences = [f"{what} {theirs} (here {ours})" for what, theirs, ours in pairs
                   if theirs is not None and theirs != ours]
    model = measured_for.get("model")
    if model is not None and model != current.model.to_dict() and measured_for.get("preset") == current.preset:
        differences.insert(0, "another model architecture under the same preset name")  # else the preset says it
    return differences


TOP_MARGIN_PX = 8
"""Above the chart's data area: half a tick label's height and a little more."""


class TuneChart(pg.PlotWidget):
    """Median tokens/s per setting (bars), its min–max over every timed step (whiskers)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("tuneChart")
        self.setMinimumHeight(100)
        self.setLabel("left", "tokens/s")
        self.setLabel("bottom", colour_key([], None))
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        # Room above the data area: the left axis' top label is centred on its edge, and was cut in half ("1.0").
        self.getPlotItem().layout.setContentsMargins(1, TOP_MARGIN_PX, 1, 1)
        for side in ("left", "bottom"):  # "(x0.001)" after the bottom label ran past the chart's edge, cut
            self.getAxis(side).enableAutoSIPrefix(False)
        self.bars: list[float] = []
        self.ticks: list[tuple[int, str]] = []

    def show_rows(self, rows: list[dict], recommended: str | None) -> None:
        self.clear()
        measured = [(i, r) for i, r in enumerate(rows) if r["tokens_per_s"]]
        self.bars = [r["tokens_per_s"]["median"] for _, r in measured]
        self.setLabel("bottom", colour_key([r for _, r in measured], recommended))
        if measured:
            xs = [i for i, _ in measured]
            medians = self.bars
            lows = [r["tokens_per_s"]["low"] for _, r in measured]
            highs = [r["tokens_per_s"]["high"] for _, r in measured]
            brushes = [QBrush(QColor("#59a14f" if r["name"] == recommended else
                                     "#9c9c9c" if r["current"] else "#4e79a7")) for _, r in measured]
            self.addItem(pg.BarGraphItem(x=xs, height=medians, width=0.6, brushes=brushes))
            self.addItem(pg.ErrorBarItem(x=np.array(xs, dtype=float), y=np.array(medians, dtype=float),
                                         top=np.array([h - m for h, m in zip(highs, medians, strict=True)]),
                                         bottom=np.array([m - lo for m, lo in zip(medians, lows, strict=True)]),
                                         beam=0.25))
        # Numbers, not names: a dozen settings' names overlap under their bars, and the table's row
        # numbers (its vertical header) say which is which.
        self.ticks = [(i, str(i + 1)) for i in range(len(rows))]
        self.getAxis("bottom").setTicks([self.ticks])
        self.setXRange(-0.6, max(len(rows) - 0.4, 0.6), padding=0)
        self.enableAutoRange(axis="y")


def colour_key(measured: list[dict], recommended: str | None) -> str:
    """The chart's axis title, naming the bar colours it shows: it named a grey bar of the current settings when
    they were the pick (green), and never the others' blue."""
    parts = []
    if any(r["name"] == recommended for r in measured):
        picked_current = any(r["name"] == recommended and r["current"] for r in measured)
        parts.append("green: the pick" + (", the current settings" if picked_current else ""))
    if any(r["current"] and r["name"] != recommended for r in measured):
        parts.append("grey: the current settings")
    if any(not r["current"] and r["name"] != recommended for r in measured):
        parts.append("blue: the others" if parts else "blue: measured")
    return "setting: its row in the table" + (f" ({'; '.join(parts)})" if parts else "")


class TuneDialog(QDialog):
    """Find fastest settings: plan, live trials, recommendation, Apply."""

    applied = Signal(dict)
    """The recommended settings were written into the config panel."""

    def __init__(self, session, settings: Callable[[], RunConfig | None], panel: QWidget,
                 parent: QWidget | None = None) -> None:
        """``settings`` gives the current config (None while a setting is invalid); ``panel`` is what Apply sets."""
        super().__init__(parent)
        self.setObjectName("tuneDialog")
        self.setWindowTitle("Find fastest settings")
        self.session = session
        self._settings = settings
        self._panel = panel
        self.report: dict | None = None
        """The finished (or opened) report; its recommendation is what Apply sets."""
        self.summary: dict | None = None
        self.finished_events = 0
        self._report_path: str | None = None
        """Where the report shown was read or saved."""
        self._awaiting = False
        """Trials were started and neither their report nor their failure has come yet."""

        self.intro = QLabel("Short trials of the current model, data and effective batch with every compile mode, "
                            "precision and micro-batch × accumulation split that fits, interleaved so that drift "
                            "hits them alike. Every trial starts from the same weights and batches; the losses "
                            "must agree.")
        self.intro.setWordWrap(True)
        self.budget = QSpinBox()
        self.budget.setObjectName("tuneBudget")
        self.budget.setRange(10, 24 * 3600)
        self.budget.setSingleStep(60)
        self.budget.setSuffix(" s")
        self.budget.setValue(int(DEFAULT_BUDGET_SECONDS))
        self.run_button = QPushButton("Run trials")
        self.run_button.setObjectName("tuneRunButton")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("tuneCancelButton")
        self.open_button = QPushButton("Open report…")
        self.open_button.setObjectName("tuneOpenButton")
        self.apply_button = QPushButton("Apply")
        self.apply_button.setObjectName("tuneApplyButton")
        self.close_button = QPushButton("Close")
        self.close_button.setObjectName("tuneCloseButton")
        for button in (self.run_button, self.cancel_button, self.open_button, self.apply_button, self.close_button):
            button.setAutoDefault(False)  # Enter in the Time budget pressed Run trials, clearing a report shown
        self.plan_label = QLabel("")
        self.plan_label.setObjectName("tunePlanLabel")
        self.plan_label.setWordWrap(True)
        self.progress_label = QLabel("")
        self.progress_label.setWordWrap(True)
        self.progress_label.setObjectName("tuneProgressLabel")
        self.table = QTableWidget(0, len(TABLE_HEADER))
        self.table.setObjectName("tuneTable")
        self.table.setHorizontalHeaderLabels(TABLE_HEADER)  # from the start, not once a first trial ended
        # Each column as wide as its header from the start too (it cut "tokens/s median (min–max)" at both ends
        # until a first trial's row sized the columns).
        self._size_columns()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.verticalHeader().setToolTip("the setting's number in the chart below")
        # Every row as tall as its status needs, again whenever a column's width changes (a scroll bar appearing
        # narrows the last one): a failed or skipped setting's reason wraps in the last column, which a laptop's
        # dialog leaves narrow ("failed: /tmp/…/mid-…" hid "invalid JSON").
        self.table.horizontalHeader().sectionResized.connect(self._fit_rows)
        self.chart = TuneChart()
        self.chart.setToolTip(RANKING)
        self.recommendation = QLabel("")
        self.recommendation.setObjectName("tuneRecommendation")
        self.recommendation.setWordWrap(True)
        self.recommendation.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.recommendation.setToolTip(RANKING)

        top = QHBoxLayout()
        top.addWidget(QLabel("Time budget"))
        top.addWidget(self.budget)
        top.addStretch(1)
        top.addWidget(self.run_button)
        top.addWidget(self.cancel_button)
        top.addWidget(self.open_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.recommendation, 1)
        bottom.addWidget(self.apply_button)
        bottom.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.intro)
        layout.addLayout(top)
        layout.addWidget(self.plan_label)
        layout.addWidget(self.progress_label)
        # The table over the chart, the divider movable; in a small window the table keeps four rows in sight
        # (the chart gives way first: it repeats the table's figures).
        # (Its horizontal scroll bar counted too: with many columns it took half of the fourth row.)
        rows = self.table.verticalHeader().defaultSectionSize()
        self.table.setMinimumHeight(self.table.horizontalHeader().sizeHint().height() + 4 * rows + 4
                                    + self.table.horizontalScrollBar().sizeHint().height())
        split = QSplitter(Qt.Orientation.Vertical)
        split.setObjectName("tuneSplitter")
        split.addWidget(self.table)
        split.addWidget(self.chart)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setCollapsible(0, False)
        layout.addWidget(split, 1)
        layout.addLayout(bottom)
        self.resize(1100, 700)

        self.run_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.open_button.clicked.connect(self.open_report)
        self.apply_button.clicked.connect(self.apply)
        self.close_button.clicked.connect(self.close)
        session.tune_event.connect(self._on_event)
        session.tune_ended.connect(self._on_ended)
        session.tune_failed.connect(self._on_failed)
        session.tune_cancel_requested.connect(self._on_cancel_requested)
        session.running_changed.connect(self._update_buttons)
        changed = getattr(panel, "changed", None)
        if changed is not None:  # Apply is offered again once the panel no longer holds the pick
            changed.connect(self._update_buttons)
        self._update_buttons()

    # ------------------------------------------------------------------ commands
    @property
    def tuning(self) -> bool:
        return self.session.tuning

    def start(self) -> None:
        if self.session.running or self.tuning:
            dialogs.show_error(self, "The torch thread is busy",
                               "A run is training: the trials need the machine to themselves. Stop the run (or "
                               "wait until it ends), then find the fastest settings.")
            return
        cfg = self._settings()
        if cfg is None:  # the panel's own words for what is wrong: the dialog may cover the field that shows them
            problem = self._panel_error()
            dialogs.show_error(self, "Invalid settings", "Fix the settings first: the trials use the current "
                                                         "model, data and effective batch."
                               + (f"\n\n{problem}" if problem else ""))
            return
        try:
            options = TuneOptions(budget_seconds=float(self.budget.value()))
        except SpeedboardError as exc:
            dialogs.show_error(self, "Cannot find settings", str(exc))
            return
        self._clear()
        self.finished_events = 0
        self.plan_label.setText("Planning: measuring this device's matmul peak and checking what fits …"
                                + self._one_process_note())
        self._awaiting = True
        self.session.start_tune(cfg, options, str(default_report_path(cfg)))
        self._update_buttons()

    def cancel(self) -> None:
        if self.tuning and not self.session.tune_cancelling:
            self.session.cancel_tune()  # tune_cancel_requested: _on_cancel_requested

    def _on_cancel_requested(self) -> None:
        """Said however the trials were asked to end: the window closing during a trial left "Trial 3 of 6 …" and
        an enabled Cancel that did nothing."""
        self.progress_label.setText(CANCELLING)
        self._update_buttons()

    def apply(self) -> None:
        rec = self._recommendation()
        if rec is None:
            return
        measured_for = (self.report or {}).get("plan", {}).get("config")
        current = self._settings()
        differences = measured_for_other(measured_for, current, self._processes())
        if current is None:  # nothing to compare with: asked, not applied as if it matched
            problem = self._panel_error() or "a setting is invalid"
            differences.append(f"settings the panel's may differ from: they cannot be read now ({problem})")
        if self._processes() > 1:  # the trials are one process': Apply sets one, else the batch would multiply
            differences.append(f"processes 1 (here {self._processes()})")
        if differences and not dialogs.confirm_apply_other(self, differences):
            return
        missed = apply_settings(self._panel, rec["settings"])
        if set(PANEL_SPINS) <= set(missed):
            dialogs.show_error(self, "Not applied", "The panel cannot hold the recommended micro-batch × "
                                                    "accumulation, so nothing was set: the other settings with the "
                                                    "current split are a combination no trial measured.")
            return
        processes = self._panel.findChild(QSpinBox, "processesSpin")
        if processes is not None:
            processes.setValue(1)  # what the trials measured: more would multiply the effective batch they kept
        if missed:
            dialogs.show_error(self, "Not all settings applied",
                               f"Not set (the panel does not offer the value): {', '.join(missed)}.")
        self.applied.emit(dict(rec["settings"]))
        self._update_buttons()

    def _panel_error(self) -> str:
        """What the settings panel says is wrong with its settings ("" where it says nothing)."""
        return getattr(self._panel, "error", "") or ""

    def _processes(self) -> int:
        return int(getattr(self._panel, "nproc", 1) or 1)

    def _panel_holds(self, rec: dict | None) -> bool:
        """The settings panel holds the recommendation's settings now (after Apply, or set by hand). A pick that
        was the settings measured with is held while the panel shows those as they were given (precision
        ``auto``, which the trials measured as what it chose)."""
        current = getattr(self._panel, "config", None) if rec else None  # as shown: nothing being typed is taken
        if current is None or self._processes() > 1:  # the trials measured one process
            return False

        def shows(values: dict) -> bool:
            return all(getattr(current.train, key, None) == values.get(key) for key in rec["settings"])

        measured = ((self.report or {}).get("plan", {}).get("config") or {}).get("train") or {}
        return shows(rec["settings"]) or (bool(rec.get("is_current")) and isinstance(measured, dict)
                                          and shows(measured))

    def open_report(self, path: str | None = None) -> bool:
        """Show a saved report (asks for the file when ``path`` is not given); True when it was shown."""
        if not path:
            start = str(reports_dir()) if reports_dir().is_dir() else str(Path.home())
            path, _ = QFileDialog.getOpenFileName(self, "Open a tuning report", start, "Tuning report (*.json)")
        if not path:
            return False
        try:
            report = load_report(path)
        except SpeedboardError as exc:
            dialogs.show_error(self, "Cannot open the report", str(exc))
            return False
        shown = (self.report, self._report_path, self.budget.value())
        try:
            self._show_report(report, path)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # a hand-edited report
            if shown[0] is not None:  # the one shown before, whole again: never half of each
                self._show_report(shown[0], shown[1])
                self.budget.setValue(shown[2])
            else:
                self._clear()
            dialogs.show_error(self, "Cannot open the report",
                               f"{path} is damaged: {type(exc).__name__} {str(exc)[:200]}")
            return False
        return True

    def _show_report(self, report: dict, path: str | None) -> None:
        self._show_plan(report["plan"])
        seconds = report["plan"].get("budget_seconds")  # finite and ≥ 0 (load_report); the field's range bounds it
        if seconds is not None:
            self.budget.setValue(int(min(max(seconds, self.budget.minimum()), self.budget.maximum())))
        self._show_summary(report["summary"], report)
        self._show_finished(report, path)

    def _clear(self) -> None:
        """No report shown: before new trials, or after one that could not be shown whole."""
        self.report, self.summary, self._report_path = None, None, None
        self.progress_label.setToolTip("")
        self.table.setRowCount(0)
        self.chart.show_rows([], None)
        for label in (self.plan_label, self.progress_label, self.recommendation):
            label.setText("")
        self._update_buttons()

    # ------------------------------------------------------------------ what the torch thread reports
    def _on_event(self, event) -> None:
        if isinstance(event, TuneStarted):
            self._show_plan(event.plan)
        elif isinstance(event, TrialStarted):
            self._progress(f"Trial {event.index} of {event.total}: {event.label} (repeat {event.repeat + 1}) … "
                           f"about {_minutes(event.eta_seconds)} left")
        elif isinstance(event, TrialFinished):
            self.finished_events += 1
            self._show_summary(event.summary)
            self._progress(f"{event.elapsed:.0f} s so far; about {_minutes(event.eta_seconds)} left")
        elif isinstance(event, TuneFinished):
            self._show_plan(event.report["plan"])  # spare settings tried at the end are no longer "not tried"
            self._show_summary(event.report["summary"], event.report)
            self._show_finished(event.report, event.path)

    def _progress(self, text: str) -> None:
        """The progress line, unless a cancel is pending: the trial cut short still reports, and its "about
        4 min left" replaced the line saying the trials were ending."""
        self.progress_label.setText(CANCELLING if self.session.tune_cancelling else text)

    def _on_ended(self) -> None:
        if self._awaiting and self.report is None:  # neither a report nor a failure: cancelled while planning
            self.plan_label.setText("Cancelled while planning: nothing was measured.")
            self.progress_label.setText("")
        self._awaiting = False
        self._update_buttons()

    def _on_failed(self, message: str) -> None:
        finished = self._awaiting and self.report is not None  # the trials ended; their report was not saved
        self._awaiting = False
        if finished:  # the results stay shown, and Apply with them: it said "The trials could not run"
            self.progress_label.setText(_readable(f"{self.progress_label.text()}; not saved"))
            dialogs.show_error(self, "Report not saved", message[:1].upper() + message[1:])
            self._update_buttons()
            return
        message = in_window_words(message)  # the engine's advice names flags; here the controls are fields
        self.plan_label.setText(_readable(f"The trials could not run: {message}"))
        dialogs.show_error(self, "Cannot find settings", message)
        self._update_buttons()

    # ------------------------------------------------------------------ drawing
    def _show_plan(self, plan: dict) -> None:
        text = plan["description"][0].upper() + plan["description"][1:]
        left_out = not_tried(plan)  # before the trials, the spare settings may still be tried
        if left_out:  # each reason whole (cut at 60 characters it lost what a split needs, and its bracket)
            reasons = "; ".join(sorted({x["reason"] for x in left_out}))
            text += f". Not tried: {len(left_out)} ({reasons})"
        self.plan_label.setText(_readable(text + ".") + self._one_process_note())  # kept past the planning

    def _one_process_note(self) -> str:
        processes = self._processes()
        return (f" The trials measure one process; the panel's {processes} processes are not what they time."
                if processes > 1 else "")

    def _fit_rows(self, *_) -> None:
        self.table.resizeRowsToContents()

    def _size_columns(self) -> None:
        """Every column as wide as its contents, the last one taking the width left."""
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(self.table.columnCount() - 1, QHeaderView.ResizeMode.Stretch)

    def _show_summary(self, summary: dict, report: dict | None = None) -> None:
        """The rows; with the finished ``report``, why a setting was not run."""
        self.summary = summary
        rows = list(summary["rows"].values())
        text = table_rows(report if report is not None else summary, running=report is None and self.tuning)
        self.table.setColumnCount(len(text[0]))
        self.table.setHorizontalHeaderLabels(text[0])
        self.table.setRowCount(len(rows))
        rec = summary.get("recommendation")
        recommended = rec["cell"] if rec else None
        bold = QFont()
        bold.setBold(True)
        for r, (row, cells) in enumerate(zip(rows, text[1:], strict=True)):
            for c, value in enumerate(cells):
                item = QTableWidgetItem(value)
                if c in (1, 2, 3, 4, 5, 6):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if row["name"] == recommended:
                    item.setBackground(RECOMMENDED)
                elif row["current"]:
                    item.setBackground(CURRENT)
                if row.get("error") or row.get("loss_agrees") is False:
                    item.setForeground(FAILED)
                if row["current"] and c == 0:
                    item.setFont(bold)
                tip = row["name"] if c == 0 else value
                status = cells[-1]
                if c < len(cells) - 1 and status != "ok":  # the status column may be scrolled out of sight
                    tip = f"{tip}\n{text[0][-1]}: {status}"
                item.setToolTip(tip)
                self.table.setItem(r, c, item)
        self._size_columns()
        self._fit_rows()
        self.chart.show_rows(rows, recommended)
        if rec:
            self.recommendation.setText(_readable(("So far: " if self.tuning else "") + rec["text"]))

    def _show_finished(self, report: dict, path: str | None) -> None:
        self.report, self._report_path = report, path
        rec = report.get("recommendation")
        where = f"; report: {Path(path).name}" if path else ""  # its folder in the tooltip: a long path widened
        taken = time_taken(report)                                # the dialog past the screen
        self.progress_label.setText(_readable(f"{taken[:1].upper()}{taken[1:]} "
                                              f"({counted(len(report['trials']), 'trial')}){where}"))
        self.progress_label.setToolTip(path or "")
        self.recommendation.setText(_readable(rec["text"]) if rec else "No setting was measured.")
        self._update_buttons()

    def _recommendation(self) -> dict | None:
        source = self.report or ({"recommendation": self.summary.get("recommendation")} if self.summary else None)
        return source.get("recommendation") if source else None

    def _update_buttons(self, *_) -> None:
        tuning = self.tuning
        training = self.session.running  # the trials need the machine (and the torch thread) to themselves
        self.run_button.setEnabled(not tuning and not training)
        self.run_button.setToolTip("A run is training: the trials need the machine to themselves; stop the run or "
                                   "wait for its end" if training else "")
        self.budget.setEnabled(not tuning)
        # Closed and reopened while a cancel is pending, the dialog offered Cancel again as if nothing was asked.
        self.cancel_button.setEnabled(tuning and not self.session.tune_cancelling)
        self.open_button.setEnabled(not tuning)
        rec = self._recommendation() if not tuning else None
        held = self._panel_holds(rec)
        # Offered whenever the panel does not hold the pick: "the current settings" are those the trials were
        # measured with, which the panel may no longer hold (set by hand since, or a report of another preset):
        # Apply was greyed, and the text said to keep settings the panel did not have.
        self.apply_button.setEnabled(bool(rec) and not held)
        if rec:
            current = rec.get("is_current")
            note = (" Applied: the settings panel holds it now." if held and not current else
                    " The settings panel holds others now: Apply sets these again." if current and not held else "")
            self.recommendation.setText(_readable(rec["text"]) + note)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._update_buttons()  # the panel may have changed while the dialog was closed
        super().showEvent(event)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.cancel()  # closing the dialog ends the trials; the report keeps what they measured
        super().closeEvent(event)

    def reject(self) -> None:
        self.cancel()  # Escape hides a dialog without a close event: it ends the trials as closing does
        super().reject()


def _readable(text: str, limit: int = 1_000, run: int = 60) -> str:
    """Text for a label that wraps: at most ``limit`` characters, and no run without a space longer than ``run``
    (a label cannot break it, and takes its width: a hand-edited report's string made the dialog 14,000 px)."""
    text = re.sub(rf"\S{{{run + 1},}}", lambda m: m.group()[:run - 1] + "…", text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
