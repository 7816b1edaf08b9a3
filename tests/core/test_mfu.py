"""MFU: at most 100% wherever it is shown, and a step past the cached matmul peak has the peak measured again."""

from __future__ import annotations

import pytest
import torch

from core.events import MatmulPeakMeasured, RunStarted, StepMetrics, event_from_dict
from core.mfu import utilization
from core.trainer import Trainer


def test_utilization_is_at_most_one_and_none_without_a_peak():
    assert utilization(1000, 1e6, 2e9) == pytest.approx(0.5)
    assert utilization(1000, 1e6, 1e9, world_size=2) == pytest.approx(0.5)  # the peak of every process
    assert utilization(1000, 1e6, 1e8) == 1.0  # past the peak: the peak is low, not the model faster
    assert utilization(1000, 1e6, 0.0) is None and utilization(1000, 1e6, None) is None


def test_the_tables_show_a_small_mfu_with_a_decimal():
    """A tiny model's 0.7% read "1%" in the run table, the tune table and the bench report (the CLI says 0.7%)."""
    from core.mfu import mfu_text

    assert [mfu_text(x) for x in (0.0, 0.007, 0.025, 0.0996, 0.1, 0.3049, 1.0)] == \
        ["0.0%", "0.7%", "2.5%", "10.0%", "10%", "30%", "100%"]


def _run(config, monkeypatch, remeasured: float, check_peak: bool = True) -> tuple[list, list[bool]]:
    import core.trainer

    calls: list[bool] = []

    def measure_again(device, precision, refresh=False):
        calls.append(refresh)
        return remeasured

    # A peak cached while the machine was busy: every step of the micro model runs past it.
    monkeypatch.setattr(core.trainer, "measure_matmul_peak", lambda device, precision="fp32": 1e3)
    monkeypatch.setattr(core.trainer, "matmul_peak", measure_again)
    events: list = []
    trainer = Trainer(config, sink=events.append)
    trainer.check_peak = check_peak
    trainer.run()
    return events, calls


def test_a_step_past_the_cached_peak_has_it_measured_again_once(micro, monkeypatch):
    """Step lines showed 127% and 110% MFU: the peak cached on a busy machine was never looked at again."""
    events, calls = _run(micro(), monkeypatch, remeasured=1e15)
    (again,) = [e for e in events if isinstance(e, MatmulPeakMeasured)]
    steady = [e for e in events if isinstance(e, StepMetrics) and not e.warmup]
    assert calls == [True] and again.step == steady[0].step  # the first step past warm-up, once a run
    assert again.previous_flops == 1e3 and again.matmul_peak_flops == 1e15 and again.step_share > 1
    assert all(0 < s.mfu < 0.01 for s in steady)  # that step included: divided by the new peak
    assert event_from_dict(again.to_dict()) == again  # written to metrics.jsonl and read back
    assert next(e for e in events if isinstance(e, RunStarted)).matmul_peak_flops == 1e3


def test_a_peak_that_measures_no_higher_again_leaves_mfu_at_most_100_percent(micro, monkeypatch):
    from core.event_text import event_line

    events, calls = _run(micro(), monkeypatch, remeasured=5e2)  # the machine is as busy now
    (again,) = [e for e in events if isinstance(e, MatmulPeakMeasured)]
    assert calls == [True] and again.matmul_peak_flops == 1e3
    assert all(s.mfu == 1.0 for s in events if isinstance(s, StepMetrics))
    line = event_line(again)
    assert line.level == "warning" and "no higher now" in line.text and "at most 100%" in line.text


def test_a_run_that_does_not_check_the_peak_measures_nothing_between_its_steps(micro, monkeypatch):
    """A tune trial times its steps between their events: a measurement there would count in them."""
    events, calls = _run(micro(), monkeypatch, remeasured=1e15, check_peak=False)
    assert calls == [] and not any(isinstance(e, MatmulPeakMeasured) for e in events)
    assert all(s.mfu == 1.0 for s in events if isinstance(s, StepMetrics))


def test_a_peak_that_cannot_be_measured_again_beside_the_run_is_a_warning(micro, monkeypatch):
    """On a GPU the peak's GEMMs need memory the run may hold: out of memory there must not end the run."""
    import core.trainer
    from core.events import RunFinished, WarningRaised

    def out_of_memory(device, precision, refresh=False):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")

    monkeypatch.setattr(core.trainer, "measure_matmul_peak", lambda device, precision="fp32": 1e3)
    monkeypatch.setattr(core.trainer, "matmul_peak", out_of_memory)
    events: list = []
    Trainer(micro(), sink=events.append).run()
    assert any(isinstance(e, RunFinished) for e in events)
    assert any(isinstance(e, WarningRaised) and "could not be measured again" in e.message for e in events)
    assert all(s.mfu == 1.0 for s in events if isinstance(s, StepMetrics))
