"""torch.compile for a model: whole or per block, with an uncompiled handle kept.

``compile_model`` never changes the model's own modules: the whole-model wrapper
(``OptimizedModule``, whose state dict carries ``_orig_mod.``) and the per-block
wrappers are held beside it, so saving, evaluation and sampling use the plain
module and its plain parameter names. Compile after loading weights.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.model import LlamaForCausalLM


@dataclass
class CompiledModel:
    """The training forward: ``module`` (plain, compiled or DDP-wrapped) plus per-block wrappers."""

    model: LlamaForCausalLM
    """The uncompiled module: save, evaluate and sample through this."""
    mode: str
    scope: str
    module: torch.nn.Module
    """What the training step calls; DDP wraps this (compile first, then wrap)."""
    blocks: list[Callable] | None = None

    @property
    def compiled(self) -> bool:
        return self.mode != "off"

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or with ``targets`` the summed loss (in the compiled graph under whole-model scope)."""
        if self.blocks is None:
            return self.module(input_ids, attention_mask, targets=targets)
        return self.module(input_ids, attention_mask, blocks=self.blocks, targets=targets)


def compile_unavailable_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot work here, or None. Checked before trying."""
    if device.type == "cpu":
        cxx = os.environ.get("CXX") or "g++"
        if not any(shutil.which(c) for c in (cxx, "g++", "c++", "clang++")):
            return "no C++ compiler found (Inductor needs one on CPU)"
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton

            if not has_triton():
                return "Triton is not installed or does not support this GPU"
        except ImportError:
            return "Triton is not available"
    return None


def reset_compiler() -> None:
    """Drop compiled graphs and guards so a new mode starts clean and old graphs are freed."""
    torch._dynamo.reset()


def compile_model(model: LlamaForCausalLM, mode: str, scope: str) -> CompiledModel:
    """Wrap ``model`` for training with torch.compile (compilation itself happens at the first call)."""
    if mode == "off":
        return CompiledModel(model, mode, scope, model)
    reset_compiler()
    kwargs = {} if mode == "default" else {"mode": mode}
    if scope == "model":
        return CompiledModel(model, mode, scope, torch.compile(model, **kwargs))
    # Per block: each decoder layer compiled on its own; identical layers share
    # one graph, so compile time is about one block's. The wrappers are not
    # registered as submodules, so the model's state dict keys stay unchanged.
    blocks = [torch.compile(layer, **kwargs) for layer in model.model.layers]
    return CompiledModel(model, mode, scope, model, blocks)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DDP (``module``) and torch.compile (``_orig_mod``) wrappers."""
    while True:
        if hasattr(module, "_orig_mod"):
            module = module._orig_mod
        elif isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        else:
            return module
