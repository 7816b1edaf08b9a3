"""The benchmark matrix: compile mode × scope × precision × gradient accumulation at a fixed effective batch.

The cells themselves are the core's (``core.trials``): the speed advisor
(``speedboard tune``) and the benchmark train the same cells with the same runner.
"""

from __future__ import annotations

from core.trials import BENCH_MODES, Cell, TrialError, build_matrix, select_cells

DEFAULT_ACCUMS = (1, 4, 8)

BenchError = TrialError
"""A benchmark option that cannot work."""

__all__ = ["BENCH_MODES", "DEFAULT_ACCUMS", "BenchError", "Cell", "build_matrix", "memory_cells", "select_cells"]


def memory_cells(cells: list[Cell], effective_batch: int) -> list[Cell]:
    """Extra eager cells for the memory table (measured, not timed), in the first precision of the matrix.

    For each b = E/k of the matrix: micro-batch b without accumulation. And one
    larger micro-batch: b = E with the smallest accumulation k > 1, beside a plain
    batch of E·k, because how much accumulation adds depends on how the
    micro-batch's activations compare with the gradients it must keep (docs/benchmarks.md).
    """
    eager = [c for c in cells if c.mode == "off"]
    if not eager:
        return []
    precision = eager[0].precision
    eager = [c for c in eager if c.precision == precision]
    have = {(c.micro_batch, c.accum) for c in eager}
    accums = sorted({c.accum for c in eager if c.accum > 1})
    wanted = [(c.micro_batch, 1) for c in eager if c.accum > 1]
    if accums and (effective_batch, 1) in have:
        wanted += [(effective_batch, accums[0]), (effective_batch * accums[0], 1)]
    extra = []
    for micro_batch, accum in wanted:
        if (micro_batch, accum) not in have:
            extra.append(Cell("off", "model", accum, micro_batch, precision, memory_only=True))
            have.add((micro_batch, accum))
    return extra
