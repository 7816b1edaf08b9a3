"""The alternative the model does not take: attention in autocast's bf16 on a CPU, for benchmarks to compare.

``core.model.attention_in_fp32`` runs attention in fp32 under autocast on a
CPU; ``bench.step_ab`` (its ``bf16-*-attn16`` cells) and ``bench.numerics``
(``--attention bf16``) measure what bf16 attention would cost and gain there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def attention_as_autocast(on: bool = True) -> Iterator[None]:
    """While on, the model's attention runs in autocast's dtype as it does on a GPU. torch.compile guards on
    the choice: a compiled model gets a graph for each, and switching between them does not recompile."""
    import core.model

    kept = core.model.attention_in_fp32
    if on:
        core.model.attention_in_fp32 = lambda q: False
    try:
        yield
    finally:
        core.model.attention_in_fp32 = kept
