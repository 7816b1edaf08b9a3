"""bench.data_scale in its quick mode: it runs end to end and reports every figure (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_data_scale_quick_mode_reports_every_figure(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "bench.data_scale", "--quick", "--json", str(out),
                           "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and rows[0]["size_mb"] < rows[1]["size_mb"]
    for row in rows:
        assert row["tokens"] > 0 and row["prepare_mchars_s"] > 0 and row["bare_encode_batch_mchars_s"] > 0
        assert row["from_store"] and row["first_step_seconds"] > 0 and row["peak_rss_mib"] > 100
    assert "| corpus | documents |" in proc.stdout and "Peak RSS, largest over smallest corpus" in proc.stdout


def test_the_table_is_the_one_in_the_docs():
    """The markdown the bench prints has docs/benchmarks.md's columns, `encode_batch_fast` beside `encode_batch`."""
    from bench.data_scale import markdown

    row = {"size_mb": 5.0, "documents": 28_026, "tokens": 1_391_166, "tokenizer_seconds": 0.8, "prepare_seconds": 1.0,
           "prepare_mchars_s": 5.0, "bare_encode_batch_mchars_s": 5.44, "bare_encode_batch_fast_mchars_s": 6.36,
           "ratio_to_encode_batch": 0.92, "first_step_seconds": 4.4, "peak_rss_mib": 524}
    head, _, line = markdown([row]).splitlines()
    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert head in docs
    assert line in docs  # the docs' 5 MB row, as the bench prints it


def test_a_childs_peak_is_its_own_not_the_bench_processs():
    """wait4's ru_maxrss of a child started at its parent's peak: the data-scale bench, having prepared 500 MB
    itself, reported its own peak as the training process'."""
    from bench.memory import ChildPeak

    held = bytearray(600 * 2**20)
    held[:: 4096] = b"x" * len(held[:: 4096])  # resident: this process' peak is over 600 MiB
    proc = subprocess.Popen([sys.executable, "-c", "b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]);"
                             "import sys; print('ready', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    peak = ChildPeak(proc.pid, interval=0.005)
    assert proc.stdout.readline() == "ready\n"
    reads = peak.reads
    deadline = time.monotonic() + 60
    while peak.reads <= reads + 1 and time.monotonic() < deadline:  # a poll that saw the child's allocation
        time.sleep(0.005)
    proc.stdin.close()  # the child ends once it has read its input to the end
    proc.wait()
    proc.stdout.close()
    own = peak.stop_mib()
    assert 150 <= own < 400, own
    del held
