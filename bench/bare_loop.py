"""The reference loop: the article series' training loop (README), written plainly.

Same model class and initial weights as Speedboard's Trainer, the same batches
in the same order, AdamW, gradient clipping and ``loss / accumulate_steps``; no
events, no metrics, no host sync inside the loop. The Trainer is timed against
it side by side: whatever the dashboard's bookkeeping costs shows up as the ratio.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.compile import reset_compiler
from core.data import Data, SampleOrder
from core.device import DTYPES, synchronize

MicroBatch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), each (b, T)


def plan_batches(data: Data, seed: int, effective_batch: int, micro_batch: int, steps: int) -> list[list[MicroBatch]]:
    """The Trainer's global batches (same seeded order, same stream positions), cut into micro-batches."""
    order = SampleOrder(len(data.train), seed)
    plan = []
    for step in range(steps):
        window = data.train.batch(order.take(step * effective_batch, effective_batch))
        plan.append(list(zip(window.inputs.split(micro_batch), window.targets.split(micro_batch), strict=True)))
    return plan


class StepClock:
    """Marks step boundaries without a host sync: CUDA events on a GPU, the wall clock elsewhere.

    Read ``intervals()`` only after synchronising; on a CPU the marks are exact as they are.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()  # queued on the stream: no wait here
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            return [a.elapsed_time(b) / 1000 for a, b in pairs]  # milliseconds between the two events
        return [b - a for a, b in pairs]


@dataclass
class LoopResult:
    losses: list[float]
    """Mean training loss of each optimizer step's window."""
    warmup_seconds: float
    """The warm-up steps (compilation happens in them)."""
    window_seconds: float
    """The timed steps after warm-up."""
    timed_steps: int
    step_seconds: list[float]
    """Each timed step on its own (``StepClock``)."""


def compile_forward(model: torch.nn.Module, mode: str, scope: str) -> torch.nn.Module:
    """torch.compile the whole model, or each decoder layer in place; ``off`` returns the model."""
    if mode == "off":
        return model
    reset_compiler()  # start clean, as the Trainer does
    kwargs = {} if mode == "default" else {"mode": mode}
    if scope == "model":
        return torch.compile(model, **kwargs)
    for layer in model.model.layers:
        layer.compile(**kwargs)
    return model


def bare_train(model: torch.nn.Module, forward: Callable[[torch.Tensor], torch.Tensor],
               batches: list[list[MicroBatch]], *, lr_at: Callable[[int], float], device: torch.device,
               precision: str, grad_clip: float, weight_decay: float, betas: tuple[float, float],
               warmup_steps: int) -> LoopResult:
    """Train ``model`` through ``forward`` on ``batches``; time the steps after ``warmup_steps``."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr_at(0), betas=betas, eps=1e-8, fused=device.type in ("cuda", "cpu"))
    amp = (torch.autocast(device.type, dtype=DTYPES[precision]) if precision != "fp32"
           else contextlib.nullcontext())
    batches = [[(x.to(device), y.to(device)) for x, y in step] for step in batches]
    model.train()
    step_losses = []
    clock = StepClock(device)
    synchronize(device)
    t_start = t_timed = time.perf_counter()
    for step, micro_batches in enumerate(batches):
        if step == warmup_steps:
            synchronize(device)  # the warm-up's kernels finish before the timed window opens
            t_timed = time.perf_counter()
            clock.mark()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        accumulate_steps = len(micro_batches)
        step_loss = torch.zeros((), device=device)
        for inputs, targets in micro_batches:
            with amp:
                logits = forward(inputs)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
            (loss / accumulate_steps).backward()
            step_loss += loss.detach() / accumulate_steps
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_losses.append(step_loss)
        if step >= warmup_steps:
            clock.mark()
    synchronize(device)  # all queued steps done before the clocks are read
    t_end = time.perf_counter()
    return LoopResult(losses=torch.stack(step_losses).tolist(), warmup_seconds=t_timed - t_start,
                      window_seconds=t_end - t_timed, timed_steps=len(batches) - warmup_steps,
                      step_seconds=clock.intervals())
