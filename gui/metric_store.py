"""Numpy buffers of every run's metrics, filled per event, read by the plots on a timer.

Appending is amortised O(1) (the buffers double when full); reading returns
views, so a redraw costs no per-point Python work. Metric names are namespaced
as in the rest of the project: ``train/loss``, ``train/lr``, ``perf/tokens_per_s``,
``mem/gib``, ``val/loss``. The x-axis is ``step``, ``tokens`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np

from core.events import CompileFinished, CompileStarted, Event, RunFinished, RunStarted, StepMetrics, ValidationDone

X_AXES = ("step", "tokens", "time")
STEP_FIELDS = ("step", "tokens", "time", "loss", "lr", "grad_norm", "tokens_per_s", "step_time",
               "mem_gib", "peak_mem_gib", "warmup")
VAL_FIELDS = ("step", "tokens", "time", "loss")
# metric name -> (table, column)
METRICS = {
    "train/loss": ("steps", "loss"),
    "train/lr": ("steps", "lr"),
    "train/grad_norm": ("steps", "grad_norm"),
    "perf/tokens_per_s": ("steps", "tokens_per_s"),
    "perf/step_time": ("steps", "step_time"),
    "mem/gib": ("steps", "mem_gib"),
    "mem/peak_gib": ("steps", "peak_mem_gib"),
    "val/loss": ("val", "loss"),
}


class Columns:
    """A growable 2-D float buffer with named columns."""

    def __init__(self, names: Iterable[str], capacity: int = 256) -> None:
        self.names = tuple(names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self._buf = np.empty((capacity, len(self.names)), dtype=np.float64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def append(self, row: Iterable[float]) -> None:
        if self.n == len(self._buf):
            grown = np.empty((2 * len(self._buf), len(self.names)), dtype=np.float64)
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n] = tuple(row)
        self.n += 1

    def __getitem__(self, name: str) -> np.ndarray:
        return self._buf[: self.n, self._index[name]]


class RunSeries:
    """One run's buffers plus what the plots need to mark (compile warm-up)."""

    def __init__(self) -> None:
        self.steps = Columns(STEP_FIELDS)
        self.val = Columns(VAL_FIELDS)
        self.compiled = False
        """The run compiles its model: its warm-up steps are marked as compile warm-up."""
        self.start = {"step": 0.0, "tokens": 0.0, "time": 0.0}
        """Where the run begins on each x-axis (a continued run begins where its parent ended)."""
        self.version = 0
        """Bumped on every change, so a redraw can skip runs that did not change."""
        self.compile_seconds: float | None = None
        """The run's compile figure (``CompileFinished``, then ``RunFinished``): the table's and the log's."""
        self.mem_baseline = 0.0
        """Memory before the model existed (``RunStarted``): subtracted, so memory is the training's own."""

    def table(self, name: str) -> Columns:
        return self.steps if name == "steps" else self.val


class MetricStore:
    def __init__(self) -> None:
        self._runs: dict[Hashable, RunSeries] = {}

    def keys(self) -> list[Hashable]:
        return list(self._runs)

    def run(self, key: Hashable) -> RunSeries:
        if key not in self._runs:
            self._runs[key] = RunSeries()
        return self._runs[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._runs

    def remove(self, key: Hashable) -> None:
        self._runs.pop(key, None)

    def add(self, key: Hashable, event: Event) -> bool:
        """Record one event of run ``key``; True when it changed a series."""
        series = self.run(key)
        if isinstance(event, StepMetrics):
            series.steps.append((event.step, event.tokens, event.time, event.loss, event.lr, event.grad_norm,
                                 event.tokens_per_s, event.step_time, max(0.0, event.mem_gib - series.mem_baseline),
                                 max(0.0, event.peak_mem_gib - series.mem_baseline),
                                 1.0 if event.warmup else 0.0))
        elif isinstance(event, ValidationDone):
            series.val.append((event.step, event.tokens, event.time, event.loss))
        elif isinstance(event, RunStarted):
            series.start = {"step": float(event.start_step), "tokens": float(event.start_tokens),
                            "time": float(event.start_time)}
            series.mem_baseline = event.mem_baseline_gib
        elif isinstance(event, CompileStarted):
            series.compiled = True
        elif isinstance(event, CompileFinished):
            series.compiled = not event.fallback
            series.compile_seconds = None if event.fallback else event.seconds
        elif isinstance(event, RunFinished) and series.compiled and event.compile_seconds is not None:
            series.compile_seconds = event.compile_seconds
        else:
            return False
        series.version += 1
        return True

    def series(self, key: Hashable, metric: str, x: str = "step",
               warmup: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` views for a metric; ``warmup`` selects warm-up or steady steps only (copies)."""
        if x not in X_AXES:
            raise KeyError(f"unknown x-axis {x!r}")
        table_name, column = METRICS[metric]
        table = self.run(key).table(table_name)
        xs, ys = table[x], table[column]
        if warmup is not None and table_name == "steps":
            mask = table["warmup"] == (1.0 if warmup else 0.0)
            return xs[mask], ys[mask]
        return xs, ys

    def recent_step_time(self, key: Hashable, n: int = 20) -> float | None:
        """Median step time of the last ``n`` steady steps (for an ETA)."""
        steps = self.run(key).steps
        times = steps["step_time"][steps["warmup"] == 0.0][-n:]
        return float(np.median(times)) if len(times) else None


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (fewer at the start), vectorised."""
    if window <= 1 or len(y) == 0:
        return y
    c = np.concatenate(([0.0], np.cumsum(y, dtype=np.float64)))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)
