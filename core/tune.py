"""The speed advisor: which settings train this experiment fastest on this machine.

For the current model, data, sequence length and **effective batch**, ``plan_tune``
lists the cells worth trying (``core.trials.Cell``: compile off / ``default``
whole model / ``default`` per block / ``max-autotune-no-cudagraphs``, and
``reduce-overhead`` on CUDA without accumulation; × fp32 and bf16 where the
device has it; × the micro-batch × accumulation splits of the effective batch
that fit in memory, largest micro-batch first), estimates the time they take
and keeps, in that order of priority, those that fit the time budget.
``run_tune`` trains them as short trials on the caller's thread, interleaved
with repeats (A B C … A B C …) so a machine whose speed drifts hits every cell
alike, and reports after every trial: tokens/s with spread, peak memory,
compile cost cold and warm, and the loss after the trial's tokens, held to the
fp32 eager loss within the precision's tolerance. The recommendation is the
fastest cell whose loss agrees, with its margin over the current settings and
whether that margin is above the noise.

Every trial starts from the same initial weights (the run's seed) and reads the
same batches; each trains in a temporary run folder that is removed, so only
the report (JSON, ``save_report``) stays. A cancel request ends the tune
between two optimizer steps; the report then holds what was measured.
torch.compile's disk cache (Inductor's FX-graph cache) is shared by the trials
and by the run that follows: a cell's first trial pays the cold compile, its
repeats and the run started with its settings a warm one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.config import RunConfig, TrainConfig
from core.errors import Cancelled, ConfigError
from core.event_text import counted
from core.json_text import finite_json, parse_json
from core.mfu import PEAK_CHECK_MFU, mfu_text, peak_share, utilization
from core.trials import (
    Cell,
    TrialCancelled,
    TrialResult,
    cell_of,
    compare,
    loss_reference,
    loss_tolerance,
    run_trial,
    select_cells,
    splits,
    spread,
)

SCHEMA = "speedboard-tune/1"
DEFAULT_BUDGET_SECONDS = 600.0
DEFAULT_STEPS = 3
DEFAULT_REPEATS = 2
TUNE_MODES = (("off", "model"), ("default", "model"), ("default", "block"), ("max-autotune-no-cudagraphs", "model"))

# What the estimate assumes (seconds). A cold compile builds Inductor's kernels (C++ on a CPU, Triton on a
# GPU) and dominates on a CPU; a warm one takes them from the disk cache and only traces again.
COLD_COMPILE_S = {"cpu": {"model": 30.0, "block": 20.0, "autotune": 90.0},
                  "cuda": {"model": 60.0, "block": 40.0, "autotune": 180.0}}
WARM_COMPILE_S = {"cpu": 4.0, "cuda": 10.0}
TRIAL_SETUP_S = 1.5
"""Data opened, model built, the run folder written and removed: per trial."""
EXPECTED_MFU = {"cpu": 0.5, "cuda": 0.3}
"""Share of the matmul peak a training step reaches, for the estimate only."""
STEP_FLOOR_S = {"cpu": 0.05, "cuda": 0.02}
"""The least an optimizer step takes however small the model: Python, the optimizer, the step's host sync."""
TIME_PASSES_BELOW_S = 0.1
"""A sample's forward and backward estimated below this (from ``EXPECTED_MFU``): the estimate times real passes
instead (``time_passes``), a fraction of a second."""
PASS_SECONDS = 0.25
"""About the longest pass ``time_passes`` times (its samples chosen from a pass of one)."""
TIMINGS_PER_PRECISION = 2
"""How often ``time_passes`` times each precision for the estimate, the precisions in turn; the cheaper counts."""
SPARE_MARGIN = 1.5
"""A setting beyond the plan starts only if this much more than its estimate (and every repeat's) is left: an
estimate short by a third took the planned settings' repeats (five settings measured once, none repeated)."""
BUDGET_ADVICE_MARGIN = 1.25
"""The budget a "too short" refusal advises, over the estimate of the two settings' trials."""


MAX_BUDGET_SECONDS = 7 * 24 * 3600
"""A week: trials that would need longer compare settings on a machine whose load has surely changed."""


@dataclass(frozen=True)
class TuneOptions:
    """How long and how carefully to measure."""

    budget_seconds: float = DEFAULT_BUDGET_SECONDS
    """No trial starts that would end past this (estimated); a compile in progress is not interrupted."""
    steps: int = DEFAULT_STEPS
    """Timed optimizer steps per trial, after its warm-up steps."""
    repeats: int = DEFAULT_REPEATS
    """Interleaved repeats of all cells."""
    precisions: tuple[str, ...] | None = None
    """None: fp32, and bf16 where the device has it."""
    patterns: str | None = None
    """Only the cells whose names match these comma-separated shell patterns (the current one is always kept)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_seconds, (int, float)) and math.isfinite(self.budget_seconds)
                and 0 < self.budget_seconds <= MAX_BUDGET_SECONDS):
            raise ConfigError(f"the time budget must be a positive number of seconds up to "
                              f"{MAX_BUDGET_SECONDS:,} (a week), got {self.budget_seconds!r}", "budget_seconds")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ConfigError(f"timed steps per trial must be an integer ≥ 1, got {self.steps!r}", "steps")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ConfigError(f"repeats must be an integer ≥ 1, got {self.repeats!r}", "repeats")
        for p in self.precisions or ():
            if p not in ("fp32", "bf16", "fp16"):
                raise ConfigError(f"unknown precision {p!r} to try; use fp32, bf16 or fp16", "precision")


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class TuneStarted:
    plan: dict[str, Any]
    """``TunePlan.to_dict()``: the cells, the ones left out and why, the estimate."""


@dataclass(frozen=True)
class TrialStarted:
    cell: str
    label: str
    repeat: int
    index: int
    """Trials started so far, this one included."""
    total: int
    elapsed: float
    eta_seconds: float
    """Seconds left for this trial and the ones after it (estimated)."""


@dataclass(frozen=True)
class TrialFinished:
    result: dict[str, Any]
    """``TrialResult.to_dict()``."""
    summary: dict[str, Any]
    """``summarise``: a row per cell and the recommendation so far."""
    elapsed: float
    eta_seconds: float


@dataclass(frozen=True)
class TuneFinished:
    report: dict[str, Any]
    """The whole report (``build_report``), also when the tune was cancelled or ran out of time."""
    path: str | None
    """Where the report was saved, if it was."""


TuneEvent = TuneStarted | TrialStarted | TrialFinished | TuneFinished


# ----------------------------------------------------------------------------- the plan
@dataclass
class TunePlan:
    config: RunConfig
    """The current settings (budget and output untouched: the trials replace them)."""
    device: str
    device_name: str
    cells: list[Cell]
    """In order of priority; the first is the current settings."""
    current: str
    """The current settings' cell name."""
    left_out: list[dict[str, str]]
    """Cells not tried, each with its reason (does not fit in memory, the budget)."""
    steps: int
    repeats: int
    total_steps: int
    """Optimizer steps per trial: the largest warm-up plus the timed steps, the same in every trial."""
    budget_seconds: float
    estimates: dict[str, dict[str, float]]
    """Per cell: ``first`` (set-up, a cold compile, the steps) and ``repeat`` (a warm compile) seconds."""
    flops_per_token: float
    peaks: dict[str, float]
    """Matmul FLOP/s of this device per precision: the MFU denominators."""
    spare: list[Cell] = field(default_factory=list)
    """Cells the estimate left out for the budget, in order of priority: tried after the planned ones when
    the trials turn out faster than estimated (a warm compile cache, a fast machine) and they still fit."""
    spare_estimates: dict[str, dict[str, float]] = field(default_factory=dict)
    planning_seconds: float = 0.0
    """What making the plan took (matmul peaks, auto's probe, the timed passes): before the trials' clock runs."""

    @property
    def estimate_seconds(self) -> float:
        return sum(e["first"] + (self.repeats - 1) * e["repeat"] for e in self.estimates.values())

    @property
    def cold_compile_seconds(self) -> float:
        return sum(e.get("cold_compile", 0.0) for e in self.estimates.values())

    def describe(self) -> str:
        """One line: how many trials, about how long, and what dominates."""
        minutes = self.estimate_seconds / 60
        when = f"about {minutes:.0f} minutes" if minutes >= 1.5 else f"about {self.estimate_seconds:.0f} seconds"
        line = (f"{counted(len(self.cells), 'setting')} × {counted(self.repeats, 'interleaved repeat')}, "
                f"{counted(self.total_steps, 'step')} each: "
                f"{when} on this machine (budget {self.budget_seconds:.0f} s)")
        cold = self.cold_compile_seconds
        if cold and cold >= 0.4 * self.estimate_seconds:
            line += (f"; cold torch.compile compiles dominate (~{cold:.0f} s, less when its cache is already "
                     f"warm from an earlier run)")
        if self.spare:
            more = f"{len(self.spare)} more settings follow" if len(self.spare) > 1 else "1 more setting follows"
            line += f"; {more} if the trials run faster than estimated"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "device": self.device, "device_name": self.device_name,
                "cells": [c.to_dict() for c in self.cells], "current": self.current, "left_out": self.left_out,
                "steps": self.steps, "repeats": self.repeats, "total_steps": self.total_steps,
                "budget_seconds": self.budget_seconds, "estimates": self.estimates,
                "estimate_seconds": self.estimate_seconds, "description": self.describe(),
                "flops_per_token": self.flops_per_token, "peaks": self.peaks,
                "spare": [c.name for c in self.spare], "planning_seconds": self.planning_seconds}


def _cold_compile(cell: Cell, device_type: str) -> float:
    table = COLD_COMPILE_S.get(device_type, COLD_COMPILE_S["cuda"])
    if not cell.compiled:
        return 0.0
    if "autotune" in cell.mode:
        return table["autotune"]
    return table[cell.scope]


def _estimate(cell: Cell, device_type: str, step_seconds: float, total_steps: int) -> dict[str, float]:
    steps = total_steps * step_seconds
    cold = _cold_compile(cell, device_type)
    warm = WARM_COMPILE_S.get(device_type, WARM_COMPILE_S["cuda"]) if cell.compiled else 0.0
    return {"first": TRIAL_SETUP_S + cold + steps, "repeat": TRIAL_SETUP_S + warm + steps, "cold_compile": cold,
            "step": step_seconds}


def _doublings(samples: int) -> list[int]:
    """2, 4, 8, … below ``samples`` (at least 2), then ``samples`` itself."""
    samples, sizes = max(2, samples), []
    n = 2
    while n < samples:
        sizes.append(n)
        n *= 2
    return [*sizes, samples]


def time_passes(model, seq_len: int, device, precision: str, samples: int) -> tuple[float, float] | None:
    """Seconds of an eager forward and backward pass of ``model`` (fresh weights, random tokens) in ``precision``:
    (what a pass costs whatever its size, what each sample of ``seq_len`` tokens adds), from passes of one and of
    at most ``samples`` samples taken in turn (the fastest of each). None where it cannot be timed (out of memory,
    anything): the estimate then assumes ``EXPECTED_MFU``."""
    from core.device import DTYPES
    from core.precision import best_interleaved, seeded_net, timed_pass

    dtype = None if precision == "fp32" else DTYPES[precision]
    try:
        # Its own RNG (seeded_net): the trials' seed is theirs, this draws nothing from it.
        net, (single, *more) = seeded_net(model, device, [(n, seq_len) for n in (1, *_doublings(samples))])
        one_pass = timed_pass(net, single, device, dtype)
        one_pass()  # its warm-up (kernel selection, first touch)
        first = min(one_pass(), one_pass())  # the faster of two: a pass slowed by another process misleads less
        # Samples doubled until a pass is clearly dearer than a pass of one (twice as long, and PASS_SECONDS), up
        # to those asked for: their number comes from the matmul peak, which a small model's pass misses by far
        # (a micro-batch of 4,096 took 10 s a pass, and the plan 3.5 minutes before refusing a batch no week
        # could train).
        for x in more:
            if x is more[-1]:
                break
            doubled = timed_pass(net, x, device, dtype)
            if min(doubled(), doubled()) >= max(2 * first, PASS_SECONDS):
                break
        samples = x.shape[0]
        one, many = best_interleaved((one_pass, timed_pass(net, x, device, dtype)), seconds=0.05, min_runs=3)
    except Exception:  # an estimate's aid: never a reason to refuse the tune
        return None
    # Timing noise can make the larger pass look barely dearer: a sample costs its share of it at least.
    per_sample = max((many - one) / (samples - 1), many / samples / 4)
    return max(0.0, one - per_sample), per_sample


def _pass_cost(timed: tuple[float, float], samples: int) -> float:
    """Seconds of a pass of ``samples`` samples by ``time_passes``' figures (what a pass costs, what a sample adds)."""
    fixed, per_sample = timed
    return fixed + samples * per_sample


BUDGET_REASON = "left out to stay within the time budget"
BUSY_LOAD_PER_CORE = 1.5
"""A load average above this many per core during the trials: other work ran beside them (said with the pick)."""
CANCELLED_REASON = "the trials were cancelled first"
INTERRUPTED_REASON = "the trials were cancelled during its first trial"


def not_tried(plan: dict[str, Any]) -> list[dict[str, str]]:
    """A plan's (``TunePlan.to_dict``) left-out settings that will not be tried: its spare ones may still be,
    until the trials end (a report's plan has none left)."""
    spare = set(plan.get("spare", []))
    return [x for x in plan.get("left_out", []) if x["cell"] not in spare]


def default_precisions(device) -> tuple[str, ...]:
    """fp32, and bf16 where the device runs it (the trials measure whether it pays)."""
    from core.device import bf16_supported

    return ("fp32", "bf16") if device.type in ("cpu", "cuda") and bf16_supported(device) else ("fp32",)


def candidate_cells(config: RunConfig, precisions: tuple[str, ...], device, current: Cell) -> tuple[
        list[Cell], list[dict[str, str]]]:
    """The current cell first, then per split (largest micro-batch first) × mode × precision; and the
    splits that do not fit in memory, with the reason."""
    from core.memory_budget import why_it_does_not_fit

    effective = config.train.micro_batch * config.train.accum_steps
    cells, left_out = [current], []
    fitting = []
    model = config.expected_model()  # the vocabulary the trials' tokenizer will have, not the preset's
    for b, k in splits(effective):
        # As --micro-batch auto fits a split (on a CPU in half the RAM: a trial out of RAM would end the tune).
        # The current split is measured as set: train accepted it.
        why = "" if b == current.micro_batch else why_it_does_not_fit(
            model, b, config.data.seq_len, "fp32" if "fp32" in precisions else precisions[0], device)
        if why:
            left_out.append({"cell": f"micro-batch {b} × {k}", "reason": f"does not fit in memory ({why})"})
            continue
        fitting.append((b, k))
    for b, k in fitting:
        modes = list(TUNE_MODES)
        if device.type == "cuda" and k == 1:
            modes.append(("reduce-overhead", "model"))
        # Each mode in every precision before the next mode: a budget that ends the list early still
        # tries bf16 (often the largest gain on a CPU with AMX or any recent GPU) and eager cells first
        # (no compile to pay).
        for mode, scope in modes:
            for precision in precisions:
                cell = Cell(mode, scope, k, b, precision)
                if cell not in cells:
                    cells.append(cell)
    return cells, left_out


def check_settings(config: RunConfig, should_stop: Callable[[], bool] | None = None) -> None:
    """Refuse, in one line, the current settings where ``speedboard train`` would refuse them before its first
    step: its own check (the data prepared, positions, tokenizer, the memory of a micro-batch), for the run the
    trials train (from scratch, one process). ``should_stop`` cancels the corpus' preparation (``Cancelled``)."""
    from core.launch import check_before_launch

    check_before_launch(config.replace(init_from=None, resume=None), 1, should_stop=should_stop)


def plan_tune(config: RunConfig, options: TuneOptions | None = None, cells: list[Cell] | None = None,
              cancelled: Callable[[], bool] | None = None) -> TunePlan:
    """Check the settings, list the cells (or take ``cells``), estimate, and keep what fits the budget.

    Raises ``ConfigError`` (one line) for settings that cannot run or a budget too short for two cells, and
    ``Cancelled`` when ``cancelled`` holds between its measurements (seconds each, a minute on a busy machine).
    """
    from core.device import (
        device_name,
        import_training_libraries,
        measure_matmul_peak,
        resolve_device,
        resolve_precision,
        training_flops_per_token,
    )
    from core.runs import check_run_root

    def check_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise Cancelled("the trials were cancelled while they were planned: nothing was measured")

    t0 = time.perf_counter()
    options = options or TuneOptions()
    device = resolve_device(config.train.device)
    if config.resume:
        raise ConfigError("the advisor measures new runs of the current settings; it does not resume a "
                          "checkpoint", "resume")
    # The trials write no run folder there, but the run that follows with the recommended settings does:
    # refused as train refuses it, before the precision probe or anything else is measured.
    check_run_root(config.out_dir)
    import_training_libraries()  # torch.compile's cache folder made (or refused) before anything is measured
    precision = resolve_precision(config.train.precision, device, config.expected_model())
    check_cancelled()  # after the precision probe (its first time on this machine)
    current = cell_of(config, precision)
    precisions = options.precisions or default_precisions(device)
    for p in precisions:
        resolve_precision(p, device)  # bf16 where the device lacks it: one line
    # Before any estimate: a setting train refuses (a micro-batch far beyond memory) is refused in train's
    # words, not planned into a budget of weeks (or a split search over every divisor of a huge batch).
    check_settings(config, should_stop=cancelled)  # a corpus prepared here: minutes for a large one
    check_cancelled()
    left_out: list[dict[str, str]] = []
    if cells is None:
        cells, left_out = candidate_cells(config, precisions, device, current)
        if options.patterns is not None:  # "" names no pattern: refused, not "every cell"
            cells = [current, *(c for c in select_cells(cells, options.patterns) if c != current)]
    elif current not in cells:
        cells = [current, *cells]
    flops = training_flops_per_token(config.expected_model(), config.data.seq_len)  # the trials' vocabulary
    peaks = {}
    for p in sorted({c.precision for c in cells}):
        check_cancelled()
        peaks[p] = measure_matmul_peak(str(device), p)  # cached per machine; its first time, seconds
    check_cancelled()
    total_steps = max(c.warmup_steps for c in cells) + options.steps
    tokens_per_step = config.tokens_per_step()
    efficiency = EXPECTED_MFU.get(device.type, EXPECTED_MFU["cuda"])
    floor = STEP_FLOOR_S.get(device.type, STEP_FLOOR_S["cuda"])
    sample_flops = flops * config.data.seq_len
    # A small model spends most of its step outside its matmuls (Python, kernel launches, the elementwise rest):
    # no share of the matmul peak predicts that, so its passes are timed (tiny reached 5-12% of the peak on a
    # busy CPU where 50% was assumed, and the estimate came out 3-5× short).
    largest = max(c.micro_batch for c in cells)  # cells that do not fit in memory are already left out
    timed: dict[str, tuple[float, float] | None] = {}
    # Each precision timed twice, the precisions in turn, and the cheaper kept: another process' burst of a few
    # seconds on a shared machine made one timing of bf16 passes 4-50× dearer than its trials' steps turned out,
    # and the same command was refused as over its budget once and ran within it the next time.
    for _ in range(TIMINGS_PER_PRECISION):
        for p in peaks:
            if (analytic := sample_flops / (peaks[p] * efficiency)) >= TIME_PASSES_BELOW_S:
                continue
            found = time_passes(config.expected_model(), config.data.seq_len, device, p,
                                min(largest, max(2, int(TIME_PASSES_BELOW_S * 2 / analytic))))
            check_cancelled()
            kept = timed.get(p)
            if kept is None or (found is not None and _pass_cost(found, largest) < _pass_cost(kept, largest)):
                timed[p] = found

    def step_seconds(cell: Cell) -> float:
        if timed.get(cell.precision) is not None:
            return max(floor, cell.accum * _pass_cost(timed[cell.precision], cell.micro_batch))
        return max(floor, flops * tokens_per_step / (peaks[cell.precision] * efficiency))

    estimates = {c.name: _estimate(c, device.type, step_seconds(c), total_steps) for c in cells}

    def fitting(repeats: int) -> list[Cell]:
        kept, used = [], 0.0
        for c in cells:
            cost = estimates[c.name]["first"] + (repeats - 1) * estimates[c.name]["repeat"]
            if used + cost <= options.budget_seconds or not kept:
                kept.append(c)
                used += cost
        return kept

    enough = min(2, len(cells))

    def holds(repeats: int) -> bool:
        """Two settings (or the only one) with this many repeats fit the budget."""
        kept = fitting(repeats)
        return len(kept) >= enough and sum(estimates[c.name]["first"] + (repeats - 1) * estimates[c.name]["repeat"]
                                           for c in kept) <= options.budget_seconds

    repeats = options.repeats
    if repeats > 1 and not holds(repeats):
        # The most repeats that fit (with one setting too: its repeats alone can outgrow any budget): fewer
        # repeats never keep fewer settings, so a bisection finds it (counting down from a huge --repeats
        # would never end).
        low, high = 1, repeats - 1
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if holds(mid) else (low, mid - 1)
        repeats = low
    kept = fitting(repeats)
    takes = sum(estimates[c.name]["first"] for c in cells[:enough])
    if len(kept) < enough or takes > options.budget_seconds:  # one setting selected: its first trial must fit
        need = math.ceil(BUDGET_ADVICE_MARGIN * takes)  # an estimate is not a promise: room for a slower machine
        if need <= MAX_BUDGET_SECONDS:
            advice = f"give --budget-seconds {need} or more"
        elif options.steps > 1:
            advice = "give fewer --trial-steps (the budget is at most a week)"
        else:  # one step each already: only a smaller step helps
            advice = ("a trial of one step takes longer than the longest budget, a week: give a smaller effective "
                      "batch (--micro-batch × --accum) or a smaller model")
        what = "compare two settings" if enough == 2 else "measure the one setting selected"
        raise ConfigError(f"a budget of {options.budget_seconds:g} s is too short to {what} here: "
                          f"that takes about {takes:,.0f} s; {advice}", "budget_seconds")
    spare = [c for c in cells if c not in kept]
    left_out += [{"cell": c.name, "reason": BUDGET_REASON} for c in spare]
    kept_names = {c.name for c in kept}
    return TunePlan(config=config, device=str(device), device_name=device_name(device), cells=kept,
                    current=current.name, left_out=left_out, steps=options.steps, repeats=repeats,
                    total_steps=total_steps, budget_seconds=float(options.budget_seconds),
                    estimates={k: v for k, v in estimates.items() if k in kept_names},
                    flops_per_token=flops, peaks=peaks, spare=spare,
                    spare_estimates={c.name: estimates[c.name] for c in spare},
                    planning_seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- running
def run_tune(plan: TunePlan, sink: Callable[[Any], None] | None = None,
             cancelled: Callable[[], bool] | None = None, report_path: str | os.PathLike[str] | None = None,
             keep_existing: bool = False) -> dict:
    """Train every cell of ``plan`` as interleaved trials on this thread; return (and save) the report.
    ``keep_existing``: ``report_path`` is a default name, and a report there is kept (``save_report``).

    ``sink`` receives ``TuneStarted``, then ``TrialStarted``/``TrialFinished`` per trial, then
    ``TuneFinished`` (its path None when the report could not be saved, before ``ReportNotSaved``); it must
    return quickly. ``cancelled`` is asked between optimizer steps and
    before each trial. A trial is not started when its estimate would end past the budget, and a
    new cell only when its repeats and those of the cells already started fit too; the estimates
    follow the step times measured so far.
    """
    from core.data import prepare_data
    from core.device import training_flops_per_token

    if report_path is not None:
        check_report_path(report_path, flag=None)  # before any trial: measurements are not lost at the end
    emit = sink or (lambda event: None)
    stop = cancelled or (lambda: False)
    t0 = time.perf_counter()
    data = prepare_data(plan.config.data)  # the corpus' store and tokenizer, once, before any clock runs
    if not plan.config.init_from:
        # MFU of the model the trials train: the tokenizer's vocabulary, as the Trainer (and so the CLI, the
        # dashboard and the bench) counts it, not the size asked for (a corpus may give fewer tokens).
        trained = replace(plan.config.model, vocab_size=data.tokenizer.vocab_size)
        plan = replace(plan, flops_per_token=training_flops_per_token(trained, plan.config.data.seq_len))
    emit(TuneStarted(plan.to_dict()))
    _warm_up(plan, stop)
    live = replace(plan, cells=list(plan.cells), estimates=dict(plan.estimates), left_out=list(plan.left_out),
                   spare=list(plan.spare))
    """The plan as it grows: a spare cell that starts joins its cells, leaves its left-out list."""
    estimates = {**plan.spare_estimates, **plan.estimates}
    results: list[TrialResult] = []
    skipped: list[dict[str, Any]] = []
    was_cancelled = False
    measured: dict[str, float] = {}
    """Per cell: the seconds a repeat takes, from its trials so far (a warm compile)."""
    ratios: list[float] = []
    """Measured over estimated step time of the trials so far: scales the estimates still to come."""
    compile_ratios: list[float] = []
    """Measured over estimated cold compile of the compiled cells' first trials: a warm cache shows here."""
    started: list[Cell] = []
    """Cells whose first trial ran: their repeats are kept within the budget before any new cell starts."""
    # Planned cells first, then the spare ones, repeat by repeat: a spare cell that starts is interleaved
    # with the others from its first trial on. Walked, never listed: the repeats may be many.
    lineup = [*plan.cells, *plan.spare]
    spare = {c.name for c in plan.spare}
    device_type = plan.device.split(":")[0]
    remeasured: set[str] = set()
    """Precisions whose matmul peak was measured again in this tune (a trial came close to it)."""

    def scale() -> float:
        return statistics.median(ratios) if ratios else 1.0

    def cost(cell: Cell, repeat: int) -> float:
        e = estimates[cell.name]
        if repeat and cell.name in measured:
            return measured[cell.name]
        steps = (scale() - 1.0) * plan.total_steps * e["step"]
        if repeat:
            return e["repeat"] + steps
        cold = e.get("cold_compile", 0.0)
        # The slowest compile seen so far sets the pace: one cold compile among warm ones keeps it cautious.
        pace = min(3.0, max(0.05, max(compile_ratios))) if compile_ratios else 1.0
        return e["first"] - cold + cold * pace + steps

    dropped: set[str] = set()
    """Planned cells whose first trial did not fit the budget: none of their trials will run."""
    later_skips = 0
    """Trials of started cells that a later repeat's budget left out."""

    def in_count(cell: Cell) -> bool:
        """In the ETA and the trial count: a planned cell that was not dropped, or a spare one that started
        ("Trial 2 of 4" was said of a tune whose budget had left the third and fourth out)."""
        return (cell.name not in spare or cell in started) and cell.name not in dropped

    def eta(repeat: int, position: int) -> float:
        """Seconds of the trials from ``position`` of ``repeat`` on: the rest of this repeat, then the later
        repeats (each costs as much as the next: ``cost`` tells only a first trial from a repeat)."""
        rest = [c for c in lineup[position:] if in_count(c) and (repeat == 0 or c in started)]
        now = sum(cost(c, repeat) for c in rest)
        later = plan.repeats - repeat - 1
        # Every later repeat runs the settings started, and (during the first) those still to start in it: only
        # the started ones, and the time left rose as the first repeat went on.
        again = [c for c in lineup if in_count(c) and (c in started or c in rest)]
        return now + (later * sum(cost(c, 1) for c in again) if later else 0.0)

    forced_past_budget = False
    interrupted = None  # the cell whose trial the cancel cut short
    for repeat in range(plan.repeats):
        if was_cancelled:
            break
        ran = False
        for position, cell in enumerate(lineup):
            if stop():
                was_cancelled = True
                break
            elapsed = time.perf_counter() - t0
            if repeat == 0:
                # A new cell starts only if it and the repeats of every cell started so far fit: a few cells
                # measured with repeats (drift hits them alike) beat many measured once.
                need = cost(cell, 0) + (plan.repeats - 1) * sum(cost(c, 1) for c in [*started, cell])
                if cell.name in spare:  # optional: it must not take the time the planned settings' repeats need
                    need *= SPARE_MARGIN
            elif cell not in started:
                continue  # its first trial was skipped (already listed)
            else:
                need = cost(cell, repeat)
            # Two settings are the least a comparison needs: the first trials of the first two always run, even
            # where the machine turned out slower than estimated (the report says by how much it overran).
            least = repeat == 0 and len(started) < min(2, len(plan.cells))
            if results and elapsed + need > plan.budget_seconds:
                if least:
                    forced_past_budget = True  # run all the same; the closing line says why the budget was overrun
                else:
                    if cell.name not in spare:  # a spare cell is already listed as left out
                        skipped.append({"cell": cell.name, "repeat": repeat,
                                        "reason": "it would not fit in the time budget left"})
                        if repeat == 0:
                            dropped.add(cell.name)
                        else:
                            later_skips += 1
                    continue
            if repeat == 0:
                started.append(cell)
                if cell.name in spare:
                    live.spare = [c for c in live.spare if c != cell]
                    live.cells.append(cell)
                    live.estimates[cell.name] = estimates[cell.name]
                    live.left_out = [x for x in live.left_out if x["cell"] != cell.name]
            total = plan.repeats * sum(1 for c in lineup if in_count(c)) - later_skips
            emit(TrialStarted(cell.name, cell.label, repeat, len(results) + 1, total, elapsed,
                              eta(repeat, position)))
            try:
                result = run_trial(plan.config, cell, plan.total_steps, repeat, cancelled=stop)
            except TrialCancelled:
                was_cancelled, interrupted = True, cell.name
                break
            ran = True
            results.append(result)
            if result.ok:
                compile_s = result.compiler_seconds or result.compile_seconds or 0.0
                warm = WARM_COMPILE_S.get(device_type, WARM_COMPILE_S["cuda"]) if cell.compiled else 0.0
                measured[cell.name] = result.wall_seconds - (compile_s - warm if repeat == 0 else 0.0)
                if result.step_seconds:
                    ratios.append(statistics.median(result.step_seconds) / estimates[cell.name]["step"])
                if repeat == 0 and cell.compiled and estimates[cell.name].get("cold_compile"):
                    compile_ratios.append(compile_s / estimates[cell.name]["cold_compile"])
                raised = _raise_peak_if_reached(live, cell, result, remeasured)
                if raised is not None:
                    live.peaks = {**live.peaks, cell.precision: raised}
            elapsed = time.perf_counter() - t0
            emit(TrialFinished(result.to_dict(), summarise(live, results), elapsed, eta(repeat, position + 1)))
        if not ran:
            # Nothing fitted in this repeat: nothing will in a later one (the estimates change only with a
            # trial, the time left only shrinks). Its skipped trials are listed; the later repeats' are not.
            break
    live.spare = []  # what was not tried by now stays in the left-out list
    planned = (plan.describe(), plan.estimate_seconds)  # what was estimated up front, as the user saw it
    extra = len(live.cells) - len(plan.cells)
    tried = (f"; {extra} of them tried as time allowed" if extra else
             "; none of them could be tried within the budget" if plan.spare and not was_cancelled else "")
    if was_cancelled:  # every setting not run, planned or spare, was left for the cancel, not for the budget
        ran = {r.cell for r in results}
        live.left_out = [{**x, "reason": CANCELLED_REASON} if x["reason"] == BUDGET_REASON else x
                         for x in live.left_out]
        live.left_out += [{"cell": c.name, "reason": INTERRUPTED_REASON if c.name == interrupted else CANCELLED_REASON}
                          for c in live.cells if c.name not in ran]
        tried = f"; cancelled after {counted(len(results), 'trial')}"
    plan = live
    report = build_report(plan, results, time.perf_counter() - t0, was_cancelled, skipped)
    report["second_setting_past_budget"] = forced_past_budget
    report["plan"]["description"] = planned[0] + tried
    report["plan"]["estimate_seconds"] = planned[1]
    path = None
    if report_path is not None:
        from core.paths import user_path

        report["path"] = str(user_path(report_path))
        try:
            path = str(save_report(report, report_path, keep_existing))
        except ConfigError as exc:  # a disk that filled up during the trials: the results are still theirs
            report["path"] = None
            emit(TuneFinished(report, None))
            raise ReportNotSaved(str(exc), report) from None
    emit(TuneFinished(report, path))
    return report


WARM_UP_STEPS = 2
"""Optimizer steps of the trial that warms the process up before the first measured one."""


def _warm_up(plan: TunePlan, stop: Callable[[], bool]) -> None:
    """An eager trial at the first setting's micro-batch and precision, its figures unused. A process's first
    training pays one-time costs (thread pools, the allocator's first pages, the first calls of the optimizer and
    of each kernel) inside its timed steps: the first trial measured, the current settings', read several times
    slower than its own repeats, and every setting compared with it looked that much faster."""
    first = plan.cells[0]
    with contextlib.suppress(TrialCancelled):  # the trials see the stop next
        run_trial(plan.config, Cell("off", "model", 1, first.micro_batch, first.precision), WARM_UP_STEPS,
                  cancelled=stop)


def _raise_peak_if_reached(plan: TunePlan, cell: Cell, result: TrialResult, remeasured: set[str]) -> float | None:
    """A trial whose median step reached ``PEAK_CHECK_MFU`` of its precision's matmul peak: the peak is measured
    again (once per precision and tune) and the cache keeps the higher figure, which is returned where it rose.
    A peak cached while the machine was busy reads low, and an MFU near 100% is how it shows."""
    import torch

    from core.precision import matmul_peak

    peak = plan.peaks.get(cell.precision)
    if cell.precision in remeasured or not result.step_rates or not peak:
        return None
    if (peak_share(statistics.median(result.step_rates), plan.flops_per_token, peak) or 0.0) < PEAK_CHECK_MFU:
        return None
    remeasured.add(cell.precision)
    kept = matmul_peak(torch.device(plan.device), cell.precision, refresh=True)
    return kept if kept > peak else None


# ----------------------------------------------------------------------------- summary
def _cell_row(plan: TunePlan, cell: Cell, trials: list[TrialResult]) -> dict[str, Any]:
    ok = [t for t in trials if t.ok]
    failed = [t for t in trials if not t.ok]
    row: dict[str, Any] = {**cell.to_dict(), "current": cell.name == plan.current, "trials": len(trials),
                           "measured": len(ok), "error": failed[0].error if failed and not ok else None}
    rates = [r for t in ok for r in t.step_rates]
    s = spread(rates)
    row["tokens_per_s"] = s.to_dict() if s else None
    peak = plan.peaks.get(cell.precision)
    row["mfu"] = utilization(s.median, plan.flops_per_token, peak) if s and peak else None
    peaks = [t.peak_mem_gib for t in ok if t.peak_mem_gib is not None]
    row["peak_mem_gib"] = max(peaks) if peaks else None
    # Never below zero: what the process freed between the reading before a trial and the trial's peak (an
    # earlier trial's leftovers) made a tiny model's figure "-0.00".
    train = [max(0.0, t.peak_mem_gib - t.mem_before_gib) for t in ok
             if t.peak_mem_gib is not None and t.mem_before_gib is not None]
    row["train_mem_gib"] = statistics.median(train) if train else None
    cold, warm = [], []
    for t in ok:
        seconds = t.compiler_seconds if t.compiler_seconds is not None else t.compile_seconds
        if not cell.compiled or seconds is None:
            continue
        if t.compile_cache_misses is None:
            (cold if t.repeat == 0 else warm).append(seconds)
        elif t.compile_cache_misses > 0:
            cold.append(seconds)
        else:
            warm.append(seconds)
    row["compile_cold_s"] = statistics.median(cold) if cold else None
    row["compile_warm_s"] = statistics.median(warm) if warm else None
    losses = [t.final_loss for t in ok if t.final_loss is not None]
    row["loss"] = losses[0] if losses else None
    return row


def summarise(plan: TunePlan, results: list[TrialResult]) -> dict[str, Any]:
    """A row per cell (in plan order), the loss agreement and the recommendation, from the trials so far."""
    by_cell: dict[str, list[TrialResult]] = {}
    for r in results:
        by_cell.setdefault(r.cell, []).append(r)
    rows = {c.name: _cell_row(plan, c, by_cell.get(c.name, [])) for c in plan.cells}
    losses = {name: row["loss"] for name, row in rows.items() if row["loss"] is not None}
    reference = loss_reference(plan.cells, losses)
    for c in plan.cells:
        row = rows[c.name]
        if row["loss"] is None or reference is None:
            row["loss_deviation"], row["loss_agrees"] = None, None
            continue
        row["loss_deviation"] = row["loss"] - losses[reference]
        row["loss_tolerance"] = loss_tolerance(c.precision)
        row["loss_agrees"] = abs(row["loss_deviation"]) <= row["loss_tolerance"]
    current_trials = by_cell.get(plan.current, [])
    for c in plan.cells:
        cmp = compare(by_cell.get(c.name, []), current_trials) if c.name != plan.current else None
        rows[c.name]["vs_current"] = cmp.to_dict() if cmp else None
    return {"rows": rows, "loss_reference": reference, "recommendation": recommend(plan, rows, by_cell)}


def recommend(plan: TunePlan, rows: dict[str, dict], by_cell: dict[str, list[TrialResult]]) -> dict[str, Any] | None:
    """The fastest measured cell whose loss agrees, its margin over the current settings and whether the
    margin is above the noise; None before any cell is measured."""
    eligible = [row for row in rows.values() if row["tokens_per_s"] and row.get("loss_agrees") is not False]
    if not eligible:
        return None
    baseline = by_cell.get(plan.current, [])
    paired = any(t.ok and t.tokens_per_s for t in baseline)  # the current settings were measured

    def speed(row: dict) -> float:
        """How fast a cell is, for the ranking: its ratio to the current settings, paired by repeat (trials run
        side by side, as the table's "vs current"), so a cell measured only in a quiet repeat does not outrank
        one also measured in a loaded one; the median tokens/s where the current settings have no measurement."""
        if not paired:
            return row["tokens_per_s"]["median"]
        return compare(by_cell.get(row["name"], []), baseline).ratio

    best = max(eligible, key=speed)
    cell = next(c for c in plan.cells if c.name == best["name"])
    current = rows.get(plan.current)
    out: dict[str, Any] = {"cell": best["name"], "label": best["label"], "settings": cell.settings(),
                           "tokens_per_s": best["tokens_per_s"]["median"], "is_current": best["name"] == plan.current}
    if out["is_current"]:
        others = [row for row in eligible if row["name"] != plan.current]
        runner_up = max(others, key=speed) if others else None
        cmp = compare(by_cell.get(runner_up["name"], []), by_cell.get(plan.current, [])) if runner_up else None
        out["vs_current"] = None
        out["significant"] = bool(cmp and cmp.significant)
        if runner_up is None or cmp is None:
            out["text"] = f"The current settings ({best['label']}) are the only ones measured."
        elif cmp.significant:
            out["text"] = (f"Keep the current settings ({best['label']}): the fastest; the next best, "
                           f"{runner_up['label']}, is {cmp.describe()}.")
        else:
            out["text"] = (f"Keep the current settings ({best['label']}): the fastest measured, but the next "
                           f"best, {runner_up['label']}, shows {cmp.describe()}.")
        return out
    cmp = compare(by_cell.get(best["name"], []), by_cell.get(plan.current, []))
    out["vs_current"] = cmp.to_dict() if cmp else None
    out["significant"] = bool(cmp and cmp.significant)
    if cmp is None:
        why = current["error"] if current and current.get("error") else "it was not measured"
        out["text"] = f"Fastest: {best['label']}; the current settings cannot be compared ({why})."
    elif cmp.significant:
        out["text"] = f"Fastest: {best['label']}, {cmp.describe()}."
    else:
        but = "" if cmp.noise is None else "but "  # "too few steps to judge" is its own reservation
        out["text"] = f"Fastest measured: {best['label']}, {but}{cmp.describe()}."
    # A pick is only as clear as its lead over the next best: a tie there is said, not hidden.
    others = [row for row in eligible if row["name"] != best["name"]]
    runner_up = max(others, key=speed) if others else None
    if runner_up is not None and runner_up["name"] == plan.current:
        # The next best is the current settings, against which the text above already set the pick (a setting
        # ranked below them was named "the next best").
        out["runner_up"] = plan.current
        out["runner_up_tied"] = bool(cmp and cmp.noise is not None and not cmp.significant)
        return out
    # The runner-up against the pick, signed as every figure of the text is (the setting named, against the
    # other): the pick's lead, worded as the runner-up's, read "+1.6%" for one 1.6% slower.
    behind = compare(by_cell.get(runner_up["name"], []), by_cell.get(best["name"], [])) if runner_up else None
    out["runner_up"] = runner_up["name"] if runner_up else None
    # A tie needs a noise to be within: with too few timed steps to judge, the margin is given, no verdict.
    out["runner_up_tied"] = bool(behind and behind.noise is not None and not behind.significant)
    if out["runner_up_tied"]:
        out["text"] += f" The next best, {runner_up['label']}, shows {behind.describe('it')}: either will do."
    elif behind is not None and behind.noise is None:
        out["text"] += f" The next best, {runner_up['label']}, shows {behind.describe('it')}."
    return out


def build_report(plan: TunePlan, results: list[TrialResult], elapsed: float, cancelled: bool,
                 skipped: list[dict[str, str]] | None = None) -> dict[str, Any]:
    from core.device import load_average
    from core.runs import library_versions

    summary = summarise(plan, results)
    load = load_average()
    rec = summary["recommendation"]
    cores = os.cpu_count() or 1
    if rec is not None and load is not None and load[0] > BUSY_LOAD_PER_CORE * cores:
        # The trials keep the cores busy themselves (a load about their count): well above it, other work ran
        # beside them, and a margin measured then may not hold on a quiet machine.
        rec["text"] += (f" The machine was busy during the trials (load average {load[0]:.1f} on {cores} "
                        f"core{'s' * (cores > 1)}): other work ran beside them, so these margins may not hold; "
                        f"tune again on a quiet machine to be sure.")
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "plan": plan.to_dict(),
        "trials": [r.to_dict() for r in results],
        "summary": summary,
        "recommendation": summary["recommendation"],
        "elapsed_seconds": elapsed,
        "cancelled": cancelled,
        "skipped": skipped or [],
        "load_average": list(load) if load else None,
        "versions": library_versions(),
    }


# ----------------------------------------------------------------------------- the report file
def reports_dir() -> Path:
    """``<data folder>/tune``, beside the runs folder: where reports go unless told otherwise."""
    from core.runs import default_out_dir

    return default_out_dir().parent / "tune"


def default_report_path(config: RunConfig) -> Path:
    """``<data folder>/tune/<date>-<time>-<preset>.json``."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return reports_dir() / f"{stamp}-{config.preset}.json"


def _temp_path(target: Path) -> Path:
    """The temporary file ``save_report`` writes before renaming it into place."""
    from core.paths import hidden_form

    return target.with_name(f".{hidden_form(target.name)}.tmp-{os.getpid()}")  # within the file system's 255 bytes


def save_report(report: dict[str, Any], path: str | os.PathLike[str], keep_existing: bool = False) -> Path:
    """Write the report as JSON, whole or not at all (a temporary file renamed into place); returns where.

    ``keep_existing``: ``path`` is a default name (a time stamp), and a report found there (another tune started
    in the same second) is kept: this one takes the next free name, ``-2``, ``-3``, …"""
    from core.paths import not_a_file, user_path, why_not_writable, why_write_failed, written_through

    target = written_through(user_path(path))
    if (what := not_a_file(target)) is not None:  # it became one during the trials
        raise ConfigError(f"cannot write the tuning report {target}: it is {what}, not a file", "json")
    if reason := why_not_writable(target.parent):  # so did its folder ("File exists" said nothing)
        raise ConfigError(f"cannot write the tuning report {target}: {reason}", "json")
    tmp = _temp_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if keep_existing:
            target = _write_to_a_free_name(report, tmp, target)
        else:
            tmp.write_text(finite_json(report, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True) if tmp.parent.is_dir() else None
        raise ConfigError(f"cannot write the tuning report {target}: {why_write_failed(exc, target)}",
                          "json") from None
    return target


def _write_to_a_free_name(report: dict[str, Any], tmp: Path, target: Path) -> Path:
    """The report at ``target``, or at ``target`` with ``-2``, ``-3``, … where a file is there (its ``path``
    saying which): a hard link is made only where the name is free, so of two writers each gets its own."""
    from core.paths import numbered

    for candidate in numbered(target):
        report["path"] = str(candidate)
        tmp.write_text(finite_json(report, indent=1) + "\n", encoding="utf-8")
        try:
            os.link(tmp, candidate)
        except FileExistsError:
            continue
        except OSError:  # no hard links on this file system: a look, then a rename (a narrow race)
            if candidate.exists():
                continue
            os.replace(tmp, candidate)
        tmp.unlink(missing_ok=True)
        return candidate
    raise FileExistsError(errno.EEXIST, "every report name of this second is taken", str(target))


class ReportNotSaved(ConfigError):
    """The trials ended but their report could not be written; ``report`` holds what they measured."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message, "json")
        self.report = report


def check_report_path(path: str | os.PathLike[str], flag: str | None = "--json",
                      what: str = "the tuning report") -> Path:
    """Before any trial: the report can be written there (not a folder, a device, a named pipe or a socket;
    its folder a writable folder or creatable, and where it exists, the temporary file ``save_report`` writes
    can be created in it). ``flag`` names how the user gave the path; None for a default location, the file
    then named as ``what`` (the bench modules check their results files so)."""
    from core.paths import (
        control_character,
        not_a_file,
        unnameable,
        user_path,
        why_not_writable,
        why_write_failed,
        written_through,
    )

    target = written_through(user_path(path))
    lead = f"{flag} {target}" if flag else f"cannot write {what} {target}"
    if target.is_dir():
        raise ConfigError(f"{flag} {target} is a folder; name a file" if flag else f"{lead}: it is a folder", "json")
    if (what := not_a_file(target)) is not None:
        raise ConfigError(f"{lead}: it is {what}, not a file; name a file", "json")
    # The file's own name too (a line break in it split the closing "report: …" line in two), as for folders.
    reason = unnameable(target) or control_character(target) or why_not_writable(target.parent)
    if reason:
        raise ConfigError(f"{lead}: {reason}", "json")
    if target.parent.is_dir():
        # Permission bits do not tell everything (root passes them in /proc, where nothing can be created):
        # the temporary file is created and removed now, not first tried after every trial.
        tmp = _temp_path(target)
        try:
            with open(tmp, "x", encoding="utf-8"):
                pass
        except FileExistsError:  # this process's own leftover: writable as it is
            pass
        except OSError as exc:
            raise ConfigError(f"{lead}: no file can be created in {target.parent} ({why_write_failed(exc, target)})",
                              "json") from None
        with contextlib.suppress(OSError):
            tmp.unlink()
    return target


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A report written by ``save_report``; anything else is one ``ConfigError`` line."""
    from core.paths import user_path

    target = user_path(path)
    if target.exists() and not target.is_file():  # a named pipe would block the reader, a device never end
        raise ConfigError(f"cannot read the tuning report {target}: it is not a regular file")
    try:
        data = parse_json(target.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError and every JSON damage
        raise ConfigError(f"cannot read the tuning report {target} ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{target} is not a Speedboard tuning report")
    for key in ("plan", "summary", "trials"):
        if not isinstance(data.get(key), (dict, list)):
            raise ConfigError(f"{target} is not a complete tuning report (no {key})")
    try:
        _check_readable(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as exc:
        raise ConfigError(f"{target} is not a complete tuning report ({type(exc).__name__}: {exc})") from None
    return data


def _check_readable(report: dict[str, Any]) -> None:
    """Everything a report is read for (the table, the recommendation and its settings, the plan line, the
    time taken) can be read from it: a damaged field raises here, not in the window that shows it."""
    plan = report["plan"]
    if not isinstance(plan.get("description"), str) or not plan["description"]:
        raise ValueError("the plan has no description")
    budget = plan.get("budget_seconds")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))):
        raise TypeError(f"budget_seconds is {budget!r}")
    if budget is not None and not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"budget_seconds is {budget!r}")
    not_tried(plan)
    rows = report["summary"]["rows"]
    if not all(isinstance(row, dict) and isinstance(row["name"], str) and isinstance(row["current"], bool)
               for row in rows.values()):
        raise ValueError("a row has no name or current flag")
    for row in rows.values():  # measured rates: NaN, infinite or negative ones were shown as if measured
        rates = row["tokens_per_s"] or {}
        for key in ("median", "low", "high"):
            value = rates.get(key)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{row['name']}: tokens/s {key} is {value!r}")
    rec = _recommendation(report)
    if rec:  # a pick of no measured row (rows removed by hand) showed beside an empty table
        picked = rows.get(rec["cell"])
        if not isinstance(picked, dict) or not picked["tokens_per_s"]:
            raise ValueError(f"the recommended setting {rec['cell']!r} is not among the measured rows")
    format_report(report)
    time_taken(report)
    settings = report_settings(report)
    if settings is not None:
        TrainConfig(**{k: settings[k] for k in ("compile_mode", "compile_scope", "precision", "micro_batch",
                                                 "accum_steps")})


# ----------------------------------------------------------------------------- text
def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


TABLE_HEADER = ("setting", "tokens/s median (min–max)", "vs current", "MFU", "compile cold / warm (s)",
                "train mem (GiB)", "loss", "status")


def table_rows(report_or_summary: dict[str, Any], running: bool = False) -> list[list[str]]:
    """The table the CLI prints and the dashboard shows, as text cells (header first). A report names why a
    setting was not run (the time budget, memory); while the trials run (``running``) it is still to come."""
    summary = report_or_summary.get("summary", report_or_summary)
    why_not = {x["cell"]: x["reason"] for x in [*report_or_summary.get("plan", {}).get("left_out", []),
                                                 *report_or_summary.get("skipped", [])]}
    rows = [list(TABLE_HEADER)]
    for row in summary["rows"].values():
        s = row["tokens_per_s"]
        rate = "–" if not s else (f"{s['median']:,.0f}" if s["n"] == 1 else
                                  f"{s['median']:,.0f} ({s['low']:,.0f}–{s['high']:,.0f})")
        vs = row.get("vs_current")
        # A ratio of single steps has no noise to be within: said as such, not as noise.
        unjudged = " (too few steps)" if vs and "noise" in vs and vs["noise"] is None else " (noise)"
        versus = "current" if row["current"] else ("–" if not vs else
                                                   f"{vs['ratio']:.2f}×{'' if vs['significant'] else unjudged}")
        compile_s = "–" if row["mode"] == "off" else (f"{_num(row['compile_cold_s'], '{:.1f}')} / "
                                                      f"{_num(row['compile_warm_s'], '{:.1f}')}")
        if row.get("error"):
            status = f"failed: {row['error']}"
        elif row["trials"] == 0:
            why = why_not.get(row["name"])
            status = ("to run" if running else "not run" if why is None else
                      f"cut short: {why}" if why == INTERRUPTED_REASON else f"not run: {why}")
        elif row.get("loss_agrees") is False:
            status = f"loss disagrees ({row['loss_deviation']:+.2e} > {row['loss_tolerance']:g})"
        else:
            status = "ok"
        mfu = "–" if row.get("mfu") is None else mfu_text(row["mfu"])
        rows.append([row["label"], rate, versus, mfu, compile_s, _num(_train_mem(row), "{:.2f}"),
                     _num(row.get("loss"), "{:.4f}"), status])
    return rows


def _train_mem(row: dict[str, Any]) -> float | None:
    """A setting's own memory: its trials' peak less what the process held before each (on a CPU the process'
    peak is mostly Python and torch, the same for every setting); the peak where that is not known."""
    own = row.get("train_mem_gib")
    return own if own is not None else row.get("peak_mem_gib")


def format_report(report: dict[str, Any]) -> str:
    """The table and the recommendation as plain text."""
    rows = table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    rec = report.get("recommendation")
    lines.append("")
    lines.append(f"recommendation: {rec['text']}" if rec else "recommendation: none (no setting was measured)")
    if rec and not rec["is_current"]:
        s = rec["settings"]
        lines.append(f"  train with: --compile {s['compile_mode']}"
                     + (f" --compile-scope {s['compile_scope']}" if s["compile_mode"] != "off" else "")
                     + f" --precision {s['precision']} --micro-batch {s['micro_batch']} --accum {s['accum_steps']}")
    # Settings never run, and repeats skipped of settings that were: a setting is counted once, not per trial.
    skipped = report.get("skipped", [])
    unrun = report["plan"].get("left_out", []) + [x for x in skipped if not x.get("repeat")]
    repeats = [x for x in skipped if x.get("repeat")]
    parts = [f"{counted(len(group), noun)} ({'; '.join(sorted({x['reason'] for x in group}))})"
             for group, noun in ((unrun, "setting"), (repeats, "repeat")) if group]
    in_table = set((report.get("summary") or {}).get("rows", {}))
    absent = [x["cell"] for x in report["plan"].get("left_out", []) if x["cell"] not in in_table]  # no row
    if absent and parts:
        parts[0] = parts[0][:-1] + (f"; {'the one' if len(absent) == 1 else f'{len(absent)}'} left out before "
                                    f"the trials, not in the table: {', '.join(absent)})")
    if parts:
        lines.append(f"not tried: {', '.join(parts)}")
    lines.append(time_taken(report))
    return "\n".join(lines)


def time_taken(report: dict[str, Any]) -> str:
    """``done in 412 s``, and by how much the budget was overrun where it was."""
    state = "cancelled" if report.get("cancelled") else "done"
    text = f"{state} in {report['elapsed_seconds']:,.0f} s"
    planning = report.get("plan", {}).get("planning_seconds") or 0.0  # reports of earlier versions lack it
    if planning >= 0.5:
        text += f", after {planning:,.0f} s of planning"
    budget = report.get("plan", {}).get("budget_seconds")
    if isinstance(budget, (int, float)) and report["elapsed_seconds"] > budget and not report.get("cancelled"):
        text += f", {report['elapsed_seconds'] - budget:,.0f} s over the budget of {budget:,.0f} s"
        # A trial starts only where its estimate fits, but for the second setting, run whatever it costs.
        text += (": a comparison needs two settings at least" if report.get("second_setting_past_budget") else
                 ": trials took longer than estimated")
    return text


def _recommendation(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's pick (a finished report's, else its summary's), or None."""
    return report.get("recommendation") or (report.get("summary") or {}).get("recommendation")


def report_settings(report: dict[str, Any]) -> dict[str, Any] | None:
    """The TrainConfig fields of the recommendation (what Apply sets), or None."""
    rec = _recommendation(report)
    return dict(rec["settings"]) if rec else None


def tune(config: RunConfig, options: TuneOptions | None = None, sink=None, cancelled=None,
         report_path=None) -> dict[str, Any]:
    """``plan_tune`` then ``run_tune``."""
    return run_tune(plan_tune(config, options, cancelled=cancelled), sink, cancelled, report_path)

