"""One row per run: its settings, results and speedup against a baseline the user ticks.

Selecting rows shows only their curves (the plots' one notion of visible; a run
hidden there reads grey here). Speedups are honest about what they compare: each
comes with a range from both runs' step-time spread, a tooltip naming the medians
compared, and a "not comparable" mark where precision, device, preset or sequence
length differ from the baseline. Rows are removed with Delete or the context menu.
"""

from __future__ import annotations

import statistics

from PySide6.QtCore import QItemSelectionModel, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QKeySequence, QPalette
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QMenu, QTableWidget, QTableWidgetItem, QWidget

from core.mfu import mfu_text
from gui.run_record import RunRecord
from gui.widgets.run_legend import SWATCH, swatch

MARK_ROLE = Qt.ItemDataRole.UserRole + 1
"""The (colour, dash) the Run cell's swatch shows."""

COLUMNS = ("Base", "Run", "State", "Compile", "Accum", "Micro", "Precision", "Device", "Procs", "Started from",
           "Compile s", "Tokens/s", "Speedup", "MFU", "Loss", "Val loss", "Train GiB")
_STATE_COLORS = {"failed": "#b00020", "stopped": "#8a6d00", "finished": "#1b5e20"}
SELECTION_COLOR = "#d5e3f0"
"""Selected rows: light enough for every run's line colour to show on it."""
_HIDDEN_COLOR = "#a0a0a0"
_NOT_COMPARABLE_COLOR = "#8a6d00"
_NOISE_COLOR = "#8c8c8c"
"""A speedup whose range spans 1×: grey, as no measured difference."""
PRIORITY = ("Base", "Run", "State", "Tokens/s", "Speedup", "Loss", "Compile s", "Train GiB", "Accum", "Compile",
            "Val loss", "MFU", "Micro", "Started from", "Precision", "Device", "Procs")
"""Columns in the order they give way when the table is narrow (the last first)."""
STATE_CHARS = 80
"""A failed run's reason is cut here in its row (and elided to the column); the tooltip has all of it."""
STATE_MAX_PX = 190
MIN_STEPS_FOR_RANGE = 4
"""Steady steps a run needs before its spread says anything."""
COMPARED = (("precision", "precision"), ("device", "device"), ("preset", "preset"), ("model", "model"),
            ("seq_len", "sequence length"), ("layout", "layout"), ("vocab_size", "vocabulary"))
_SIZES = (("hidden_size", "hidden {}"), ("num_layers", "{} layers"), ("num_heads", "{} heads"),
          ("num_kv_heads", "{} key/value heads"), ("intermediate_size", "MLP {}"))


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _gib(value: float | None) -> str:
    """GiB to two decimals; "<0.01" for less than that but more than nothing (a micro model's "0.00" read as
    unmeasured)."""
    return "—" if value is None else "<0.01" if 0 < value < 0.005 else f"{value:.2f}"


def _quartiles(times: list[float]) -> tuple[float, float] | None:
    if len(times) < MIN_STEPS_FOR_RANGE:
        return None
    q1, _, q3 = statistics.quantiles(times, n=4)
    return q1, q3


def comparison_keys(record: RunRecord) -> dict[str, str]:
    """What must match for two runs' throughputs to be compared: precision, device, preset, the model's sizes (a
    checkpoint's own architecture runs under the preset's name), sequence length, layout (documents padded or
    packed) and the vocabulary (the output head's size: another corpus' tokenizer)."""
    cfg = record.config
    model = cfg.get("model", {})
    return {"precision": record.precision or str(record.train.get("precision", "")),
            "device": record.device or str(record.train.get("device", "")),
            "preset": str(cfg.get("preset", "")),
            "model": ", ".join(words.format(model[key]) for key, words in _SIZES if key in model),
            "seq_len": str(cfg.get("data", {}).get("seq_len", "")),
            "layout": str(cfg.get("data", {}).get("layout", "packed")),
            "vocab_size": str(model.get("vocab_size", ""))}


def not_comparable(record: RunRecord, base: RunRecord) -> list[str]:
    """The settings of ``record`` that differ from ``base``'s, in words (empty: comparable)."""
    mine, theirs = comparison_keys(record), comparison_keys(base)
    return [f"{words} {mine[key]} vs {theirs[key]}" for key, words in COMPARED if mine[key] != theirs[key]]


def speedup_range(record: RunRecord, base: RunRecord) -> tuple[float, float] | None:
    """Speedup with each run's step time at its 25th and 75th percentile (slow vs fast and fast vs slow):
    the spread of the two measurements, not a confidence interval."""
    mine, theirs = _quartiles(record.step_seconds), _quartiles(base.step_seconds)
    if mine is None or theirs is None or not record.tokens_per_step or not base.tokens_per_step or mine[0] <= 0:
        return None
    ratio = record.tokens_per_step / base.tokens_per_step  # tokens/s = tokens per step / step time
    return ratio * theirs[0] / mine[1], ratio * theirs[1] / mine[0]


class RunTable(QTableWidget):
    selection_changed = Signal(object)
    """The keys of the selected runs (a set), or None when nothing is selected."""
    remove_requested = Signal(object)
    """The user asked to remove these runs' rows (a set of keys)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setObjectName("runTable")
        self.setAccessibleName("Runs")
        self.setTabKeyNavigation(False)  # Tab leaves the table (the arrows move between cells): else a trap
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().setVisible(False)
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.setAlternatingRowColors(True)
        # A light selection, dark text on it: the first run's line colour (#1f77b4) vanished into Qt's blue
        # highlight, and with it the swatch that ties a selected row to its curves.
        palette = self.palette()
        for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Inactive):
            palette.setColor(group, QPalette.ColorRole.Highlight, QColor(SELECTION_COLOR))
            palette.setColor(group, QPalette.ColorRole.HighlightedText, QColor("#000000"))
        self.setPalette(palette)
        self.setWordWrap(False)
        header = self.horizontalHeader()
        # Widths are set by ``_fit``, once per turn of the event loop for every change until then: a header that
        # resizes to its contents measures every row at each cell's change, which grew with the rows' square
        # (opening 100 run folders beside 75 took 18 s).
        header.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        header.setStretchLastSection(False)
        header.setMinimumSectionSize(28)
        header.setSectionResizeMode(COLUMNS.index("State"), QHeaderView.ResizeMode.Interactive)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.horizontalHeaderItem(0).setToolTip("Tick the run that speedups are measured against")
        tips = {"Micro": "Micro-batch: sequences per forward/backward pass",
                "Procs": "Processes that train the run (more than one: torchrun)",
                "Started from": "The weights the run began with: its parent run (Continue), a loaded file, "
                                "or a fresh initialisation (—)",
                "Compile s": "Compile warm-up: the warm-up steps' wall time minus the same steps at steady "
                             "speed (median of the first steady steps); the shaded region in the throughput "
                             "plot shows the same figure",
                "Tokens/s": "Median tokens per second over the steps after warm-up",
                "Speedup": "Median tokens/s relative to the ticked baseline run, with the range from both "
                           "runs' step-time spread (25th–75th percentile). The runs were measured one after "
                           "the other, not interleaved: load on the machine between them moves the figure",
                "MFU": "Model FLOPs utilisation of the median tokens/s, against this machine's measured GEMM peak "
                       "in the run's precision (the figure of the CLI's step lines and of speedboard bench); a "
                       "job of N processes against N times that peak",
                "Loss": "Final training loss",
                "Train GiB": "Peak memory of the training itself: CUDA max allocated, or on CPU the peak "
                             "resident set minus what the process held before the model existed (the "
                             "window and earlier runs excluded; their freed memory is handed back first), as "
                             "speedboard bench reports it. On CPU a window's first run also counts torch's "
                             "one-time set-up, so it reads higher than the runs after it. A job of several "
                             "processes: rank 0's, one process's (each holds its own model, optimizer and share "
                             "of the batch); its Tokens/s and MFU are the whole job's"}
        for name, tip in tips.items():
            self.horizontalHeaderItem(COLUMNS.index(name)).setToolTip(tip)
        # The Run cell's swatch at its own size, as the legend draws it: scaled to the default 16 px its dash and
        # dot read alike and its colour faded.
        self.setIconSize(SWATCH)
        self._records: list[RunRecord] = []
        self._hidden: set[int] = set()
        self._baseline: int | None = None
        self._user_baseline = False
        self._filling = False
        self.itemChanged.connect(self._on_item_changed)
        self.itemSelectionChanged.connect(self._on_selection)
        self._fit_timer = QTimer(self)  # owned: it dies with the table
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(0)
        self._fit_timer.timeout.connect(self._fit_and_scroll)
        self._newest_in_view = False
        """A row was added since the last fit: the newest is scrolled into view then. Scrolled to as it was
        inserted, it was one row short of the end (the scroll range had not grown yet) once the table overflowed."""
        header.sectionResized.connect(self._schedule_fit)  # a column grew with its content
        self._fitting = False
        # A hidden section's header reports no size hint, so each column's title width is kept from when
        # it was shown: measured hidden, a column would fit, come back, not fit, and go again, forever.
        self._title_widths: dict[int, int] = {}

        self.remove_action = QAction("Remove from the table", self)
        self.remove_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.remove_action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.remove_action.triggered.connect(self._remove_selected)
        self.addAction(self.remove_action)
        self.clear_failed_action = QAction("Clear failed runs", self)
        self.clear_failed_action.triggered.connect(self.clear_failed)
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._context_menu)

    # ------------------------------------------------------------------ rows
    def column(self, name: str) -> int:
        return COLUMNS.index(name)

    def row_of(self, key: int) -> int:
        return next(i for i, r in enumerate(self._records) if r.key == key)

    def record_at(self, row: int) -> RunRecord:
        return self._records[row]

    @property
    def keys(self) -> list[int]:
        return [r.key for r in self._records]

    def add_record(self, record: RunRecord) -> None:
        self._records.append(record)
        row = self.rowCount()
        self._filling = True
        try:
            self.insertRow(row)
            for col in range(len(COLUMNS)):
                item = QTableWidgetItem()
                item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
                self.setItem(row, col, item)
            base = self.item(row, 0)
            base.setFlags(base.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            base.setCheckState(Qt.CheckState.Unchecked)
        finally:
            self._filling = False
        if self.selectionModel().hasSelection():
            # A new run is shown in the plots: with rows selected (only their runs shown), it joins them, so the
            # selection says what the plots show (only the rows selected before were, and the new run's curves
            # were drawn beside them).
            with QSignalBlocker(self), QSignalBlocker(self.selectionModel()):
                self.selectionModel().select(self.model().index(row, 0), QItemSelectionModel.SelectionFlag.Select
                                             | QItemSelectionModel.SelectionFlag.Rows)
            self.viewport().update()
        self.update_record(record)
        self._newest_in_view = True  # a new run is in view: after the table's layout has made room for its row
        self.schedule_fit()  # once for all the rows added together (a runs folder of hundreds of runs)

    def remove_record(self, key: int) -> None:
        selected = key in self.selected_keys()
        row = self.row_of(key)
        self._records.pop(row)
        self._hidden.discard(key)
        self._filling = True
        try:
            # Removing a selected row changes the selection; told now, the plots would hand their hidden runs
            # back (set_hidden) while the row is still there but its record gone, and every row after it would
            # be painted with the next record's texts. The selection is told once rows and records agree.
            with QSignalBlocker(self):
                self.removeRow(row)
            self._mark_mfu_peaks()  # the run whose peak stood apart may be the one removed
        finally:
            self._filling = False
        if selected:  # else the selection is as it was: runs hidden in the legend stay hidden
            self._on_selection()
        self.fit_columns()
        if key == self._baseline:
            self._baseline = None
            self._user_baseline = False
            fallback = next((r.key for r in self._records if r.median_tokens_per_s is not None), None)
            self.set_baseline(fallback)
        else:
            self._refresh_speedups()

    def update_record(self, record: RunRecord) -> None:
        row = self.row_of(record.key)
        tps = record.median_tokens_per_s
        compile_s = "fallback" if record.compile_fallback else _fmt(record.compile_seconds, ".1f")
        if record.parent_number is not None:
            started = f"#{record.parent_number}"
        elif record.parent_id:
            started = record.parent_id
        else:
            started = _short_path(record.started_from) if record.started_from else "—"
        texts = {
            "Run": record.label,
            # While it compiles, the time alone: what compiles (its tooltip, the status bar) widened the column past
            # the room of Loss and Train GiB, which went until the run ended.
            "State": _cut(record.progress_text(brief=True), STATE_CHARS),
            "Compile": record.compile_text,
            "Accum": str(record.train.get("accum_steps", "")),
            "Micro": str(record.train.get("micro_batch", "")),
            "Precision": record.precision or record.train.get("precision", ""),
            "Device": record.device or record.train.get("device", ""),
            "Procs": str(record.processes),
            "Started from": started,
            "Compile s": compile_s,
            "Tokens/s": _fmt(tps, ",.0f"),
            "MFU": "—" if record.mfu is None else mfu_text(record.mfu),
            "Loss": _fmt(record.final_loss if record.final_loss is not None else record.last_loss, ".4f"),
            "Val loss": _fmt(record.val_loss, ".4f"),
            # No step trained, no training memory to show (not 0.00: a run stopped while it compiled).
            "Train GiB": _gib(record.peak_mem_gib if record.step > record.start_step else None),
        }
        self._filling = True
        changed = False
        try:
            for name, text in texts.items():
                item = self.item(row, self.column(name))
                if item.text() != text:  # each change is a repaint and a measure: only the texts that change
                    item.setText(text)
                    changed = True
            run = self.item(row, 1)
            if run.data(MARK_ROLE) != record.mark:  # a failed run gives its colour back: its mark goes
                run.setData(MARK_ROLE, record.mark)
                run.setIcon(swatch(*record.mark))
            state = self.item(row, self.column("State"))
            state.setForeground(QColor(_STATE_COLORS.get(record.state, "#202020")))
            state.setToolTip(record.message or record.compile_progress())
            if record.split_changes:  # the Micro and Accum cells show the split it trains with now
                self.item(row, self.column("Micro")).setToolTip(
                    f"Changed {record.split_changes}× during the run (out of memory, or fitted before it): "
                    f"the same effective batch; see the Log")
            run_item = self.item(row, self.column("Run"))
            hidden = " (hidden in the plots: tick it in the legend or select its row)" \
                if record.key in self._hidden else ""
            run_item.setToolTip("\n".join(t for t in (record.run_id, record.folder) if t) + hidden)
            run_item.setForeground(QColor(_HIDDEN_COLOR if record.key in self._hidden else "#202020"))
            origin = self.item(row, self.column("Started from"))
            parent = f"continues run {record.parent_id}" if record.parent_id else ""
            origin.setToolTip(parent or record.started_from)
            self.item(row, self.column("Precision")).setToolTip(record.precision_reason)
            self._mark_mfu_peaks()
        finally:
            self._filling = False
        if changed:
            self.schedule_fit()
        if self._baseline is None and tps is not None and not self._user_baseline:
            self.set_baseline(record.key)
        else:  # another run's speedup depends on it only when it is the baseline
            self._refresh_speedups(None if record.key == self._baseline else [row])

    def fit_columns(self) -> None:
        """Show the columns that fit the width, most useful first; the others give way until it widens
        (their figures stay in the tooltips and the log)."""
        self._fitting = True  # the sections this resizes or hides are not "a column grew": no refit
        try:
            self._fit()
        finally:
            self._fitting = False

    def _title_width(self, col: int) -> int:
        header = self.horizontalHeader()
        if not self.isColumnHidden(col) or col not in self._title_widths:
            hint = header.sectionSizeHint(col)
            if hint > 0:
                self._title_widths[col] = hint
        return self._title_widths.get(col, 0)

    def _fit(self) -> None:
        # Room for a vertical scroll bar is kept: its appearing does not resize the table.
        available = self.width() - 2 * self.frameWidth() - self.verticalScrollBar().sizeHint().width()
        state = self.column("State")
        content = max(self.sizeHintForColumn(state), self._title_width(state))
        self.setColumnWidth(state, min(STATE_MAX_PX, content))
        used, room = 0, True
        for name in self._priority():
            col = self.column(name)
            if col == state:
                width = self.columnWidth(col)
            else:
                width = max(self.sizeHintForColumn(col), self._title_width(col))
            fits = room and (used + width <= available or name in ("Base", "Run", "State"))
            if fits:
                used += width
                if col != state and self.columnWidth(col) != width:
                    self.setColumnWidth(col, width)
            else:
                room = False  # strictly in order of use: a later, narrower column does not jump the queue
            if self.isColumnHidden(col) == fits:
                self.setColumnHidden(col, not fits)

    def _mark_mfu_peaks(self) -> None:
        """Each MFU cell names the peak it divides by; where runs of one device and precision were measured
        against peaks more than 5% apart (the cache keeps the higher one, measured again when a run came near it),
        their MFU cells are marked as not on one scale: 4.3% against 165 GFLOP/s beside 23% against 344 read as
        one column."""
        col = self.column("MFU")
        # The peaks of each device and precision, gathered once: this runs at every row's update.
        peaks: dict[tuple[str, str], set[float]] = {}
        for record in self._records:
            if record.matmul_peak_flops:
                peaks.setdefault((record.device, record.precision), set()).add(record.matmul_peak_flops)
        for row, record in enumerate(self._records):
            item = self.item(row, col)
            if item is None:
                continue
            peak = record.matmul_peak_flops
            others = peaks.get((record.device, record.precision), set()) - {peak}
            apart = bool(peak) and any(abs(other - peak) > 0.05 * max(other, peak) for other in others)
            tip = f"against {peak / 1e9:,.0f} GFLOP/s of {record.precision} GEMMs per process" if peak else ""
            if apart:
                tip += ("; other runs of this device and precision were measured against " + ", ".join(
                    f"{other / 1e9:,.0f}" for other in sorted(others)) + " GFLOP/s: their MFU is not on the "
                    "same scale (compare Tokens/s)")
            if item.toolTip() != tip:
                item.setToolTip(tip)
            color = QColor(_NOT_COMPARABLE_COLOR if apart else "#202020")
            if item.foreground().color() != color:
                item.setForeground(color)

    def _priority(self) -> list[str]:
        """``PRIORITY``, with the columns that show nothing in any row ("—" throughout: Compile s of eager runs)
        giving way first: at 1024 × 640 an empty Compile s kept its place while Val loss and Accum went."""
        rows = range(self.rowCount())

        def says_nothing(name: str) -> bool:
            col = self.column(name)
            return bool(rows) and name not in ("Base", "Run", "State") and all(
                (item := self.item(row, col)) is None or item.text() in ("", "—") for row in rows)

        empty = [name for name in PRIORITY if says_nothing(name)]
        return [name for name in PRIORITY if name not in empty] + empty

    def _schedule_fit(self, *_) -> None:
        if not self._fitting:
            self.schedule_fit()

    def _fit_and_scroll(self) -> None:
        self.fit_columns()
        if self._newest_in_view and self.rowCount():
            self._newest_in_view = False
            self.executeDelayedItemsLayout()  # the rows' geometry, and so the scroll range, as it now is
            self.scrollToItem(self.item(self.rowCount() - 1, 1))

    def schedule_fit(self) -> None:
        """``fit_columns`` once control returns to the event loop: one measure of every row's width for all the
        changes made until then (each measures every row: done per change, opening runs grew with their square)."""
        if not self._fit_timer.isActive():
            self._fit_timer.start()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self.fit_columns()

    def set_hidden(self, keys: set[int]) -> None:
        """The runs hidden in the plots: their names read grey. With rows selected (only their runs shown), the
        selection follows the legend: a run unticked there is no longer selected (it stayed selected, its curves
        hidden), one ticked is selected with the others."""
        self._hidden = set(keys)
        model = self.selectionModel()
        if model.hasSelection():
            selected = {index.row() for index in model.selectedRows()}
            shown = {row for row, record in enumerate(self._records) if record.key not in self._hidden}
            if selected != shown:
                flags = QItemSelectionModel.SelectionFlag
                with QSignalBlocker(self), QSignalBlocker(model):  # the plots already show this
                    for row in selected ^ shown:
                        model.select(self.model().index(row, 0),
                                     (flags.Select if row in shown else flags.Deselect) | flags.Rows)
                self.viewport().update()
        for record in self._records:
            self.update_record(record)

    # ------------------------------------------------------------------ baseline and speedups
    @property
    def baseline(self) -> int | None:
        return self._baseline

    def set_baseline(self, key: int | None) -> None:
        self._baseline = key
        self._filling = True
        try:
            for row, record in enumerate(self._records):
                checked = Qt.CheckState.Checked if record.key == key else Qt.CheckState.Unchecked
                self.item(row, 0).setCheckState(checked)
        finally:
            self._filling = False
        self._refresh_speedups()

    def _base(self) -> RunRecord | None:
        return next((r for r in self._records if r.key == self._baseline), None)

    def speedup(self, record: RunRecord) -> float | None:
        base = self._base()
        if base is None or not base.median_tokens_per_s or record.median_tokens_per_s is None:
            return None
        return record.median_tokens_per_s / base.median_tokens_per_s

    def _refresh_speedups(self, rows: list[int] | None = None) -> None:
        """The Speedup cells of ``rows`` (all when None: the baseline changed)."""
        col = self.column("Speedup")
        base = self._base()
        rows = list(range(self.rowCount())) if rows is None else rows
        before = [self.item(row, col).text() for row in rows]
        self._filling = True
        try:
            for row in rows:
                record = self._records[row]
                item = self.item(row, col)
                value = self.speedup(record)
                if value is None or base is None:
                    item.setText("—")
                    item.setToolTip("")
                    item.setForeground(QColor("#202020"))
                    continue
                if record.key == self._baseline:
                    item.setText(f"{value:.2f}× (base)")
                    item.setToolTip(f"The baseline: median {base.median_tokens_per_s:,.0f} tokens/s over "
                                    f"{len(base.step_seconds)} steady steps")
                    item.setForeground(QColor("#202020"))
                    continue
                span = speedup_range(record, base)
                text = f"{value:.2f}×" + (f" ({span[0]:.2f}–{span[1]:.2f})" if span else "")
                differ = not_comparable(record, base)
                noise = span is not None and span[0] <= 1.0 <= span[1]  # the step times overlap
                if differ:
                    text += " ≠"
                item.setText(text)
                item.setForeground(QColor(_NOT_COMPARABLE_COLOR if differ else _NOISE_COLOR if noise else "#202020"))
                tip = (f"Median tokens/s of {record.label} ({record.median_tokens_per_s:,.0f} over "
                       f"{len(record.step_seconds)} steady steps) ÷ median of {base.label} "
                       f"({base.median_tokens_per_s:,.0f} over {len(base.step_seconds)} steady steps).\n"
                       f"The two runs were measured one after the other, not interleaved: a change in the "
                       f"machine's load between them moves this figure.")
                if span:
                    tip += (f"\nRange {span[0]:.2f}–{span[1]:.2f}×: both runs' step times at their 25th and "
                            f"75th percentiles.")
                if noise:
                    tip += "\nThe range spans 1×: the two runs' step times overlap, so this is no measured difference."
                if differ:
                    tip += "\nNot comparable with the baseline: " + "; ".join(differ) + "."
                item.setToolTip(tip)
        finally:
            self._filling = False
        if [self.item(row, col).text() for row in rows] != before:
            self.schedule_fit()  # a range appeared: other columns may have to give way

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._filling or item.column() != 0:
            return
        record = self._records[item.row()]
        self._user_baseline = True
        if item.checkState() == Qt.CheckState.Checked:
            self.set_baseline(record.key)
        elif record.key == self._baseline:
            self.set_baseline(None)

    # ------------------------------------------------------------------ selection and removal
    def selected_keys(self) -> set[int]:
        return {self._records[index.row()].key for index in self.selectionModel().selectedRows()}

    def _on_selection(self) -> None:
        keys = self.selected_keys()
        self.selection_changed.emit(keys or None)

    def failed_keys(self) -> set[int]:
        return {r.key for r in self._records if r.state == "failed"}

    def clear_failed(self) -> None:
        failed = self.failed_keys()
        if failed:
            self.remove_requested.emit(failed)

    def _remove_selected(self) -> None:
        keys = self.selected_keys()
        if keys:
            self.remove_requested.emit(keys)

    def focusInEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().focusInEvent(event)
        if event.reason() == Qt.FocusReason.MouseFocusReason or not self.rowCount():
            return
        # Reached by the keyboard: the current cell on a run's name, not on its Base checkbox, where Space changed
        # the baseline (and a lone row could not be selected at all); nothing is selected by arriving.
        current = self.currentIndex()
        if not current.isValid() or current.column() == 0:
            self.selectionModel().setCurrentIndex(self.model().index(max(current.row(), 0), 1),
                                                  QItemSelectionModel.SelectionFlag.NoUpdate)

    def keyPressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if event.key() in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace) and self.selected_keys():
            self._remove_selected()
            event.accept()
            return
        super().keyPressEvent(event)

    def _context_menu(self, pos) -> None:
        menu = self.context_menu()
        menu.exec(self.viewport().mapToGlobal(pos))

    def context_menu(self) -> QMenu:
        """Remove the selected rows; clear every failed run."""
        menu = QMenu(self)
        selected = len(self.selected_keys())
        self.remove_action.setText(f"Remove {selected} run(s) from the table" if selected > 1
                                   else "Remove from the table")
        self.remove_action.setEnabled(selected > 0)
        menu.addAction(self.remove_action)
        failed = len(self.failed_keys())
        self.clear_failed_action.setText(f"Clear failed runs ({failed})")
        self.clear_failed_action.setEnabled(failed > 0)
        menu.addAction(self.clear_failed_action)
        return menu


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _short_path(path: str) -> str:
    """The last two parts of a path: enough to recognise a checkpoint."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    return "/".join(parts[-2:])
