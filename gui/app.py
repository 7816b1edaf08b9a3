"""Start-up: ``speedboard gui`` (and ``make run``) open the dashboard here."""

from __future__ import annotations

import os
import signal
import sys

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from assets import ICON
from gui.main_window import APPLICATION, ORGANIZATION, MainWindow


def _no_display_reason() -> str | None:
    """On Linux without X11/Wayland Qt would abort; say so in one line instead."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return ("no display found (DISPLAY is not set): on a machine without a screen, train with "
            "`speedboard train`, or run the dashboard under `xvfb-run speedboard gui`")


def main(argv: list[str] | None = None) -> int:
    reason = _no_display_reason()
    if reason:
        print(f"speedboard: error: {reason}", file=sys.stderr)
        return 2
    app = QApplication.instance() or QApplication(list(sys.argv if argv is None else argv))
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("Speedboard")
    app.setDesktopFileName("speedboard")  # matches assets/speedboard.desktop (Wayland and task bars)
    app.setWindowIcon(QIcon(str(ICON)))
    window = MainWindow()
    window.show()
    # Ctrl-C in the terminal closes the window like its close button (asking first during a run).
    signal.signal(signal.SIGINT, lambda *_: window.close())
    wake = QTimer()
    wake.timeout.connect(lambda: None)  # gives Python a moment to run signal handlers
    wake.start(250)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
