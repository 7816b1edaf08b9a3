"""A combo box whose shown text ends in an ellipsis where the box is narrower than it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox, QStylePainter


class ElidingComboBox(QComboBox):
    """Qt clips a combo's text at its edge, mid-letter ("auto (bf16: training 1.5× faster than fp"): here it is
    elided ("… faster th…"), so a cut text reads as cut. The popup shows every item whole."""

    def shown_text(self) -> str:
        """The current text as drawn: elided to the box's text field."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        return self._elided(option)

    def _elided(self, option: QStyleOptionComboBox) -> str:
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        return self.fontMetrics().elidedText(option.currentText, Qt.TextElideMode.ElideRight, field.width())

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if self.isEditable():
            super().paintEvent(event)  # the line edit draws its own text
            return
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        option.currentText = self._elided(option)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)
