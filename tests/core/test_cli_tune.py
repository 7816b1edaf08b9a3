"""``speedboard tune`` on the command line: one line for bad input, and a tiny tune end to end."""

from __future__ import annotations

import json

import pytest

from core.cli import main
from core.tune import load_report


@pytest.fixture
def micro_file(micro, tmp_path):
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(micro().to_dict()))
    return str(path)


def _exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as exc:  # the argument parser's own errors
        return exc.code


@pytest.mark.parametrize("args, words", [
    (["--budget-seconds", "-1"], "positive number of seconds"),
    (["--budget-seconds", "inf"], "positive number of seconds"),
    (["--budget-seconds", "soon"], "expected a number of seconds"),
    (["--budget-seconds", "0.2"], "too short to compare two settings"),
    (["--trial-steps", "0"], "≥ 1"),
    (["--repeats", "x"], "expected an integer"),
    (["--precisions", "fp8"], "expected fp32, bf16 or fp16"),
    (["--cells", "nothing-*"], "matches no cell"),
    (["--micro-batch", "0"], "micro"),
    (["--device", "cuda:7"], "cuda:7"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, micro_file, capsys):
    assert _exit_code(["tune", "--config", micro_file, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_a_report_path_that_cannot_be_written_is_refused_before_any_trial(micro_file, tmp_path, capsys):
    assert main(["tune", "--config", micro_file, "--json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["tune", "--config", micro_file, "--json", str(blocker / "r.json")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_a_tiny_tune_end_to_end(micro_file, tmp_path, capsys):
    import torch

    torch.set_num_threads(1)
    report_path = tmp_path / "tune.json"
    code = main(["tune", "--config", micro_file, "--cells", "off-a1-*,off-a2-fp32", "--repeats", "1",
                 "--trial-steps", "2", "--json", str(report_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "settings × 1 interleaved repeats" in out and "[3/3]" in out
    assert "recommendation:" in out and f"report: {report_path}" in out
    report = load_report(report_path)
    assert set(report["summary"]["rows"]) == {"off-a1-fp32", "off-a2-fp32", "off-a1-bf16"}
    # No run folder is left where runs go (the config's output folder): only the report.
    assert not (tmp_path / "runs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["micro.json", "tune.json"]


def test_the_help_states_the_advisors_defaults():
    from core.tune import DEFAULT_BUDGET_SECONDS, DEFAULT_REPEATS, DEFAULT_STEPS, TuneOptions

    assert (TuneOptions().budget_seconds, TuneOptions().steps, TuneOptions().repeats) == (
        DEFAULT_BUDGET_SECONDS, DEFAULT_STEPS, DEFAULT_REPEATS) == (600, 3, 2)  # the numbers the help text gives
