"""Self-fitting micro-batches: how a step's split shrinks after an out-of-memory error, and how ranks agree.

A step's global batch is micro-batch × accumulation × processes sequences. The
loss of every micro-step is divided by the real target tokens of the whole
global batch, so any split of that batch gives the same update: when a
micro-step runs out of memory, the trainer frees what the step held and redoes
the whole step from its start (same samples, gradients zeroed) with a smaller
micro-batch and more accumulation (``smaller_split``), and the run goes on.

Under torchrun the ranks must train with the same split, and none may wait in
a collective that a failed peer never joins. Each attempt of a step therefore
has exactly one agreement point on every rank (``OomAgreement``): a rank that
ran out of memory skips its remaining micro-steps and goes there at once, the
others reach it before the micro-step that DDP synchronises (the last: DDP
prepares its gradient all-reduce in that forward pass, and a prepared
reduction must be completed). The flag travels over a CPU (gloo) group: the
error is raised on the host, so the agreement needs no GPU sync.

Until a split has trained one step, the last micro-step runs under
``no_sync`` too and the agreement follows it, then the gradients are
all-reduced by hand (``average_gradients``): the first step of a split is
where an out-of-memory error is likely, and every later step has the same
shapes. An out-of-memory error in the last micro-step of a later step cannot
be redone on one rank alone: it ends the job as a failed rank does (the peers'
collectives fail, at the latest after the collective timeout). FSDP gathers
weights in every forward pass, so an out-of-memory error under FSDP is not
redone either.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from core.distributed import DistContext
from core.errors import SpeedboardError

_CPU_ALLOCATION_FAILED = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """What counts as running out of memory in a micro-step: CUDA's caching allocator raises
    ``torch.OutOfMemoryError``; the CPU's allocator a plain RuntimeError, where an allocation can fail at all
    (under ``ulimit -v`` or strict overcommit; otherwise Linux ends the process instead)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _CPU_ALLOCATION_FAILED)


def out_of_memory_detail(exc: BaseException) -> str:
    """The part of an out-of-memory error worth a line: CUDA's first line, or the CPU allocator's own words."""
    text = str(exc)
    at = text.find("DefaultCPUAllocator: ")
    detail = text[at:] if at >= 0 else text
    return detail.strip().splitlines()[0][:160] if detail.strip() else type(exc).__name__


class OutOfMemory(SpeedboardError):
    """A micro-step ran out of memory and the split cannot shrink (micro-batch 1, or a setting refuses it).

    ``here``: this process ran out, not (only) another of its job, whose own error says it.
    """

    def __init__(self, message: str, here: bool = True) -> None:
        super().__init__(message, "micro_batch")
        self.here = here


def smaller_split(micro_batch: int, accum_steps: int) -> tuple[int, int] | None:
    """The split to redo a step with: half the micro-batch and twice the accumulation when the micro-batch is
    even, else the largest divisor of micro-batch × accumulation below half; None at micro-batch 1."""
    per_process = micro_batch * accum_steps
    for micro in range(micro_batch // 2, 0, -1):
        if per_process % micro == 0:
            return micro, per_process // micro
    return None


class OomAgreement:
    """One flag per attempt of a step: did any rank run out of memory? (see the module's docstring)."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._group = None
        if ctx.enabled:
            # NCCL cannot reduce a CPU tensor: a gloo group beside it carries host-side flags.
            self._group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    def any_rank(self, local: bool) -> bool:
        """True when this rank (``local``) or another ran out of memory in this attempt; a collective."""
        if not self.ctx.enabled:
            return local
        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)  # CPU tensor: no GPU sync
        return bool(flag.item())

    def smallest(self, value: int) -> int:
        """The smallest ``value`` over the ranks (a micro-batch every rank can train with); a collective."""
        if not self.ctx.enabled:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
        return int(t.item())


def average_gradients(model: torch.nn.Module, world_size: int) -> None:
    """What DDP's reducer does at the end of a synchronised backward: gradients summed over ranks, ÷ world."""
    # In place, one parameter at a time: no flat copy that could itself run out of memory. Slower than
    # DDP's buckets, but only for the first step of a split. Asynchronous on the device: no host sync.
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
