"""Qt objects are destroyed on the GUI thread: cyclic garbage is collected there, never on the torch thread."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gui import gc_pin

ROOT = Path(__file__).resolve().parents[2]
HANG_AFTER_S = 240


def test_collection_is_pinned_to_the_gui_thread_while_a_torch_thread_lives(qtbot, make_window):
    assert gc.isenabled()
    window = make_window()
    collector = gc_pin.active_collector()
    assert collector is not None and not gc.isenabled()  # no thread but the GUI thread collects now

    freed_on: list[str] = []

    class Leftover:
        pass

    def leave_garbage():
        leftover = Leftover()
        leftover.cycle = leftover
        import weakref

        weakref.finalize(leftover, lambda: freed_on.append(threading.current_thread().name))

    worker = threading.Thread(target=lambda: [leave_garbage() for _ in range(collector.thresholds[0] * 3)],
                              name="allocating-worker")
    worker.start()
    worker.join()
    assert not freed_on  # the worker crossed the threshold several times and collected nothing
    qtbot.waitUntil(lambda: len(freed_on) > 0, timeout=5_000)  # the GUI thread's timer did
    assert set(freed_on) == {threading.main_thread().name}

    window.close()
    assert window.session.controller.thread_finished
    assert gc_pin.active_collector() is None and gc.isenabled()  # the last torch thread gone: Python collects


def test_start_up_objects_are_frozen_while_pinned_and_a_freeze_made_before_is_left_standing(make_window):
    gc.unfreeze()  # as at an application's start (this suite's own fixture freezes the objects of earlier tests)
    window = make_window()
    assert gc.get_freeze_count() > 0  # the window and everything before it: left out of the GUI thread's collections
    window.close()
    assert gc.get_freeze_count() == 0
    # Every object frozen below is kept alive here, so the count can only change by an unfreeze: an earlier test's
    # leftover freed by its reference count during the window's life lowered it by 2 in one CI run.
    alive = gc.get_objects()
    gc.freeze()  # an application's own freeze …
    frozen = gc.get_freeze_count()
    window = make_window()
    window.close()
    assert gc.get_freeze_count() == frozen  # … outlives the collector, which would have undone it with its own
    del alive


def test_several_windows_share_one_collector(make_window):
    first, second = make_window(), make_window()
    collector = gc_pin.active_collector()
    first.close()
    assert gc_pin.active_collector() is collector and not gc.isenabled()  # the second window's thread lives
    second.close()
    assert gc_pin.active_collector() is None and gc.isenabled()


@pytest.mark.slow
def test_windows_and_runs_discarded_with_qt_objects_in_cycles_never_free_them_off_the_gui_thread():
    """The walk that used to hang (or crash) when the torch thread's collection destroyed a leftover Qt object."""
    proc = subprocess.run([sys.executable, "-m", "tests.gui.qt_lifetime_stress", "--rounds", "3",
                           "--hang-after", str(HANG_AFTER_S)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_AFTER_S + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["freed_on"].get(result["gui_thread"], 0) > 0  # leftovers were collected …
    assert set(result["freed_on"]) == {result["gui_thread"]}  # … all of them on the GUI thread
    assert result["qt_thread_messages"] == []
