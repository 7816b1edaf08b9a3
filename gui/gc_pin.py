"""Cyclic garbage collection pinned to the GUI thread while a torch thread runs beside the window.

Python's cyclic collector runs in whichever thread crosses an allocation
threshold, and in the dashboard that is usually the torch thread, which
allocates the most. Garbage in a reference cycle that holds a Qt object (a
widget, a timer, a pyqtgraph item) would then be destroyed on the torch thread,
while Qt objects must be destroyed on the thread that owns them: at best Qt
warns ("Timers cannot be stopped from another thread"), at worst the torch
thread, holding the GIL inside the collector, waits for a Qt lock that the GUI
thread holds while it waits for the GIL, and the process hangs for good.

So while any ``Controller`` (the owner of a torch thread) lives, automatic
collection is off for the whole process and a timer on the GUI thread collects
instead, generation by generation, with the thresholds Python itself would
use. The objects that exist once start-up is done are frozen (``gc.freeze``):
they are never garbage, and leaving them out keeps a full collection on the GUI
thread short. An application that froze its own objects before keeps them
frozen: unfreezing is all or nothing, and would undo its freeze too.
"""

from __future__ import annotations

import gc
import threading
import time

from PySide6.QtCore import QCoreApplication, QObject, QTimer

CHECK_INTERVAL_MS = 50
"""How often the GUI thread looks at the allocation counts (a look costs microseconds)."""


class GuiThreadCollector(QObject):
    """Runs ``gc.collect`` on the GUI thread when Python's own thresholds are crossed."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._was_enabled = gc.isenabled()
        self.thresholds = gc.get_threshold()
        self.collections = [0, 0, 0]
        self.longest_s = 0.0
        """The longest collection so far: how long it held the GUI thread."""
        self._froze = gc.get_freeze_count() == 0  # else someone else's freeze stands, and covers start-up
        gc.disable()
        if self._froze:
            gc.freeze()
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_INTERVAL_MS)
        self._timer.timeout.connect(self.check)
        self._timer.start()

    def check(self) -> None:
        assert threading.current_thread() is threading.main_thread()
        counts = gc.get_count()
        generation = -1
        for gen in range(3):  # the oldest generation whose count is over its threshold, as Python picks it
            if counts[gen] > self.thresholds[gen]:
                generation = gen
        if generation < 0:
            return
        t0 = time.perf_counter()
        gc.collect(generation)
        self.longest_s = max(self.longest_s, time.perf_counter() - t0)
        self.collections[generation] += 1

    def release(self) -> None:
        """Give collection back to Python (the last torch thread has ended)."""
        self._timer.stop()
        if self._froze:
            gc.unfreeze()
        if self._was_enabled:
            gc.enable()
        gc.collect()  # on this, the GUI thread: what accumulated since the last check


_collector: GuiThreadCollector | None = None
_holders = 0


def pin_collection_to_gui_thread() -> None:
    """Called by each owner of a torch thread when it starts (on the GUI thread); pair with ``unpin``."""
    global _collector, _holders
    assert threading.current_thread() is threading.main_thread(), "pin from the GUI thread"
    _holders += 1
    if _collector is None:
        _collector = GuiThreadCollector(QCoreApplication.instance())


def unpin_collection() -> None:
    """Called once the owner's torch thread has finished; the last one gives collection back to Python."""
    global _collector, _holders
    assert _holders > 0, "unpin without pin"
    _holders -= 1
    if _holders == 0 and _collector is not None:
        collector, _collector = _collector, None
        collector.release()
        collector.deleteLater()


def active_collector() -> GuiThreadCollector | None:
    return _collector
