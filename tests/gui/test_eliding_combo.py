"""Combo boxes end a text they cut in an ellipsis."""

from __future__ import annotations

from gui.widgets.eliding_combo import ElidingComboBox

LONG = "auto (bf16: training 1.5× faster than fp32 on this CPU)"


def test_a_text_wider_than_the_box_ends_in_an_ellipsis_and_a_short_one_is_whole(qtbot):
    combo = ElidingComboBox()
    qtbot.addWidget(combo)
    combo.addItems([LONG, "fp32"])
    combo.setMinimumContentsLength(10)
    combo.setSizeAdjustPolicy(ElidingComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.resize(150, combo.sizeHint().height())
    combo.show()
    shown = combo.shown_text()
    assert shown.endswith("…") and LONG.startswith(shown[:-1]) and len(shown) < len(LONG), shown
    combo.grab()  # drawn with it (the paint path runs)
    combo.resize(combo.fontMetrics().horizontalAdvance(LONG) + 80, combo.height())
    assert combo.shown_text() == LONG
    combo.setCurrentIndex(1)
    assert combo.shown_text() == "fp32"


def test_the_settings_panel_s_combos_elide(window):
    from PySide6.QtWidgets import QComboBox

    combos = [c for c in window.config_panel.findChildren(QComboBox)]
    assert combos and all(isinstance(c, ElidingComboBox) for c in combos)
