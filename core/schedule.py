"""Learning rate as a function of tokens consumed.

Defining the schedule on tokens, not optimizer steps, keeps it right when the
effective batch changes between runs of one lineage: nanoGPT's and the
article series' (README) step-based schedule is the special case of a fixed batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.config import MAX_COUNT
from core.errors import ConfigError

if TYPE_CHECKING:
    from core.config import TrainConfig


@dataclass(frozen=True)
class LRSchedule:
    max_lr: float
    min_lr: float
    warmup_tokens: int
    end_tokens: int
    """Tokens at which the cosine reaches ``min_lr`` (the lineage's budget)."""
    start_tokens: int = 0
    """Where this schedule segment begins (non-zero for a run extended past its parent's budget)."""

    def __post_init__(self) -> None:
        assert self.end_tokens > self.start_tokens >= 0, (self.start_tokens, self.end_tokens)

    def __call__(self, tokens: int) -> float:
        """LR for the optimizer step that ends after ``tokens`` tokens."""
        t = tokens - self.start_tokens
        if self.warmup_tokens > 0 and t < self.warmup_tokens:
            return self.max_lr * max(t, 0) / self.warmup_tokens
        span = self.end_tokens - self.start_tokens - self.warmup_tokens
        ratio = min(max((t - self.warmup_tokens) / span, 0.0), 1.0) if span > 0 else 1.0
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.max_lr - self.min_lr)

    def to_dict(self) -> dict:
        return {"max_lr": self.max_lr, "min_lr": self.min_lr, "warmup_tokens": self.warmup_tokens,
                "end_tokens": self.end_tokens, "start_tokens": self.start_tokens}


@dataclass(frozen=True)
class Position:
    """Where a run stands when its schedule is made: the optimizer steps and tokens behind it (zero for a new
    run, the parent's for a resume), the tokens one step takes now, and the tokens of one epoch of its data."""

    step: int
    tokens: int
    tokens_per_step: int
    epoch_tokens: int


def budget_tokens(train: TrainConfig, at: Position) -> int:
    """``train``'s budget in tokens (at least one step's)."""
    if train.budget_kind == "steps":
        return int(train.budget) * at.tokens_per_step
    if train.budget_kind == "tokens":
        return max(int(train.budget), at.tokens_per_step)
    return max(int(train.budget * at.epoch_tokens), at.tokens_per_step)


def _lineage_end_tokens(train: TrainConfig, at: Position) -> int:
    """``train``'s budget as the lineage's total, counted from its start."""
    if train.budget_kind == "steps":
        return at.tokens + (int(train.budget) - at.step) * at.tokens_per_step
    return budget_tokens(train, at)


def make_schedule(train: TrainConfig, at: Position, saved: dict[str, Any] | None = None) -> LRSchedule:
    """Warmup + cosine on tokens for a run of ``train`` at ``at``; ``saved`` is a resumed parent's trainer state.

    On resume:

    - the parent stopped early: continue its schedule to its horizon, by
      tokens, whatever the new effective batch (accumulation, micro-batch);
      a budget changed (or given: ``budget_given``) on resume sets the lineage's new total instead
      (a ``ConfigError`` when that total is already behind it, or inside
      the warmup it keeps);
    - the parent finished its budget: a new cosine segment of this run's
      budget from here, without warmup ("continue training").

    A step or a budget whose tokens do not fit the 64-bit counters is a ``ConfigError``: the trainer and the
    launcher (before any process starts) refuse it alike.
    """
    schedule = _schedule(train, at, saved)
    if max(at.tokens_per_step, schedule.end_tokens) > MAX_COUNT:
        raise ConfigError(f"{_big(at.tokens_per_step)} tokens per step and a budget of "
                          f"{_big(schedule.end_tokens)} tokens: counts beyond 2**63 - 1 do not fit the 64-bit "
                          f"counters; give a smaller batch or budget",
                          "budget")
    return schedule


def _big(count: int) -> str:
    """``count`` with thousands separators, or as 1e+23 past 2**53: a budget given as 1e23 is a float's nearest
    integer (99,999,999,999,999,991,611,392), digits the user never wrote."""
    return f"{count:,}" if count <= 2**53 else f"{float(count):.6g}"


def _schedule(train: TrainConfig, at: Position, saved: dict[str, Any] | None) -> LRSchedule:
    if saved is None:
        budget = budget_tokens(train, at)
        return LRSchedule(train.lr, train.min_lr, int(train.warmup_ratio * budget), budget)
    theirs = saved["schedule"]
    if at.tokens >= theirs["end_tokens"]:
        return LRSchedule(train.lr, train.min_lr, 0, at.tokens + budget_tokens(train, at), at.tokens)
    parent = saved.get("train_config") or {}
    end = theirs["end_tokens"]
    if train.budget_given or (parent.get("budget_kind"), parent.get("budget")) != (train.budget_kind, train.budget):
        end = _lineage_end_tokens(train, at)
        if end <= at.tokens:
            raise ConfigError(f"a budget of {train.budget:g} {train.budget_kind} is already used up: the checkpoint "
                              f"is at step {at.step} ({at.tokens:,} tokens); give a larger budget", "budget")
        warmed = theirs["start_tokens"] + theirs["warmup_tokens"]
        if end <= warmed:  # it would end still warming up, never at its peak learning rate nor its floor
            raise ConfigError(f"a budget of {train.budget:g} {train.budget_kind} ends at {end:,} tokens, inside the "
                              f"warmup the lineage keeps (to {warmed:,} tokens, about step "
                              f"{at.step + -(-(warmed - at.tokens) // at.tokens_per_step):,}): the learning rate "
                              f"would never reach its peak or decay; give a budget past the warmup", "budget")
    return LRSchedule(train.lr, train.min_lr, theirs["warmup_tokens"], end, theirs["start_tokens"])
