"""Timestamped messages: run starts and ends, compile results, warnings, errors."""

from __future__ import annotations

import html
import time

from PySide6.QtWidgets import QPlainTextEdit, QWidget

_COLORS = {"info": "#202020", "warning": "#a15c00", "error": "#b00020"}


class LogView(QPlainTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("logView")
        self.setReadOnly(True)
        self.setMaximumBlockCount(5000)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)

    def add(self, message: str, level: str = "info") -> None:
        stamp = time.strftime("%H:%M:%S")
        color = _COLORS.get(level, _COLORS["info"])
        prefix = {"warning": "warning: ", "error": "error: "}.get(level, "")
        self.appendHtml(f'<span style="color:#808080">{stamp}</span> '
                        f'<span style="color:{color}">{html.escape(prefix + message)}</span>')

    def messages(self) -> list[str]:
        return self.toPlainText().splitlines()
