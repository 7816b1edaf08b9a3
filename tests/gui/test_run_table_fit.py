"""The run table's columns give way to its width without a layout loop."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from gui.widgets.run_table import COLUMNS, RunTable


def _hidden(table: RunTable) -> tuple[bool, ...]:
    return tuple(table.isColumnHidden(c) for c in range(len(COLUMNS)))


def test_fitting_is_stable_at_every_width(qtbot):
    table = RunTable()
    qtbot.addWidget(table)
    table.show()
    fits = []
    original = table.fit_columns

    def counted() -> None:
        fits.append(1)
        original()

    table.fit_columns = counted
    table._fit_timer.timeout.disconnect()
    table._fit_timer.timeout.connect(counted)
    for width in range(260, 1500, 9):
        table.resize(width, 200)
        table.fit_columns()
        first = _hidden(table)
        for _ in range(5):
            QApplication.processEvents()
        fits.clear()
        for _ in range(5):
            QApplication.processEvents()
        # A hidden column's header reports no size: once it gave way it must not come back and go again.
        assert not fits, f"the columns keep refitting at width {width}"
        assert _hidden(table) == first, f"the visible columns flip at width {width}"
        assert not table.isColumnHidden(COLUMNS.index("Run"))
