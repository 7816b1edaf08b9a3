"""Learning rate as a function of tokens consumed.

Defining the schedule on tokens, not optimizer steps, keeps it right when the
effective batch changes between runs of one lineage: nanoGPT's and the
article series' (README) step-based schedule is the special case of a fixed batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
