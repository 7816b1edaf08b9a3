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


def rope_theta_of(cos: torch.Tensor) -> float | None:
    """The RoPE base a ``cos`` table ([positions, head size], half-split layout) was computed with, if it tells."""
    if cos.ndim != 2 or cos.shape[0] < 2 or cos.shape[1] < 4:
        return None
    head_dim = cos.shape[1]
    angle = math.acos(max(-1.0, min(1.0, float(cos[1, 1]))))  # position 1 × inv_freq[1] = theta^(-2/head_dim)
    if not 0.0 < angle < 1.0:
        return None
    return angle ** (-head_dim / 2)
