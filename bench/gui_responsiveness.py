"""Does the dashboard stay responsive while it trains, and does it cost training speed?

    python -m bench.gui_responsiveness [--preset tiny --steps 40 --micro-batch 8 --repeats 3 --threads 1]

Each measurement runs in a fresh process:

1. Throughput. The same settings trained by the headless CLI (``speedboard
   train``) and by the dashboard (the real window, offscreen unless a display
   is set), interleaved (H D, D H, H D, …) so drift in the machine's load hits
   both alike; each side's figure is the trainer's own median tokens/s after
   warm-up. Target: dashboard ≥ 0.97 × headless.
2. Responsiveness, in separate dashboard runs (the probe itself needs the GIL
   100 times a second, so it stays out of the throughput runs): a 10 ms
   ``QTimer`` in the GUI thread records how late each tick fires. Lateness is
   reported (p50/p99/max, ms) for steady training of an eager run, and for the
   compile warm-up and steady training of a run with ``--compile-mode``.
   Target: p99 < 50 ms in steady training.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.module_cli import int_at_least, module_parser, positive_number, run_module
from core.config import PRESETS

RESULT_MARK = "GUI_BENCH_RESULT "
ROOT = Path(__file__).resolve().parent.parent
TICK_MS = 10


# --------------------------------------------------------------------------- the dashboard side (child process)
def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def run_dashboard(spec: dict) -> dict:
    """Train once in the real window and measure the GUI thread's timer lateness."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from core.events import CompileFinished, CompileStarted, RunFinished, RunStarted, StepMetrics
    from gui.controller import RunJobEnded
    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    settings = QSettings(str(Path(spec["out"]) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, out_dir=spec["out"])
    window.resize(1500, 950)
    window.show()
    panel = window.config_panel
    for combo, value in ((panel.preset, spec["preset"]), (panel.compile_mode, spec["compile_mode"]),
                         (panel.budget_kind, "steps"), (panel.device, spec["device"])):
        combo.setCurrentIndex(combo.findData(value))
    panel.micro_batch.setValue(spec["micro_batch"])
    panel.accum.setValue(spec["accum"])
    panel.budget.setValue(spec["steps"])
    if panel.config is None:
        raise SystemExit(f"invalid settings: {panel.error}")

    ticks: list[tuple[float, float]] = []  # (time, lateness ms)
    marks: dict[str, float] = {}
    last = [None]

    def tick() -> None:
        now = time.perf_counter()
        if last[0] is not None:
            ticks.append((now, max(0.0, (now - last[0]) * 1000 - TICK_MS)))
        last[0] = now

    def on_event(event) -> None:
        now = time.perf_counter()
        if isinstance(event, RunStarted):
            marks["run_started"] = now
        elif isinstance(event, CompileStarted):
            marks["compile_started"] = now
        elif isinstance(event, CompileFinished):
            marks["compile_finished"] = now
        elif isinstance(event, StepMetrics):
            if not event.warmup:
                marks.setdefault("first_steady", now)
            marks["last_step"] = now
        elif isinstance(event, RunFinished):
            marks["finished"] = now
        elif isinstance(event, RunJobEnded):
            QTimer.singleShot(0, app.quit)

    controller = window.session.controller
    controller.event.connect(on_event)
    controller.run_job_ended.connect(on_event)
    probe = QTimer()
    probe.setTimerType(Qt.TimerType.PreciseTimer)
    probe.setInterval(TICK_MS)
    probe.timeout.connect(tick)
    watchdog = QTimer()
    watchdog.setSingleShot(True)
    watchdog.timeout.connect(lambda: (controller.stop(), marks.setdefault("timed_out", time.perf_counter())))
    watchdog.start(int(spec["timeout"] * 1000))

    def start() -> None:
        marks["start"] = time.perf_counter()
        if spec["probe"]:
            probe.start()
        window.controls.start.click()

    QTimer.singleShot(500, start)  # let the window settle first
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    app.exec()
    gui_cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    probe.stop()
    record = window.session.records[-1]
    window.close()

    def between(a: str, b: str) -> list[float]:
        if a not in marks or b not in marks:
            return []
        return [late for t, late in ticks if marks[a] < t <= marks[b]]

    return {
        "side": "dashboard",
        "state": record.state,
        "message": record.message,
        "median_tokens_per_s": record.median_tokens_per_s,
        "compile_seconds": record.compile_seconds,
        "steps": record.step,
        "timed_out": "timed_out" in marks,
        "gui_thread_cpu_s": gui_cpu,
        "wall_s": wall,
        "lateness_ms": {
            "setup": _percentiles(between("start", "run_started")),
            "compile": _percentiles(between("compile_started", "compile_finished")),
            "steady": _percentiles(between("first_steady", "last_step")),
        },
    }


# --------------------------------------------------------------------------- the headless side
def run_headless(spec: dict) -> dict:
    """The same settings through ``speedboard train`` in a fresh process."""
    cmd = [sys.executable, "-m", "core.cli", "train", "--preset", spec["preset"], "--steps", str(spec["steps"]),
           "--micro-batch", str(spec["micro_batch"]), "--accum", str(spec["accum"]),
           "--compile", spec["compile_mode"], "--device", spec["device"], "--out", spec["out"], "--no-progress",
           "--log-every", "1000000"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=spec["timeout"])
    if proc.returncode != 0:
        raise SystemExit(f"headless run failed: {proc.stderr.strip().splitlines()[-1:]}")
    (run_dir,) = [p for p in Path(spec["out"]).iterdir() if (p / "metrics.jsonl").is_file()]
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    finished = json.loads(lines[-1])
    return {"side": "headless", "state": finished["event"], "median_tokens_per_s": finished.get("median_tokens_per_s"),
            "steps": finished.get("step")}


def _child(side: str, spec: dict) -> dict:
    """One measurement in a fresh process (the dashboard) or through the CLI (headless)."""
    spec = dict(spec, out=tempfile.mkdtemp(prefix=f"speedboard-guibench-{side}-"))
    if side == "headless":
        return run_headless(spec)
    cmd = [sys.executable, "-m", "bench.gui_responsiveness", "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=spec["timeout"] + 120)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise SystemExit(f"dashboard run failed:\n{proc.stderr[-2000:]}")


# --------------------------------------------------------------------------- report
def _fmt_lateness(stats: dict) -> str:
    if not stats["n"]:
        return f"{'—':>8} {'—':>8} {'—':>8} {0:>8}"
    return f"{stats['p50']:8.1f} {stats['p99']:8.1f} {stats['max']:8.1f} {stats['n']:>8}"


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("gui_responsiveness", "Dashboard responsiveness and throughput vs the headless CLI.")
    parser.add_argument("--preset", default="tiny", choices=list(PRESETS))
    parser.add_argument("--steps", type=int_at_least(1), default=40)
    parser.add_argument("--micro-batch", type=int_at_least(1), default=8)
    parser.add_argument("--accum", type=int_at_least(1), default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int_at_least(1), default=3, help="interleaved headless/dashboard pairs")
    parser.add_argument("--compile-mode", default="default",
                        help="mode of the extra dashboard run that measures compile warm-up ('off' skips it)")
    parser.add_argument("--threads", type=int_at_least(1),
                        help="torch CPU threads on both sides (OMP_NUM_THREADS); default: torch's own choice")
    parser.add_argument("--timeout", type=positive_number, default=1800, help="seconds allowed per run")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(RESULT_MARK + json.dumps(run_dashboard(json.loads(args.child))), flush=True)
        return 0

    if args.threads:  # children inherit it: the same thread count on both sides
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    spec = {"preset": args.preset, "steps": args.steps, "micro_batch": args.micro_batch, "accum": args.accum,
            "device": args.device, "compile_mode": "off", "timeout": args.timeout, "probe": False}
    print(f"settings: preset {args.preset}, {args.steps} steps, micro-batch {args.micro_batch}, "
          f"accumulation {args.accum}, device {args.device}, torch threads {args.threads or 'default'}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    pairs = []
    for r in range(args.repeats):
        order = ("headless", "dashboard") if r % 2 == 0 else ("dashboard", "headless")
        result = {side: _child(side, spec) for side in order}
        ratio = result["dashboard"]["median_tokens_per_s"] / result["headless"]["median_tokens_per_s"]
        pairs.append({**result, "ratio": ratio})
        print(f"  pair {r + 1} ({' then '.join(order)}): headless "
              f"{result['headless']['median_tokens_per_s']:,.0f} tok/s, dashboard "
              f"{result['dashboard']['median_tokens_per_s']:,.0f} tok/s, ratio {ratio:.3f}", flush=True)
    eager = _child("dashboard", dict(spec, probe=True))
    print(f"  eager dashboard run with the lateness probe: {eager['state']}", flush=True)
    compiled = None
    if args.compile_mode != "off":
        compiled = _child("dashboard", dict(spec, compile_mode=args.compile_mode, probe=True))
        print(f"  compiled dashboard run ({args.compile_mode}): {compiled['state']}, compile warm-up "
              f"{compiled['compile_seconds'] or 0:.1f} s, {compiled['median_tokens_per_s'] or 0:,.0f} tok/s",
              flush=True)

    ratios = [p["ratio"] for p in pairs]
    headless = [p["headless"]["median_tokens_per_s"] for p in pairs]
    dashboard = [p["dashboard"]["median_tokens_per_s"] for p in pairs]
    print()
    print(f"Throughput, median tokens/s after warm-up ({args.repeats} interleaved pairs):")
    print(f"  headless CLI {statistics.median(headless):,.0f}   dashboard {statistics.median(dashboard):,.0f}   "
          f"dashboard/headless: median {statistics.median(ratios):.3f} (pairs: "
          f"{', '.join(f'{r:.3f}' for r in ratios)})  target ≥ 0.97")
    print()
    print(f"GUI-thread lateness of a {TICK_MS} ms QTimer (ms):       p50      p99      max  samples")
    rows = [("setup (data, tokenizer), eager", eager["lateness_ms"]["setup"]),
            ("steady training, eager", eager["lateness_ms"]["steady"])]
    if compiled is not None:
        rows += [(f"compile warm-up ({args.compile_mode})", compiled["lateness_ms"]["compile"]),
                 (f"steady training, compiled ({args.compile_mode})", compiled["lateness_ms"]["steady"])]
    for name, stats in rows:
        print(f"  {name:<42}{_fmt_lateness(stats)}")
    steady = [eager] + ([compiled] if compiled is not None else [])
    steady_p99 = max(r["lateness_ms"]["steady"]["p99"] or 0.0 for r in steady)
    print(f"  worst steady p99 {steady_p99:.1f} ms (target < 50 ms)")
    gui_share = [p["dashboard"]["gui_thread_cpu_s"] / p["dashboard"]["wall_s"] for p in pairs]
    print(f"  GUI thread CPU in the throughput runs: {100 * max(gui_share):.1f}% of one core at most")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "pairs": pairs, "eager": eager,
                                               "compiled": compiled},
                                              indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "gui_responsiveness"))
