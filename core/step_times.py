"""Optimizer-step times of a run: warm-up kept apart, compile time and throughput from robust medians."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

STEADY_STEPS_FOR_COMPILE_TIME = 5
"""Steady steps whose median stands for the non-compile work of a warm-up step, so
one noisy step cannot decide the compile time (a slow first steady step once made
a 10 s compile read 0.3 s)."""


@dataclass
class StepTimes:
    warmup_steps: int
    """The first steps of a run, which may compile: left out of throughput."""
    warmup: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)

    @property
    def next_is_warmup(self) -> bool:
        return len(self.warmup) < self.warmup_steps

    @property
    def count(self) -> int:
        return len(self.warmup) + len(self.steady)

    def add(self, seconds: float) -> bool:
        """Record one step; True when it was a warm-up step."""
        warm = self.next_is_warmup
        (self.warmup if warm else self.steady).append(seconds)
        return warm

    @property
    def compile_time_known(self) -> bool:
        """Enough steady steps have run for ``compile_seconds`` to be final."""
        return len(self.steady) >= STEADY_STEPS_FOR_COMPILE_TIME

    def compile_seconds(self) -> float | None:
        """Warm-up time minus what the same steps take at steady speed (the median of the
        first steady steps); all of the warm-up when the run ended inside it; None before any step."""
        if not self.warmup:
            return None
        total = sum(self.warmup)
        if not self.steady:
            return total
        typical = statistics.median(self.steady[:STEADY_STEPS_FOR_COMPILE_TIME])
        return max(0.0, total - len(self.warmup) * typical)

    def median_rate(self, units_per_step: float) -> float | None:
        """The median of the steady steps' rates (tokens/s): with an even count, the mean of the two middle rates,
        as the per-step figures of metrics.jsonl give it (units over the median time is not that)."""
        rates = [units_per_step / t for t in self.steady if t > 0]
        return statistics.median(rates) if rates else None
