"""Start-up: ``speedboard gui`` (and ``make run``) open the dashboard here."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# Qt is imported in main(), after the checks: Qt's GUI module itself links system libraries (EGL, fontconfig),
# and importing it without one fails with an ImportError that names a file, not the package that has it.


HEADLESS_ADVICE = "on a machine without a screen, train with `speedboard train`, or run the dashboard under " \
                  "`xvfb-run speedboard gui`"
NO_DISPLAY = f"no display found (DISPLAY is not set): {HEADLESS_ADVICE}"


def _no_display_reason() -> str | None:
    """On Linux without a display Qt aborts (with a hint about a library that is installed); say so in one line
    instead. A display named but not reachable (no X server on ``DISPLAY``, no Wayland compositor) counts too, and
    so does a ``QT_QPA_PLATFORM`` that names no platform plugin here."""
    if not sys.platform.startswith("linux"):
        return None
    asked = [p.split(":")[0].strip() for p in os.environ.get("QT_QPA_PLATFORM", "").split(";") if p.strip()]
    if asked:  # Qt tries them in order
        reasons = [_platform_problem(name) for name in asked]
        return None if None in reasons else reasons[0]
    x11, wayland = os.environ.get("DISPLAY"), os.environ.get("WAYLAND_DISPLAY")
    if not x11 and not wayland:
        return NO_DISPLAY
    if wayland:
        problem = _wayland_problem()
        if problem is None or not x11:
            return problem
    return _x11_problem()


def _platform_problem(name: str) -> str | None:
    import PySide6

    folder = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms"
    known = sorted(p.name[len("libq"):-len(".so")] for p in folder.glob("libq*.so")) if folder.is_dir() else []
    if known and name.split("-")[0] not in known:  # wayland-egl is the wayland plugin's
        return f"QT_QPA_PLATFORM={name} names no Qt platform plugin here (these exist: {', '.join(known)})"
    if name == "xcb":
        return _x11_problem()
    if name.startswith("wayland"):
        return _wayland_problem()
    return None  # offscreen, minimal, vnc, eglfs …: nothing to connect to first


def _x11_problem() -> str | None:
    """Why the X server of ``DISPLAY`` cannot be reached (asked through libxcb, as Qt will), or None."""
    import ctypes

    display = os.environ.get("DISPLAY")
    if not display:
        return NO_DISPLAY
    try:
        xcb = ctypes.CDLL("libxcb.so.1")
    except OSError:
        return None  # the missing library is named by the check that follows (XCB_LIBRARIES)
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    connection = xcb.xcb_connect(os.fsencode(display), None)
    try:
        failed = xcb.xcb_connection_has_error(connection)
    finally:
        xcb.xcb_disconnect(connection)
    if failed:
        return f"cannot connect to the X display {display!r} (is its X server running?): {HEADLESS_ADVICE}"
    return None


def _wayland_problem() -> str | None:
    """Why no Wayland compositor answers on its socket (``WAYLAND_DISPLAY`` in ``XDG_RUNTIME_DIR``), or None."""
    import socket

    name = os.environ.get("WAYLAND_DISPLAY") or "wayland-0"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not os.path.isabs(name) and not runtime:
        return f"no Wayland display: XDG_RUNTIME_DIR is not set, so {name!r} names no socket: {HEADLESS_ADVICE}"
    path = name if os.path.isabs(name) else os.path.join(runtime, name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except OSError:
            return f"cannot connect to the Wayland display {name!r} (is a compositor running?): {HEADLESS_ADVICE}"
    return None


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
