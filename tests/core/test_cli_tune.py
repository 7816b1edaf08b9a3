"""``speedboard tune`` on the command line: one line for bad input, and a tiny tune end to end."""

from __future__ import annotations

import json
import os
import signal
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.cli import main
from core.tune import load_report

ROOT = Path(__file__).resolve().parents[2]


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
    (["--budget-seconds", "1e30"], "positive number of seconds up to 604,800 (a week), got 1e+30"),
    (["--budget-seconds", "soon"], "expected a number of seconds"),
    (["--budget-seconds", "0.2"], "too short to compare two settings"),
    (["--trial-steps", str(10**18)], "give fewer --trial-steps (the budget is at most a week)"),
    (["--trial-steps", str(10**20)], "expected an integer from 1 to 2**63 - 1"),
    (["--repeats", str(2**64)], "expected an integer from 1 to 2**63 - 1"),
    (["--trial-steps", "0"], "expected an integer from 1 to 2**63 - 1, got 0"),
    (["--repeats", "x"], "expected an integer"),
    (["--precisions", "fp8"], "expected fp32, bf16 or fp16"),
    (["--cells", "nothing-*"], "matches no cell"),
    (["--cells", ","], "names no pattern"),
    (["--cells", " "], "names no pattern"),
    (["--cells", ""], "names no pattern"),
    (["--json", ""], "expected a path, got an empty one"),
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
    # A line break in the report's own name split the closing "report: …" line in two (folders were refused).
    assert main(["tune", "--config", micro_file, "--json", str(tmp_path / "a\nb.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a control character ('\\n')" in err, err
    assert not (tmp_path / "a\nb.json").exists()


def _no_trials(monkeypatch) -> None:
    """Planning's matmul measurement and the trials fail the test: a refusal must come before either."""
    import core.device
    import core.tune

    def never(*args, **kwargs):
        raise AssertionError("reached planning or a trial")

    monkeypatch.setattr(core.device, "measure_matmul_peak", never)
    monkeypatch.setattr(core.tune, "run_trial", never)


def test_a_micro_batch_train_refuses_is_refused_in_trains_words_before_planning(tmp_path, monkeypatch, capsys):
    import core.memory_budget

    # The same memory on both calls: the message quotes it.
    monkeypatch.setattr(core.memory_budget, "device_memory", lambda device: (16 * 2**30, "available RAM"))
    _no_trials(monkeypatch)
    code = main(["tune", "--preset", "tiny", "--repeats", "1", "--trial-steps", "1", "--budget-seconds", "20",
                 "--precisions", "fp32", "--micro-batch", "100000000", "--json", str(tmp_path / "t.json")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    tune_line = captured.err.strip()
    assert len(tune_line.splitlines()) == 1 and "too short" not in tune_line
    assert "micro-batch 100,000,000 × 128 tokens needs at least" in tune_line
    assert "fits with the same effective batch" in tune_line  # the split that fits, as train names it
    assert main(["train", "--preset", "tiny", "--steps", "1", "--micro-batch", "100000000",
                 "--out", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == tune_line
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("blocker", ["home/tune", "home"])
def test_a_default_report_folder_that_cannot_be_written_is_refused_before_any_trial(
        blocker, micro_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPEEDBOARD_HOME", str(tmp_path / "home"))
    (tmp_path / blocker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / blocker).write_text("")  # a file where the folder should be
    _no_trials(monkeypatch)
    assert main(["tune", "--config", micro_file]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1, captured
    assert f"{tmp_path / blocker} is a file, not a folder" in err and "give --json FILE" in err


def test_a_report_that_fails_to_write_at_the_end_still_prints_the_results(micro_file, tmp_path, monkeypatch,
                                                                           capsys):
    import errno
    from pathlib import Path

    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("SPEEDBOARD_HOME", str(tmp_path / "home"))
    reports = tmp_path / "home" / "tune"
    real = Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.parent == reports:  # only the report: the trials write as usual
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full)
    code = main(["tune", "--config", micro_file, "--cells", "off-a2-fp32", "--precisions", "fp32",
                 "--repeats", "1", "--trial-steps", "1"])
    captured = capsys.readouterr()
    assert code == 2
    assert "[2/2]" in captured.out and "tokens/s median" in captured.out and "recommendation: " in captured.out
    assert "report:" not in captured.out
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "cannot write the tuning report" in err
    assert "no space left on the device" in err
    assert list(reports.iterdir()) == []  # no partial report left behind


def test_a_tiny_tune_end_to_end(micro_file, tmp_path, capsys):
    import torch

    torch.set_num_threads(1)
    report_path = tmp_path / "tune.json"
    code = main(["tune", "--config", micro_file, "--cells", "off-a1-*,off-a2-fp32", "--repeats", "1",
                 "--trial-steps", "2", "--json", str(report_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "3 settings × 1 interleaved repeat, " in out and "[3/3]" in out
    assert "recommendation:" in out and f"report: {report_path}" in out
    report = load_report(report_path)
    assert set(report["summary"]["rows"]) == {"off-a1-fp32", "off-a2-fp32", "off-a1-bf16"}
    for trial in report["trials"]:  # the JSON holds the figure each trial's line printed (a median step)
        rates = [trial["tokens_per_step"] / t for t in trial["step_seconds"]]
        assert trial["median_tokens_per_s"] == pytest.approx(statistics.median(rates))
        assert f"{trial['median_tokens_per_s']:,.0f} tok/s (median step)" in out
    # No run folder is left where runs go (the config's output folder): only the report.
    assert not (tmp_path / "runs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["micro.json", "tune.json"]


def test_the_help_states_the_advisors_defaults():
    from core.tune import DEFAULT_BUDGET_SECONDS, DEFAULT_REPEATS, DEFAULT_STEPS, TuneOptions

    assert (TuneOptions().budget_seconds, TuneOptions().steps, TuneOptions().repeats) == (
        DEFAULT_BUDGET_SECONDS, DEFAULT_STEPS, DEFAULT_REPEATS) == (600, 3, 2)  # the numbers the help text gives


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 130), (signal.SIGINT, 130)])
def test_sigterm_ends_a_tune_in_one_line_and_sighup_stops_it_like_ctrl_c(signum, code, micro_file, tmp_path):
    """SIGTERM: end now, one line, exit 143; SIGHUP (the terminal closed): stop after the current step and report,
    as a first Ctrl-C does, exit code 130 (it was 0: a script could not tell a cancelled tune from a finished
    one). Either way no trial's run folder is left in the temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    report = tmp_path / "tune.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "core.cli", "tune", "--config", micro_file, "--cells", "off-*",
                             "--trial-steps", "100000", "--repeats", "1", "--budget-seconds", "604800",
                             "--json", str(report)], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith("speedboard tune: ")  # planned; the first trial starts
        while not any(p.name.startswith("speedboard-trial-") for p in tmp.iterdir()):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    if signum == signal.SIGTERM:
        assert err.strip().splitlines()[-1] == "speedboard: terminated (SIGTERM)", err
        assert not report.exists()
    else:
        assert "recommendation:" in out and report.is_file()
    assert not [p for p in tmp.iterdir() if p.name.startswith("speedboard-trial-")]


@pytest.mark.slow
def test_a_closed_terminal_while_a_tune_plans_stops_it_and_keeps_no_half_store(micro_file, tmp_path):
    """SIGHUP while the tune prepared its corpus (planning): its default action killed the process silently, with a
    half-written token store and its lock left in the cache."""
    import random

    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(words) for _ in range(12)) + "\n" for _ in range(150_000)))
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "SPEEDBOARD_CACHE_DIR": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "core.cli", "tune", "--config", micro_file, "--data", str(corpus),
                             "--cells", "off-*", "--json", str(tmp_path / "tune.json")], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stores = cache / "stores"
        while not (stores.is_dir() and any(p.name.startswith(".tmp-") for p in stores.iterdir())):
            assert proc.poll() is None, proc.stderr.read()  # its tokens are being written: planning
            time.sleep(0.05)
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "no token store was kept" in err, err
    assert [p.name for p in stores.iterdir()] == [] and not (tmp_path / "tune.json").exists()


def _special_files(tmp_path) -> list[Path]:
    """A named pipe, and a character device (root only) as ``mknod c 1 3`` makes one: /dev/null's numbers."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    found = [pipe]
    if os.geteuid() == 0:
        null = tmp_path / "null"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        found.append(null)
    return found


def test_a_report_path_that_is_a_device_or_a_pipe_is_refused_not_replaced(micro_file, tmp_path, monkeypatch, capsys):
    """A rename onto it would replace the device by a JSON file (as root, ``--json /dev/null`` would)."""
    _no_trials(monkeypatch)
    for special in _special_files(tmp_path):
        kind = stat.S_IFMT(os.stat(special).st_mode)
        assert main(["tune", "--config", micro_file, "--json", str(special)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--json {special}: it is a" in err and "not a file" in err, err
        assert stat.S_IFMT(os.stat(special).st_mode) == kind  # still what it was


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="a /proc file system")
def test_a_report_folder_that_permissions_call_writable_but_is_not_is_refused_before_any_trial(
        micro_file, monkeypatch, capsys):
    """/proc passes root's permission check, yet no file can be created there: found by trying, up front."""
    _no_trials(monkeypatch)
    assert main(["tune", "--config", micro_file, "--json", "/proc/speedboard-tune.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--json /proc/speedboard-tune.json: " in err, err
    assert "no file can be created in /proc" in err or "/proc is not writable" in err  # root, or not
    assert not Path(f"/proc/.speedboard-tune.json.tmp-{os.getpid()}").exists()


def test_an_output_folder_train_refuses_is_refused_in_trains_words(micro_file, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "passwd"
    blocker.write_text("root:x:0:0\n")
    _no_trials(monkeypatch)
    assert main(["tune", "--config", micro_file, "--out", str(blocker), "--json", str(tmp_path / "t.json")]) == 2
    tune_line = capsys.readouterr().err.strip()
    assert len(tune_line.splitlines()) == 1
    assert f"cannot create run folders in {blocker} (the output folder): {blocker} is a file, not a folder" in tune_line
    assert main(["train", "--config", micro_file, "--out", str(blocker)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == tune_line
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("args", [["--repeats", "x"], ["--budget-seconds", "soon"], ["--micro-batch", "x"],
                                  ["--cells", "nothing-*"], ["--json", ""]])
def test_every_tune_error_has_the_same_prefix(args, micro_file, capsys):
    assert _exit_code(["tune", "--config", micro_file, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedboard: error: "), err


def test_the_line_after_a_trial_shows_the_tables_statistic():
    """A first trial's slow first step (7.26 s among 0.6 s ones) moves the window's mean, not the median step
    the table shows: the line and the table agree."""
    from core.trials import TrialResult
    from core.tune import TrialFinished, TrialStarted
    from core.tune_cli import TuneConsole

    steps = [7.26, 0.67, 0.60]
    result = TrialResult("off-a1-fp32", "speedboard", 0, tokens_per_s=3 * 1024 / sum(steps), tokens_per_step=1024,
                         timed_steps=3, step_seconds=steps, losses=[5.0])
    lines = []
    console = TuneConsole()
    console.say = lines.append
    console(TrialStarted("off-a1-fp32", "compile off, fp32, 16 × 1", 0, 1, 20, 0.0, 60.0))
    console(TrialFinished(result.to_dict(), {}, 9.0, 50.0))
    assert lines == ["[1/20] compile off, fp32, 16 × 1: 1,528 tok/s (median step), loss 5.0000  (about 0.8 min left)"]
    from core.trials import spread

    assert f"{spread(result.step_rates).median:,.0f}" == "1,528"  # the table's figure


@pytest.mark.parametrize("fails", [False, True])
def test_planning_is_said_on_a_terminal_and_erased_after_it(monkeypatch, fails):
    """The plan prepares the corpus and measures the machine: seconds with nothing on the screen."""
    import io
    import sys

    from core.errors import ConfigError
    from core.tune_cli import _planned

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    def plan(config, options, cancelled):
        assert cancelled() is False
        assert "planning: checking the settings, preparing the corpus, measuring this machine" in terminal.getvalue()
        if fails:
            raise ConfigError("bad")
        return "the plan"

    if fails:
        with pytest.raises(ConfigError):
            _planned(None, None, plan, lambda: False)
    else:
        assert _planned(None, None, plan, lambda: False) == "the plan"
    assert terminal.getvalue().endswith("\r\033[K")
