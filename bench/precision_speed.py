"""fp32 vs bf16, eager vs compiled: ``speedboard train`` side by side, interleaved, in fresh processes.

    python -m bench.precision_speed --preset small --steps 10 --repeats 3

Each repeat runs every (precision, compile) cell once, in a rotated order, as
``python -m core.cli train --preset P --device cpu --steps N`` in its own
process; the median tokens/s after warm-up and the median MFU of the timed
steps come from each run's ``metrics.jsonl``. One untimed compiled run per
precision first warms Inductor's cache, so compiled cells pay the warm
compile only (it is kept out of tokens/s anyway). Prints a Markdown table
with the load average before and after every run; ``--out`` keeps the JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.module_cli import int_at_least, module_parser, output_file, run_module, write_output
from bench.run import _load
from core.config import PRESETS
from core.trainer import COMPILE_WARMUP_STEPS

CELLS = (("fp32", "off"), ("fp32", "default"), ("bf16", "off"), ("bf16", "default"))


def _loads(values) -> str:
    known = [v for v in values if v is not None]
    return f"{min(known):.1f}–{max(known):.1f}" if known else "unknown"


def _summary(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["event"] == "step" and not r.get("warmup")]
    started = next(r for r in rows if r["event"] == "run_started")
    finished = next((r for r in rows if r["event"] == "finished"), {})
    return {"tokens_per_s": finished.get("median_tokens_per_s"),
            "mfu": statistics.median(r["mfu"] for r in steps) if steps else None,
            "peak_flops": started.get("matmul_peak_flops"), "precision": started["precision"],
            "reason": started.get("precision_reason", ""), "final_loss": finished.get("final_loss")}


def run_cell(precision: str, mode: str, args, home: Path, tag: str, steps: int = 0) -> dict:
    run_id = f"{tag}-{precision}-{mode}"
    argv = [sys.executable, "-m", "core.cli", "train", "--preset", args.preset, "--device", "cpu",
            "--steps", str(steps or args.steps), "--precision", precision, "--compile", mode, "--eval-every", "0",
            "--save-every", "0", "--sample-every", "0", "--out", str(home / "runs"), "--run-id", run_id]
    before = _load()
    p = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "SPEEDBOARD_HOME": str(home)})
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    return {"precision": precision, "compile": mode, "load_before": before, "load_after": _load(),
            **_summary(home / "runs" / run_id)}


def main(argv: list[str] | None = None) -> int:
    p = module_parser("precision_speed", __doc__)
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--steps", type=int_at_least(COMPILE_WARMUP_STEPS + 1), default=10,
                   help=f"steps per run (at least {COMPILE_WARMUP_STEPS + 1}: a compiled run's first "
                        f"{COMPILE_WARMUP_STEPS} are its warm-up, outside its tokens/s)")
    p.add_argument("--repeats", type=int_at_least(1), default=3)
    p.add_argument("--out", type=output_file, help="JSON file for every run")
    args = p.parse_args(argv)
    # Every run's folder (and its final checkpoint) removed with it: gigabytes of small-preset runs stayed in /tmp.
    with tempfile.TemporaryDirectory(prefix="speedboard-precision-") as folder:
        runs = _measure(args, Path(folder))
    _print_table(args, runs)
    if args.out:
        write_output(args.out, json.dumps(runs, indent=2))
    return 0


def _measure(args, home: Path) -> list[dict]:
    runs = []
    for precision in ("fp32", "bf16"):  # warm Inductor's cache: the compiled cells then pay a warm compile
        run_cell(precision, "default", args, home, "warm", steps=2)
    for repeat in range(args.repeats):
        order = CELLS[repeat % len(CELLS):] + CELLS[:repeat % len(CELLS)]
        for precision, mode in order:
            r = {"repeat": repeat, **run_cell(precision, mode, args, home, f"r{repeat}")}
            runs.append(r)
            print(f"[{repeat + 1}/{args.repeats}] {precision} {mode:<8} {r['tokens_per_s']:9,.0f} tok/s  "
                  f"MFU {r['mfu']:.0%} of {r['peak_flops'] / 1e9:,.0f} GFLOP/s  load "
                  f"{_loads([r['load_before']])}→{_loads([r['load_after']])}", flush=True)
    return runs


def _print_table(args, runs: list[dict]) -> None:
    base = statistics.median(r["tokens_per_s"] for r in runs if (r["precision"], r["compile"]) == ("fp32", "off"))
    print(f"\n{args.preset}, {args.steps} steps, {args.repeats} interleaved repeats; load average "
          f"{_loads([r['load_before'] for r in runs] + [r['load_after'] for r in runs])}\n")
    print("| precision, compile | median tokens/s (min–max) | vs fp32 eager | median MFU | peak (GFLOP/s) |")
    print("|---|---|---|---|---|")
    for precision, mode in CELLS:
        mine = [r for r in runs if (r["precision"], r["compile"]) == (precision, mode)]
        tps = [r["tokens_per_s"] for r in mine]
        print(f"| {precision}, {mode} | {statistics.median(tps):,.0f} ({min(tps):,.0f}–{max(tps):,.0f}) | "
              f"{statistics.median(tps) / base:.2f}× | {statistics.median(r['mfu'] for r in mine):.0%} | "
              f"{mine[0]['peak_flops'] / 1e9:,.0f} |")


if __name__ == "__main__":
    sys.exit(run_module(main, "precision_speed"))
