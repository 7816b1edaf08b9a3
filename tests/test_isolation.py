"""The test session's own folders: never the user's, whatever the environment says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tests_never_write_into_the_users_folders_or_windows(tmp_path):
    """An exported SPEEDBOARD_CACHE_DIR received the tests' token stores (it was only a default)."""
    env = {**os.environ, "SPEEDBOARD_HOME": str(tmp_path / "home"), "SPEEDBOARD_CACHE_DIR": str(tmp_path / "cache"),
           "QT_QPA_PLATFORM": "xcb"}
    code = ("import os, sys; sys.path.insert(0, os.getcwd()); import tests.conftest; "
            "print(os.environ['SPEEDBOARD_HOME'], os.environ['SPEEDBOARD_CACHE_DIR'], os.environ['QT_QPA_PLATFORM'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    home, cache, platform = out
    assert str(tmp_path) not in home and str(tmp_path) not in cache and platform == "offscreen"
