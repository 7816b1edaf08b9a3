"""``speedboard bench`` when things go wrong: empty lists, unknown devices, a disk that fills up, Ctrl-C and SIGTERM.

Each ends with one line on stderr and its exit code, and leaves no half-written
report, no temporary folder and no empty output folder behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from core.trials import Cell, TrialResult
from speedboard.cli import main

ROOT = Path(__file__).resolve().parents[2]
# The smallest bench there is: the tiny preset, one eager cell, one timed step, no probes, no HF.
TINY = ["--preset", "tiny", "--no-hf", "--no-probes", "--modes", "off", "--accum", "1", "--effective-batch", "1",
        "--precision", "fp32", "--steps", "1", "--matmul-size", "64"]


def _run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return exc.code


def _leftovers(folder: Path) -> list[str]:
    """Files of ours that a failed write or an interrupted run must not leave: hidden temporaries."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp"))


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize("flag, value, message", [
    ("--cells", ",", "argument --cells: no cell given"),
    ("--cells", " ", "argument --cells: no cell given"),
    ("--cells", " , ,", "argument --cells: no cell given"),
    ("--modes", ",", "argument --modes: no compile setting given"),
    ("--accum", " , ", "argument --accum: no accumulation given"),
    ("--precision", ",", "argument --precision: no precision given"),
])
def test_a_list_option_with_no_item_is_refused_in_one_line(flag, value, message, capsys, tmp_path):
    assert _run_main(["bench", *TINY, flag, value, "--out", str(tmp_path / "bench")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"speedboard bench: error: {message}"]
    assert not (tmp_path / "bench").exists()


def test_an_output_folder_that_cannot_be_written_is_refused_before_anything_is_measured(capsys, tmp_path,
                                                                                           monkeypatch):
    """An existing read-only --out was found out after the whole matrix had run; an empty one meant the default
    folder."""
    import core.paths

    assert _run_main(["bench", *TINY, "--out", ""]) == 2
    assert capsys.readouterr().err.strip() == \
        "speedboard bench: error: argument --out: expected a path, got an empty one"
    out = tmp_path / "bench"
    out.mkdir()
    monkeypatch.setattr(core.paths, "why_not_writable", lambda path: f"{path} is on a read-only file system")
    assert _run_main(["bench", *TINY, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"speedboard bench: error: --out {out}: {out} is on a read-only file system"]


def test_a_default_report_folder_that_cannot_be_made_is_named_as_such(capsys, tmp_path, monkeypatch):
    """With no --out given, the refusal named "--out" and said nothing of how to write elsewhere."""
    home = tmp_path / "home"
    home.write_text("a file where SPEEDBOARD_HOME should be a folder")
    monkeypatch.setenv("SPEEDBOARD_HOME", str(home))
    assert _run_main(["bench", *TINY]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"speedboard bench: error: the report folder {home}/bench/"), line
    assert "--out " not in line.split("; give")[0] and line.endswith("; give --out FOLDER to write the report "
                                                                     "elsewhere")


def test_a_report_of_the_longest_name_the_file_system_takes_is_written_and_replaced(tmp_path):
    """Its hidden copies, written beside it first, took the name whole with more added: past 255 bytes, and
    "File name too long" was said of the folder."""
    path = tmp_path / f"{'x' * 250}.json"
    for _ in range(2):  # written, then replaced (the one there kept aside until the new one is in place)
        written = report.write_reports(_raw(), path)
        assert path in written and json.loads(path.read_text())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_report_of_a_path_that_is_not_utf8_is_written_whole(tmp_path):
    """A folder named with the byte 0xff: the Markdown could not be encoded once everything had been measured,
    and nothing was written."""
    raw = _raw()
    raw["command"] = "speedboard bench --out b\udcffname"  # a lone surrogate, as Python decodes such a name
    written = report.write_reports(raw, tmp_path / "bench.json")
    assert (tmp_path / "bench.md") in written
    assert "b\\udcffname" in (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "bench.json").read_text())["command"] == raw["command"]


@pytest.mark.parametrize("name", ["bench.json", "bench.md", "bench.png"])
def test_a_report_file_that_is_a_folder_is_refused_before_anything_is_measured(name, capsys, tmp_path, monkeypatch):
    """The folder could be written, but the report's own file could not be replaced: that was found out only
    when the report was written, after the whole matrix had been measured and then thrown away."""
    import bench.runners

    def measured(*args, **kwargs):
        raise AssertionError("a run was measured")

    monkeypatch.setattr(bench.runners, "run_speedboard", measured)
    out = tmp_path / "bench"
    (out / name).mkdir(parents=True)
    assert _run_main(["bench", *TINY, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"speedboard bench: error: --out {out}: its {name} is a folder, not a file the report can replace"]
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_an_effective_batch_that_cannot_fit_is_one_line_before_any_run(capsys, tmp_path):
    """Its accumulation-1 cells train the whole batch at once: a traceback from a 24 GiB allocation, exit 1."""
    argv = [a if a != "1" or TINY[i - 1] != "--effective-batch" else "100000000" for i, a in enumerate(TINY)]
    assert _run_main(["bench", *argv, "--out", str(tmp_path / "bench")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("speedboard bench: error: --effective-batch: a micro-batch of 100,000,000 sequences")
    assert line.endswith("give a smaller --effective-batch") and not (tmp_path / "bench").exists()


def test_duplicates_and_blanks_in_a_list_option_are_dropped():
    from bench.run import build_parser

    args = build_parser().parse_args(["--cells", " off-*, ,off-*", "--accum", "4,1,,4", "--precision", "fp32, fp32"])
    assert (args.cells, args.accum, args.precision) == ("off-*", (1, 4), ("fp32",))


@pytest.mark.parametrize("name", ["bogus", "meta", ""])
def test_an_unknown_device_lists_the_devices_of_this_machine(name, capsys, tmp_path):
    from core.device import available_devices

    assert _run_main(["bench", *TINY, "--device", name, "--out", str(tmp_path / "bench")]) == 2
    err = capsys.readouterr().err.strip()
    choices = ["auto", *available_devices()]
    assert err.splitlines() == [f"speedboard bench: error: unknown device {name!r}; "
                                f"use {', '.join(choices[:-1])} or {choices[-1]}"]
    if "mps" not in available_devices():
        assert "mps" not in err
    assert not (tmp_path / "bench").exists()


# ----------------------------------------------------------------------------- writing the report
def _raw(steps: int = 1, repeats: int = 1, precision: str = "fp32") -> dict:
    """A bench.json of one eager cell measured by the Trainer and the bare loop (numbers made up)."""
    cell = Cell("off", "model", 1, 1, precision)
    runs = [TrialResult(cell=cell.name, runner=runner, repeat=r, tokens_per_s=1000.0 + r, tokens_per_step=128,
                        timed_steps=steps, window_seconds=0.128 * steps, losses=[7.6] * (steps + 1),
                        step_seconds=[0.128] * steps).to_dict()
            for r in range(repeats) for runner in ("speedboard", "bare")]
    raw = {
        "schema": "speedboard-bench/1", "created": "2025-01-01T00:00:00", "command": "speedboard bench --quick",
        "device": {"type": "cpu", "name": "a test CPU", "threads": 2}, "versions": {"torch": "2"},
        "config": {"preset": "tiny", "num_parameters": 1000, "seq_len": 128, "effective_batch": 1,
                   "tokens_per_step": 128, "accums": [1], "modes": ["off"], "steps": steps, "repeats": repeats,
                   "total_steps": steps + 1, "precision": precision, "precisions": [precision], "seed": 0,
                   "lr": 1e-3, "hf": False, "probes": False, "loss_tolerance": 2e-3,
                   "loss_tolerances": {precision: 2e-3}},
        "flops_per_token": 6000.0,
        "matmul_peak": {"sizes": [], "measurements": {precision: [1e9]}, "flops": {precision: 1e9}},
        "cells": [cell.to_dict()], "probes": {}, "runs": runs, "load_average": [], "notes": [],
        "wall_seconds": 1.0,
    }
    raw["summary"] = report.summarise(raw)
    return raw


def test_the_back_to_back_range_is_of_median_steps_as_the_ratio_beside_it():
    """The headline "trainer ÷ bare" divides median steps, its bracketed range divided window throughputs: a slow
    first timed step put a 1.024 headline beside a range of 0.94–0.97."""
    raw = _raw(steps=3, repeats=2)
    for run in raw["runs"]:
        if run["runner"] == "speedboard":  # one slow step in each window: 750 tokens/s over it, 1,000 a median step
            run["step_seconds"], run["tokens_per_s"] = [0.256, 0.128, 0.128], 3 * 128 / 0.512
        else:
            run["step_seconds"], run["tokens_per_s"] = [0.128] * 3, 1000.0
    row = report.summarise(raw)["cells"]["off-a1-fp32"]
    assert row["trainer_vs_bare"] == pytest.approx(1.0)
    paired = row["trainer_vs_bare_paired"]
    assert paired["min"] == pytest.approx(1.0) and paired["max"] == pytest.approx(1.0)


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """A real full-disk condition for this process: writes past ``limit`` bytes fail with EFBIG."""
    resource = pytest.importorskip("resource")
    if not hasattr(signal, "SIGXFSZ"):
        pytest.skip("no file-size limit signal on this platform")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _earlier_report(folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    earlier = {"bench.json": b'{"earlier": true}\n', "bench.md": b"# earlier\n", "bench.png": b"\x89PNG earlier"}
    for name, data in earlier.items():
        (folder / name).write_bytes(data)
    return earlier


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_without_matplotlib_an_earlier_chart_is_not_left_beside_the_new_tables(tmp_path, monkeypatch):
    _earlier_report(tmp_path)

    def no_matplotlib(raw):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(report, "_figure", no_matplotlib)
    written = report.write_reports(_raw(), tmp_path / "bench.json")
    assert [p.name for p in written] == ["bench.json", "bench.md"]
    assert sorted(_contents(tmp_path)) == ["bench.json", "bench.md"]
    assert "| off-a1-fp32 | 1 × 1 |" in (tmp_path / "bench.md").read_text()


def test_the_report_is_written_whole(tmp_path):
    pytest.importorskip("matplotlib")
    written = report.write_reports(_raw(), tmp_path / "bench.json")
    assert [p.name for p in written] == ["bench.json", "bench.md", "bench.png"]
    assert json.loads((tmp_path / "bench.json").read_text())["summary"]["cells"]["off-a1-fp32"]["speedboard"]
    assert "| off-a1-fp32 | 1 × 1 |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _leftovers(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "bench.json").stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain write makes it


@pytest.mark.parametrize("limit", [0, 1000])
def test_a_full_disk_leaves_the_earlier_report_as_it_was(limit, tmp_path):
    earlier = _earlier_report(tmp_path)
    with _file_size_limit(limit), pytest.raises(report.ReportNotWritten) as caught:
        report.write_reports(_raw(), tmp_path / "bench.json")
    assert str(caught.value) == (f"cannot write {tmp_path / 'bench.json'}: a file reached the file-size limit "
                                 f"of {limit:,} bytes (ulimit -f)")
    assert _contents(tmp_path) == earlier  # nothing half-written, no temporary file


def test_a_full_disk_while_writing_the_chart_keeps_the_json_and_markdown_out_too(tmp_path):
    pytest.importorskip("matplotlib")
    earlier = _earlier_report(tmp_path)
    raw = _raw()
    # A file-size limit that the JSON and the Markdown fit in and the chart does not.
    limit = max(len(report._json_bytes(raw)), len(report._markdown_file(raw).encode()))
    with _file_size_limit(limit), pytest.raises(report.ReportNotWritten, match=r"cannot write .*bench\.png: "):
        report.write_reports(raw, tmp_path / "bench.json")
    assert _contents(tmp_path) == earlier  # all three or none


@pytest.mark.parametrize("refused", ["bench.md", "bench.png"])
def test_a_report_file_that_cannot_be_replaced_leaves_the_earlier_report_whole(refused, tmp_path, monkeypatch):
    """An earlier bench.md the user may not replace (immutable, another user's in a shared sticky folder): the
    new bench.json was already in place, beside the earlier bench.md and bench.png, a report of two runs."""
    pytest.importorskip("matplotlib")
    earlier = _earlier_report(tmp_path)
    replace = os.replace

    def refusing(src, dst, *args, **kwargs):
        if Path(dst).name == refused and not Path(src).name.endswith(".old"):
            raise PermissionError(1, "Operation not permitted")
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(report.os, "replace", refusing)
    with pytest.raises(report.ReportNotWritten, match=f"cannot write .*{refused}: "):
        report.write_reports(_raw(), tmp_path / "bench.json")
    monkeypatch.undo()
    assert _contents(tmp_path) == earlier  # every file the earlier run's, and no hidden one left


def test_ctrl_c_while_writing_leaves_no_temporary_file(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    earlier = _earlier_report(tmp_path)

    def interrupted(fig, f):
        f.write(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "_save_figure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_reports(_raw(), tmp_path / "bench.json")
    assert _contents(tmp_path) == earlier


@pytest.mark.parametrize("steps, repeats, text", [
    (1, 1, "1 timed step after warm-up × 1 interleaved repeat (tokens/s"),
    (4, 3, "4 timed steps after warm-up × 3 interleaved repeats (tokens/s"),
])
def test_the_report_counts_in_the_singular_and_the_plural(steps, repeats, text):
    assert text in report.markdown(_raw(steps, repeats))


def test_the_report_says_how_many_steps_eager_cells_time():
    """Every cell trains the same steps; an eager cell, warm after one, timed 3 where the header said 1."""
    raw = _raw(steps=1)
    raw["config"]["total_steps"] = 4
    for run in raw["runs"]:
        run["timed_steps"] = 3
    assert ("1 timed step after warm-up (3 for eager cells: they warm up in one step, and every cell trains the "
            "same 4 steps, so that their losses compare) × 1 interleaved repeat") in report.markdown(raw)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_speedup_column_names_the_precision_it_is_against(precision):
    """A bench of bf16 alone headed its speedups "vs fp32 eager a1" over rows that were against bf16 eager."""
    text = report.markdown(_raw(precision=precision))
    assert f"| vs {precision} eager a1 |" in text
    assert "| off-a1-" + precision + " | 1 × 1 | 1,000 | 1.00× |" in text


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("{not json", "cannot read"),
    ('{"a": 1}', "is not a report of speedboard bench"),
])
def test_rewriting_a_report_that_is_not_one_is_refused_in_one_line(content, message, tmp_path, capsys):
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    assert report.main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m bench.report: error: ") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["bench.json"] if content is not None else [])


def _bench_on_a_full_disk(monkeypatch, out: Path, limit: int) -> int:
    """A tiny bench whose report files meet a file-size limit of ``limit`` bytes; its exit code."""
    write_reports = report.write_reports

    def on_a_full_disk(raw, path):
        with _file_size_limit(limit):
            return write_reports(raw, path)

    monkeypatch.setattr(report, "write_reports", on_a_full_disk)
    return main(["bench", *TINY, "--repeats", "1", "--out", str(out)])


@pytest.mark.slow
def test_a_bench_whose_report_cannot_be_written_prints_it_and_says_why(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench"
    earlier = _earlier_report(out)
    assert _bench_on_a_full_disk(monkeypatch, out, 1000) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"speedboard bench: error: cannot write {out / 'bench.json'}: a file "
                                         "reached the file-size limit of 1,000 bytes (ulimit -f)"]
    assert "| off-a1-fp32 | 1 × 1 |" in captured.out  # the results, on the terminal before the files failed
    assert "wrote" not in captured.out
    assert _contents(out) == earlier
    # The start line counts in the singular; the peak it prints is MFU's denominator, the report's own figure
    # (said again should the runs have raised it).
    assert "fp32, 1 cell × 1 repeat, 2 steps per run (1 timed)," in captured.out
    said = re.findall(r"^matmul peak \(MFU's denominator\b.*? fp32 ([\d,.]+) GFLOP/s", captured.out, re.M)
    reported = re.search(r"matmul peak \(MFU's denominator, per precision.*?\): fp32 ([\d,.]+) GFLOP/s",
                         captured.out)
    assert said and reported and said[-1] == reported[1]


def test_quick_takes_the_modes_given(tmp_path, capsys, monkeypatch):
    """bench --quick --modes default-model: "--cells pattern 'off-*' matches no cell", a flag never given (its
    eager cells were a filter that beat the --modes given; the help says options given win)."""
    import bench.runners

    started = []

    def first_run(base, cell, steps, repeat):
        started.append(cell.name)
        raise KeyboardInterrupt  # nothing is compiled or trained: the cell chosen is what is asked

    monkeypatch.setattr(bench.runners, "run_speedboard", first_run)
    code = main(["bench", "--quick", "--modes", "default-model", "--no-hf", "--no-probes", "--precision", "fp32",
                 "--accum", "1", "--effective-batch", "1", "--matmul-size", "64", "--out", str(tmp_path / "out")])
    assert code == 130 and started == ["default-model-a1-fp32"], capsys.readouterr().err


@pytest.mark.slow
def test_partial_results_never_replace_a_finished_report(tmp_path, capsys, monkeypatch):
    """Ctrl-C during a bench rerun into the --out of a finished one wrote its partial results over them."""
    import bench.runners

    out = tmp_path / "bench"
    finished = {"runs": [{"cell": "off-a1-fp32"}], "summary": {}}
    out.mkdir()
    (out / "bench.json").write_text(json.dumps(finished))
    earlier = _contents(out)
    real_run = bench.runners.run_speedboard
    runs = []

    def second_run_interrupted(*args, **kwargs):
        runs.append(1)
        if len(runs) == 2:
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(bench.runners, "run_speedboard", second_run_interrupted)
    assert main(["bench", *TINY, "--repeats", "2", "--out", str(out)]) == 130
    partial = tmp_path / "bench-partial"
    line, = capsys.readouterr().err.splitlines()
    assert line.endswith(f"; partial results written to {partial} ({out} keeps its finished report)"), line
    assert _contents(out) == earlier
    assert json.loads((partial / "bench.json").read_text())["interrupted"].startswith("interrupted (Ctrl-C)")
    # A partial report there is replaced by the next one: only a finished bench's is kept.
    (out / "bench.json").write_text(json.dumps({**finished, "interrupted": "terminated"}))
    runs.clear()
    assert main(["bench", *TINY, "--repeats", "2", "--out", str(out)]) == 130
    assert json.loads((out / "bench.json").read_text())["interrupted"].startswith("interrupted (Ctrl-C)")
    assert capsys.readouterr().err.endswith(f"; partial results written to {out}\n")


class _GoneTerminal:
    """A terminal that has closed (or a pipe whose reader went away): every write fails."""

    def write(self, text: str) -> int:
        raise OSError(errno.EIO, "Input/output error")

    def flush(self) -> None:
        raise OSError(errno.EIO, "Input/output error")


@pytest.mark.slow
def test_a_bench_whose_terminal_is_gone_still_writes_its_report(tmp_path, monkeypatch):
    """Under `| tee` at Ctrl-C (BrokenPipeError) or a closed terminal (EIO), printing the table before the files
    raised: a traceback, exit code 1, and no report, partial results included."""
    monkeypatch.setattr(sys, "stdout", _GoneTerminal())
    monkeypatch.setattr(sys, "stderr", _GoneTerminal())
    out = tmp_path / "bench"
    assert main(["bench", *TINY, "--repeats", "1", "--out", str(out)]) == 0
    assert json.loads((out / "bench.json").read_text())["runs"]
    assert main(["bench", *TINY, "--cells", "nothing-*", "--out", str(tmp_path / "other")]) == 2  # its error too


@pytest.mark.slow
def test_a_bench_that_cannot_write_into_a_new_folder_leaves_none(tmp_path, capsys, monkeypatch):
    out = tmp_path / "new" / "bench"
    assert _bench_on_a_full_disk(monkeypatch, out, 0) == 2
    assert "cannot write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- Ctrl-C and SIGTERM
def _interrupt(tmp_path: Path, sig: int, after: str, options: list[str],
               background: bool = False) -> tuple[int, str, Path, Path]:
    """Start a bench with ``options`` that would run for a long time; send ``sig`` once a line starting
    ``after`` is out. ``background``: started as a shell starts `… &`, SIGINT ignored.

    Returns the exit code, stderr, the --out folder and the bench's temporary folder (its TMPDIR).
    """
    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "speedboard.cli", "bench", *options, "--repeats", "10000",
                             "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(after):
                proc.send_signal(sig)
                break
        else:
            pytest.fail(f"no line starting {after!r} in the output: {''.join(seen)}")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err, out, tmp


def _processes_in(tmp: Path) -> list[int]:
    """Processes still running with ``tmp`` as their TMPDIR (the bench's probes), where /proc says."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"TMPDIR={tmp}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
    return found


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_measured_as_partial_results(tmp_path):
    # Sent as `kill -INT` to a background job, which a shell starts ignoring SIGINT: it stops all the same.
    code, err, out, tmp = _interrupt(tmp_path, signal.SIGINT, "[1/", TINY, background=True)
    assert code == 130 and "Traceback" not in err
    line, = err.strip().splitlines()
    assert line.startswith("speedboard bench: interrupted (Ctrl-C) after ") and " of 20000 runs" in line
    assert line.endswith(f"; partial results written to {out}")
    raw = json.loads((out / "bench.json").read_text())
    assert raw["interrupted"].startswith("interrupted (Ctrl-C) after ") and raw["runs"]
    assert raw["summary"]["cells"]["off-a1-fp32"]["speedboard"]["median"] > 0  # the first run, measured
    assert "**Partial results**: interrupted (Ctrl-C)" in (out / "bench.md").read_text()
    assert _leftovers(out) == []
    assert list(tmp.iterdir()) == []  # no speedboard-bench-* scratch, no trial folder


@pytest.mark.slow
def test_a_closed_terminal_keeps_what_was_measured_and_leaves_nothing(tmp_path):
    """SIGHUP: its default action killed the bench with no report, its temporary folders left in TMPDIR."""
    code, err, out, tmp = _interrupt(tmp_path, signal.SIGHUP, "[1/", TINY)
    assert code == 129 and "Traceback" not in err
    line, = err.strip().splitlines()
    assert line.startswith("speedboard bench: the terminal was closed (SIGHUP) after ")
    assert json.loads((out / "bench.json").read_text())["interrupted"].startswith("the terminal was closed")
    assert list(tmp.iterdir()) == []


@pytest.mark.slow
def test_sigterm_during_a_probe_stops_it_and_leaves_nothing(tmp_path):
    # With probes: the first cell's memory probe is a process of its own, running when the peak is out.
    options = [o for o in TINY if o != "--no-probes"]
    code, err, out, tmp = _interrupt(tmp_path, signal.SIGTERM, "matmul peak", options)
    assert code == 143 and "Traceback" not in err
    line, = err.strip().splitlines()
    assert line.startswith("speedboard bench: terminated (SIGTERM) ")
    if line.endswith("nothing was written"):
        assert not out.exists()  # the bench made it and wrote nothing into it: gone
    else:  # only if the probe had finished first
        assert json.loads((out / "bench.json").read_text())["interrupted"].startswith("terminated (SIGTERM)")
    assert list(tmp.iterdir()) == []
    if Path("/proc/self/environ").exists():
        assert _processes_in(tmp) == []


def test_a_partial_report_without_a_measured_run_draws_without_a_warning():
    """Stopped during the probes, before any run: matplotlib warned "No artists with labels found to put in
    legend" on stderr, a second line beside the one that says the bench was stopped."""
    import warnings

    from bench import report

    raw = {"summary": {"cells": {"off-a1-fp32": {"name": "off-a1-fp32", "memory_only": False, "speedboard": None,
                                                 "bare": None, "hf": None, "peak_gib": None,
                                                 "train_mem_gib": None}}},
           "config": {"preset": "tiny", "precision": "fp32"}, "device": {"name": "cpu"}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = report._figure(raw)
    report._close_figure(fig)


def test_the_start_line_names_the_folder_the_report_will_take(tmp_path, monkeypatch):
    """With a bench of the same second there, the start line named its folder; the report went to "-2"."""
    import datetime

    from bench.run import default_report_folder

    monkeypatch.setenv("SPEEDBOARD_HOME", str(tmp_path / "home"))
    now = datetime.datetime(2026, 12, 7, 13, 27, 48)
    first = default_report_folder("tiny", "cpu", now)
    assert first.name == "20261207-132748-tiny-cpu"
    first.mkdir(parents=True)
    assert default_report_folder("tiny", "cpu", now).name == "20261207-132748-tiny-cpu-2"


def test_a_default_report_folder_of_the_same_second_is_kept_and_the_next_free_one_used(tmp_path):
    """Two benches started in the same second both said "wrote results …/bench/20261207-061333-tiny-cpu/…";
    one report survived. A default folder is claimed by one process (an exclusive mkdir); --out is written."""
    from bench.run import _report

    out = tmp_path / "bench" / "20261207-061333-tiny-cpu"
    earlier = _earlier_report(out)
    second = _report(_raw(), out, fresh=True)
    third = _report(_raw(), out, fresh=True)
    assert (second.name, third.name) == (f"{out.name}-2", f"{out.name}-3")
    assert _contents(out) == earlier and (second / "bench.json").is_file() and (third / "bench.md").is_file()
    assert _report(_raw(), out) == out and _contents(out) != earlier  # --out given: written there, as asked



def test_a_ratio_lies_within_the_range_of_the_back_to_back_ratios_beside_it():
    """The headline was the ratio of the medians pooled over repeats: on a busy machine 0.136 beside a range
    of 0.19–0.58, the two repeats' own ratios."""
    raw = _raw(steps=3, repeats=2)
    rates = {("speedboard", 0): 1361, ("bare", 0): 2346, ("speedboard", 1): 269, ("bare", 1): 1434}
    for run in raw["runs"]:
        run["step_seconds"] = [128 / rates[run["runner"], run["repeat"]]] * 3
    row = report.summarise(raw)["cells"]["off-a1-fp32"]
    paired = row["trainer_vs_bare_paired"]
    assert paired["min"] <= row["trainer_vs_bare"] <= paired["max"]
    assert row["trainer_vs_bare"] == pytest.approx((1361 / 2346 + 269 / 1434) / 2)
