"""The latest text the model generated (sampled at validation or at the end of a run)."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from gui.widgets.shown_text import as_written


class SampleView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sampleView")
        self.header = QLabel("No sample yet: a run generates one at the end (and every N steps if set).")
        self.header.setWordWrap(True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.text, 1)

    def show_sample(self, run_label: str, step: int, text: str) -> None:
        self.header.setText(f"{run_label}, step {step}:")
        self.text.setPlainText(as_written(text))  # a model's text: no direction control reorders it on screen
