"""One cell in a fresh process: the Trainer's compile seconds and the steady-state peak memory.

Started by ``bench.run`` as ``python -m bench.probe SPEC_JSON``, with
``TORCHINDUCTOR_CACHE_DIR`` pointing at an empty folder (a cold compile) or at
the folder a previous probe filled (a warm compile: what a second run on the
same machine pays). It prints one result line, ``PROBE_RESULT {json}``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_MARK = "PROBE_RESULT "
ROOT = Path(__file__).resolve().parent.parent


def probe(spec: dict) -> dict:

    from bench.cells import Cell
    from bench.memory import current_bytes, peak_bytes, reset_peak
    from bench.runners import MeasurementDone, TimingSink, cell_config, compiler_seconds
    from core.config import RunConfig
    from core.control import Control
    from core.data import prepare_data
    from core.device import import_training_libraries, resolve_device
    from core.events import StepMetrics
    from core.trainer import Trainer

    base = RunConfig.from_dict(spec["config"])
    cell = Cell.from_dict(spec["cell"])
    device = resolve_device(base.train.device)
    prepare_data(base.data)  # libraries loaded, tokenizer cached: what every process holds before a model exists
    import_training_libraries()  # as the trainer does before its own baseline
    gc.collect()
    baseline = current_bytes(device)

    class MemorySink(TimingSink):
        """Resets the high-water mark after each warm-up step; the peak of the timed steps is training's own."""

        def __init__(self) -> None:
            super().__init__(stop_after=spec["total_steps"])
            self.peak_with_compile = 0
            self.steady_peak = 0
            self.reset_ok = True

        def __call__(self, event) -> None:
            if isinstance(event, StepMetrics):
                if event.warmup:
                    self.peak_with_compile = max(self.peak_with_compile, peak_bytes(device))
                    self.reset_ok = reset_peak(device) and self.reset_ok
                else:
                    self.steady_peak = max(self.steady_peak, peak_bytes(device))
            super().__call__(event)  # last: it ends the run after the last step

    sink = MemorySink()
    out = tempfile.mkdtemp(prefix="speedboard-bench-probe-")
    try:
        trainer = Trainer(cell_config(base, cell, spec["total_steps"], out), Control(), sink)
        trainer.check_peak = False  # its GEMMs would count in the memory measured
        trainer.run()
    except MeasurementDone:
        pass
    finally:
        shutil.rmtree(out, ignore_errors=True)
    compile_event = sink.compile
    return {
        "cell": cell.name,
        "compile_seconds": compile_event.seconds if compile_event and not compile_event.fallback else None,
        "compiler_seconds": compiler_seconds() if cell.compiled else None,
        "fallback": bool(compile_event and compile_event.fallback),
        "peak_bytes": sink.steady_peak,
        "peak_with_compile_bytes": max(sink.peak_with_compile, sink.steady_peak),
        "baseline_bytes": baseline,
        "peak_reset": sink.reset_ok,
        "losses": [e.loss for _, e in sink.steps],
        "warnings": sink.warnings,
    }


STOP_GRACE_S = 10.0
"""How long a probe stopped by Ctrl-C is given to clean up after itself before it is killed."""


def run_probe(spec: dict, cache_dir: Path, timeout: float, tmp_dir: Path | None = None) -> dict:
    """Run ``probe(spec)`` in a fresh Python process with Inductor's disk cache in ``cache_dir``.

    ``tmp_dir``: the process's temporary folder (``TMPDIR``), so that what a killed probe leaves
    there is removed with the caller's own. Ctrl-C or SIGTERM in this process stops the probe
    (SIGINT, then a kill after ``STOP_GRACE_S``) before it is raised on.
    """
    env = dict(os.environ)
    env.update({
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),  # Triton keeps its own cache: cold means both empty
        # Large blocks straight from and back to the OS, so the resident set tracks live tensors
        # instead of what malloc keeps cached (glibc; ignored elsewhere).
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    })
    if tmp_dir is not None:
        (tmp_dir / "tmp").mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp_dir / "tmp")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.probe", json.dumps(spec)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc, grace=0.0)
        return {"error": f"timed out after {timeout:.0f} s"}
    except BaseException:  # Ctrl-C, SIGTERM: the probe ends too
        _stop(proc, grace=STOP_GRACE_S)
        raise
    wall = time.perf_counter() - t0
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK):])
            result["process_seconds"] = wall
            return result
    lines = [ln for ln in (stderr or stdout).strip().splitlines() if ln.strip()]
    return {"error": f"exit code {proc.returncode}: {lines[-1] if lines else 'no output'}"}


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """End ``proc``: Ctrl-C first (it removes its own temporary folder), killed if still there after ``grace``."""
    try:
        if grace > 0 and proc.poll() is None and os.name == "posix":
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def main(argv: list[str] | None = None) -> int:
    from bench.module_cli import module_parser

    p = module_parser("probe", __doc__)
    p.add_argument("spec", help="the cell's spec, a JSON object with its run config and cell (bench.run writes it)")
    args = p.parse_args(argv)
    try:
        spec = json.loads(args.spec)
        if not (isinstance(spec, dict) and {"config", "cell", "total_steps"} <= spec.keys()):
            raise ValueError("not an object with 'config', 'cell' and 'total_steps'")
    except ValueError as exc:  # JSONDecodeError is a ValueError
        p.error(f"the spec is not a cell's spec: {exc}")
    result = probe(spec)
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    from bench.module_cli import run_module

    sys.exit(run_module(main, "probe"))
