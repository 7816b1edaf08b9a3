"""Timestamped messages: run starts and ends, compile results, warnings, errors."""

from __future__ import annotations

import html
import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from gui.widgets.shown_text import log_message

_COLORS = {"info": "#202020", "warning": "#a15c00", "error": "#b00020"}


class LogView(QPlainTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("logView")
        self.setAccessibleName("Log")
        self.setReadOnly(True)
        self.setMaximumBlockCount(5000)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        # Following the newest line is the user's choice, made by scrolling: Qt's own rule (follow while the
        # bar is at its end) lost it at the first resize, whose rewrapping moved the end away from the bar,
        # and the log showed an old line for good.
        self.following = True
        bar = self.verticalScrollBar()
        bar.actionTriggered.connect(lambda _action: QTimer.singleShot(0, self._note_following))  # before it moves
        bar.sliderReleased.connect(self._note_following)
        bar.rangeChanged.connect(self._keep_following)

    def add(self, message: str, level: str = "info", at: float | None = None) -> None:
        """Append ``message``, stamped with ``at`` (seconds since the epoch: when a run's event happened, also
        one read later from its folder) or now; the date too when that is not today."""
        stamp = _stamp(at)
        color = _COLORS.get(level, _COLORS["info"])
        prefix = {"warning": "warning: ", "error": "error: "}.get(level, "")
        self.appendHtml(f'<span style="color:#808080">{stamp}</span> '
                        f'<span style="color:{color}">{html.escape(prefix + log_message(message))}</span>')

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().keyPressEvent(event)  # Page Up, Ctrl+End: a scroll of the user's too
        self._note_following()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._keep_following()

    def _note_following(self) -> None:
        bar = self.verticalScrollBar()
        self.following = bar.value() >= bar.maximum()

    def _keep_following(self, *_range) -> None:
        if self.following:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def messages(self) -> list[str]:
        return self.toPlainText().splitlines()


def _stamp(at: float | None) -> str:
    now = time.localtime()
    try:
        when = time.localtime(at) if isinstance(at, (int, float)) else now
    except (OverflowError, OSError, ValueError):  # a damaged line's time: beyond what the C library can show
        when = now
    same_day = when[:3] == now[:3]
    return time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", when)
