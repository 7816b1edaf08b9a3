"""The mouse wheel over a scrolled form scrolls it: it changes a field only once the user has chosen the field.

Qt's spin boxes and combo boxes take every wheel turn over them, focused or not: scrolling the settings column
with the pointer resting on a field changed that field silently (Precision went from auto to fp16). A field
here changes by the wheel only while it has the keyboard focus (clicked or tabbed into, as in browsers'
forms); otherwise the turn goes to the scroll area around it, or nowhere.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget


class WheelGuard(QObject):
    """Event filter of ``guard_wheel``; parented to the form, so it lives and dies with it on the GUI thread."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() != QEvent.Type.Wheel or not isinstance(watched, QWidget) or watched.hasFocus():
            return False
        area = _scroll_area_around(watched)
        if area is not None:
            QCoreApplication.sendEvent(area.viewport(), event)
        return True  # never the field's own: its value stays


def _scroll_area_around(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QAbstractScrollArea):
        parent = parent.parentWidget()
    return parent


def guard_wheel(form: QWidget) -> None:
    """Every spin box and combo box below ``form`` changes by the wheel only while focused; the wheel alone
    no longer gives them the focus either."""
    guard = WheelGuard(form)
    for field in form.findChildren(QAbstractSpinBox) + form.findChildren(QComboBox):
        field.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        field.installEventFilter(guard)
