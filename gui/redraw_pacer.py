"""How often the window redraws its plots: at most every tick, less while the GUI thread is busy.

On a CPU run the machine's cores also train, so the window measures the CPU
time its own thread spends (painting included) and skips plot redraws while
that share of a core is above a budget, redrawing at least once a second.
"""

from __future__ import annotations

import time

GUI_CPU_BUDGET = 0.04
"""Share of a core the GUI thread may use before plots skip ticks."""
MAX_PLOT_GAP_S = 1.0
"""Plots redraw at least this often, however busy the GUI thread is."""


class RedrawPacer:
    def __init__(self, budget: float = GUI_CPU_BUDGET, max_gap_s: float = MAX_PLOT_GAP_S) -> None:
        self.budget, self.max_gap_s = budget, max_gap_s
        self._clock = (time.perf_counter(), time.thread_time())
        self.cpu_share = 0.0
        """Running share of a core used by the calling (GUI) thread between calls of ``due``."""
        self._last_redraw = 0.0

    def due(self) -> bool:
        """Called once per tick on the GUI thread: whether the plots should redraw now."""
        now, cpu = time.perf_counter(), time.thread_time()
        wall0, cpu0 = self._clock
        self._clock = (now, cpu)
        if now > wall0:
            self.cpu_share = 0.7 * self.cpu_share + 0.3 * (cpu - cpu0) / (now - wall0)
        if self.cpu_share <= self.budget or now - self._last_redraw >= self.max_gap_s:
            self._last_redraw = now
            return True
        return False
