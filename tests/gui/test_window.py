"""The window without training: controls, live validation, remembered settings."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QComboBox, QPushButton, QSpinBox, QTableWidget

from core.config import COMPILE_MODES
from tests.gui.conftest import child

REQUIRED = {
    "presetCombo": QComboBox, "microBatchSpin": QSpinBox, "accumStepsSpin": QSpinBox,
    "compileModeCombo": QComboBox, "startButton": QPushButton, "pauseButton": QPushButton,
    "stopButton": QPushButton, "continueButton": QPushButton, "saveButton": QPushButton,
    "loadButton": QPushButton, "runTable": QTableWidget,
}


def test_named_widgets_exist_with_their_types(window):
    for name, cls in REQUIRED.items():
        assert isinstance(child(window, name), cls), name
    for name in ("lossPlot", "lrPlot", "throughputPlot", "memoryPlot"):
        assert child(window, name).isVisible()
    modes = child(window, "compileModeCombo")
    assert [modes.itemData(i) for i in range(modes.count())] == list(COMPILE_MODES)
    assert child(window, "accumStepsSpin").maximum() == 1024
    assert child(window, "accumStepsSpin").minimum() == 1


def test_idle_window_offers_start_only(window):
    assert child(window, "startButton").isEnabled()
    for name in ("pauseButton", "stopButton", "continueButton", "saveButton"):
        assert not child(window, name).isEnabled(), name


def test_effective_batch_follows_micro_batch_and_accumulation(window):
    child(window, "microBatchSpin").setValue(4)
    child(window, "accumStepsSpin").setValue(3)
    # micro preset: sequences of 32 tokens
    assert child(window, "effectiveBatchLabel").text() == "12 sequences · 384 tokens per step"
    assert window.config_panel.config.tokens_per_step() == 384


def test_invalid_combination_is_explained_next_to_the_control_before_start(window):
    accum, mode = child(window, "accumStepsSpin"), child(window, "compileModeCombo")
    accum.setValue(4)
    mode.setCurrentIndex(mode.findData("reduce-overhead"))
    error = child(window, "compile_modeError")
    assert not child(window, "startButton").isEnabled()
    assert error.isVisibleTo(window)
    assert "CUDA graphs" in error.text() and "max-autotune-no-cudagraphs" in error.text()
    assert not child(window, "seq_lenError").isVisibleTo(window)

    accum.setValue(1)
    assert child(window, "startButton").isEnabled()
    assert not error.isVisibleTo(window)

    child(window, "seqLenSpin").setValue(128)  # the micro model has 64 positions
    seq_error = child(window, "seq_lenError")
    assert seq_error.isVisibleTo(window)
    assert "beyond the model's 64 positions" in seq_error.text()
    assert not child(window, "startButton").isEnabled()


def test_why_start_is_grey_is_in_sight_and_in_its_tooltip(qtbot, window):
    """A budget of 0 was said under a row scrolled out of view: grey buttons and nothing on screen saying why."""
    window.resize(1024, 640)
    scroll = window.settings_scroll
    scroll.verticalScrollBar().setValue(0)
    window.config_panel.budget.setValue(0)
    error = child(window, "budgetError")
    start, again = child(window, "startButton"), child(window, "continueButton")
    assert not start.isEnabled() and "budget must be positive" in error.text()
    assert start.toolTip() == again.toolTip() == f"Cannot run these settings: {error.text()}"

    def in_sight() -> bool:
        top = error.mapTo(scroll.widget(), error.rect().topLeft()).y() - scroll.verticalScrollBar().value()
        return 0 <= top and top + error.height() <= scroll.viewport().height()

    assert not in_sight()  # below the fold of a 1024 × 640 window
    qtbot.waitUntil(in_sight)
    window.config_panel.budget.setValue(10)
    assert start.isEnabled() and start.toolTip() == "Start a new run with these settings"


def test_missing_data_file_is_explained_before_start(window, dialogs, tmp_path):
    dialogs.files["getOpenFileName"] = str(tmp_path / "gone.txt")
    child(window, "dataFileButton").click()
    assert "does not exist" in child(window, "sourceError").text()
    assert not child(window, "startButton").isEnabled()
    child(window, "dataBuiltinButton").click()
    assert child(window, "startButton").isEnabled()


def test_settings_of_the_last_session_are_remembered(make_window):
    first = make_window()
    child(first, "accumStepsSpin").setValue(3)
    mode = child(first, "compileModeCombo")
    mode.setCurrentIndex(mode.findData("default"))
    child(first, "xAxisCombo").setCurrentIndex(child(first, "xAxisCombo").findData("tokens"))
    first.close()
    assert first.session.controller.thread_finished

    second = make_window()
    assert child(second, "accumStepsSpin").value() == 3
    assert child(second, "compileModeCombo").currentData() == "default"
    assert second.plots.x_axis == "tokens"
    assert second.config_panel.preset.currentData() == "micro"


def test_no_display_gives_one_clear_line(monkeypatch, capsys):
    import sys

    from gui import app

    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    assert app.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no display" in err and "speedboard train" in err


@pytest.mark.parametrize("env, says", [
    ({"DISPLAY": ":987"}, "cannot connect to the X display ':987' (is its X server running?)"),
    ({"QT_QPA_PLATFORM": "xcb"}, "no display found (DISPLAY is not set)"),
    ({"QT_QPA_PLATFORM": "bogus"}, "QT_QPA_PLATFORM=bogus names no Qt platform plugin here (these exist: "),
    ({"WAYLAND_DISPLAY": "wayland-9"}, "cannot connect to the Wayland display 'wayland-9' (is a compositor"),
    ({"QT_QPA_PLATFORM": "wayland", "XDG_RUNTIME_DIR": None}, "no Wayland display: XDG_RUNTIME_DIR is not set"),
])
def test_a_display_named_but_not_reachable_gives_one_clear_line(monkeypatch, capsys, tmp_path, env, says):
    """Qt aborted (exit 134, eight lines, a hint about a library that was installed) where a display variable
    was set but nothing answered, or the platform named did not exist."""
    import sys

    from gui import app

    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no compositor's socket in it
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert app.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speedboard: error: ") and says in err, err
    assert "xvfb-run speedboard gui" in err or "bogus" in err


def test_qt_binding_keeps_none_alive():
    """Why PySide6 6.12.0 is excluded: each void call dropped a reference to None (an abort on Python 3.11)."""
    import sys

    from PySide6.QtGui import QImage, QPainter

    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    before = sys.getrefcount(None)
    for _ in range(2000):
        painter.setOpacity(1.0)
    after = sys.getrefcount(None)
    painter.end()
    assert after > before - 100


def test_torch_thread_gets_the_gil_back_quickly(window):
    """While the GUI thread runs Python, the torch thread waits at most the switch interval per operator."""
    import sys

    from gui.controller import GIL_SWITCH_INTERVAL_S

    assert sys.getswitchinterval() <= GIL_SWITCH_INTERVAL_S < 0.005  # Python's default is 5 ms


def test_the_empty_loss_plot_says_a_started_run_is_setting_up_not_press_start(qtbot, window):
    from gui.widgets.plot_panel import EMPTY_HINT
    from tests.gui.conftest import click, wait_idle

    hint = child(window, "lossPlotHint")
    assert hint.text() == EMPTY_HINT and hint.isVisible()
    assert "Open run folders…" in EMPTY_HINT  # the File menu's own words
    click(window, "startButton")  # the run exists at once; its first step comes later, on the torch thread
    record = window.session.records[-1]  # its events reach this thread in the event loop: none yet
    assert record.step == 0 and hint.isVisible()
    assert hint.text() == f"{record.label} is setting up.\nIts curves begin with its first optimizer step."
    wait_idle(qtbot, window)
    window.plots.refresh(force=True)  # the curves are drawn at the redraw pacer's next frame
    assert record.state == "finished" and not hint.isVisible()


def test_the_settings_column_comes_back_as_wide_as_it_was(qtbot, window):
    """Collapsed and shown again at 1024 px, it came back 257 px wide of 400, its controls cut: the compact
    Start/Pause/Stop that stand in for it still held the plots' side wide when its room was given back."""
    window.resize(1024, 640)
    qtbot.waitUntil(lambda: window.width() == 1024)
    before = window.main_splitter.sizes()[0]
    toggle = child(window, "settingsToggle")
    toggle.click()
    assert window.main_splitter.sizes()[0] == 0
    toggle.click()
    assert window.main_splitter.sizes()[0] == before


def test_start_by_its_shortcut_while_a_number_is_typed_takes_it_as_the_field_left(qtbot, window):
    """Ctrl+Return does not leave the field: a run started with accumulation 204 while it read 2048."""
    from PySide6.QtCore import Qt

    field = child(window, "accumStepsSpin")
    window.activateWindow()
    field.setFocus()
    field.lineEdit().selectAll()
    qtbot.keyClicks(field.lineEdit(), "2048")
    qtbot.keyClick(field.lineEdit(), Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert window.session.active is not None, "the shortcut started nothing"
    assert window.session.active.train["accum_steps"] == 1024 and field.value() == 1024


def test_tab_reaches_the_settings_button_where_it_stands_before_the_plots_options(window):
    """It sits at the top left of the plots, yet Tab reached it last, after the run table."""
    from PySide6.QtCore import Qt

    def next_focusable(widget):
        widget = widget.nextInFocusChain()
        while not (widget.focusPolicy() & Qt.FocusPolicy.TabFocus and widget.isVisibleTo(window)
                   and widget.isEnabled()):
            widget = widget.nextInFocusChain()
        return widget

    assert next_focusable(window.settings_button) is window.plots.x_axis_combo
    reached, widget = [], window.settings_button
    for _ in range(200):  # once round the chain
        widget = next_focusable(widget)
        reached.append(widget)
        if widget is window.settings_button:
            break
    # Round the chain: the settings column, the log below it, then the button, not the run table.
    assert reached[-2].objectName() == "logView" and window.table in reached[:-2]


def test_tab_leaves_the_run_table(qtbot, window, tmp_path):
    """Tab moved between the table's cells: a keyboard user who reached it could leave only by a shortcut."""
    from PySide6.QtCore import Qt

    from tests.gui.test_dashboard_view import open_runs

    open_runs(window, tmp_path, 2)
    window.activateWindow()
    window.table.setFocus()
    window.table.setCurrentCell(0, 1)
    qtbot.keyClick(window.table, Qt.Key.Key_Tab)
    assert not window.table.hasFocus() and window.focusWidget() is not None
    window.table.setFocus()
    qtbot.keyClick(window.table, Qt.Key.Key_Backtab)  # (with ShiftModifier, QTest left Shift held for later tests)
    assert not window.table.hasFocus()
