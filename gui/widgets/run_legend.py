"""The runs' legend, above the plots and outside their curves: one checkable entry per run.

An entry's tick is the run's visibility, the same one the table's selection sets
(``PlotPanel`` keeps it): unticking hides the run in every plot, ticking brings it
back. Each entry shows the run's colour and dash pattern, as its curves do.
"""

from __future__ import annotations

from collections.abc import Hashable

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QListView, QListWidget, QListWidgetItem, QWidget

from gui.widgets.metric_plot import DASH_STYLES

SWATCH = QSize(30, 12)
KEY_ROLE = Qt.ItemDataRole.UserRole + 1


def swatch(color: str, dash: str, size: QSize = SWATCH) -> QIcon:
    """A short line in the run's colour and dash pattern: the run's mark in the legend and the table; blank
    for no colour (a run without curves that gave its colour back)."""
    pixmap = QPixmap(size)
    pixmap.fill(Qt.GlobalColor.transparent)
    if not color:
        return QIcon(pixmap)
    painter = QPainter(pixmap)
    pen = QPen(QColor(color), 2.5)
    pen.setStyle(DASH_STYLES.get(dash, Qt.PenStyle.SolidLine))
    painter.setPen(pen)
    painter.drawLine(1, size.height() // 2, size.width() - 1, size.height() // 2)
    painter.end()
    return QIcon(pixmap)


class RunLegend(QListWidget):
    toggled = Signal(object, bool)
    """``(key, visible)``: the user ticked or unticked a run."""

    ROWS = 2
    """Rows shown before it scrolls: many runs do not push the plots away."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("runLegend")
        self.setAccessibleName("Runs shown in the plots")
        self.setFlow(QListView.Flow.LeftToRight)
        self.setWrapping(True)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setIconSize(SWATCH)
        self.setSpacing(1)
        self.setSelectionMode(QListWidget.SelectionMode.NoSelection)
        # Reached by Tab (a click ticks without taking the focus from a field being typed in): the arrows move
        # between entries, Space ticks or unticks one.
        self.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setToolTip("Tick or untick a run to show or hide its curves in every plot (keyboard: Tab to here, "
                        "the arrows, Space)")
        self.setFrameShape(QListWidget.Shape.NoFrame)
        self._items: dict[Hashable, QListWidgetItem] = {}
        self._pressed: tuple[QListWidgetItem, Qt.CheckState] | None = None
        self._filling = False
        self.itemChanged.connect(self._on_item_changed)
        self.setVisible(False)

    def _fit_height(self) -> None:
        self.setVisible(bool(self._items))
        if not self._items:
            return
        # The rows as the view wraps the entries now: its own layout waits for the next event loop turn, and
        # a count made beside it (from the entries' widths before a resize) showed 1 row of 2 at 1024 px wide,
        # the last run's entry out of sight with no scroll bar to reach it.
        self.doItemsLayout()
        rows = len({self.visualItemRect(self.item(i)).top() for i in range(self.count())})
        row = self.sizeHintForRow(0) + 2 * self.spacing()
        self.setFixedHeight(min(rows, self.ROWS) * row + 2 * self.frameWidth() + 2)

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        item = self.itemAt(event.position().toPoint())
        self._pressed = (item, item.checkState()) if item is not None else None
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().mouseReleaseEvent(event)
        pressed, self._pressed = self._pressed, None
        item = self.itemAt(event.position().toPoint())
        # A click on an entry's name ticks it as its box does: only the box did, and a click on the name of a
        # run (what a user aims at) did nothing. A click on the box was handled by the view: its state changed.
        if pressed is not None and item is pressed[0] and item.checkState() == pressed[1] \
                and event.button() == Qt.MouseButton.LeftButton:
            item.setCheckState(Qt.CheckState.Unchecked if pressed[1] == Qt.CheckState.Checked
                               else Qt.CheckState.Checked)

    def focusInEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if self.currentRow() < 0 and self.count():
            self.setCurrentRow(0)  # an entry to act on, shown by its focus frame
        super().focusInEvent(event)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_height()

    def set_run(self, key: Hashable, color: str, dash: str, label: str, visible: bool = True) -> None:
        """Add run ``key``'s entry, or update its mark and label."""
        self._filling = True
        try:
            item = self._items.get(key)
            if item is None:
                item = QListWidgetItem(label)
                item.setData(KEY_ROLE, key)
                item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(Qt.CheckState.Checked if visible else Qt.CheckState.Unchecked)
                self.addItem(item)
                self._items[key] = item
            item.setText(label)
            item.setIcon(swatch(color, dash))
        finally:
            self._filling = False
        self._fit_height()

    def remove_run(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.takeItem(self.row(item))
        self._fit_height()

    def set_visible(self, key: Hashable, visible: bool) -> None:
        item = self._items.get(key)
        if item is None:
            return
        self._filling = True
        try:
            item.setCheckState(Qt.CheckState.Checked if visible else Qt.CheckState.Unchecked)
        finally:
            self._filling = False

    def is_checked(self, key: Hashable) -> bool:
        item = self._items.get(key)
        return item is not None and item.checkState() == Qt.CheckState.Checked

    def item_of(self, key: Hashable) -> QListWidgetItem | None:
        return self._items.get(key)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if not self._filling:
            self.toggled.emit(item.data(KEY_ROLE), item.checkState() == Qt.CheckState.Checked)
