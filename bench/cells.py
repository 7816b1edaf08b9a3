"""The benchmark matrix: compile mode × scope × gradient accumulation at a fixed effective batch."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from core.config import CUDA_GRAPH_MODES
from core.errors import SpeedboardError

DEFAULT_ACCUMS = (1, 4, 8)


class BenchError(SpeedboardError):
    """A benchmark option that cannot work."""


@dataclass(frozen=True)
class Cell:
    """One configuration of the matrix; every runner trains it the same way."""

    mode: str
    scope: str
    accum: int
    micro_batch: int
    memory_only: bool = False
    """An extra cell of the memory table (micro-batch b, no accumulation): not timed."""

    @property
    def name(self) -> str:
        base = f"off-a{self.accum}" if self.mode == "off" else f"{self.mode}-{self.scope}-a{self.accum}"
        return f"{base}-mb{self.micro_batch}" if self.memory_only else base

    @property
    def compiled(self) -> bool:
        return self.mode != "off"

    @property
    def warmup_steps(self) -> int:
        """Steps left out of timing: the Trainer's own rule (compilation happens in the first ones)."""
        return 3 if self.compiled else 1

    @classmethod
    def from_dict(cls, data: dict) -> Cell:
        return cls(data["mode"], data["scope"], data["accum"], data["micro_batch"], data.get("memory_only", False))

    def to_dict(self) -> dict:
        return {"name": self.name, "mode": self.mode, "scope": self.scope, "accum": self.accum,
                "micro_batch": self.micro_batch, "memory_only": self.memory_only}


def build_matrix(effective_batch: int, accums: tuple[int, ...] = DEFAULT_ACCUMS, cuda: bool = False) -> list[Cell]:
    """Compile off, ``default`` whole model, ``default`` per block, each × accumulation;
    on CUDA also the CUDA-graph modes at accumulation 1 (the only accumulation they are allowed)."""
    for k in accums:
        if k < 1 or effective_batch % k:
            raise BenchError(f"effective batch {effective_batch} is not divisible by accumulation {k}; "
                             f"choose an effective batch that every accumulation in {list(accums)} divides")
    cells = []
    for mode, scope in (("off", "model"), ("default", "model"), ("default", "block")):
        cells += [Cell(mode, scope, k, effective_batch // k) for k in accums]
    if cuda:
        cells += [Cell(mode, "model", 1, effective_batch) for mode in CUDA_GRAPH_MODES]
    return cells


def select_cells(cells: list[Cell], patterns: str | None) -> list[Cell]:
    """Keep the cells whose name matches one of the comma-separated shell patterns (``off-*,default-model-a1``)."""
    if not patterns:
        return cells
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    for p in wanted:
        if not any(fnmatch.fnmatchcase(c.name, p) for c in cells):
            raise BenchError(f"--cells pattern {p!r} matches no cell; cells are: {', '.join(c.name for c in cells)}")
    return [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in wanted)]


def memory_cells(cells: list[Cell], effective_batch: int) -> list[Cell]:
    """Extra eager cells for the memory table (measured, not timed).

    For each b = E/k of the matrix: micro-batch b without accumulation. And one
    larger micro-batch: b = E with the smallest accumulation k > 1, beside a plain
    batch of E·k, because how much accumulation adds depends on how the
    micro-batch's activations compare with the gradients it must keep (docs/benchmarks.md).
    """
    have = {(c.micro_batch, c.accum) for c in cells if c.mode == "off"}
    accums = sorted({c.accum for c in cells if c.mode == "off" and c.accum > 1})
    wanted = [(c.micro_batch, 1) for c in cells if c.mode == "off" and c.accum > 1]
    if accums and (effective_batch, 1) in have:
        wanted += [(effective_batch, accums[0]), (effective_batch * accums[0], 1)]
    extra = []
    for micro_batch, accum in wanted:
        if (micro_batch, accum) not in have:
            extra.append(Cell("off", "model", accum, micro_batch, memory_only=True))
            have.add((micro_batch, accum))
    return extra
