"""A run's state machine: ``RunRecord.apply`` is the one place a run's state changes."""

from __future__ import annotations

import pytest

from core.events import (
    CheckpointFailed,
    CompileFinished,
    CompileStarted,
    RunFailed,
    RunFinished,
    RunStarted,
    StepMetrics,
)
from gui.run_record import RunRecord, StopRequested, TrainingPaused, TrainingResumed, describe


def started(run_id: str = "r1") -> RunStarted:
    return RunStarted(run_id, 0.0, run_dir=f"/runs/{run_id}", config={}, device="cpu", precision="fp32",
                      num_parameters=1000, tokens_per_step=128, budget_tokens=1280, total_steps=10)


def step(n: int, warmup: bool = False) -> StepMetrics:
    return StepMetrics("r1", float(n), step=n, tokens=128 * n, loss=3.0, lr=1e-3, grad_norm=1.0, tokens_per_s=1e4,
                       step_time=0.01, peak_mem_gib=0.1, mem_gib=0.1, mfu=0.0, warmup=warmup)


def finished(stopped: bool) -> RunFinished:
    return RunFinished("r1", 9.0, step=3, tokens=384, stopped=stopped, final_loss=2.5, val_loss=None,
                       median_tokens_per_s=1e4, compile_seconds=None, peak_mem_gib=0.1, checkpoint="/runs/r1/ck")


def states(record: RunRecord, events) -> list[str]:
    seen = []
    for event in events:
        record.apply(event)
        seen.append(record.state)
    return seen


def test_stop_requested_is_stopping_until_the_run_reports_its_end():
    record = RunRecord(key=1, number=1, config={})
    assert record.apply(StopRequested()) is True and record.state == "stopping"  # even before the trainer started
    assert states(record, [started(), step(1), CompileStarted("r1", 1.0, "default", "model"),
                           CompileFinished("r1", 2.0, "default", "model", 1.0, 1), TrainingPaused(1)]) == \
        ["stopping"] * 5  # nothing the trainer still reports undoes the request
    assert record.active and not record.ended
    assert states(record, [finished(stopped=True)]) == ["stopped"]
    assert record.ended and record.checkpoint == "/runs/r1/ck"


def test_a_stop_during_the_compile_is_still_compiling_until_its_step_has_run():
    """A second close during a compile said the window waits for "the current optimizer step": once stopping,
    the record no longer knew that the compile still ran."""
    record = RunRecord(key=1, number=1, config={})
    record.apply(started())
    assert not record.compiling
    record.apply(CompileStarted("r1", 1.0, "default", "model"))
    assert record.compiling
    record.apply(StopRequested())
    assert record.state == "stopping" and record.compiling
    record.apply(step(1, warmup=True))  # the compiled step has run: the stop comes now
    assert record.state == "stopping" and not record.compiling
    trained = RunRecord(key=2, number=2, config={})
    states(trained, [started(), step(1), StopRequested()])
    assert trained.state == "stopping" and not trained.compiling


def test_pause_returns_to_the_state_it_interrupted():
    record = RunRecord(key=1, number=1, config={})
    assert states(record, [started(), CompileStarted("r1", 1.0, "default", "model"), TrainingPaused(2),
                           TrainingResumed(), CompileFinished("r1", 2.0, "default", "model", 1.0, 2), step(3),
                           TrainingPaused(3), StopRequested(), TrainingResumed()]) == \
        ["training", "compiling", "paused", "compiling", "training", "training", "paused", "stopping", "stopping"]


@pytest.mark.parametrize("note", [StopRequested(), TrainingPaused(4), TrainingResumed()])
def test_notes_do_not_touch_ended_or_followed_runs(note):
    ended = RunRecord(key=1, number=1, config={})
    states(ended, [started(), RunFailed("r1", 1.0, "boom")])
    assert ended.apply(note) is False and ended.state == "failed"
    followed = RunRecord(key=2, number=2, config={}, origin="folder", state="following")
    assert followed.apply(note) is False and followed.state == "following"


def test_a_failed_save_changes_no_state_and_is_logged_as_a_warning():
    record = RunRecord(key=1, number=1, config={})
    states(record, [started(), step(1)])
    failed = CheckpointFailed("r1", 1.0, step=1, path="/full/disk", message="No space left on device")
    assert record.apply(failed) is False and record.state == "training"
    line = describe(failed)
    assert line.level == "warning" and "No space left on device" in line.text


def test_notes_have_log_lines_and_steps_have_none():
    assert describe(TrainingPaused(7)).text == "paused at step 7"
    assert describe(TrainingResumed()).text == "resumed"
    assert "stopping" in describe(StopRequested()).text
    assert describe(step(1)) is None
    assert describe(RunFailed("r1", 1.0, "boom", step=2)).level == "error"


def test_a_run_of_several_processes_says_so_in_its_label():
    config = {"train": {"compile_mode": "default", "accum_steps": 2}}
    assert RunRecord(key=1, number=3, config=config).label == "#3 default ×2"
    assert RunRecord(key=1, number=3, config=config, nproc=2).label == "#3 default ×2 on 2 processes"
    followed = RunRecord(key=1, number=4, config=config)
    followed.apply(RunStarted("r1", 0.0, run_dir="/runs/r1", config=config, device="cpu", precision="fp32",
                              num_parameters=1, tokens_per_step=1, budget_tokens=9, total_steps=9, world_size=4))
    assert followed.label == "#4 default ×2 on 4 processes"


def test_the_time_left_counts_the_validations_still_to_come():
    """The ETA was the steps left × the step time: 0:00 with seconds of validation still to run."""
    from core.events import ValidationDone

    record = RunRecord(key=1, number=1, config={"train": {"eval_every": 4}})
    assert record.seconds_left(0.5) == 0.0  # nothing known yet
    record.apply(RunStarted("r1", 0.0, run_dir="/runs/r1", config={"train": {"eval_every": 4}}, device="cpu",
                            precision="fp32", num_parameters=1000, tokens_per_step=128, budget_tokens=1280,
                            total_steps=10))
    record.apply(step(4))  # at 4.0 s
    assert record.seconds_left(0.5) == 3.0  # no validation measured yet: the steps alone
    record.apply(ValidationDone("r1", 6.0, step=4, tokens=512, loss=2.0, perplexity=7.4))
    assert record.eval_seconds == 2.0
    # 6 steps, and the validations at step 8 and at the end (10): 3 + 2 × 2.
    assert record.seconds_left(0.5) == 7.0


def test_the_mfu_column_divides_by_a_peak_measured_again_and_is_at_most_100_percent():
    """The table divided the median by the peak of RunStarted: above 100% where the cached peak read low."""
    import dataclasses

    from core.events import MatmulPeakMeasured

    record = RunRecord(key=1, number=1, config={})
    record.apply(dataclasses.replace(started(), matmul_peak_flops=1e9, flops_per_token=1e6))
    record.apply(finished(stopped=False))  # median 1e4 tokens/s: 1e10 FLOP/s, ten times the peak
    assert record.mfu == 1.0
    record.apply(MatmulPeakMeasured("r1", 1.0, step=2, precision="fp32", matmul_peak_flops=4e10,
                                    previous_flops=1e9, step_share=10.0))
    assert record.mfu == pytest.approx(0.25)


def test_the_trainings_own_memory_is_never_below_zero():
    """A step below the baseline (memory the window freed meanwhile) was shown as -0.10 GiB in the table, the status
    bar and the memory plot, where the CLI and RunFinished say 0."""
    from dataclasses import replace

    from gui.metric_store import MetricStore

    begun = replace(started(), mem_baseline_gib=0.8)
    record, store = RunRecord(key=1, number=1, config={}), MetricStore()
    for event in (begun, step(1), step(2)):
        record.apply(event)
        store.add(1, event)
    assert record.mem_gib == record.peak_mem_gib == 0.0
    assert store.series(1, "mem/gib")[1].tolist() == store.series(1, "mem/peak_gib")[1].tolist() == [0.0, 0.0]
    record.apply(replace(finished(False), peak_mem_gib=0.7))
    assert record.peak_mem_gib == 0.0


def test_a_run_that_failed_after_measured_steps_has_their_median_tokens_per_s():
    """Its row showed Tokens/s, MFU and Speedup as "—" although metrics.jsonl held its steps' rates."""
    from dataclasses import replace

    record = RunRecord(key=1, number=1, config={}, origin="live")
    rates = [1e6, 3e3, 1e3, 2e3, 4e3]  # the first a warm-up step: not counted, as in a finished run's median
    events = [started()] + [replace(step(n + 1, warmup=n == 0), tokens_per_s=r) for n, r in enumerate(rates)]
    states(record, [*events, RunFailed("r1", 9.0, "the gradient norm became nan at step 6", step=6)])
    assert record.state == "failed" and record.median_tokens_per_s == 2.5e3
    never = RunRecord(key=2, number=2, config={}, origin="live")
    states(never, [started(), RunFailed("r1", 1.0, "boom")])
    assert never.median_tokens_per_s is None  # no step measured: nothing to show
