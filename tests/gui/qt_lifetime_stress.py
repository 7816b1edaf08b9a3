"""Many windows and runs created and discarded in one process, with Qt objects left in reference cycles.

Run as a script (``python -m tests.gui.qt_lifetime_stress``) by tests/gui/test_qt_lifetimes.py in a
child process: a hang (two threads waiting for each other's lock, the GIL being one) cannot be
interrupted from inside the process, so the child arms ``faulthandler`` to dump every thread's
stack and exit, and the parent waits with a timeout of its own.

Each round builds a window, leaves behind a few Qt objects caught in reference cycles (a plot, a
widget, a running timer: the kind of leftover a discarded window or run can hold), and trains a
short run while the GUI thread redraws. The torch thread allocates the most, so with Python's
automatic collection it is the thread that frees those leftovers. Every leftover records the
thread its wrapper was freed on; Qt's messages are recorded from every thread. The result is one
JSON line on stdout.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25, help="optimizer steps of each round's run")
    parser.add_argument("--hang-after", type=float, default=240.0, help="seconds before the process counts as hung")
    parser.add_argument("--unpinned", action="store_true",
                        help="let any thread collect (Python's default), as before collection was pinned")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash prints every thread's stack
    faulthandler.dump_traceback_later(args.hang_after, exit=True)  # a hang ends the process with the stacks

    home = Path(tempfile.mkdtemp(prefix="speedboard-stress-"))
    atexit.register(shutil.rmtree, home, True)  # its runs and caches (a hang's forced exit leaves it, for a look)
    os.environ["SPEEDBOARD_HOME"] = str(home / "home")
    os.environ["SPEEDBOARD_CACHE_DIR"] = str(home / "cache")
    import pyqtgraph as pg
    import torch
    from PySide6.QtCore import QEventLoop, QSettings, QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

    from gui.main_window import MainWindow
    from tests.conftest import micro_config

    torch.set_num_threads(1)
    app = QApplication.instance() or QApplication([])
    for kind in ("warning", "critical", "information", "question"):  # no dialog may block the walk
        setattr(QMessageBox, kind, staticmethod(lambda *a, **k: QMessageBox.StandardButton.Yes))
    qt_messages: list[str] = []
    qInstallMessageHandler(lambda mode, context, message: qt_messages.append(message))
    gc.set_threshold(200, 5, 5)  # frequent collections: many chances for the wrong thread to run one

    freed_on: Counter[str] = Counter()

    def note_freed() -> None:
        freed_on[threading.current_thread().name] += 1

    def leave_cycles() -> None:
        """Qt objects owned by the GUI thread that only the cyclic collector can free."""
        plot = pg.PlotWidget()
        plot.plot([1.0, 2.0, 3.0])
        widget = QWidget()
        timer = QTimer()
        timer.start(1000)
        for obj in (plot, widget, timer):
            obj.cycle = obj  # a reference cycle through a Python attribute
            weakref.finalize(obj, note_freed)

    def spin_until(done, timeout: float = 120.0, litter: bool = False) -> None:
        start = time.monotonic()
        while not done():
            if litter:
                leave_cycles()
                # The GUI thread idles (allocating nothing) while the torch thread trains, as it
                # does between redraws: the next collection is then the torch thread's to run.
                time.sleep(0.03)
            app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
            if time.monotonic() - start > timeout:
                raise TimeoutError("a run did not end")

    config = micro_config(home, train={"budget": args.steps, "eval_every": 0})
    for i in range(args.rounds):
        settings = QSettings(str(home / f"settings{i}.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, extra_presets={"micro": config})
        window.show()
        window.config_panel.preset.setCurrentText("micro")
        if args.unpinned:
            gc.enable()
        session = window.session
        session.start(window.config_panel.config, 1)
        spin_until(lambda s=session: not s.running, litter=True)
        window.close()
        spin_until(lambda s=session: s.controller.thread_finished)
        window.deleteLater()
        del window, session
    for _ in range(3):
        app.processEvents()
        gc.collect()
    off_thread = [m for m in qt_messages if "another thread" in m or "different thread" in m]
    print(json.dumps({"rounds": args.rounds, "freed_on": dict(freed_on), "qt_thread_messages": off_thread[:5],
                      "gui_thread": threading.main_thread().name}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
