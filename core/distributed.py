"""torch.distributed for runs launched by torchrun: the process group, failures, FSDP.

torchrun sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; a plain ``python``
start has none of them and runs as a single process. NCCL is used on CUDA,
gloo on the CPU.

Failures end the whole job quickly rather than hang: a rank that dies closes
its sockets, so its peers' next collective raises at once (``is_peer_failure``
turns that into one clear line), and torchrun, which watches its workers, sends
the others SIGTERM (``JobTerminated``). The collective timeout is the last
guard, for a peer that hangs without dying.

FSDP2 (``fully_shard``) shards every decoder layer and the root. Its parameters
are DTensors, so whole-model state (weights for a checkpoint, optimizer state)
is gathered into plain tensors with ``full_state_dicts``, and saved optimizer
state uses the index-keyed layout of ``Optimizer.state_dict()`` whatever the
mode, so a checkpoint resumes with or without FSDP and with any number of ranks.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from core.errors import ConfigError

TIMEOUT_ENV = "SPEEDBOARD_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
"""Long enough for rank 0 to write a large checkpoint while the others wait in
their next collective; a dead peer is noticed long before (see the module doc)."""


class PeerLost(RuntimeError):
    """Another process of the job failed or stopped; this one cannot continue."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher_pid: int | None = None
    """The parent that started this worker (torchrun's agent); None in a single process."""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def launcher_gone(self) -> bool:
        """True when the launcher died without ending its workers (killed with SIGKILL)."""
        return self.launcher_pid is not None and os.getppid() != self.launcher_pid


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""The longest collective timeout taken (30 days): beyond it, no peer's failure would ever be noticed."""


def collective_timeout() -> datetime.timedelta:
    """``SPEEDBOARD_DIST_TIMEOUT`` (seconds, 1 to 30 days), else the default; a ConfigError names a bad value.
    The launcher reads it before any process starts (``core.launch.check_before_launch``): each rank said it once,
    NaN and inf were tracebacks, and 1e-9 a page of C++ frames ("timed out after 0ms")."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not 1.0 <= seconds <= MAX_TIMEOUT_S:  # NaN fails too
        raise ConfigError(f"{TIMEOUT_ENV} must be between 1 and {MAX_TIMEOUT_S:,.0f} seconds (30 days), "
                          f"got {text!r}")
    return datetime.timedelta(seconds=seconds)


def init_distributed(device_type: str) -> DistContext:
    """Join the process group torchrun prepared (idempotent); single-process otherwise."""
    if not launched_by_torchrun():
        return DistContext()
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=collective_timeout())
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")),
                       launcher_pid=os.getppid())


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def check_same_on_all_ranks(value: str, what: str, ctx: DistContext) -> None:
    """Raise ConfigError on every rank unless all ranks hold the same ``value``.

    Every rank prepares its own data; a different corpus file on one node, or a
    tokenizer trained differently, would silently train on mismatched batches.
    """
    if not ctx.enabled:
        return
    values: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(values, value)
    odd = [r for r, v in enumerate(values) if v != values[0]]
    if odd:
        raise ConfigError(f"the processes of this job disagree on the {what} (rank 0 vs rank {odd[0]}): "
                          f"every process must read the same data with the same settings")


def shutdown() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # after a peer failure the group may already be broken; nothing left to free
            pass


def exit_without_teardown(code: int) -> NoReturn:
    """End a process of a job whose work is over (its results written, ``shutdown`` done): output flushed,
    then ``os._exit``, skipping the interpreter's teardown.

    There, now and then, gloo's threads abort a process that has finished
    everything ("terminate called without an active exception": 1 run in 114 of
    ``train --nproc 2 --fsdp`` on the 2-core CPU machine; torch's known gloo
    teardown problem, pytorch/pytorch#179291), and torchrun then reports a
    failed worker after a run that succeeded.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


# --------------------------------------------------------------------------- failures
_BACKEND_MARKERS = ("gloo", "nccl", "connection reset", "connection closed", "broken pipe", "processgroup",
                    "c10d", "socket timeout")


def is_peer_failure(exc: BaseException, ctx: DistContext) -> bool:
    """Whether ``exc`` is a collective that failed because another rank is gone or stuck."""
    if not ctx.enabled or not isinstance(exc, RuntimeError) or isinstance(exc, PeerLost):
        return False
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return any(m in text for m in _BACKEND_MARKERS)


def peer_failure_message(exc: BaseException, ctx: DistContext) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    detail = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else type(exc).__name__  # drop "[file.cc:123]"
    detail = detail.split(". This is typically")[0][:200]
    return (f"rank {ctx.rank}: another process of this job failed or stopped, so this one cannot continue "
            f"(the first failure is said by the process that failed, or, for one killed without a word, by "
            f"the job's launcher once the job has ended; {detail})")


# --------------------------------------------------------------------------- FSDP2
def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2 in place: each decoder layer is one unit of all-gather, the root holds the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def local_scalar(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from what clip_grad_norm_ returns (a DTensor under FSDP)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Gather full weights and optimizer state onto rank 0's CPU (a collective: every rank calls it).

    Other ranks get empty dicts. The optimizer state comes back in the
    index-keyed layout of ``Optimizer.state_dict()``.
    """
    from torch.distributed.checkpoint import state_dict as dsd

    options = dsd.StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = dsd.get_model_state_dict(model, options=options)
    optim = dsd.get_optimizer_state_dict(model, optimizer, options=options)
    if dist.get_rank() != 0:
        return {}, {}
    return weights, optimizer_state_by_index(optim)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
    """Shard an index-keyed full optimizer state (read by every rank) into a sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    fqns = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    set_optimizer_state_dict(model, optimizer, optimizer_state_by_fqn(state, fqns),
                             options=StateDictOptions(full_state_dict=True))


def optimizer_state_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """Parameter-name keys (torch.distributed.checkpoint) -> the indices ``Optimizer.state_dict()`` uses.

    Indices count parameters group by group, each parameter once, as the
    optimizer itself numbers them.
    """
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        for name in group["params"]:
            index.setdefault(name, len(index))
        groups.append({**group, "params": [index[n] for n in group["params"]]})
    return {"state": {index[n]: v for n, v in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_fqn(state: dict[str, Any], fqns: list[list[str]]) -> dict[str, Any]:
    """The inverse: ``fqns`` names each optimizer group's parameters in order."""
    if len(fqns) != len(state["param_groups"]) or any(
            len(names) != len(g["params"]) for names, g in zip(fqns, state["param_groups"], strict=True)):
        raise ConfigError("the saved optimizer state does not fit this model's parameter groups")
    name_of: dict[int, str] = {}
    groups = []
    for names, group in zip(fqns, state["param_groups"], strict=True):
        name_of.update(zip(group["params"], names, strict=True))
        groups.append({**group, "params": list(names)})
    return {"state": {name_of[i]: v for i, v in state["state"].items()}, "param_groups": groups}
