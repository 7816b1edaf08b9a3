"""fp32 and bf16 autocast train the same curve: tiny preset, same seed, same batches, loss compared step by step.

bf16 rounds activations and matmul inputs to 8 mantissa bits, so the two runs
drift apart a little; the question is whether the curves agree within a stated
tolerance. Compared on windows of steps (the mean loss of each window), since
single steps are noisy in both: the largest window difference must stay within
``WINDOW_TOLERANCE`` and the final window within ``FINAL_TOLERANCE`` (absolute,
in nats per token).

    python -m bench.numerics                   # tiny preset, 300 steps, its micro-batch 16 × 128
    python -m bench.numerics --micro-batch 4 --seq-len 64 --threads 1  # the agreeing run in docs/benchmarks.md
    python -m bench.numerics --steps 30 --micro-batch 4 --seq-len 64   # what the CI test runs (windows of 5)
    python -m bench.numerics --threads 1 --attention bf16              # attention in bf16 too: they disagree

Exit code 1 when the curves disagree. On a CPU the model runs attention in fp32
under autocast (``core.model.attention_in_fp32``): in bf16 it alone made the
bf16 curve trail at the preset's own micro-batch (docs/benchmarks.md).

Prints a table and writes a JSON with both curves (``--out``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from bench.module_cli import int_at_least, module_parser, output_file, run_module, write_output
from core.config import PRESETS

WINDOW_TOLERANCE = 0.08
"""Largest |mean fp32 loss − mean bf16 loss| over any window of steps (nats)."""
FINAL_TOLERANCE = 0.05
"""|fp32 − bf16| of the last window's mean loss (nats)."""


@dataclass
class Agreement:
    steps: int
    window: int
    fp32: list[float]
    bf16: list[float]
    window_diffs: list[float]
    max_window_diff: float
    final_diff: float
    fp32_seconds: float
    bf16_seconds: float
    bf16_attention: str = "fp32"
    """The bf16 run's attention: fp32 (the model's on a CPU) or bf16 (``--attention bf16``)."""

    @property
    def ok(self) -> bool:
        return self.max_window_diff <= WINDOW_TOLERANCE and self.final_diff <= FINAL_TOLERANCE

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "window_tolerance": WINDOW_TOLERANCE,
                "final_tolerance": FINAL_TOLERANCE}


def loss_curve(precision: str, steps: int, micro_batch: int, seq_len: int, seed: int, out_dir: str,
               preset: str = "tiny") -> tuple[list[float], float]:
    """Training losses of one run on the CPU, and its wall seconds."""
    from core.config import config_from_preset
    from core.events import ListSink, StepMetrics
    from core.trainer import Trainer

    cfg = config_from_preset(preset, data={"seq_len": seq_len},
                             train={"precision": precision, "device": "cpu", "micro_batch": micro_batch,
                                    "budget_kind": "steps", "budget": steps, "seed": seed, "eval_every": 0,
                                    "eval_batches": 1, "sample_tokens": 1},
                             out_dir=out_dir)
    sink = ListSink()
    t0 = time.perf_counter()
    Trainer(cfg, sink=sink).run()
    return [e.loss for e in sink.of(StepMetrics)], time.perf_counter() - t0


def compare(steps: int = 300, micro_batch: int = 16, seq_len: int = 128, seed: int = 1337, window: int = 0,
            out_dir: str | None = None, preset: str = "tiny", bf16_attention: bool = False) -> Agreement:
    """Train fp32, then bf16 autocast, from the same initialisation on the same batches; compare the curves.
    ``bf16_attention``: the bf16 run's attention in bf16 too, as autocast would run it (the model's is fp32
    on a CPU, ``core.model.attention_in_fp32``)."""
    import tempfile

    from bench.autocast_attention import attention_as_autocast

    window = window or max(1, steps // 10)
    with tempfile.TemporaryDirectory(prefix="speedboard-numerics-") as tmp:
        where = out_dir or tmp
        fp32, t32 = loss_curve("fp32", steps, micro_batch, seq_len, seed, where, preset)
        with attention_as_autocast(bf16_attention):
            bf16, t16 = loss_curve("bf16", steps, micro_batch, seq_len, seed, where, preset)
    assert len(fp32) == len(bf16) == steps, (len(fp32), len(bf16))
    diffs = [abs(statistics.fmean(fp32[i:i + window]) - statistics.fmean(bf16[i:i + window]))
             for i in range(0, steps, window)]
    return Agreement(steps, window, fp32, bf16, diffs, max(diffs), diffs[-1], t32, t16,
                     "bf16" if bf16_attention else "fp32")


def main(argv: list[str] | None = None) -> int:
    p = module_parser("numerics", __doc__)
    p.add_argument("--preset", default="tiny", choices=list(PRESETS))
    p.add_argument("--steps", type=int_at_least(1), default=300)
    p.add_argument("--micro-batch", type=int_at_least(1), default=16)
    p.add_argument("--seq-len", type=int_at_least(2), default=128)
    p.add_argument("--seed", type=int_at_least(0), default=1337)
    p.add_argument("--window", type=int_at_least(0), default=0, help="steps per compared window (default: a tenth)")
    p.add_argument("--threads", type=int_at_least(1), help="torch threads (default: torch's)")
    p.add_argument("--attention", choices=("fp32", "bf16"), default="fp32",
                   help="the bf16 run's attention: fp32 as the model runs it on a CPU, or bf16 as autocast would")
    p.add_argument("--out", type=output_file, help="JSON file for both curves and the verdict")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    r = compare(args.steps, args.micro_batch, args.seq_len, args.seed, args.window, preset=args.preset,
                bf16_attention=args.attention == "bf16")
    print(f"{args.preset}, {args.steps} steps, micro-batch {args.micro_batch} × {args.seq_len} tokens, "
          f"seed {args.seed}, bf16 run's attention in {args.attention}; mean loss per {r.window}-step window:")
    print("| steps | fp32 | bf16 | |Δ| |\n|---|---|---|---|")
    for i, d in enumerate(r.window_diffs):
        lo, hi = i * r.window, min(args.steps, (i + 1) * r.window)
        print(f"| {lo + 1}–{hi} | {statistics.fmean(r.fp32[lo:hi]):.4f} | {statistics.fmean(r.bf16[lo:hi]):.4f} "
              f"| {d:.4f} |")
    print(f"largest window |Δ| {r.max_window_diff:.4f} (tolerance {WINDOW_TOLERANCE}), final window |Δ| "
          f"{r.final_diff:.4f} (tolerance {FINAL_TOLERANCE}) -> {'agree' if r.ok else 'DISAGREE'}; "
          f"fp32 {r.fp32_seconds:.0f} s, bf16 {r.bf16_seconds:.0f} s")
    if args.out:
        write_output(args.out, json.dumps(r.to_dict(), indent=2))
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(run_module(main, "numerics"))
