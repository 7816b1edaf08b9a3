"""A word-wrapped label that also wraps a long path or name, which has no space to break at."""

from __future__ import annotations

import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

BREAK = "\u200b"
"""Zero width space: where a line may break, invisible where it does not."""
LONG_RUN = 24
"""A run of this many characters without a space gets places to break."""
_AFTER = re.compile(r"([/\\_.,:;=&?-])")
_RUN = re.compile(rf"\S{{{LONG_RUN},}}")
_PIECE = 24
"""The longest piece a run without separators is left in."""


def breakable(text: str) -> str:
    """``text`` with a place to break after each separator of a long run without spaces (a path, a URL, a run
    id), and every ``_PIECE`` characters in a part still longer: a word-wrapped label wraps it instead of
    growing as wide as it (a long data path pushed the settings column sideways, its labels out of view)."""
    def split(match: re.Match) -> str:
        parts = _AFTER.sub(rf"\1{BREAK}", match.group(0)).split(BREAK)
        return BREAK.join(BREAK.join(p[i:i + _PIECE] for i in range(0, len(p), _PIECE)) or p for p in parts)

    return _RUN.sub(split, text)


class WrappingLabel(QLabel):
    """``QLabel`` with word wrap that wraps long paths too; ``text()`` is the text as set (without the breaks)."""

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self.setWordWrap(True)
        self.setTextFormat(Qt.TextFormat.PlainText)  # a path or message, never markup: "<b>" in a name is shown
        self._text = ""
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._text = text
        super().setText(breakable(text))

    def text(self) -> str:
        return self._text
