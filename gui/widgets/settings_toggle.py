"""The button that collapses the settings and log column of the window's main splitter, and shows it again."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, Signal
from PySide6.QtWidgets import QSplitter, QToolButton

SETTINGS_MIN_WIDTH = 250
"""The settings scroll sideways below this; the window fits 1024 px (half of a 1920 screen)."""


class SettingsToggle(QToolButton):
    """Checked while the splitter's first widget (the settings column) has room; dragging the handle to the
    edge collapses the column too, and the button follows."""

    shown_changed = Signal(bool)
    """The column was shown or collapsed (by the button, a drag or restored state)."""

    def __init__(self, splitter: QSplitter) -> None:
        super().__init__()
        self.setObjectName("settingsToggle")
        self.setCheckable(True)
        self.setAutoRaise(True)
        self._splitter = splitter
        self._width = 400
        """The column's width before it was collapsed, given back when it is shown."""
        self.toggled.connect(self.show_settings)
        splitter.splitterMoved.connect(self._on_moved)
        self.sync()

    def settings_shown(self) -> bool:
        return self._splitter.sizes()[0] > 0

    def show_settings(self, shown: bool) -> None:
        """Show or collapse the settings and log column (the plots take its room)."""
        sizes = self._splitter.sizes()
        if shown != (sizes[0] > 0):
            total = sum(sizes)
            if shown:
                # Said first: what stands in for the column while it is collapsed (the window's compact Start,
                # Pause and Stop) leaves the plots' side, whose minimum width would otherwise keep the column
                # narrow (257 px of 400 at 1024 px, its controls cut).
                self.shown_changed.emit(True)
                QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)  # their room given back now
                left = min(self._width, total // 2)
                self._splitter.setSizes([left, total - left])
            else:
                self._width = max(sizes[0], SETTINGS_MIN_WIDTH)
                self._splitter.setSizes([0, total])
        self.sync()

    def _on_moved(self, *_) -> None:
        self.sync()
        sizes, least = self._splitter.sizes(), self._splitter.widget(0).minimumSizeHint().width()
        if 0 < sizes[0] < least:  # dragged out of its collapse by a few pixels (its minimum was one): all of it
            left = min(least, sum(sizes) // 2)
            self._splitter.setSizes([left, sum(sizes) - left])

    def sync(self, *_) -> None:
        """Check state, text and tooltip from the splitter (after a drag, or restored splitter state)."""
        shown = self.settings_shown()
        # A splitter's minimum width counts a collapsed column's minimum too: collapsing widened the window (to
        # 1,032 px, past a 1024 px screen). One pixel while collapsed; its own minimum again while shown.
        self._splitter.widget(0).setMinimumWidth(0 if shown else 1)
        self.blockSignals(True)
        self.setChecked(shown)
        self.blockSignals(False)
        self.setText("◀ settings" if shown else "▶ settings")
        self.setToolTip("Hide the settings and log (more room for the plots)" if shown
                        else "Show the settings and log")
        self.shown_changed.emit(shown)
