"""The benchmarks' switch to autocast's bf16 attention on a CPU: it takes effect, and it is always undone."""

from __future__ import annotations

import pytest
import torch

import core.model
from bench.autocast_attention import attention_as_autocast
from core.config import ModelConfig


def _sdpa_dtypes(monkeypatch) -> list[torch.dtype]:
    """The query dtypes scaled_dot_product_attention computes in during a bf16 autocast forward of a tiny model."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        seen.append(torch.bfloat16 if torch.is_autocast_enabled("cpu") else q.dtype)  # autocast casts it so
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    cfg = ModelConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=24, max_position_embeddings=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        core.model.LlamaForCausalLM(cfg)(torch.zeros(1, 8, dtype=torch.long))
    return seen


def test_on_it_gives_attention_to_autocast_and_off_it_leaves_the_model_alone(monkeypatch):
    with attention_as_autocast():
        assert _sdpa_dtypes(monkeypatch) == [torch.bfloat16]
    assert _sdpa_dtypes(monkeypatch) == [torch.float32]
    with attention_as_autocast(False):
        assert _sdpa_dtypes(monkeypatch) == [torch.float32]


def test_the_model_gets_its_choice_back_after_an_error():
    kept = core.model.attention_in_fp32
    with pytest.raises(KeyboardInterrupt), attention_as_autocast():
        raise KeyboardInterrupt
    assert core.model.attention_in_fp32 is kept
