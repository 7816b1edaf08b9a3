"""Does the dashboard stay responsive while it opens a run folder with a long metrics.jsonl?

    python -m bench.open_run_folder [--steps 100000]

Trains a 3-step run with the headless engine, rewrites its ``metrics.jsonl`` to hold ``--steps`` step lines (the
run's own first step, renumbered), opens the folder in the real window (offscreen unless a display is set) as
File → Open run folders… does, and reports: how long the open call held the GUI thread, the time until the whole
file is shown, and the longest gap between ticks of a 50 ms timer meanwhile (what a user sees as a freeze).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import int_at_least, module_parser, run_module

TICK_MS = 50


def make_run_folder(out: Path, steps: int) -> Path:
    """A finished run folder whose metrics.jsonl holds ``steps`` step lines."""
    from core.config import config_from_preset
    from core.trainer import train

    cfg = config_from_preset("tiny").replace(
        out_dir=str(out), data={"seq_len": 32}, train={"budget_kind": "steps", "budget": 3, "micro_batch": 2,
                                                       "eval_every": 0, "sample_every": 0, "save_every": 0})
    folder = Path(train(cfg).run_dir)
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    head = [e for e in lines if e["event"] not in ("step", "finished", "failed")]
    step = next(e for e in lines if e["event"] == "step")
    ending = next(e for e in lines if e["event"] == "finished")
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as f:
        for event in head:
            f.write(json.dumps(event) + "\n")
        for n in range(1, steps + 1):
            f.write(json.dumps({**step, "step": n, "tokens": n * step["tokens"]}) + "\n")
        f.write(json.dumps({**ending, "step": steps}) + "\n")
    return folder


def measure(folder: Path, out: Path) -> dict:
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings, Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(settings=QSettings(str(out / "settings.ini"), QSettings.Format.IniFormat), out_dir=str(out))
    window.show()
    gaps, last, result = [], [None], {}

    def tick() -> None:
        now = time.perf_counter()
        if last[0] is not None:
            gaps.append(now - last[0])
        last[0] = now
        record = result.get("record")
        if record is not None and record.ended and "shown_s" not in result:
            result["shown_s"] = now - result["opened_at"]
            QTimer.singleShot(0, app.quit)

    def open_it() -> None:
        result["opened_at"] = start = time.perf_counter()
        result["record"] = window.open_run_folder(str(folder))
        result["open_call_s"] = time.perf_counter() - start

    timer = QTimer()
    timer.setTimerType(Qt.TimerType.PreciseTimer)
    timer.setInterval(TICK_MS)
    timer.timeout.connect(tick)
    timer.start()
    QTimer.singleShot(500, open_it)  # the timer ticks first
    QTimer.singleShot(600_000, app.quit)
    app.exec()
    timer.stop()
    record = result["record"]
    window.close()
    return {"steps": record.step, "state": record.state, "open_call_s": result["open_call_s"],
            "shown_s": result.get("shown_s"), "longest_timer_gap_s": max(gaps) if gaps else None}


def main(argv: list[str] | None = None) -> int:
    p = module_parser("open_run_folder", __doc__)
    p.add_argument("--steps", type=int_at_least(1), default=100_000, help="step lines in the folder's metrics.jsonl")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="speedboard-open-bench-") as tmp:
        folder = make_run_folder(Path(tmp) / "runs", args.steps)
        size = (folder / "metrics.jsonl").stat().st_size
        r = measure(folder, Path(tmp))
    print(f"{r['steps']:,} steps ({size / 1e6:.0f} MB), {r['state']}: the open call held the window "
          f"{r['open_call_s']:.3f} s; shown whole after {r['shown_s']:.1f} s; longest gap of a {TICK_MS} ms timer "
          f"{r['longest_timer_gap_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "open_run_folder"))
