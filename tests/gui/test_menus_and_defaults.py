"""The Run menu, the defaults a first run gets, and the one-line tooltips of the speed settings."""

from __future__ import annotations

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QMenu

from core.config import config_from_preset
from gui.widgets.config_panel import CPU_TINY_STEPS, first_run_budget, presets_with
from tests.gui.conftest import child, wait_idle, wait_steps


def _menu_state(window) -> dict[str, bool]:
    return {text: action.isEnabled() for text, action in window.actions.items()
            if text in ("Start", "Pause", "Resume", "Stop", "Continue with these settings")}


def test_the_run_menu_offers_pause_and_continue_and_stop_only_while_running(qtbot, make_window):
    window = make_window(train={"budget": 1_000_000})
    assert _menu_state(window) == {"Start": True, "Pause": False, "Stop": False,
                                   "Continue with these settings": False}
    # No model yet: File ▸ Save model… is disabled as the Save button is, and enabled with it.
    assert not window.actions["Save model…"].isEnabled() and not window.controls.save.isEnabled()
    assert "recommends the fastest" in window.tune_action.toolTip()
    window.actions["Start"].trigger()
    record = wait_steps(qtbot, window, 1)
    assert _menu_state(window) == {"Start": False, "Pause": True, "Stop": True,
                                   "Continue with these settings": True}
    # A greyed item says why, as its button does (the speed advisor had nothing to say).
    assert not window.tune_action.isEnabled() and window.tune_action.toolTip().startswith("Waits for the run to end")
    assert window.actions["Start"].toolTip() == window.controls.start.toolTip() != ""
    assert all(menu.toolTipsVisible() for menu in window.menuBar().findChildren(QMenu))
    pause = window.actions["Pause"]
    pause.trigger()
    qtbot.waitUntil(lambda: record.state == "paused")
    assert pause.text() == "Resume"
    pause.trigger()
    qtbot.waitUntil(lambda: record.state == "training")
    assert pause.text() == "Pause"
    window.actions["Stop"].trigger()
    wait_idle(qtbot, window)
    assert record.state == "stopped"
    assert not window.actions["Stop"].isEnabled() and not pause.isEnabled()
    assert window.actions["Continue with these settings"].isEnabled()  # from its final checkpoint
    assert window.actions["Save model…"].isEnabled() and window.controls.save.isEnabled()
    assert record.device == "cpu (1 thread)"  # singular (the tests train on one torch thread)


def test_the_default_seed_is_the_cli_s(window):
    from core.cli import build_parser, config_from_args

    cli = config_from_args(build_parser().parse_args(["train"]))
    assert window.config_panel.seed.value() == cli.train.seed == 1337
    window.config_panel.preset.setCurrentIndex(window.config_panel.preset.findData("tiny"))
    assert window.config_panel.config.train.seed == cli.train.seed


def test_the_first_run_budget_fits_the_machine():
    cpu, gpu = presets_with(None, ["cpu"]), presets_with(None, ["cpu", "cuda", "cuda:0"])
    assert cpu["tiny"].train.budget == CPU_TINY_STEPS and cpu["tiny"].train.budget_kind == "steps"
    assert gpu["tiny"].train.budget == config_from_preset("tiny").train.budget  # a GPU keeps the preset's
    for name in ("small", "base"):  # the same work in FLOPs as tiny's first run, at least 10 steps
        assert 10 <= cpu[name].train.budget < CPU_TINY_STEPS
        assert first_run_budget(config_from_preset(name), gpu=True) == config_from_preset(name).train.budget


def test_speed_settings_say_in_one_line_what_they_do(window):
    for name in ("accumStepsSpin", "compileModeCombo", "compileScopeCombo", "precisionCombo", "budgetSpin"):
        tip = child(window, name).toolTip()
        assert tip and "\n" not in tip, name
        assert "memory" in tip and ("math" in tip or "the update" in tip or "rounding" in tip
                                    or "learning rate" in tip), (name, tip)
    assert "minute" in child(window, "budgetSpin").toolTip()


def test_every_file_menu_entry_has_a_key_where_the_platform_binds_none(window):
    """Quit's standard key is empty on X11 without a desktop theme (and offscreen): File ▸ Quit listed no key and
    Ctrl+Q did nothing."""
    for text in ("Open run folders…", "Save model…", "Load weights…", "Quit"):
        assert not window.actions[text].shortcut().isEmpty(), text
    assert window.actions["Quit"].shortcut().toString() in ("Ctrl+Q", QKeySequence(QKeySequence.StandardKey.Quit)
                                                            .toString())


def test_tab_takes_a_field_scrolled_out_of_sight_into_view_and_passes_the_plots_by(qtbot, make_window):
    """Tab wrapping round from the run table gave the Preset field focus while the settings column was scrolled to
    its end, out of sight; and the four plots were Tab stops that showed no focus and took no key."""
    from PySide6.QtCore import Qt

    window = make_window()
    window.resize(1024, 640)
    qtbot.waitUntil(lambda: window.settings_scroll.verticalScrollBar().maximum() > 0)
    bar = window.settings_scroll.verticalScrollBar()
    bar.setValue(bar.maximum())
    preset = child(window, "presetCombo")
    window.table.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(window.table.hasFocus)
    preset.setFocus(Qt.FocusReason.TabFocusReason)  # where Tab goes next from the table: round to the first field
    qtbot.waitUntil(preset.hasFocus)
    top = preset.mapTo(window.settings_scroll.viewport(), preset.rect().topLeft()).y()
    assert 0 <= top <= window.settings_scroll.viewport().height() - preset.height()
    for name in ("lossPlot", "lrPlot", "throughputPlot", "memoryPlot"):
        assert child(window, name).focusPolicy() == Qt.FocusPolicy.ClickFocus


def test_continue_and_save_greyed_at_start_say_why(window):
    """Greyed with their generic tooltips ("Start a new run from …"), they said what they do, not why they could
    not (after a job in several processes too: its weights are in its processes)."""
    from gui.main_window import NOTHING_TO_CONTINUE, NOTHING_TO_SAVE

    continue_, save = child(window, "continueButton"), child(window, "saveButton")
    assert not continue_.isEnabled() and continue_.toolTip() == NOTHING_TO_CONTINUE
    assert not save.isEnabled() and save.toolTip() == NOTHING_TO_SAVE
