"""Start-up: ``speedboard gui`` (and ``make run``) open the dashboard here."""

from __future__ import annotations

import os
import signal
import sys

# Qt is imported in main(), after the checks: Qt's GUI module itself links system libraries (EGL, fontconfig),
# and importing it without one fails with an ImportError that names a file, not the package that has it.


def _no_display_reason() -> str | None:
    """On Linux without X11/Wayland Qt would abort; say so in one line instead."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return ("no display found (DISPLAY is not set): on a machine without a screen, train with "
            "`speedboard train`, or run the dashboard under `xvfb-run speedboard gui`")


# Qt's X11 platform plugin (libqxcb.so and libQt6XcbQpa.so) links these; pip cannot install them, and without
# one Qt aborts with "could not load the Qt platform plugin xcb", which does not name it. soname -> Debian package.
XCB_LIBRARIES = {
    "libxcb.so.1": "libxcb1", "libX11.so.6": "libx11-6", "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0", "libxcb-icccm.so.4": "libxcb-icccm4", "libxcb-util.so.1": "libxcb-util1",
    "libxcb-image.so.0": "libxcb-image0", "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0", "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0", "libxcb-shm.so.0": "libxcb-shm0", "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0", "libxcb-xkb.so.1": "libxcb-xkb1", "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0", "libGL.so.1": "libgl1", "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
}


# Qt's GUI module (libQt6Gui.so) links these on every platform, offscreen included; a desktop has them, a
# minimal system may not.
QT_GUI_LIBRARIES = {"libEGL.so.1": "libegl1", "libfontconfig.so.1": "libfontconfig1",
                    "libfreetype.so.6": "libfreetype6"}


def _qt_platform() -> str:
    """The platform plugin Qt will pick on Linux: QT_QPA_PLATFORM's first, else wayland in a Wayland session,
    else xcb (X11) when there is a display."""
    name = os.environ.get("QT_QPA_PLATFORM", "")
    if name:
        return name.split(";")[0].split(":")[0].strip()
    if os.environ.get("WAYLAND_DISPLAY") and os.environ.get("XDG_SESSION_TYPE") == "wayland":
        return "wayland"
    return "xcb" if os.environ.get("DISPLAY") else ""


def _loadable(soname: str) -> bool:
    import ctypes

    try:
        ctypes.CDLL(soname)  # found the way Qt's plugin would find it (the dynamic loader's search path)
    except OSError:
        return False
    return True


def missing_xcb_libraries() -> list[str]:
    """System libraries Qt's X11 plugin needs that cannot be loaded; [] elsewhere than Linux with xcb."""
    if not sys.platform.startswith("linux") or _qt_platform() != "xcb":
        return []
    return [soname for soname in XCB_LIBRARIES if not _loadable(soname)]


def missing_system_libraries() -> list[str]:
    """System libraries the window needs here that cannot be loaded: Qt's GUI module's, and on X11 its
    plugin's; [] elsewhere than Linux."""
    if not sys.platform.startswith("linux"):
        return []
    gui = [soname for soname in QT_GUI_LIBRARIES if not _loadable(soname)]
    return gui + [soname for soname in missing_xcb_libraries() if soname not in gui]


def _missing_libraries_message(missing: list[str]) -> str:
    packages = " ".join(dict.fromkeys({**QT_GUI_LIBRARIES, **XCB_LIBRARIES}[name] for name in missing))
    what = "for X11 " if all(name in XCB_LIBRARIES for name in missing) else ""
    return (f"the window needs system libraries {what}that pip cannot install (missing: {', '.join(missing)}); "
            f"on Debian/Ubuntu install them with:\n    sudo apt-get install -y {packages}")


def main(argv: list[str] | None = None) -> int:
    reason = _no_display_reason()
    if reason:
        print(f"speedboard: error: {reason}", file=sys.stderr)
        return 2
    missing = missing_system_libraries()  # before Qt, which would abort with a message that names none of them
    if missing:
        print(f"speedboard: error: {_missing_libraries_message(missing)}", file=sys.stderr)
        return 2
    try:
        from PySide6.QtCore import QTimer
        from PySide6.QtGui import QIcon
        from PySide6.QtWidgets import QApplication

        from assets import ICON
        from gui.main_window import APPLICATION, ORGANIZATION, MainWindow
    except ImportError as exc:
        print(f"speedboard: error: the dashboard needs PySide6 and pyqtgraph ({exc})", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(list(sys.argv if argv is None else argv))
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("Speedboard")
    app.setDesktopFileName("speedboard")  # matches assets/speedboard.desktop (Wayland and task bars)
    app.setWindowIcon(QIcon(str(ICON)))
    window = MainWindow()
    screen = app.primaryScreen()
    if screen is not None:
        window.fit_on(screen.availableGeometry())
    window.show()
    # Ctrl-C in the terminal closes the window like its close button (asking first during a run).
    signal.signal(signal.SIGINT, lambda *_: window.close())
    # SIGTERM ends the process at once, as a window manager's kill does (the command line's start handler would
    # raise it inside a Qt slot, where it would be printed and the window would stay).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    wake = QTimer()
    wake.timeout.connect(lambda: None)  # gives Python a moment to run signal handlers
    wake.start(250)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
