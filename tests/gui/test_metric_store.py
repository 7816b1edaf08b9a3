"""The numpy buffers behind the plots."""

from __future__ import annotations

import numpy as np
import pytest

from core.events import CompileFinished, CompileStarted, RunStarted, StepMetrics, ValidationDone
from gui.metric_store import Columns, MetricStore, moving_average


def _step(step: int, warmup: bool = False, loss: float = 1.0) -> StepMetrics:
    return StepMetrics("r", time=0.5 * step, step=step, tokens=128 * step, loss=loss, lr=1e-3, grad_norm=1.0,
                       tokens_per_s=1000.0 + step, step_time=0.1, peak_mem_gib=1.0, mem_gib=0.5, mfu=0.1,
                       warmup=warmup)


def test_columns_grow_past_their_capacity_and_keep_every_row():
    cols = Columns(("a", "b"), capacity=2)
    for i in range(1000):
        cols.append((i, 2 * i))
    assert len(cols) == 1000
    np.testing.assert_array_equal(cols["a"], np.arange(1000))
    np.testing.assert_array_equal(cols["b"], 2 * np.arange(1000))


def test_series_by_axis_and_warmup_filter():
    store = MetricStore()
    store.add(1, RunStarted("r", 0.0, run_dir="", config={}, device="cpu", precision="fp32", num_parameters=1,
                            tokens_per_step=128, budget_tokens=1280, total_steps=10, start_step=5,
                            start_tokens=640, start_time=12.0))
    store.add(1, CompileStarted("r", 0.0, "default", "model"))
    for step in range(6, 11):
        store.add(1, _step(step, warmup=step < 8, loss=10.0 / step))
    store.add(1, ValidationDone("r", 5.0, step=10, tokens=1280, loss=0.9, perplexity=2.5))
    run = store.run(1)
    assert run.compiled and run.start == {"step": 5.0, "tokens": 640.0, "time": 12.0}
    x, y = store.series(1, "train/loss", "tokens")
    np.testing.assert_array_equal(x, 128 * np.arange(6, 11))
    np.testing.assert_allclose(y, 10.0 / np.arange(6, 11))
    x, _ = store.series(1, "perf/tokens_per_s", "step", warmup=True)
    np.testing.assert_array_equal(x, [6, 7])
    x, y = store.series(1, "perf/tokens_per_s", "step", warmup=False)
    np.testing.assert_array_equal(x, [8, 9, 10])
    np.testing.assert_array_equal(y, [1008, 1009, 1010])
    assert store.series(1, "val/loss", "time")[0].tolist() == [5.0]
    assert store.recent_step_time(1) == pytest.approx(0.1)
    store.add(1, CompileFinished("r", 6.0, "default", "model", 0.0, 0, fallback=True))
    assert not run.compiled  # fell back to eager: nothing to shade
    with pytest.raises(KeyError):
        store.series(1, "train/loss", "epochs")


def test_moving_average_is_a_trailing_mean():
    y = np.array([1.0, 3.0, 5.0, 7.0, 9.0])
    np.testing.assert_allclose(moving_average(y, 2), [1.0, 2.0, 4.0, 6.0, 8.0])
    np.testing.assert_allclose(moving_average(y, 10), np.cumsum(y) / np.arange(1, 6))
    assert moving_average(y, 1) is y
