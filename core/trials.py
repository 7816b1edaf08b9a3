"""Short timed training runs of one setting: the engine under ``speedboard tune`` and ``speedboard bench``.

A *cell* is one way to train the same experiment: compile mode and scope,
precision, and a micro-batch × accumulation split of the same effective
batch. A *trial* trains a cell for a fixed number of optimizer steps with
Speedboard's own ``Trainer``, exactly as the CLI and the dashboard start it:
the same seed (so the same initial weights), the same sample stream (so the
same global batches), in a throw-away run folder that is removed afterwards.
Warm-up steps, in which torch.compile compiles, are left out of timing; every
trial trains the same number of steps, so the losses after them must agree
across cells within the precision's tolerance (the speedups leave the math
unchanged).

A trial never raises for what it measures: a compile error that made the
Trainer fall back to eager, an out-of-memory error or any other exception is
a ``TrialResult`` with its ``error``. Only a cancellation (``TrialCancelled``)
leaves it, between two optimizer steps.
"""

from __future__ import annotations

import fnmatch
import gc
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from core.compile import reset_compiler
from core.config import COMPILE_MODES, CUDA_GRAPH_MODES, RunConfig
from core.control import Control
from core.device import release_freed_memory
from core.errors import SpeedboardError, describe_exception, first_line
from core.events import CompileFinished, Event, RunFailed, RunFinished, RunStarted, StepMetrics, WarningRaised
from core.paths import remove_tree, temp_folder_name
from core.stopping import removed_on_forced_exit
from core.trainer import COMPILE_WARMUP_STEPS, Trainer

LOSS_TOLERANCE = {"fp32": 2e-3, "bf16": 3e-2, "fp16": 3e-2}
"""Absolute tolerance of the loss after a trial's tokens, against the fp32 eager reference: fp32 sums
in another order differ in the last bits; bf16 keeps 8 bits of mantissa in its matmuls."""

MODE_LABELS = {"off": "off", "default": "default", "reduce-overhead": "reduce-overhead",
               "max-autotune": "max-autotune", "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}


class TrialError(SpeedboardError):
    """A set of trials that cannot be built (a bad option)."""


@dataclass(frozen=True)
class Cell:
    """One configuration to train; every runner trains it the same way."""

    mode: str
    scope: str
    accum: int
    micro_batch: int
    precision: str = "fp32"
    memory_only: bool = False
    """An extra cell of the benchmark's memory table (micro-batch b, no accumulation): not timed."""

    @property
    def name(self) -> str:
        base = f"off-a{self.accum}" if self.mode == "off" else f"{self.mode}-{self.scope}-a{self.accum}"
        base = f"{base}-{self.precision}"
        return f"{base}-mb{self.micro_batch}" if self.memory_only else base

    @property
    def short_name(self) -> str:
        """The name without its precision (what ``--cells`` patterns written before precisions match)."""
        return self.name.replace(f"-{self.precision}", "", 1)

    @property
    def label(self) -> str:
        """For people: ``default (per block), bf16, 4 × 2``."""
        what = "compile off" if self.mode == "off" else (
            f"{self.mode} ({'per block' if self.scope == 'block' else 'whole model'})")
        return f"{what}, {self.precision}, {self.micro_batch} × {self.accum}"

    @property
    def compiled(self) -> bool:
        return self.mode != "off"

    @property
    def warmup_steps(self) -> int:
        """Steps left out of timing: the Trainer's own rule (compilation happens in the first ones)."""
        return COMPILE_WARMUP_STEPS if self.compiled else 1

    def settings(self) -> dict:
        """The TrainConfig fields this cell sets."""
        return {"micro_batch": self.micro_batch, "accum_steps": self.accum, "compile_mode": self.mode,
                "compile_scope": self.scope, "precision": self.precision}

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        return cls(data["mode"], data["scope"], int(data["accum"]), int(data["micro_batch"]),
                   data.get("precision", "fp32"), bool(data.get("memory_only", False)))

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "scope": self.scope, "accum": self.accum,
                "micro_batch": self.micro_batch, "precision": self.precision, "memory_only": self.memory_only,
                "label": self.label}


def cell_of(config: RunConfig, precision: str) -> Cell:
    """The cell that a config trains (``precision`` resolved from ``auto``)."""
    tc = config.train
    return Cell(tc.compile_mode, tc.compile_scope if tc.compile_mode != "off" else "model", tc.accum_steps,
                tc.micro_batch, precision)


def splits(effective_batch: int) -> list[tuple[int, int]]:
    """Every micro-batch × accumulation with this product, largest micro-batch first."""
    # Divisors come in pairs around the square root: a batch of 10⁸ takes 10⁴ steps, not 10⁸.
    small = [b for b in range(1, math.isqrt(effective_batch) + 1) if effective_batch % b == 0]
    micro = sorted({*small, *(effective_batch // b for b in small)}, reverse=True)
    return [(b, effective_batch // b) for b in micro]


BENCH_MODES = (("off", "model"), ("default", "model"), ("default", "block"))
"""The compile settings the benchmark crosses unless told otherwise."""


def parse_modes(text: str) -> tuple[tuple[str, str], ...]:
    """``off,default-model,max-autotune-no-cudagraphs`` → (mode, scope) pairs; a mode alone is the whole
    model. CUDA-graph modes are not listed here: the matrix adds them on CUDA, at accumulation 1."""
    pairs = []
    allowed = [m for m in COMPILE_MODES if m not in CUDA_GRAPH_MODES]
    for item in (v.strip() for v in text.split(",")):
        if not item:
            continue
        mode, scope = item, "model"
        for suffix in ("-model", "-block"):
            if item.endswith(suffix) and item[: -len(suffix)] in allowed:
                mode, scope = item[: -len(suffix)], suffix[1:]
        if mode not in allowed or (mode == "off" and scope != "model"):
            raise TrialError(f"unknown compile setting {item!r}; choose from "
                             f"{', '.join(['off'] + [f'{m}-{s}' for m in allowed[1:] for s in ('model', 'block')])}")
        pairs.append((mode, scope))
    if not pairs:
        raise TrialError("no compile setting given")
    return tuple(dict.fromkeys(pairs))


def build_matrix(effective_batch: int, accums: tuple[int, ...], precisions: tuple[str, ...] = ("fp32",),
                 cuda: bool = False, modes: tuple[tuple[str, str], ...] = BENCH_MODES) -> list[Cell]:
    """The benchmark's matrix: per precision, each (mode, scope) of ``modes`` × accumulation (by default
    compile off, ``default`` whole model and per block); on CUDA also the CUDA-graph modes at
    accumulation 1 (the only one they are allowed)."""
    for k in accums:
        if k < 1 or effective_batch % k:
            raise TrialError(f"effective batch {effective_batch} is not divisible by accumulation {k}; "
                             f"choose an effective batch that every accumulation in {list(accums)} divides")
    cells = []
    for precision in precisions:
        for mode, scope in modes:
            cells += [Cell(mode, scope, k, effective_batch // k, precision) for k in accums]
        if cuda:
            cells += [Cell(mode, "model", 1, effective_batch, precision) for mode in CUDA_GRAPH_MODES]
    return cells


def select_cells(cells: list[Cell], patterns: str | None) -> list[Cell]:
    """Keep the cells whose name (with or without its precision) matches one of the comma-separated
    shell patterns (``off-*,default-model-a1``)."""
    if patterns is None:
        return cells
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    if not wanted:  # "", "," or " ": a list of nothing, not "every cell"
        raise TrialError(f"--cells {patterns!r} names no pattern; cells are: {', '.join(c.name for c in cells)}")

    def match(cell: Cell, pattern: str) -> bool:
        return fnmatch.fnmatchcase(cell.name, pattern) or fnmatch.fnmatchcase(cell.short_name, pattern)

    for p in wanted:
        if not any(match(c, p) for c in cells):
            raise TrialError(f"--cells pattern {p!r} matches no cell; cells are: {', '.join(c.name for c in cells)}")
    return [c for c in cells if any(match(c, p) for p in wanted)]


def cell_config(base: RunConfig, cell: Cell, total_steps: int, out_dir: str | None) -> RunConfig:
    """The Trainer's config for ``cell``: a fixed number of steps, no periodic validation, sample or save."""
    return base.replace(out_dir=out_dir, resume=None, init_from=None, train={
        **cell.settings(), "budget_kind": "steps", "budget": total_steps,
        "eval_every": 0, "eval_batches": 1, "sample_every": 0, "sample_tokens": 1, "save_every": 0, "keep": 1,
    })


# ----------------------------------------------------------------------------- one trial
class MeasurementDone(BaseException):
    """Raised by the sink after the last measured step, to skip the run's closing work.

    The end-of-run validation, sample and checkpoint are not part of any
    figure; cutting them saves seconds per run. A BaseException, so it passes
    any ``except Exception`` on its way out of the Trainer, like Ctrl-C does.
    """


class TrialCancelled(BaseException):
    """The caller asked the trials to stop; raised between two optimizer steps (or before a trial)."""


class TimingSink:
    """Stamps each step's metrics event with the wall clock as it arrives.

    The interval between two consecutive events is one whole iteration of the
    Trainer's loop: control polling, the optimizer step, its host sync and the
    bookkeeping around it. With ``stop_after`` the run ends right after that step's event;
    ``cancelled`` is asked at every event, and a True ends the run at once (``TrialCancelled``).
    """

    def __init__(self, stop_after: int | None = None, cancelled: Callable[[], bool] | None = None) -> None:
        self.stop_after = stop_after
        self.cancelled = cancelled
        self.started = 0.0
        self.steps: list[tuple[float, StepMetrics]] = []
        self.compile: CompileFinished | None = None
        self.warnings: list[str] = []
        self.run_started: RunStarted | None = None

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        if isinstance(event, RunStarted):  # the last thing before the loop starts
            self.started = now
            self.run_started = event
        elif isinstance(event, StepMetrics):
            self.steps.append((now, event))
            if event.step == self.stop_after:
                raise MeasurementDone
        elif isinstance(event, CompileFinished):
            self.compile = event
        elif isinstance(event, WarningRaised):
            self.warnings.append(event.message)
        elif isinstance(event, (RunFailed, RunFinished)):
            # The run's last word, said as it ends: raising here would replace why it ends (a second Ctrl-C's
            # KeyboardInterrupt, which aborts, became a cancel that went on to the summary and exit code 0).
            return
        if self.cancelled is not None and self.cancelled():
            raise TrialCancelled

    def window(self) -> tuple[float, float, list[float]]:
        """Warm-up seconds, timed-window seconds, and the seconds of each timed step."""
        warm = [t for t, e in self.steps if e.warmup]
        timed = [t for t, e in self.steps if not e.warmup]
        assert warm and timed, "a timed run needs warm-up steps and timed steps"
        assert warm[-1] < timed[0], "warm-up steps come first"
        edges = [warm[-1], *timed]
        return warm[-1] - self.started, timed[-1] - warm[-1], [b - a for a, b in zip(edges, edges[1:], strict=False)]


@dataclass
class TrialResult:
    """One timed run of one cell (``runner`` ``speedboard``: the Trainer; the benchmark adds references)."""

    cell: str
    runner: str
    repeat: int
    tokens_per_s: float | None = None
    """Tokens of the timed steps over their wall time (warm-up excluded); None when the trial failed."""
    tokens_per_step: int = 0
    timed_steps: int = 0
    window_seconds: float = 0.0
    warmup_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    """Each timed step: the Trainer's from its metrics events, the bare loop's from its ``StepClock``."""
    compile_seconds: float | None = None
    """The Trainer's own compile figure (warm-up minus the same steps at steady speed), in this process."""
    compiler_seconds: float | None = None
    """Time inside torch.compile during the run (``compiler_seconds()``)."""
    compile_cache_hits: int | None = None
    """Graphs Inductor took from its disk cache in this trial: > 0 and no misses is a warm compile."""
    compile_cache_misses: int | None = None
    bookkeeping_seconds: list[float] = field(default_factory=list)
    """Trainer only: each timed step's loop iteration minus the optimizer step the Trainer timed itself
    (control polling, metrics event, run-folder line): the bookkeeping's own cost, free of run-to-run noise."""
    peak_mem_gib: float | None = None
    """CUDA: max allocated during the trial; CPU: the peak resident set (Linux; elsewhere sampled per step)."""
    mem_before_gib: float | None = None
    """The same reading just before the trial: training memory is the peak minus this."""
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    """Why the cell could not be measured (a compile error, out of memory, …); None when it was."""
    wall_seconds: float = 0.0
    """The whole trial, set-up and compilation included."""

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def step_rates(self) -> list[float]:
        """Tokens/s of each timed step."""
        return [self.tokens_per_step / t for t in self.step_seconds if t > 0]

    @property
    def median_tokens_per_s(self) -> float | None:
        """Its median timed step's tokens/s: the figure its line and the tables give (a slow first step inside the
        window moves ``tokens_per_s``, not this); in its JSON beside ``tokens_per_s``."""
        rates = self.step_rates
        return statistics.median(rates) if rates else self.tokens_per_s

    def to_dict(self) -> dict:
        return {**asdict(self), "median_tokens_per_s": self.median_tokens_per_s}

    @classmethod
    def from_dict(cls, data: dict) -> TrialResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def compiler_seconds() -> float | None:
    """Seconds spent inside torch.compile (Dynamo, AOTAutograd, Inductor; forward and backward) since the last
    ``reset_compiler()``: the compiler's own clock, free of the noise of subtracting step times."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        return float(calculate_time_spent()["total_wall_time"])
    except (ImportError, KeyError, AttributeError):  # a private API: absent in some releases
        return None


def _cache_counts() -> tuple[int, int] | None:
    """Inductor's FX-graph cache hits and misses so far in this process (a private counter)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])
    except (ImportError, KeyError, AttributeError, TypeError):
        return None


def release() -> None:
    """Free a trial's compiled graphs and tensors before the next one starts."""
    reset_compiler()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    release_freed_memory()  # else the next trial reuses these pages and its training memory reads about 0


def _out_of_memory(exc: BaseException) -> bool:
    from core.split import is_out_of_memory

    return is_out_of_memory(exc) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def run_trial(base: RunConfig, cell: Cell, total_steps: int, repeat: int = 0,
              cancelled: Callable[[], bool] | None = None) -> TrialResult:
    """Train ``cell`` for ``total_steps`` optimizer steps with the Trainer; time the steps after warm-up.

    The run folder lives in a private temporary folder, removed whatever happens.
    Failures become the result's ``error``; a cancellation raises ``TrialCancelled``.
    """
    from core.device import memory_gib, resolve_device

    t0 = time.perf_counter()
    counts_before = _cache_counts()  # (its first call imports torch._dynamo: seconds, before any folder exists)
    sink = TimingSink(stop_after=total_steps, cancelled=cancelled)
    out = str(temp_folder_name("speedboard-trial-"))  # made inside the block that removes it
    result = TrialResult(cell=cell.name, runner="speedboard", repeat=repeat)
    # A forced exit (a SIGTERM Python discarded inside torch.compile, then the watchdog's exit) skips the finally
    # below: it removes the folder too (one such trial folder was left in TMPDIR).
    with removed_on_forced_exit(out):
        try:
            os.mkdir(out, 0o700)
            config = cell_config(base, cell, total_steps, out)  # a setting it refuses is the caller's to say
            result.tokens_per_step = config.tokens_per_step()
            try:
                device = resolve_device(config.train.device)
                result.mem_before_gib = memory_gib(device)
                trainer = Trainer(config, Control(), sink)
                trainer.check_peak = False  # a measurement between two steps would count in this trial's step times
                trainer.run()
                result.error = "the run ended before its last step"  # not reached: the sink ends it
            except MeasurementDone:
                pass
            except (TrialCancelled, KeyboardInterrupt):
                raise
            except Exception as exc:  # a failing cell is a row with its reason, never the end of the trials
                result.error = f"out of memory ({first_line(exc)})" if _out_of_memory(exc) else describe_exception(exc)
        finally:
            remove_tree(out)  # the run folder (and any checkpoint), first
            if cell.compiled:
                result.compiler_seconds = compiler_seconds()
                counts_after = _cache_counts()
                if counts_before is not None and counts_after is not None:
                    result.compile_cache_hits = counts_after[0] - counts_before[0]
                    result.compile_cache_misses = counts_after[1] - counts_before[1]
            release()
            result.wall_seconds = time.perf_counter() - t0
    result.warnings = sink.warnings
    result.losses = [e.loss for _, e in sink.steps]
    if sink.compile is not None and sink.compile.fallback and result.error is None:
        # The Trainer went on eagerly: this cell was not measured as asked.
        reason = next((w for w in sink.warnings if "torch.compile" in w), "torch.compile failed")
        result.error = reason
    if result.error is None and cell.compiled and sink.run_started is not None and not sink.compile:
        unavailable = next((w for w in sink.warnings if "unavailable" in w), None)
        if unavailable:
            result.error = unavailable
    if result.error is not None:
        return result
    warmup_s, window_s, steps = sink.window()
    timed = [e for _, e in sink.steps if not e.warmup]
    result.tokens_per_s = len(steps) * result.tokens_per_step / window_s
    result.timed_steps = len(steps)
    result.window_seconds, result.warmup_seconds, result.step_seconds = window_s, warmup_s, steps
    result.compile_seconds = sink.compile.seconds if sink.compile else None
    result.bookkeeping_seconds = [interval - e.step_time for interval, e in zip(steps, timed, strict=True)]
    result.peak_mem_gib = max(e.peak_mem_gib for _, e in sink.steps)
    return result


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Spread:
    """Median and range of a set of measurements."""

    median: float
    low: float
    high: float
    n: int

    @property
    def relative_half_range(self) -> float:
        return (self.high - self.low) / 2 / self.median if self.median else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def spread(values: list[float]) -> Spread | None:
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def relative_noise(rates: list[float]) -> float | None:
    """How much one cell's tokens/s vary from step to step: the interquartile range over the median
    (quartiles resist the odd slow step a busy machine throws in; with fewer than 4 values, half the range).
    None with fewer than two values: one step shows no spread, which is not the same as none."""
    if len(rates) < 2:
        return None
    med = statistics.median(rates)
    if len(rates) < 4:
        return (max(rates) - min(rates)) / 2 / med
    q1, _, q3 = statistics.quantiles(rates, n=4)
    return (q3 - q1) / med


@dataclass(frozen=True)
class Comparison:
    """How a candidate's tokens/s compare with a baseline's, measured interleaved."""

    ratio: float
    """Candidate over baseline: the median of the ratios of trials run in the same repeat (drift hits
    both alike), or the ratio of the medians when they never ran in the same repeat."""
    noise: float | None
    """The relative noise of the two cells' step rates (the larger of the two); None where either cell has
    fewer than two timed steps, so its noise is unknown."""
    significant: bool
    """The margin exceeds the noise, and (with several repeats) every repeat points the same way; never
    where the noise is unknown."""
    pairs: int = 0
    """Repeats in which both ran: one cannot show drift between trials, only the noise within them."""

    @property
    def margin(self) -> float:
        return self.ratio - 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "margin": self.margin}

    def describe(self, what: str = "the current settings") -> str:
        if self.noise is None:
            return (f"{self.margin:+.1%} against {what}, with too few timed steps to judge (a spread needs two "
                    f"or more per setting)")
        if not self.significant:
            return (f"no significant difference from {what} ({self.margin:+.1%}, within the noise of "
                    f"±{self.noise:.1%})")
        word = "faster" if self.margin > 0 else "slower"
        once = ", from one trial each (no repeat)" if self.pairs == 1 else ""
        return f"{abs(self.margin):.1%} {word} than {what}: above the noise (±{self.noise:.1%}){once}"


def compare(candidate: list[TrialResult], baseline: list[TrialResult]) -> Comparison | None:
    """Noise-aware comparison of two cells' successful trials; None when either has none."""
    cand = [t for t in candidate if t.ok and t.tokens_per_s]
    base = [t for t in baseline if t.ok and t.tokens_per_s]
    if not cand or not base:
        return None
    # Each trial's median step, as the table shows it: a slow first step (the process's first trials pay one-time
    # set-up inside their timed window) does not move it, as it would the mean.
    by_repeat = {t.repeat: t.median_tokens_per_s for t in base}
    paired = [t.median_tokens_per_s / by_repeat[t.repeat] for t in cand if t.repeat in by_repeat]
    cand_rates = [r for t in cand for r in t.step_rates]
    base_rates = [r for t in base for r in t.step_rates]
    if paired:
        ratio = statistics.median(paired)
    else:
        ratio = statistics.median(cand_rates) / statistics.median(base_rates)
    noises = [relative_noise(cand_rates), relative_noise(base_rates)]
    noise = None if None in noises else max(noises)
    # Only trials run side by side (the same repeat) can show a difference: the machine may have drifted between.
    significant = noise is not None and abs(ratio - 1.0) > noise and bool(paired)
    if significant and len(paired) >= 2:
        significant = all(p > 1.0 for p in paired) or all(p < 1.0 for p in paired)
    return Comparison(ratio, noise, significant, len(paired))


def loss_reference(cells: list[Cell], losses: dict[str, float]) -> str | None:
    """The cell whose loss the others are held to: fp32 eager (the most exact), else the first that has one."""
    ordered = sorted((c for c in cells if c.name in losses),
                     key=lambda c: (c.precision != "fp32", c.mode != "off", -c.micro_batch))
    return ordered[0].name if ordered else None


def loss_tolerance(precision: str) -> float:
    return LOSS_TOLERANCE.get(precision, LOSS_TOLERANCE["bf16"])
