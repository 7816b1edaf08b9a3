"""Fitting a top-level window or dialog to the free area of its screen."""

from __future__ import annotations

from PySide6.QtCore import QRect
from PySide6.QtWidgets import QWidget


def fit_within(widget: QWidget, available: QRect) -> None:
    """Shrink ``widget`` to ``available`` (a laptop's 1024 × 640 holds no 1100 × 700 dialog), its title bar and
    borders included once it has been shown, and centre it there; a smaller size is kept."""
    frame = widget.frameGeometry().size() - widget.size()
    widget.resize(min(widget.width(), available.width() - frame.width()),
                  min(widget.height(), available.height() - frame.height()))
    placed = widget.frameGeometry()
    placed.moveCenter(available.center())
    widget.move(placed.topLeft())
