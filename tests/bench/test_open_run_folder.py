"""bench.open_run_folder: the folder it writes holds the steps asked for, and the bench runs end to end in a process
of its own (no timing asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.runs import read_events

ROOT = Path(__file__).resolve().parents[2]


def test_the_folder_holds_the_steps_asked_for_and_its_ending(tmp_path):
    from bench.open_run_folder import make_run_folder

    events = read_events(make_run_folder(tmp_path / "runs", 700))
    steps = [e.step for e in events if type(e).__name__ == "StepMetrics"]
    assert steps == list(range(1, 701)) and type(events[-1]).__name__ == "RunFinished" and events[-1].step == 700


@pytest.mark.slow
def test_the_bench_opens_the_folder_in_the_window_and_reports_it(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SPEEDBOARD_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "bench.open_run_folder", "--steps", "3000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^3,000 steps \(\d+ MB\), finished: the open call held the window \d+\.\d+ s; shown whole "
                     r"after \d+\.\d+ s; longest gap of a 50 ms timer \d+\.\d+ s$", done.stdout, re.M), done.stdout
