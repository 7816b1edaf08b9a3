"""Compile time and throughput from a run's step times: robust to one noisy step."""

from __future__ import annotations

from core.step_times import StepTimes


def test_compile_time_is_not_decided_by_one_slow_steady_step():
    """The issue's steps: warm-up 8.35, 1.95, 0.13 s, then a slow first steady step of 3.38 s."""
    times = StepTimes(3)
    for seconds in (8.35, 1.95, 0.13, 3.38, 0.13, 0.12, 0.14, 0.13):
        times.add(seconds)
    assert times.compile_time_known
    # 10.43 s of warm-up minus 3 × the median steady step (0.13 s), not minus 3 × 3.38 s (which read 0.3 s).
    assert abs(times.compile_seconds() - (8.35 + 1.95 + 0.13 - 3 * 0.13)) < 1e-9


def test_a_run_that_ends_inside_its_warm_up_counts_all_of_it():
    times = StepTimes(3)
    for seconds in (5.0, 1.0):
        times.add(seconds)
    assert times.compile_seconds() == 6.0 and times.median_rate(100) is None


def test_the_compile_line_counts_its_steps_in_the_right_number():
    from core.event_text import event_line
    from core.events import CompileFinished

    one = event_line(CompileFinished("r", 1.0, "default", "model", 47.2, warmup_steps=1)).text
    three = event_line(CompileFinished("r", 1.0, "default", "model", 9.5, warmup_steps=3)).text
    assert one == "compile warm-up 47.2 s over 1 step (default, model)"
    assert three == "compile warm-up 9.5 s over 3 steps (default, model)"


def test_the_median_rate_is_the_median_of_the_steps_rates_with_an_even_count_too():
    """Tokens over the median step time: with steps of 1 s and 2 s (100 tokens each), 66.7 tokens/s where the
    steps' own rates, 100 and 50, have the median 75 that metrics.jsonl's figures give."""
    times = StepTimes(warmup_steps=1)
    for seconds in (5.0, 1.0, 2.0):  # the first is warm-up
        times.add(seconds)
    assert times.median_rate(100) == 75.0
    times.add(4.0)
    assert times.median_rate(100) == 50.0
