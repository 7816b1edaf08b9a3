"""The architecture of a bare state dict, read from the shapes of its tensors where they tell it unambiguously.

A ``.pt``/``.safetensors`` state dict carries no config. Its shapes give the
vocabulary and hidden size (the embedding), the depth (the layer indices), the
MLP width (``gate_proj``) and the query and key/value widths; the head size,
and so the number of heads, is only known from rotary tables saved with the
weights (the article series' ``rotary_emb.cos``: [positions, head size]),
which also give the number of positions. Without them the caller must name
the architecture (``--preset`` or ``--config``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch

from core.checkpoint.keys import ROPE_TABLES
from core.config import ModelConfig
from core.errors import CheckpointError, ConfigError

_ASK = "give --preset or --config with its architecture"
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _shape(value) -> tuple[int, ...]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(value)


def embedding_rows(state: Mapping[str, object]) -> int | None:
    """Rows of the token embedding (the vocabulary a model needs to take these weights), if present."""
    embed = state.get("model.embed_tokens.weight")
    return _shape(embed)[0] if embed is not None and len(_shape(embed)) == 2 else None


def infer_model_config(state: Mapping[str, object], source: str) -> ModelConfig:
    """A ``ModelConfig`` for a bare state dict (tensors or shapes, clean keys), or a CheckpointError saying
    what is missing and asking for ``--preset``/``--config``.

    Settings no shape shows keep their defaults (``rms_norm_eps`` 1e-5, ``rope_theta`` 10,000, the
    article series', see README); loading checks the rotary tables against the model's own, so another RoPE base is
    refused there rather than computed wrong.
    """
    shapes = {k: _shape(v) for k, v in state.items()}
    embed = shapes.get("model.embed_tokens.weight")
    if embed is None or len(embed) != 2:
        raise CheckpointError(f"{source} has no token embedding (model.embed_tokens.weight): it is not a "
                              f"Llama-style state dict this model can read")
    vocab, hidden = embed
    layers = sorted({int(m.group(1)) for k in shapes if (m := _LAYER.match(k))})
    if not layers or layers != list(range(len(layers))):
        raise CheckpointError(f"{source} has no numbered decoder layers (model.layers.N.…); {_ASK}")

    def width(name: str) -> int:
        shape = shapes.get(f"model.layers.0.{name}.weight")
        if shape is None or len(shape) != 2:
            raise CheckpointError(f"{source} has no model.layers.0.{name}.weight; {_ASK}")
        return shape[0]

    q, kv, mlp = width("self_attn.q_proj"), width("self_attn.k_proj"), width("mlp.gate_proj")
    tables = [shapes[k] for k in ROPE_TABLES if k in shapes]
    if not tables:
        raise CheckpointError(f"{source} is a bare state dict without rotary tables, so its head size (and "
                              f"number of attention heads) cannot be read from its tensors; {_ASK}")
    if len(tables[0]) != 2:
        raise CheckpointError(f"{source} has rotary tables of shape {tables[0]}, not [positions, head size]")
    positions, head_dim = tables[0]
    if head_dim < 2 or q % head_dim or kv % head_dim:
        raise CheckpointError(f"{source}: its rotary tables' head size {head_dim} does not divide its query "
                              f"({q}) and key/value ({kv}) widths; {_ASK}")
    if q != hidden:
        raise CheckpointError(f"{source} has attention {q} wide in a model {hidden} wide: heads × head size must "
                              f"equal the hidden size here")
    try:
        return ModelConfig(vocab_size=vocab, hidden_size=hidden, num_layers=len(layers), num_heads=q // head_dim,
                           num_kv_heads=kv // head_dim, intermediate_size=mlp, max_position_embeddings=positions,
                           tie_word_embeddings="lm_head.weight" not in shapes)
    except ConfigError as exc:
        raise CheckpointError(f"{source}: the architecture its tensors show is not supported ({exc})") from None


def _rope_cos(theta: float, positions: int, head_dim: int) -> torch.Tensor:
    """The first half of a ``cos`` table of base ``theta`` (the second half repeats it), in float64."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return torch.cos(torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq)


def rope_theta_of(cos: torch.Tensor, atol: float = 1e-3) -> float | None:
    """The RoPE base a ``cos`` table ([positions, head size], half-split layout) was computed with, if it tells:
    the shortest figure (``5e+05``, ``1.2e+04``) whose table matches this one within ``atol`` everywhere (the
    check a load makes), so that the base named can be given back.

    Fitted over the whole table rather than read from one entry: raised to the power head size / 2, one bf16 entry
    missed the base by up to 16 %, and the base it named was refused in turn."""
    if cos.ndim != 2 or cos.shape[0] < 2 or cos.shape[1] < 4 or cos.shape[1] % 2:
        return None
    head_dim = cos.shape[1]
    table = cos[:, : head_dim // 2].double()
    probe = table[:256]  # enough positions to tell the base; a search over all of them would take seconds

    def error(log_theta: float) -> float:
        return float((_rope_cos(math.exp(log_theta), len(probe), head_dim) - probe).square().mean())

    # Bases from 10 to 10^9: a grid fine enough that no minimum falls between two points (a phase moves by at
    # most 256 / (e·ln θ) per unit of ln θ), then a golden-section search between the best point's neighbours.
    grid = [math.log(10) + i * 0.005 for i in range(int(math.log(1e8) / 0.005) + 1)]
    errors = [error(x) for x in grid]
    best = min(range(len(grid)), key=errors.__getitem__)
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (low, b) if error(a) < error(b) else (a, high)
    theta = math.exp((low + high) / 2)
    for digits in range(1, 8):
        figure = float(f"{theta:.{digits}g}")
        if float((_rope_cos(figure, len(table), head_dim) - table).abs().max()) <= atol:
            return figure
    return None  # not a RoPE table of one base (another layout, or damaged): no base to name
