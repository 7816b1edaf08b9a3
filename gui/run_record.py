"""What the window knows about one run: settings, state and results, updated from events.

A record exists from the moment the user presses Start (before the trainer
has a run id) or opens a run folder; plain Python, no Qt, so it is easy to test.
``RunRecord.apply`` is the one place a run's state changes: from the trainer's
events, and from the dashboard's own notes about the run (a stop asked for, a
pause the trainer acknowledged), which are typed here.

States: ``starting`` → ``compiling`` ⇄ ``training`` ⇄ ``paused``, any of them
→ ``stopping`` (Stop pressed) → ``stopped``; ``finished`` and ``failed`` end
any of them. While ``starting``, a run may be ``preparing`` its data (its corpus
tokenized into its token store, once); a run stopped before it started (Stop
cancels that preparation) ends ``stopped``, without a checkpoint. A folder
opened from disk is ``following`` until its run ends, or ``not running`` when it
records no ending and no process writes it any more (killed).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from core.event_text import EventLine, data_progress_line, event_line
from core.events import (
    CheckpointSaved,
    CompileFinished,
    CompileStarted,
    DataPreparationProgress,
    DataPreparationStarted,
    DataPrepared,
    Event,
    MatmulPeakMeasured,
    MicroBatchChanged,
    RunFailed,
    RunFinished,
    RunStarted,
    StepMetrics,
    ValidationDone,
)
from core.mfu import utilization

# Distinct, readable on white; a run keeps its colour and dash for the whole session.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f")
DASHES = ("solid", "dash", "dot", "dashdot")
"""Line patterns: each round of ten colours gets the next, so 40 runs stay distinguishable."""

ACTIVE_STATES = ("starting", "compiling", "training", "paused", "stopping", "following")
ENDED_STATES = ("finished", "stopped", "failed")
_STOPPABLE = ("starting", "compiling", "training", "paused")


# --------------------------------------------------------------------------- the dashboard's notes about a run
@dataclass(frozen=True)
class StopRequested:
    """The user asked the run to stop after its current optimizer step (it then saves and ends), or, before
    its first step, to cancel its set-up (``before_training``: nothing to save)."""

    before_training: bool = False


@dataclass(frozen=True)
class TrainingPaused:
    """The trainer acknowledged a pause: it waits between two optimizer steps."""

    step: int


@dataclass(frozen=True)
class TrainingResumed:
    """The trainer goes on after a pause."""


@dataclass(frozen=True)
class WriterGone:
    """A run folder opened from disk records no ending, and no process writes it any more (``core.runs.run_state``),
    or the folder itself was moved or deleted while shown (``folder_gone``: its writer may live on)."""

    message: str
    folder_gone: bool = False


RunNote = StopRequested | TrainingPaused | TrainingResumed | WriterGone


def describe(event: Event | RunNote) -> EventLine | None:
    """A log line for a core event (``core.event_text``) or a note of the dashboard's; None: not logged."""
    if isinstance(event, StopRequested):
        if event.before_training:
            return EventLine("stopping its set-up (nothing to save yet: it has trained no step) …")
        return EventLine("stopping after the current optimizer step (a final checkpoint is saved) …")
    if isinstance(event, TrainingPaused):
        return EventLine(f"paused at step {event.step}")
    if isinstance(event, TrainingResumed):
        return EventLine("resumed")
    if isinstance(event, WriterGone):
        return EventLine(f"{'no longer followed' if event.folder_gone else 'not running'}: {event.message}",
                         "warning")
    return event_line(event)


@dataclass
class RunRecord:
    key: int
    """Stable id in this window (run ids arrive only once the trainer has started)."""
    number: int
    """1-based number shown to the user."""
    config: dict[str, Any]
    origin: str = "live"
    """``live`` (started here) or ``folder`` (opened from disk)."""
    folder: str | None = None
    run_id: str | None = None
    parent_id: str | None = None
    parent_number: int | None = None
    state: str = "starting"
    message: str = ""
    device: str = ""
    precision: str = ""
    precision_reason: str = ""
    matmul_peak_flops: float = 0.0
    """The MFU denominator of one process (``RunStarted``)."""
    flops_per_token: float = 0.0
    world_size: int = 1
    num_parameters: int = 0
    tokens_per_step: int = 0
    start_step: int = 0
    total_steps: int = 0
    budget_tokens: int = 0
    """The lineage's budget in tokens, its schedule's horizon (``RunStarted``; 0 before it started)."""
    warmup_end_tokens: int | None = None
    """Where its schedule's warmup ends, in tokens (``RunStarted``; None before, or from an older writer)."""
    step: int = 0
    tokens: int = 0
    last_loss: float | None = None
    mem_gib: float | None = None
    compile_seconds: float | None = None
    compile_fallback: bool = False
    median_tokens_per_s: float | None = None
    final_loss: float | None = None
    val_loss: float | None = None
    peak_mem_gib: float | None = None
    checkpoint: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    nproc: int = 1
    """Processes that train it (more than one: torchrun)."""
    split_changes: int = 0
    """Times its micro-batch × accumulation changed (it ran out of memory, or ``auto`` fitted it)."""
    preparing: bool = False
    """Its corpus is being tokenized into its token store (before the run starts)."""
    preparation: str = ""
    """Its data preparation as one line (``core.event_text.data_progress_line``), while it runs."""
    preparation_share: float | None = None
    """Share of the current preparation stage done (None: its size is unknown)."""
    slot: int = -1
    """Its place in the colour × dash sequence (``RunSession`` gives each new run the lowest free one);
    -1: by its number."""
    removed: bool = False
    """The user removed its row: it is no longer drawn or listed."""
    started_from: str = ""
    """The weights it began with: a loaded file (``init_from`` or ``resume``), or empty."""
    mem_baseline_gib: float = 0.0
    """Memory of the process before the model existed (``RunStarted``): subtracted from every memory
    figure, so on CPU they show the training's own resident memory, not the whole window's."""
    step_seconds: list[float] = field(default_factory=list, repr=False)
    """Every steady optimizer step's time (the spread behind the speedup's uncertainty)."""
    step_rates: list[float] = field(default_factory=list, repr=False)
    """Every steady optimizer step's tokens/s: a run that fails after some has their median, as a finished run."""
    compile_started: float | None = None
    """``time.monotonic()`` when its compile warm-up began, while it compiles (the elapsed time shown)."""
    compile_what: str = ""
    """What torch.compile compiles: its mode and scope, in words."""
    eval_seconds: float | None = None
    """How long its last validation took (from the step before it to its result): the ETA counts those to come."""
    _last_step_at: float | None = field(default=None, repr=False)
    _before_pause: str = field(default="training", repr=False)
    _held_before_first_step: bool = field(default=False, repr=False)
    """Paused where the trainer waits before its first step (``Trainer._before_first_step``): a stop there keeps
    nothing, as one during set-up."""
    _stopped_compiling: bool = field(default=False, repr=False)
    """Asked to stop while it compiled, and no step has ended since: the stop waits for the compile."""

    @property
    def style_index(self) -> int:
        return self.slot if self.slot >= 0 else self.number - 1

    @property
    def color(self) -> str:
        return PALETTE[self.style_index % len(PALETTE)]

    @property
    def dash(self) -> str:
        return DASHES[(self.style_index // len(PALETTE)) % len(DASHES)]

    @property
    def holds_style(self) -> bool:
        """It keeps its colour and dash from new runs: a removed run, or one that failed before its
        first step (nothing of it is drawn), gives them back."""
        return not self.removed and not (self.state == "failed" and self.last_loss is None)

    @property
    def mark(self) -> tuple[str, str]:
        """Its colour and dash where it is listed (legend, table): none ("", "") once it gave them back, for a
        later run has them (two rows showed one orange line, the failed run's and the next run's)."""
        return (self.color, self.dash) if self.holds_style or self.removed else ("", "")

    @property
    def train(self) -> dict[str, Any]:
        return self.config.get("train", {})

    @property
    def mfu(self) -> float | None:
        """MFU of the median tokens/s, as the CLI computes it per step; None before the run ends or without a peak."""
        if not self.median_tokens_per_s:
            return None
        return utilization(self.median_tokens_per_s, self.flops_per_token, self.matmul_peak_flops, self.world_size)

    @property
    def compile_text(self) -> str:
        mode = self.train.get("compile_mode", "off")
        if mode == "off":
            return "off"
        scope = self.train.get("compile_scope", "model")
        return f"{mode} ({'per block' if scope == 'block' else 'model'})"

    @property
    def processes(self) -> int:
        """The processes it trains in: a followed or reopened run tells it by its world size."""
        return max(self.nproc, self.world_size)

    @property
    def label(self) -> str:
        """Short name for legends: number, compile mode, accumulation, and the processes when more than one."""
        mode = self.train.get("compile_mode", "off")
        mode = "eager" if mode == "off" else mode
        if self.train.get("compile_scope") == "block" and mode != "eager":
            mode += "/block"
        text = f"#{self.number} {mode} ×{self.train.get('accum_steps', 1)}"
        processes = self.processes
        if processes > 1:
            text += f" on {processes} processes"
        if self.parent_number is not None:
            text += f" ← #{self.parent_number}"
        elif self.parent_id:
            text += " (continued)"
        return text

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def compiling(self) -> bool:
        """torch.compile is compiling its step (which cannot be interrupted), a stop asked for meanwhile or not."""
        return self.state == "compiling" or (self.state == "stopping" and self._stopped_compiling)

    @property
    def before_training(self) -> bool:
        """It has trained no step and none is under way, so a stop keeps nothing: in set-up (its ``RunStarted``,
        which names its run id, has not come), or paused before its first step (after ``RunStarted``: a run paused
        then ended "failed" after the window said a final checkpoint would be saved)."""
        return not self.run_id or self._held_before_first_step

    def apply(self, event: Event | RunNote) -> bool:
        """Update from one event or note; True when something the run table shows (other than progress) changed."""
        if isinstance(event, StopRequested):
            compiling = self.state == "compiling"
            if not self._set_state("stopping", when=_STOPPABLE):
                return False
            self._stopped_compiling = compiling
            return True
        if isinstance(event, TrainingPaused):
            before = self.state
            if self._set_state("paused", when=("starting", "compiling", "training")):
                self._before_pause = before
                # Paused with no step recorded: the trainer waits before its first (the step's metrics come before
                # the pause that follows a step, from the same thread).
                self._held_before_first_step = self.step == self.start_step
                return True
            return False
        if isinstance(event, TrainingResumed):
            self._held_before_first_step = False  # on into its first step: a stop now is one after that step
            return self._set_state(self._before_pause, when=("paused",))
        if isinstance(event, WriterGone):
            self.message = event.message
            return self._set_state("not running", when=("following",))
        if self.state == "not running":  # written again after all (a machine that was suspended)
            self.state, self.message = "following", ""
        if isinstance(event, DataPreparationProgress):
            self.preparation = data_progress_line(event)
            self.preparation_share = event.bytes_done / event.bytes_total if event.bytes_total else None
            return False
        if isinstance(event, StepMetrics):
            self._stopped_compiling = False  # the compiled step has run
            self.step, self.tokens, self.last_loss = event.step, event.tokens, event.loss
            self._last_step_at = event.time
            # The training's own memory, never below zero (the CLI's lines and RunFinished clamp it too).
            self.mem_gib = max(0.0, event.mem_gib - self.mem_baseline_gib)
            self.peak_mem_gib = max(0.0, event.peak_mem_gib - self.mem_baseline_gib)
            # A step time of 0 (a hand-edited or foreign folder: a well-typed float) measures no speed; the
            # speedup's division by it raised in every refresh.
            if not event.warmup and event.step_time > 0 and math.isfinite(event.step_time):
                self.step_seconds.append(event.step_time)
                self.step_rates.append(event.tokens_per_s)
            if self.state in ("starting", "compiling") and not event.warmup:
                self.state = "training"
            return False
        if isinstance(event, RunStarted):
            self.run_id = event.run_id
            self.config = dict(event.config) or self.config
            self.parent_id = event.parent
            self.folder = event.run_dir
            self.device, self.precision = event.device, event.precision
            self.precision_reason = event.precision_reason
            self.matmul_peak_flops, self.flops_per_token = event.matmul_peak_flops, event.flops_per_token
            self.world_size = event.world_size
            self.num_parameters, self.tokens_per_step = event.num_parameters, event.tokens_per_step
            self.start_step = self.step = event.start_step
            self.tokens = event.start_tokens
            self.total_steps, self.budget_tokens = event.total_steps, event.budget_tokens
            self.warmup_end_tokens = event.warmup_end_tokens
            self.mem_baseline_gib = event.mem_baseline_gib
            source = self.config.get("resume") or self.config.get("init_from")
            self.started_from = str(source) if source else ""
            # Its data is ready: a torchrun job's launcher said it prepared it, its rank 0 says nothing more.
            self.preparing, self.preparation, self.preparation_share = False, "", None
            if self.state == "starting":
                self.state = "training"
        elif isinstance(event, DataPreparationStarted):
            self.preparing = True
        elif isinstance(event, DataPrepared):
            self.preparing, self.preparation, self.preparation_share = False, "", None
        elif isinstance(event, CompileStarted):
            self.compile_started = time.monotonic()
            what = "each decoder block" if event.scope == "block" else "the whole model"
            self.compile_what = f"{what}, mode {event.mode}"
            if self.state in ("starting", "training"):
                self.state = "compiling"
        elif isinstance(event, CompileFinished):
            self.compile_started = None
            self.compile_fallback = event.fallback
            self.compile_seconds = None if event.fallback else event.seconds
            if self.state == "compiling":
                self.state = "training"
        elif isinstance(event, ValidationDone):
            self.val_loss = event.loss
            if self._last_step_at is not None:
                self.eval_seconds = max(0.0, event.time - self._last_step_at)
        elif isinstance(event, MatmulPeakMeasured):  # measured again during the run: MFU divides by it
            self.matmul_peak_flops = event.matmul_peak_flops
        elif isinstance(event, MicroBatchChanged):  # the split it trains with now (same effective batch)
            self.config = {**self.config, "train": {**self.train, "micro_batch": event.new_micro,
                                                    "accum_steps": event.new_accum}}
            self.split_changes += 1
        elif isinstance(event, CheckpointSaved):
            self.checkpoints.append(event.path)
            return False
        elif isinstance(event, RunFinished):
            self.state = "stopped" if event.stopped else "finished"
            self.step, self.tokens = event.step, event.tokens
            self.final_loss, self.val_loss = event.final_loss, event.val_loss
            self.median_tokens_per_s = event.median_tokens_per_s
            if event.compile_seconds is not None and not self.compile_fallback:
                self.compile_seconds = event.compile_seconds
            # The training's own figure where the run gave it: a folder whose run_started line is lost has no
            # baseline here, and its process' whole peak read as training memory.
            self.peak_mem_gib = event.train_mem_gib if event.train_mem_gib is not None else \
                max(0.0, event.peak_mem_gib - self.mem_baseline_gib)
            self.checkpoint = event.checkpoint
        elif isinstance(event, RunFailed):
            # Stopped before it started: its data preparation was cancelled, nothing was kept.
            self.state = "stopped" if self.state == "stopping" and self.before_training else "failed"
            self.message = event.message
            self.preparing, self.preparation, self.preparation_share = False, "", None
            self.compile_started = None
            if self.step_rates and self.median_tokens_per_s is None:  # its steps measured until it failed
                self.median_tokens_per_s = statistics.median(self.step_rates)
        else:
            return False
        return True

    def _set_state(self, state: str, when: tuple[str, ...]) -> bool:
        if self.state not in when:
            return False
        self.state = state
        return True

    def compile_progress(self, now: float | None = None, brief: bool = False) -> str:
        """While it compiles: how long it has, and what (the first steps of a compiled model run
        the compiler: seconds to minutes with nothing else to show); ``brief``: how long alone."""
        if self.state != "compiling" or self.compile_started is None:
            return ""
        elapsed = (time.monotonic() if now is None else now) - self.compile_started
        minutes, seconds = divmod(int(max(0.0, elapsed)), 60)
        # The time first: the status bar cuts a long text at its end.
        return f"compiling {minutes}:{seconds:02d}" + ("" if brief else f" ({self.compile_what})")

    def seconds_left(self, step_time: float) -> float:
        """Time to its end at ``step_time`` per optimizer step, with the validations still to come at the
        last one's duration (every ``eval_every`` steps, and one at the end)."""
        steps = max(0, self.total_steps - self.step)
        if not self.eval_seconds:
            return steps * step_time
        every = int(self.train.get("eval_every") or 0)
        evaluations = (self.total_steps // every - self.step // every + (self.total_steps % every != 0)
                       if every else 1)
        return steps * step_time + max(0, evaluations) * self.eval_seconds

    def progress_text(self, brief: bool = False) -> str:
        if self.state == "compiling" and self.compile_started is not None:
            return self.compile_progress(brief=brief)
        if self.state in ("training", "following") and self.total_steps:
            return f"{self.state} {self.step}/{self.total_steps}"
        if self.state == "stopping":
            return "stopping…"
        if self.state == "failed":
            first = self.message.strip().splitlines()[0] if self.message.strip() else ""
            return f"failed: {first}" if first else "failed"
        if self.preparing and self.state == "starting":
            share = f" {100 * self.preparation_share:.0f}%" if self.preparation_share is not None else ""
            return f"preparing data{share}"
        return self.state
