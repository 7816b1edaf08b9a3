"""Every ``python -m bench.<module>`` answers a mistake as ``speedboard bench`` does: one line, exit code 2, no
traceback, before anything is measured; and ``--help`` is help, not a file name or a spec."""

from __future__ import annotations

import importlib
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
