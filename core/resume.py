"""What a resume checks in, and restores from, a parent's trainer state.

The trainer state (``Trainer.trainer_state``, saved with every checkpoint) holds
the counters, schedule, optimizer and loss-scaler state, random state and the
settings it was trained with. A resume restores weights, optimizer and schedule
exactly; what it cannot restore (the same sample stream on other data, the same
steps with another effective batch) is said, not hidden.
"""

from __future__ import annotations

from typing import Any

import torch

from core.data import SAMPLE_ORDER
from core.errors import CheckpointError


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """The saved optimizer state fits this model's parameters, tensor by tensor (``load_state_dict``
    checks only the group sizes, and a wrong shape would fail at the first step, after the run folder exists)."""
    groups = optimizer.param_groups
    saved_groups = saved["param_groups"]
    if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in groups]:
        raise CheckpointError("the optimizer state does not fit this model: it holds "
                              f"{sum(len(g['params']) for g in saved_groups)} parameters in "
                              f"{len(saved_groups)} groups, this model "
                              f"{sum(len(g['params']) for g in groups)} in {len(groups)}")
    for saved_group, group in zip(saved_groups, groups, strict=True):
        for index, param in zip(saved_group["params"], group["params"], strict=True):
            for name, value in saved["state"].get(index, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise CheckpointError(f"the optimizer state does not fit this model: {name} of parameter "
                                          f"{index} has shape {tuple(value.shape)}, the parameter "
                                          f"{tuple(param.shape)}")


def rng_state() -> dict[str, Any]:
    """The random state an exact resume puts back (``set_rng_state``): the CPU's, and every GPU's."""
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict) -> None:
    """Put back the random state ``rng_state`` took (the GPUs' only where there are as many now)."""
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def other_stream(state: dict[str, Any], train_samples: int, data_digest: str | None = None) -> str:
    """Why a resume from ``state`` cannot read the samples its parent would have read next ("" if it can):
    weights, optimizer and schedule still resume exactly. ``data_digest`` identifies this run's tokens
    (``TokenStore.digest``); a state saved with one (``"data_digest"``) is compared with it, so other data
    with as many samples is told too."""
    saved_order, saved_samples = state.get("sample_order"), state.get("train_samples")
    if saved_order != SAMPLE_ORDER:
        why = f"with sample order {saved_order!r}" if saved_order else "by an earlier Speedboard"
        return (f"the checkpoint was saved {why}: weights, optimizer and schedule resume exactly, but the "
                f"samples that follow are not the ones the parent run would have read next")
    saved_digest = state.get("data_digest")
    if saved_samples is not None and int(saved_samples) != train_samples:
        if saved_digest and data_digest and saved_digest == data_digest:  # the same tokens, cut otherwise
            return (f"the samples differ from the parent run's: the same tokens, cut into {int(saved_samples):,} "
                    f"training samples then and {train_samples:,} now (another sequence length or layout): "
                    f"weights, optimizer and schedule resume exactly, on another sample stream")
        return (f"the data differs from the parent run's ({int(saved_samples):,} training samples then, "
                f"{train_samples:,} now): weights, optimizer and schedule resume exactly, on another sample "
                f"stream")
    if saved_digest and data_digest and saved_digest != data_digest:
        return ("the data differs from the parent run's (other tokens, as many training samples): weights, "
                "optimizer and schedule resume exactly, on another sample stream")
    return ""


def other_batch(state: dict[str, Any], tokens_per_step: int, seq_len: int, remaining: int) -> str:
    """A resume whose effective batch (micro-batch × accumulation × processes) is not its parent's: said, with
    what it means for the step count ("" when the batch is the same, or unknown)."""
    before = state.get("tokens_per_step")
    if not isinstance(before, int):  # saved before the state recorded it: from the parent's settings
        saved = state.get("train_config") or {}
        try:
            before = int(saved["micro_batch"]) * int(saved["accum_steps"]) * int(state.get("world_size", 1)) * seq_len
        except (KeyError, TypeError, ValueError):
            return ""
    if before == tokens_per_step:
        return ""
    return (f"the effective batch changes on resume, from {before:,} to {tokens_per_step:,} tokens per step: "
            f"the schedule continues by tokens, so {remaining:,} step{'s remain' if remaining != 1 else ' remains'} "
            f"to its end")
