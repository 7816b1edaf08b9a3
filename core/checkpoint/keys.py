"""State-dict keys: the wrapper parts torch.compile and DDP add, removed wherever they appear."""

from __future__ import annotations

import torch

from core.compile import CompiledModel, unwrap
from core.errors import CheckpointError

_WRAPPER_PARTS = ("_orig_mod",)
_DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older HF checkpoints saved; derived here


def clean_key(key: str) -> str:
    """Remove wrapper components: ``_orig_mod`` anywhere (whole-model or per-block
    torch.compile) and leading ``module`` (DDP), in any mix."""
    parts = [p for p in key.split(".") if p not in _WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts.pop(0)
    return ".".join(parts)


def clean_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = clean_key(key)
        if new.endswith(_DROPPED_SUFFIXES):
            continue
        if new in out:
            raise CheckpointError(f"two entries map to the same parameter {new!r} ({key!r})")
        out[new] = value
    return out


def plain_module(model: torch.nn.Module | CompiledModel) -> torch.nn.Module:
    """The uncompiled module under a ``CompiledModel``, torch.compile and DDP wrappers."""
    if isinstance(model, CompiledModel):
        model = model.model
    return unwrap(model)


def model_state_dict(model: torch.nn.Module | CompiledModel) -> dict[str, torch.Tensor]:
    """Weights of the plain module on the CPU, with plain names (never ``_orig_mod.``)."""
    plain = plain_module(model)
    # clean_state_dict as well: per-block wrappers registered as submodules
    # (``layers[i] = torch.compile(layers[i])``) put ``_orig_mod`` mid-key.
    state = clean_state_dict(plain.state_dict())
    if getattr(getattr(plain, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: stored once, as HF does
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
