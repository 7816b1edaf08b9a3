"""torch.distributed set-up for runs launched by torchrun.

torchrun sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; a plain ``python``
start has none of them and runs as a single process. NCCL is used on CUDA,
gloo on the CPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def init_distributed(device_type: str) -> DistContext:
    """Join the process group torchrun prepared (idempotent); single-process otherwise."""
    if not launched_by_torchrun():
        return DistContext()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        # A short timeout turns a dead peer into an error instead of a hang.
        timeout = datetime.timedelta(seconds=float(os.environ.get("SPEEDBOARD_DIST_TIMEOUT", "60")))
        dist.init_process_group(backend=backend, timeout=timeout)
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
