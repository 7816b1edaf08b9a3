"""One row per run: its settings, results and speedup against a baseline the user ticks.

Selecting rows shows only their curves; with no selection every run is shown.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from gui.run_record import RunRecord

COLUMNS = ("Base", "Run", "State", "Compile", "Accum", "Micro", "Precision", "Device", "Compile s",
           "Tokens/s", "Speedup", "MFU", "Loss", "Val loss", "Peak GiB")
_STATE_COLORS = {"failed": "#b00020", "stopped": "#8a6d00", "finished": "#1b5e20"}


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


class RunTable(QTableWidget):
    selection_changed = Signal(object)
    """The keys of the selected runs (a set), or None when nothing is selected."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setObjectName("runTable")
        self.setHorizontalHeaderLabels(COLUMNS)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().setVisible(False)
        self.setAlternatingRowColors(True)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.horizontalHeaderItem(0).setToolTip("Tick the run that speedups are measured against")
        tips = {"Micro": "Micro-batch: sequences per forward/backward pass",
                "Compile s": "Compile warm-up: extra seconds the first steps took",
                "Tokens/s": "Median tokens per second over the steps after warm-up",
                "Speedup": "Tokens/s relative to the ticked baseline run",
                "MFU": "Model FLOPs utilisation of the median tokens/s, against this machine's measured GEMM peak "
                       "in the run's precision (the figure of the CLI's step lines and of speedboard bench)",
                "Loss": "Final training loss", "Peak GiB": "Peak memory: CUDA allocated, or process RSS on CPU"}
        for name, tip in tips.items():
            self.horizontalHeaderItem(COLUMNS.index(name)).setToolTip(tip)
        self._records: list[RunRecord] = []
        self._baseline: int | None = None
        self._user_baseline = False
        self._filling = False
        self.itemChanged.connect(self._on_item_changed)
        self.itemSelectionChanged.connect(self._on_selection)

    # ------------------------------------------------------------------ rows
    def column(self, name: str) -> int:
        return COLUMNS.index(name)

    def row_of(self, key: int) -> int:
        return next(i for i, r in enumerate(self._records) if r.key == key)

    def record_at(self, row: int) -> RunRecord:
        return self._records[row]

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
            self.item(row, 1).setData(Qt.ItemDataRole.DecorationRole, QColor(record.color))
        finally:
            self._filling = False
        self.update_record(record)

    def update_record(self, record: RunRecord) -> None:
        row = self.row_of(record.key)
        tps = record.median_tokens_per_s
        compile_s = "fallback" if record.compile_fallback else _fmt(record.compile_seconds, ".1f")
        texts = {
            "Run": record.label,
            "State": record.progress_text(),
            "Compile": record.compile_text,
            "Accum": str(record.train.get("accum_steps", "")),
            "Micro": str(record.train.get("micro_batch", "")),
            "Precision": record.precision or record.train.get("precision", ""),
            "Device": record.device or record.train.get("device", ""),
            "Compile s": compile_s,
            "Tokens/s": _fmt(tps, ",.0f"),
            "MFU": _fmt(record.mfu, ".0%"),
            "Loss": _fmt(record.final_loss if record.final_loss is not None else record.last_loss, ".4f"),
            "Val loss": _fmt(record.val_loss, ".4f"),
            "Peak GiB": _fmt(record.peak_mem_gib, ".2f"),
        }
        self._filling = True
        try:
            for name, text in texts.items():
                self.item(row, self.column(name)).setText(text)
            state = self.item(row, self.column("State"))
            state.setForeground(QColor(_STATE_COLORS.get(record.state, "#202020")))
            state.setToolTip(record.message)
            if record.split_changes:  # the Micro and Accum cells show the split it trains with now
                self.item(row, self.column("Micro")).setToolTip(
                    f"Changed {record.split_changes}× during the run (out of memory, or fitted before it): "
                    f"the same effective batch; see the Log")
            run_item = self.item(row, self.column("Run"))
            run_item.setToolTip("\n".join(t for t in (record.run_id, record.folder) if t))
            self.item(row, self.column("Precision")).setToolTip(record.precision_reason)
            if record.matmul_peak_flops:
                self.item(row, self.column("MFU")).setToolTip(
                    f"against {record.matmul_peak_flops / 1e9:,.0f} GFLOP/s of {record.precision} GEMMs per process")
        finally:
            self._filling = False
        if self._baseline is None and tps is not None and not self._user_baseline:
            self.set_baseline(record.key)
        else:
            self._refresh_speedups()

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

    def speedup(self, record: RunRecord) -> float | None:
        base = next((r for r in self._records if r.key == self._baseline), None)
        if base is None or not base.median_tokens_per_s or record.median_tokens_per_s is None:
            return None
        return record.median_tokens_per_s / base.median_tokens_per_s

    def _refresh_speedups(self) -> None:
        col = self.column("Speedup")
        self._filling = True
        try:
            for row, record in enumerate(self._records):
                value = self.speedup(record)
                text = "—" if value is None else f"{value:.2f}×"
                if record.key == self._baseline and value is not None:
                    text += " (base)"
                self.item(row, col).setText(text)
        finally:
            self._filling = False

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._filling or item.column() != 0:
            return
        record = self._records[item.row()]
        self._user_baseline = True
        if item.checkState() == Qt.CheckState.Checked:
            self.set_baseline(record.key)
        elif record.key == self._baseline:
            self.set_baseline(None)

    # ------------------------------------------------------------------ selection
    def selected_keys(self) -> set[int]:
        return {self._records[index.row()].key for index in self.selectionModel().selectedRows()}

    def _on_selection(self) -> None:
        keys = self.selected_keys()
        self.selection_changed.emit(keys or None)
