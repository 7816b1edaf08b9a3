"""Take the README's dashboard screenshot: two runs (eager, then compiled with accumulation 4).

    xvfb-run -s "-screen 0 1920x1200x24" python -m bench.dashboard_screenshot --out docs/dashboard.png \
        --small-out docs/dashboard-1024x640.png

Drives the real window: sets the controls, clicks Start, waits for each run to
end, then grabs the window. Runs go to a temporary folder and the window's
settings to a temporary file, so nothing of the user's is touched.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import int_at_least, module_parser, positive_number, run_module
from core.config import PRESETS


def _wait_idle(app, window, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while window.session.controller.running:
        if time.monotonic() > deadline:
            raise SystemExit("the run did not end in time")
        app.processEvents()
        time.sleep(0.01)


def _set(combo, value) -> None:
    index = combo.findData(value)
    if index < 0:
        raise SystemExit(f"{combo.objectName()} has no item {value!r}")
    combo.setCurrentIndex(index)


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("dashboard_screenshot", __doc__)
    parser.add_argument("--out", default="docs/dashboard.png")
    parser.add_argument("--preset", default="tiny", choices=list(PRESETS))
    parser.add_argument("--tokens", type=int_at_least(1), default=49_152, help="budget of each run in tokens")
    parser.add_argument("--micro-batch", type=int_at_least(1), default=8)
    parser.add_argument("--eval-every", type=int_at_least(0), default=12)
    parser.add_argument("--warmup", type=int_at_least(0), default=5, help="warmup, percent of the budget")
    parser.add_argument("--compile-mode", default="default", help="compile mode of the second run")
    parser.add_argument("--size", default="1600x1000", help="window size WxH")
    parser.add_argument("--small-out", help="also grab the same window at --small-size into this file")
    parser.add_argument("--small-size", default="1024x640", help="window size WxH of --small-out")
    parser.add_argument("--timeout", type=positive_number, default=1800, help="seconds allowed per run")
    parser.add_argument("--threads", type=int_at_least(1), help="torch CPU threads (steadier curves on a busy machine)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    home = Path(tempfile.mkdtemp(prefix="speedboard-shot-"))
    os.environ.setdefault("SPEEDBOARD_HOME", str(home))

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from core.config import config_from_preset
    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    base = config_from_preset(args.preset, train={"eval_every": args.eval_every})
    settings = QSettings(str(home / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, extra_presets={args.preset: base}, out_dir=str(home / "runs"))
    width, height = (int(v) for v in args.size.split("x"))
    window.resize(width, height)
    window.show()

    panel = window.config_panel
    _set(panel.preset, args.preset)
    panel.micro_batch.setValue(args.micro_batch)
    _set(panel.budget_kind, "tokens")
    panel.budget.setValue(args.tokens)
    panel.warmup.setValue(args.warmup)
    _set(panel.device, "auto")
    for mode, accum in (("off", 1), (args.compile_mode, 4)):
        _set(panel.compile_mode, mode)
        panel.accum.setValue(accum)
        if panel.config is None:
            raise SystemExit(f"invalid settings: {panel.error}")
        window.controls.start.click()
        _wait_idle(app, window, args.timeout)
        record = window.session.records[-1]
        print(f"{record.label}: {record.state}, {record.median_tokens_per_s or 0:,.0f} tokens/s, "
              f"compile {record.compile_seconds}", flush=True)
        if record.state != "finished":
            raise SystemExit(f"run failed: {record.message}")

    window.plots.set_x_axis("tokens")
    window.plots.smoothing.setValue(5)
    window.table.clearSelection()
    window.tabs.setCurrentWidget(window.log)
    for _ in range(30):  # let the timer redraw and the layout settle
        app.processEvents()
        time.sleep(0.02)
    window.plots.refresh(force=True)
    app.processEvents()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not window.grab().save(str(out)):
        raise SystemExit(f"could not write {out}")
    print(f"wrote {out}")
    if args.small_out:
        width, height = (int(v) for v in args.small_size.split("x"))
        window.resize(width, height)
        for _ in range(30):
            app.processEvents()
            time.sleep(0.02)
        window.plots.refresh(force=True)
        app.processEvents()
        small = Path(args.small_out)
        if not window.grab().save(str(small)):
            raise SystemExit(f"could not write {small}")
        print(f"wrote {small} at {window.width()}x{window.height()}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "dashboard_screenshot"))
