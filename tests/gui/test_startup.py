"""Start-up on a fresh Linux desktop: missing X11 libraries are named, with the one command that installs them."""

from __future__ import annotations

import sys

import pytest

from gui import app


@pytest.fixture
def x11_desktop(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    for name in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY", "XDG_SESSION_TYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(app, "_x11_problem", lambda: None)  # its X server answers


def test_missing_xcb_libraries_are_named_with_one_apt_get_line(x11_desktop, monkeypatch, capsys):
    gone = {"libxcb-cursor.so.0", "libxkbcommon-x11.so.0", "libgthread-2.0.so.0", "libglib-2.0.so.0"}
    monkeypatch.setattr(app, "_loadable", lambda soname: soname not in gone)
    assert app.main([]) == 2  # before any QApplication: Qt would abort without naming them
    err = capsys.readouterr().err
    assert err.startswith("speedboard: error: the window needs system libraries")
    assert "libxcb-cursor.so.0" in err and "Traceback" not in err
    (command,) = [line.strip() for line in err.splitlines() if "apt-get" in line]
    assert command == "sudo apt-get install -y libxcb-cursor0 libxkbcommon-x11-0 libglib2.0-0"


def test_qt_s_own_system_libraries_are_checked_before_qt_is_imported(monkeypatch, capsys):
    import subprocess

    # Importing the start-up module imports no Qt: a missing libEGL cannot fail the import before the check.
    code = "import sys; sys.modules['PySide6.QtGui'] = None; import gui.app"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # not X11: Qt's GUI module still needs them
    monkeypatch.setattr(app, "_loadable", lambda soname: soname != "libEGL.so.1")
    assert app.main([]) == 2
    err = capsys.readouterr().err
    assert "missing: libEGL.so.1" in err and "Traceback" not in err
    assert [line.strip() for line in err.splitlines() if "apt-get" in line] == ["sudo apt-get install -y libegl1"]


@pytest.mark.parametrize(("env", "checked"), [
    ({"QT_QPA_PLATFORM": "offscreen"}, False),
    ({"QT_QPA_PLATFORM": "xcb"}, True),
    ({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}, False),
    ({}, True),
])
def test_only_the_xcb_platform_is_checked(x11_desktop, monkeypatch, env, checked):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    asked: list[str] = []
    monkeypatch.setattr(app, "_loadable", lambda soname: asked.append(soname) or True)
    assert app.missing_xcb_libraries() == []
    assert bool(asked) is checked
    if checked:
        assert set(asked) == set(app.XCB_LIBRARIES)


def test_the_readme_lists_the_same_packages():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if "apt-get install -y libxcb" in line)
    assert set(line.split("install -y", 1)[1].split()) == {*app.XCB_LIBRARIES.values(), *app.QT_GUI_LIBRARIES.values()}


@pytest.mark.parametrize("damage", [
    "[session]\nrun_folders=null\n", "[session]\nrun_folders=5\n", "[session]\nrun_folders=[[[[[\n",
    "[window]\ngeometry=garbage\nmain_splitter=garbage\n",
    "[window]\nmain_splitter=@ByteArray(\\0\\0\\0\\xff)\n",  # a state cut short: it collapsed the settings
    "[config]\naccum=99999999999999999999\nmicro_batch=5e3\nseq_len=-4\nwarmup=1.5\n",
    "[config]\nbudget=nan\nseed=nan\nlr=inf\npreset=tiny, small\ndevice=cpu, cuda\n",
    "[plots]\nx_axis=step, time\nsmoothing=1e400\nlog_scale=maybe\n",
    "[paths]\nlast_dir=a, b\nsave_dir=@Invalid()\n",
])
def test_a_damaged_settings_file_keeps_the_defaults_and_the_window_opens(qtbot, make_window, settings_path, damage):
    """A hand-edited or cut-short settings file stopped the window from opening (a traceback, then "QThread:
    Destroyed while thread is still running"); a budget of nan came back as 9,007,199,254,740,991."""
    defaults = make_window()
    expected = (defaults.config_panel.budget.number(), defaults.config_panel.seed.number(),
                defaults.config_panel.accum.value(), defaults.config_panel.micro_batch.value(),
                defaults.plots.smoothing.value(), defaults.plots.log_scale.isChecked())
    defaults.close()
    settings_path.write_text(damage)
    window = make_window()
    panel = window.config_panel
    assert (panel.budget.number(), panel.seed.number(), panel.accum.value(), panel.micro_batch.value(),
            window.plots.smoothing.value(), window.plots.log_scale.isChecked()) == expected
    assert panel.config is not None, panel.error
    assert not window.geometry_restored and window.session.records == []
    assert window.main_splitter.sizes()[0] > 0  # the settings column shown


def test_the_icon_loads_and_the_desktop_entry_names_it_and_the_command(qtbot):
    """The window icon and the desktop entry ship with the app (assets/), and agree with each other."""
    import configparser
    import tomllib
    from pathlib import Path

    from PySide6.QtGui import QIcon

    from assets import DESKTOP_ENTRY, ICON

    icon = QIcon(str(ICON))
    assert not icon.isNull() and not icon.pixmap(64, 64).isNull()  # the SVG renders
    entry = configparser.ConfigParser(interpolation=None)
    entry.read(DESKTOP_ENTRY, encoding="utf-8")
    desktop = entry["Desktop Entry"]
    assert desktop["Icon"] == ICON.stem and desktop["Exec"] == "speedboard gui" and desktop["Type"] == "Application"
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["speedboard"]  # the command the entry runs is installed
    files = project["tool"]["setuptools"]["data-files"]
    assert files["share/applications"] == ["assets/speedboard.desktop"]
    assert files["share/icons/hicolor/scalable/apps"] == ["assets/speedboard.svg"]


def test_a_collapsed_settings_column_comes_back_collapsed_and_a_shown_one_shown(qtbot, make_window):
    """What the splitters' states are checked for (a state cut short collapsed the column) lets whole ones by."""
    first = make_window()
    first.settings_button.click()
    assert not first.settings_shown()
    first.save_settings()
    assert not make_window().settings_shown()
    shown = make_window()
    shown.settings_button.click()
    shown.save_settings()
    assert make_window().settings_shown()
