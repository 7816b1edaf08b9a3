"""Where a cold torch.compile spends its time: whole model against per block.

    python -m bench.compile_cost [--preset small --micro-batch 2 --scopes model,block]

For each scope a fresh Python process with an empty Inductor cache compiles the
model as the Trainer does (``core.compile.compile_model``, mode ``default``)
and runs one forward and backward. Reported: the compiler's own clock
(Dynamo, AOTAutograd and Inductor, forward and backward), its main phases
(tracing the Python code, lowering and code generation, building the generated
C++/Triton kernels), and the number of kernel modules the cache holds
afterwards: kernels with identical source are built once, so identical blocks
of a whole-model graph share them. This explains the per-block compile ratio
in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import int_at_least, module_parser, output_file, positive_number, run_module, write_output
from core.config import PRESETS
from core.errors import SpeedboardError

RESULT_MARK = "COMPILE_COST "
ROOT = Path(__file__).resolve().parent.parent
# dynamo_timed phases worth naming; each is summed over every graph compiled.
PHASES = {
    "trace": ("bytecode_tracing", "aot_trace_joint_graph"),
    "lower": ("GraphLowering.run", "Scheduler.__init__"),
    "codegen": ("Scheduler.codegen",),
    "build": ("async_compile.wait",),
}


def _child(preset: str, micro_batch: int, scope: str) -> dict:
    from bench.runners import preset_model
    from core.compile import compile_model

    _, data, model = preset_model(preset)
    compiled = compile_model(model, "default", scope)
    batch = data.train.batch(list(range(micro_batch)))
    t0 = time.perf_counter()
    # The loss inside the compiled graph, as the Trainer computes it (the model's forward given targets): computed
    # outside it, the graph measured was not the one a run compiles.
    compiled(batch.inputs, targets=batch.targets).backward()
    wall = time.perf_counter() - t0
    try:
        from torch._dynamo.utils import calculate_time_spent, compilation_time_metrics  # private: may move

        total = float(calculate_time_spent()["total_wall_time"])
        phases = {name: sum(sum(compilation_time_metrics.get(key, [])) for key in keys)
                  for name, keys in PHASES.items()}
    except (ImportError, KeyError, AttributeError):
        total, phases = None, {}
    return {"scope": scope, "first_step_s": wall, "compiler_s": total, "phases": phases}


def measure(preset: str, micro_batch: int, scope: str, timeout: float) -> dict:
    """One cold compile in a fresh process; adds the count of kernel modules its cache folder holds."""
    with tempfile.TemporaryDirectory(prefix="speedboard-compile-cost-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=str(Path(cache) / "triton"),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        try:
            proc = subprocess.run([sys.executable, "-m", "bench.compile_cost", "--child", scope, "--preset", preset,
                                   "--micro-batch", str(micro_batch)], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SpeedboardError(f"the {scope} compile took longer than --timeout {timeout:g} s") from None
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(RESULT_MARK)), None)
        if line is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise SystemExit(f"compile_cost: the {scope} process failed: {tail[-1] if tail else proc.returncode}")
        result = json.loads(line[len(RESULT_MARK):])
        files = list(Path(cache).rglob("*.so")) + list(Path(cache).rglob("*.cubin"))
        result["kernel_modules"] = len(files)
    return result


def _scopes(text: str) -> tuple[str, ...]:
    """``model``, ``block`` or both, comma-separated: any other word was measured as per block, under its name."""
    scopes = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not scopes or any(s not in ("model", "block") for s in scopes):
        raise argparse.ArgumentTypeError(f"expected model, block or model,block, got {text!r}")
    return scopes


def main(argv: list[str] | None = None) -> int:
    p = module_parser("compile_cost", __doc__)
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--micro-batch", type=int_at_least(1), default=2)
    p.add_argument("--scopes", type=_scopes, default=("model", "block"), help="model, block or both (model,block)")
    p.add_argument("--repeats", type=int_at_least(1), default=1, help="cold compiles per scope, interleaved")
    p.add_argument("--timeout", type=positive_number, default=900)
    p.add_argument("--json", type=output_file, help="also write the results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_MARK + json.dumps(_child(args.preset, args.micro_batch, args.child)), flush=True)
        return 0
    results = [measure(args.preset, args.micro_batch, scope, args.timeout)
               for _ in range(args.repeats) for scope in args.scopes]
    print(f"cold compile, {args.preset} preset, micro-batch {args.micro_batch} (seconds; phases summed over graphs):")
    print(f"{'scope':6} {'first step':>10} {'compiler':>9} {'trace':>6} {'lower':>6} {'codegen':>8} {'build':>6} "
          f"{'kernel modules':>15}")
    for r in results:
        ph = r["phases"]

        def cell(v, width):
            return f"{v:{width}.1f}" if v is not None else f"{'–':>{width}}"

        print(f"{r['scope']:6} {cell(r['first_step_s'], 10)} {cell(r['compiler_s'], 9)} {cell(ph.get('trace'), 6)} "
              f"{cell(ph.get('lower'), 6)} {cell(ph.get('codegen'), 8)} {cell(ph.get('build'), 6)} "
              f"{r['kernel_modules']:>15}")
    if args.json:
        write_output(args.json, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "compile_cost"))
