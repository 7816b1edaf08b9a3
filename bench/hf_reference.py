"""Hugging Face's ``LlamaForCausalLM`` built from the same configuration and weights.

transformers is a benchmark-only extra (``pip install -e '.[bench]'`` in the project folder). The two
models share parameter names and math, so the HF model starts from Speedboard's
initial weights and the same bare loop trains both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from core.config import ModelConfig


def transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def build_hf_model(cfg: ModelConfig, state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    """An HF Llama with ``cfg`` (via ``ModelConfig.to_hf_dict``) holding ``state_dict``; SDPA attention like ours."""
    import transformers

    hf_cfg = {k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures", "torch_dtype")}
    config = transformers.LlamaConfig(**hf_cfg)
    config._attn_implementation = "sdpa"
    config.use_cache = False
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(state_dict, strict=True)
    return model


def hf_forward(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """Logits of an HF causal LM (or its compiled wrapper) for token ids, no KV cache."""

    def forward(input_ids: torch.Tensor) -> torch.Tensor:
        return module(input_ids=input_ids, use_cache=False).logits

    return forward
