"""Every ``python -m bench.<module>`` answers a mistake as ``speedboard bench`` does: one line, exit code 2, no
traceback, before anything is measured; and ``--help`` is help, not a file name or a spec."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.module_cli import run_module
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def _entry(module: str, argv: list[str]) -> int:
    """What ``python -m bench.<module> ARGV`` exits with, in this process."""
    main = importlib.import_module(f"bench.{module}").main
    try:
        return run_module(lambda: main(argv), module)
    except SystemExit as exc:  # the parser's own refusals, and --help
        return exc.code


def test_the_runnable_modules_are_the_ones_listed_here():
    assert RUNNABLE == sorted(BAD_VALUES)


BAD_VALUES = {
    "compile_cost": ["--repeats", "0"],
    "cuda_graph_grads": ["--preset", "nope"],
    "dashboard_screenshot": ["--timeout", "nan"],
    "data_scale": ["--sizes", "abc"],
    "gpu_check": ["--out", "unused", "--budget", "-1"],
    "gui_responsiveness": ["--steps", "0"],
    "long_docs": ["--gigabytes", "inf"],
    "mfu_ceiling": ["--threads", "-1"],
    "numerics": ["--steps", "-1"],
    "open_run_folder": ["--steps", "0"],
    "precision_speed": ["--steps", "0"],
    "probe": ["not json"],
    "profile_step": ["--preset", "nope"],
    "report": [],
    "run": ["--steps", "0"],
    "step_ab": ["--repeats", "0"],
    "tune_screenshot": ["--size"],
}


@pytest.mark.parametrize("module", sorted(BAD_VALUES))
def test_a_bad_value_is_one_line_and_exit_2(module, capsys):
    assert _entry(module, BAD_VALUES[module]) == 2
    prog = "speedboard bench" if module == "run" else f"python -m bench.{module}"  # the command it is the body of
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines


@pytest.mark.parametrize("module", ["probe", "report"])
def test_help_is_help_for_the_modules_with_a_positional_argument(module, capsys):
    assert _entry(module, ["--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m bench.{module} ")


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "-1"], "argument --sizes: expected a positive number, got -1"),
    (["--sizes", ","], "argument --sizes: expected comma-separated positive numbers, got ','"),
])
def test_corpus_sizes_are_checked_before_a_corpus_is_written(argv, message, capsys):
    assert _entry("data_scale", argv) == 2
    assert capsys.readouterr().err.strip() == f"python -m bench.data_scale: error: {message}"


def test_a_mistake_found_after_parsing_is_one_line_and_exit_2(capsys):
    def main() -> int:
        raise ConfigError("device 'cuda' requested, but no CUDA device is present")

    assert run_module(main, "numerics") == 2
    assert capsys.readouterr().err == (
        "python -m bench.numerics: error: device 'cuda' requested, but no CUDA device is present\n")


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    def main() -> int:
        raise KeyboardInterrupt

    assert run_module(main, "step_ab") == 130
    assert capsys.readouterr().err == "python -m bench.step_ab: interrupted\n"


def test_a_module_run_as_a_program_says_a_late_mistake_in_one_line(tmp_path):
    """The whole path: a CUDA-only check on a machine without CUDA, through ``python -m``."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, "-m", "bench.cuda_graph_grads", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "python -m bench.cuda_graph_grads: error: device 'cuda' requested, but no CUDA device is present"]


@pytest.mark.parametrize("module, flag", [("data_scale", "--json"), ("compile_cost", "--json"),
                                          ("precision_speed", "--out"), ("long_docs", "--json"),
                                          ("numerics", "--out")])
def test_a_results_file_that_cannot_be_written_is_refused_before_anything_is_measured(module, flag, tmp_path,
                                                                                      capsys):
    """It was written with a bare write_text once everything had been measured: a traceback, the figures lost."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [(blocker / "rows.json", "is a file, not a folder"), (tmp_path, "is a folder")]
    if Path("/proc/self").is_dir():  # writable by its permission bits for root, yet no file can be made there
        cases.append((Path("/proc/rows.json"), "cannot write the results file /proc/rows.json: "))
    for target, says in cases:
        assert _entry(module, [flag, str(target)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"python -m bench.{module}: error: argument {flag}: ") and says in line, line


def test_a_results_file_that_fails_late_is_one_line(tmp_path, monkeypatch):
    """A disk that fills during the measurement: the write at the end is one line, not a traceback."""
    import errno

    from bench.module_cli import write_output
    from core.errors import SpeedboardError

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(SpeedboardError, match=r"cannot write .*rows\.json: "):
        write_output(tmp_path / "rows.json", "{}")


@pytest.mark.parametrize("argv, says", [
    (["--scopes", "bogus"], "argument --scopes: expected model, block or model,block, got 'bogus'"),
    (["--scopes", ","], "argument --scopes: expected model, block or model,block, got ','"),
])
def test_compile_cost_takes_only_the_scopes_it_measures(argv, says, capsys):
    """Any other word was measured as per block under its own name (a cold compile of a minute), and ',' was an
    empty table; exit code 0 each time."""
    assert _entry("compile_cost", argv) == 2
    assert capsys.readouterr().err.strip() == f"python -m bench.compile_cost: error: {says}"


def test_a_compile_past_its_timeout_is_one_line(monkeypatch):
    import bench.compile_cost
    from core.errors import SpeedboardError

    def slow(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(bench.compile_cost.subprocess, "run", slow)
    with pytest.raises(SpeedboardError, match=r"^the model compile took longer than --timeout 2 s$"):
        bench.compile_cost.measure("tiny", 2, "model", 2.0)


@pytest.mark.parametrize("steps", ["1", "3"])
def test_precision_speed_needs_a_step_after_compiled_warm_up_and_removes_its_runs(steps, monkeypatch, tmp_path,
                                                                                 capsys):
    """A compiled run's first three steps are its warm-up: with 3 (or 1) its tokens/s were None, a traceback after
    minutes of runs; and the runs' folders, checkpoints included, stayed in the temporary folder (gigabytes for
    the small preset)."""
    import bench.precision_speed as ps

    assert _entry("precision_speed", ["--steps", steps]) == 2
    assert f"expected an integer ≥ 4, got {steps}" in capsys.readouterr().err
    homes = []

    def run_cell(precision, mode, args, home, tag, steps=0):
        homes.append(home)
        (home / "runs" / tag).mkdir(parents=True, exist_ok=True)
        return {"precision": precision, "compile": mode, "tokens_per_s": 100.0, "mfu": 0.1, "peak_flops": 1e9,
                "load_before": (0.0, 0.0, 0.0), "load_after": (0.0, 0.0, 0.0)}

    monkeypatch.setattr(ps, "run_cell", run_cell)
    monkeypatch.setattr(ps, "_loads", lambda loads: "0")
    assert ps.main(["--steps", "4", "--repeats", "1", "--out", str(tmp_path / "runs.json")]) == 0
    assert homes and not homes[0].exists() and len(json.loads((tmp_path / "runs.json").read_text())) == 4


def test_step_ab_refuses_a_cell_it_does_not_have_before_building_a_model(capsys):
    assert _entry("step_ab", ["--cells", "bf16-off-attn16,fp16-off"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m bench.step_ab: error: unknown cell 'fp16-off': one of fp32-off, ")
    assert "bf16-graph-attn16" in err
