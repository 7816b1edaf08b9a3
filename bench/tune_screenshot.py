"""Take the README's screenshot of the speed advisor's result, from a saved report.

    QT_QPA_PLATFORM=offscreen python -m bench.tune_screenshot docs/tune-cpu-small.json --out docs/tune.png

Opens the real dialog (Run ▸ Find fastest settings…), shows the report the way
*Open report…* does, and grabs the dialog with ``QWidget.grab()``. Nothing is
trained; the window's settings go to a temporary file.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import module_parser, run_module


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("tune_screenshot", __doc__)
    parser.add_argument("report", help="a tuning report (speedboard tune --json FILE, or the dashboard's)")
    parser.add_argument("--out", default="docs/tune.png")
    parser.add_argument("--size", default="1250x720", help="dialog size WxH")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = Path(tempfile.mkdtemp(prefix="speedboard-shot-"))
    os.environ.setdefault("SPEEDBOARD_HOME", str(home))

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = MainWindow(settings=QSettings(str(home / "settings.ini"), QSettings.Format.IniFormat),
                        out_dir=str(home / "runs"))
    window.show()
    dialog = window.find_fastest_settings()
    if not dialog.open_report(args.report):
        raise SystemExit(f"{args.report} is not a tuning report")
    width, height = (int(v) for v in args.size.split("x"))
    dialog.resize(width, height)
    for _ in range(30):  # let the layout settle and the chart draw
        app.processEvents()
        time.sleep(0.02)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not dialog.grab().save(str(out)):
        raise SystemExit(f"could not write {out}")
    print(f"wrote {out}")
    dialog.close()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "tune_screenshot"))
