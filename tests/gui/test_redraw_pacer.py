"""Plot redraws back off while the GUI thread is busy, and never stop for more than the gap."""

from itertools import pairwise

import gui.redraw_pacer as pacer_module
from gui.redraw_pacer import RedrawPacer


class FakeClocks:
    def __init__(self, monkeypatch) -> None:
        self.wall, self.cpu = 100.0, 0.0
        monkeypatch.setattr(pacer_module.time, "perf_counter", lambda: self.wall)
        monkeypatch.setattr(pacer_module.time, "thread_time", lambda: self.cpu)

    def tick(self, cpu_share: float, seconds: float = 0.1) -> None:
        self.wall += seconds
        self.cpu += cpu_share * seconds


def test_an_idle_gui_thread_redraws_every_tick(monkeypatch):
    clocks = FakeClocks(monkeypatch)
    pacer = RedrawPacer(budget=0.04, max_gap_s=1.0)
    for _ in range(20):
        clocks.tick(cpu_share=0.01)
        assert pacer.due()


def test_a_busy_gui_thread_skips_redraws_but_not_for_longer_than_the_gap(monkeypatch):
    clocks = FakeClocks(monkeypatch)
    pacer = RedrawPacer(budget=0.04, max_gap_s=1.0)
    due = []
    for _ in range(50):  # 5 s of ticks at 10 Hz, the thread busy half the time
        clocks.tick(cpu_share=0.5)
        due.append(pacer.due())
    assert pacer.cpu_share > 0.4
    assert sum(due) < 15  # backed off from 50 …
    redraws = [k for k, d in enumerate(due) if d]
    assert max(b - a for a, b in pairwise(redraws)) <= 11  # … yet a redraw once the 1 s gap has passed


def test_redraws_come_back_once_the_thread_is_quiet(monkeypatch):
    clocks = FakeClocks(monkeypatch)
    pacer = RedrawPacer(budget=0.04, max_gap_s=1.0)
    for _ in range(30):
        clocks.tick(cpu_share=0.5)
        pacer.due()
    for _ in range(30):
        clocks.tick(cpu_share=0.0)
        pacer.due()
    clocks.tick(cpu_share=0.0)
    assert pacer.cpu_share < 0.04 and pacer.due()
