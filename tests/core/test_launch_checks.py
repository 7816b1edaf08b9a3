"""``speedboard train --nproc N`` before torchrun starts: the run folder's claim, the start checkpoint, the data lines.

Everything here runs in this process, with torchrun replaced by a stand-in that
fails the test if it is ever started where the launcher must refuse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from core import checkpoint as ck
from core.cli import main
from core.errors import ConfigError
from core.runs import (
    CLAIM_ENV,
    CLAIM_FILE,
    claim_run_dir,
    create_run_dir,
    is_run_dir,
    release_run_dir,
    run_state,
)
from core.trainer import train
from tests.conftest import micro_config
from tests.core.checkpoint_helpers import corpus_file, one_thread


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))


def no_torchrun(*args, **kwargs):
    raise AssertionError("torchrun was started")


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def error_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- the run folder's claim
def test_a_claimed_run_folder_is_taken_over_once_and_only_by_its_own_launchers_worker(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    token = claim_run_dir(root / "r")
    assert (root / "r" / CLAIM_FILE).read_text() == token
    with pytest.raises(ConfigError, match="run folder .* already exists; choose another run id"):
        claim_run_dir(root / "r")  # a second job with the same id
    monkeypatch.delenv(CLAIM_ENV, raising=False)
    with pytest.raises(FileExistsError):
        create_run_dir(root, "r")  # a process that was not started for this claim
    monkeypatch.setenv(CLAIM_ENV, "another-token")
    with pytest.raises(FileExistsError):
        create_run_dir(root, "r")
    monkeypatch.setenv(CLAIM_ENV, token)
    assert create_run_dir(root, "r") == root / "r"
    assert list((root / "r").iterdir()) == []
    with pytest.raises(FileExistsError):
        create_run_dir(root, "r")  # taken once
    (root / "r" / "metrics.jsonl").write_text("{}\n")
    release_run_dir(root / "r", token)  # taken over: the run's folder now, left alone
    assert files_of(root / "r") == {"metrics.jsonl": b"{}\n"}

    untaken = claim_run_dir(root / "s")
    release_run_dir(root / "s", untaken)
    assert not (root / "s").exists()


def test_the_launcher_that_loses_the_race_for_a_run_id_refuses_and_leaves_the_winners_folder_alone(
        tmp_path, capsys, monkeypatch):
    """Two jobs with one run id start at once: both find the id free, the other one claims the folder first."""
    out = tmp_path / "runs"
    winner = out / "same-id"

    def winner_claims_meanwhile(config, nproc, **kwargs):
        winner.mkdir(parents=True)
        (winner / "metrics.jsonl").write_text(json.dumps({"event": "warning", "run_id": "same-id", "time": 1.0,
                                                          "message": "the winner's"}) + "\n")
        (winner / "heartbeat.json").write_text('{"pid": 1}')

    monkeypatch.setattr("core.launch.check_before_launch", winner_claims_meanwhile)
    monkeypatch.setattr("core.launch.torchrun_argv", no_torchrun)
    code = main(["train", "--nproc", "2", "--device", "cpu", "--preset", "tiny", "--steps", "2",
                 "--run-id", "same-id", "--out", str(out), "--data", str(corpus_file(tmp_path))])
    err = error_line(capsys, code)
    assert err == f"speedboard: error: run folder {winner} already exists; choose another run id"
    assert files_of(winner) == {"heartbeat.json": b'{"pid": 1}',
                                "metrics.jsonl": (json.dumps({"event": "warning", "run_id": "same-id", "time": 1.0,
                                                              "message": "the winner's"}) + "\n").encode()}


# ----------------------------------------------------------------------------- the start checkpoint
@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    """Checkpoint 2 of a run of 4 steps: a resume from it continues to step 4."""
    folder = tmp_path_factory.mktemp("parent")
    cfg = micro_config(folder, data={"source": str(corpus_file(folder))},
                       train={"budget": 4, "save_every": 1, "keep": 5})
    with one_thread():
        result = train(cfg)
    return result.run_dir / "checkpoints" / "step_0000002"


def truncated(parent: Path, tmp_path: Path) -> list[str]:
    copy = tmp_path / "truncated"
    shutil.copytree(parent, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return ["--resume", str(copy)]


def without_trainer_state(parent: Path, tmp_path: Path) -> list[str]:
    """Weights, tokenizer and settings only (the dashboard's Save model…)."""
    model, loaded = ck.model_from_checkpoint(parent)
    saved = ck.save_checkpoint(tmp_path / "weights-only", model, tokenizer=loaded.tokenizer,
                               run_config=loaded.meta["run"])
    return ["--resume", str(saved)]


def bare_state_dict(parent: Path, tmp_path: Path) -> list[str]:
    """Weights alone: said as such first (it was "sequence length 128 is beyond the model's 64 positions", from the
    architecture read off its shapes, and only after --seq-len was changed the trainer state)."""
    path = tmp_path / "weights.pth"
    torch.save(ck.read_checkpoint(parent).state_dict, path)
    return ["--resume", str(path)]


def budget_used_up(parent: Path, tmp_path: Path) -> list[str]:
    return ["--resume", str(parent), "--steps", "2"]


@pytest.mark.parametrize("source, message", [(truncated, "model.safetensors"),
                                             (without_trainer_state, "holds no trainer state"),
                                             (bare_state_dict, "holds no trainer state"),
                                             (budget_used_up, "already used up: the checkpoint is at step 2")])
def test_a_bad_resume_source_is_the_single_process_line_before_torchrun_starts(
        source, message, parent, tmp_path, capsys, monkeypatch, single_thread):
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    args = ["train", *source(parent, tmp_path), "--no-progress"]
    one = error_line(capsys, main([*args, "--out", str(tmp_path / "one")]))
    assert message in one
    many = error_line(capsys, main([*args, "--nproc", "2", "--out", str(tmp_path / "many")]))
    assert many == one  # the same check, said the same way
    assert not (tmp_path / "one").exists() and not (tmp_path / "many").exists()


def test_a_good_resume_source_is_handed_to_torchrun(parent, tmp_path, monkeypatch, single_thread):
    handed = []
    monkeypatch.setattr("core.launch.run_torchrun", lambda nproc, args, run_dir, env=None: handed.append(args) or 0)
    assert main(["train", "--resume", str(parent), "--nproc", "2", "--out", str(tmp_path / "runs"),
                 "--no-progress"]) == 0
    assert len(handed) == 1 and str(parent) in handed[0]


# ----------------------------------------------------------------------------- auto precision
def test_auto_is_probed_at_the_workers_thread_count_and_a_resume_keeps_its_parents(tmp_path, monkeypatch):
    """The launcher measured the probe with all the cores (a figure no process of the job reads, and one of the
    three first measurements of the one-process entry used up), and ignored the parent's precision on resume."""
    from core import precision as prec
    from core.launch import check_before_launch, worker_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    threads_at_probe, before = [], torch.get_num_threads()
    torch.set_num_threads(2)  # the launcher's: all the cores; each of 2 workers trains with 1

    def probe(model, device=None):
        threads_at_probe.append(torch.get_num_threads())
        return prec.ProbeResult(100e9, 98e9)

    monkeypatch.setattr(prec, "measured_probe", probe)
    source = str(corpus_file(tmp_path))
    try:
        check_before_launch(micro_config(tmp_path, data={"source": source}, train={"precision": "auto"}), 2)
        assert threads_at_probe == [worker_threads(2, "cpu")] == [1]
        assert torch.get_num_threads() == 2  # the launcher's own count is back
    finally:
        torch.set_num_threads(before)

    folder = tmp_path / "bf16-parent"
    with one_thread():
        result = train(micro_config(folder, data={"source": source}, train={"budget": 2, "precision": "bf16"}))
    checkpoint = result.run_dir / "checkpoints" / "step_0000002"
    assert ck.read_checkpoint(checkpoint).meta["precision"] == "bf16"
    seen = []
    monkeypatch.setattr("core.memory_budget.check_fits", lambda model, micro, seq, precision, *a, **k: seen.append(
        precision))
    check_before_launch(micro_config(tmp_path, data={"source": source}, train={"precision": "auto", "budget": 4},
                                     resume=str(checkpoint)), 2)
    assert threads_at_probe == [1] and seen == ["bf16"]  # not probed again: the parent's precision


# ----------------------------------------------------------------------------- the data's lines
def test_the_launcher_leaves_the_data_summary_to_rank_0(tmp_path, capsys, monkeypatch):
    """The launcher prepares the corpus (its progress is shown here) and rank 0 then reports the data:
    its "data …" and "tokenizer …" lines come once."""
    monkeypatch.setattr("core.launch.run_torchrun", lambda *args, **kwargs: 0)
    assert main(["train", "--nproc", "2", "--device", "cpu", "--preset", "tiny", "--steps", "2",
                 "--data", str(corpus_file(tmp_path)), "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "preparing" in out and "into its token store" in out
    assert "data: " not in out and "tokenizer: " not in out


# ----------------------------------------------------------------------------- a signal before the launch
def test_sigterm_while_the_launcher_checks_is_one_line_and_exit_143(tmp_path, capsys, monkeypatch):
    """A SIGTERM during the checks (the corpus may take long to prepare) ends the launcher as it would end the
    job: one line, exit 143, nothing started and no run folder."""
    import os
    import signal

    def terminated_meanwhile(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr("core.launch.check_before_launch", terminated_meanwhile)
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    from core.interrupts import install_start_handlers

    install_start_handlers()  # as main does first: the handler the launcher's own is installed over
    before = signal.getsignal(signal.SIGTERM)
    assert main(["train", "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "runs"), "--no-progress"]) == 143
    assert capsys.readouterr().err.strip() == "speedboard: terminated (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the caller's again
    # The abort watchdog (for an exception Python swallows) stands down once the exception came through.
    import threading

    for watchdog in [t for t in threading.enumerate() if t.name == "speedboard-term-watchdog"]:
        watchdog.join(timeout=60)
        assert not watchdog.is_alive()
    assert not (tmp_path / "runs").exists()


def test_a_stop_that_comes_while_the_launcher_checks_starts_no_processes(tmp_path, capsys, monkeypatch):
    """Ctrl-C (the dashboard's Stop) during a check that polls no stop of its own (a store already prepared,
    a tokenizer being trained): nothing is launched once the checks return; exit 130 and no run folder."""
    import os
    import signal

    def stopped_meanwhile(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr("core.launch.check_before_launch", stopped_meanwhile)
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    assert main(["train", "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "runs"), "--no-progress"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "speedboard: stopped before training began; nothing was started or kept")
    assert not (tmp_path / "runs").exists()


def test_the_tokens_of_all_processes_must_fit_the_counters_before_anything_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    code = main(["train", "--nproc", "2", "--device", "cpu", "--micro-batch", str(2**55), "--seq-len", "128",
                 "--out", str(tmp_path / "runs"), "--no-progress"])
    err = error_line(capsys, code)
    assert "× 2 processes × sequence length): counts beyond 2**63 - 1" in err and "fewer processes" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("budget", [["--steps", "10000000000000000000000"], ["--tokens", "1e23"]])
def test_a_budget_beyond_the_counters_is_refused_before_any_process_starts(budget, tmp_path, capsys, monkeypatch):
    """Checked inside the ranks only: two error lines, a "rank 0 exited with code 143" line, exit 1 and an empty
    --out folder."""
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    code = main(["train", "--nproc", "2", "--device", "cpu", "--preset", "tiny", *budget,
                 "--data", str(corpus_file(tmp_path)), "--out", str(tmp_path / "runs"), "--no-progress"])
    err = error_line(capsys, code)
    assert "counts beyond 2**63 - 1 do not fit the 64-bit counters" in err
    # The budget as given (1e23), not the float's nearest integer 99,999,999,999,999,991,611,392.
    assert ("a budget of 1e+23 tokens" if "1e23" in budget else "a budget of 4.096e+25 tokens") in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["abc", "0", "nan", "inf", "1e-9", "1e12"])
def test_a_bad_collective_timeout_is_one_line_before_any_process_starts(value, tmp_path, capsys, monkeypatch):
    """Read only by the ranks: each said it (exit code 1), NaN and inf were tracebacks, 1e-9 pages of C++ frames."""
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    monkeypatch.setenv("SPEEDBOARD_DIST_TIMEOUT", value)
    code = main(["train", "--nproc", "2", "--device", "cpu", "--out", str(tmp_path / "runs"), "--no-progress"])
    err = error_line(capsys, code)
    assert err.endswith(f"SPEEDBOARD_DIST_TIMEOUT must be between 1 and 2,592,000 seconds (30 days), got "
                        f"{value!r}") or (value == "abc" and err.endswith("must be a number of seconds, got 'abc'"))
    assert not (tmp_path / "runs").exists()


def test_a_model_that_does_not_fit_in_so_many_processes_says_so(monkeypatch):
    import torch

    from core.config import config_from_preset
    from core.memory_budget import check_fits

    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (2**30, "available RAM"))
    with pytest.raises(ConfigError, match="per process × 1,000.*use fewer processes, or choose a smaller model"):
        check_fits(config_from_preset("tiny").model, 1, 32, "fp32", torch.device("cpu"), processes=1000)


def test_cpu_processes_count_what_each_holds_for_itself_and_a_crowded_cpu_is_said(monkeypatch):
    """--nproc 400 on a CPU was accepted (the estimate left out each process's own ~0.3-0.5 GiB), and a
    refusal at micro-batch 1 recommended the very split it refused."""
    import os

    import torch

    from core.config import config_from_preset
    from core.errors import ConfigError
    from core.launch import crowded_cpu
    from core.memory_budget import GIB, check_fits, process_overhead

    cpu, model = torch.device("cpu"), config_from_preset("tiny").model
    assert process_overhead(cpu, 1) == 0 and process_overhead(cpu, 4) > 0.05 * GIB
    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (int(8 * GIB), "available RAM"))
    with pytest.raises(ConfigError) as err:
        check_fits(model, 1, 128, "fp32", cpu, processes=400, accum_steps=16)
    assert "GiB for itself (Python, torch)" in str(err.value) and "use fewer processes" in str(err.value)
    check_fits(model, 1, 128, "fp32", cpu, processes=4, accum_steps=16)  # a few fit
    cores = os.cpu_count() or 1
    assert crowded_cpu(cores, "cpu") is None
    assert crowded_cpu(cores + 1, "cpu") == (f"{cores + 1} processes on {cores} CPU cores: each has less than one "
                                             f"core, and the job trains slower than {cores} processes would")


@pytest.mark.parametrize("nproc", ["400", "99999999999999999999999"])
def test_a_refused_process_count_is_said_in_its_one_line_without_the_crowded_cpu_warning(nproc, tmp_path, capsys,
                                                                                        monkeypatch):
    """The warning that the processes share too few cores came first, then the refusal: two lines."""
    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    code = main(["train", "--nproc", nproc, "--device", "cpu", "--preset", "tiny", "--steps", "2",
                 "--data", str(corpus_file(tmp_path)), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "less than one core" not in err and err.count("speedboard: error:") == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_claim_whose_launcher_is_gone_frees_its_run_id(tmp_path):
    """A launcher killed (kill -9, the OOM killer) before a worker took its claim left a folder holding only
    ``.claim``: that run id was refused for good, though no run ever started."""
    import subprocess
    import sys

    from core.runs import run_id_taken

    folder = tmp_path / "runs" / "job"
    script = ("import sys, os; from pathlib import Path; from core.runs import claim_run_dir; "
              "claim_run_dir(Path(sys.argv[1])); os._exit(0)")  # gone without releasing it
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, cwd=Path(__file__).parents[2])
    assert [p.name for p in folder.iterdir()] == [CLAIM_FILE]
    assert not run_id_taken(tmp_path / "runs", "job") and not folder.exists()
    token = claim_run_dir(folder)  # this process's claim is held: another job finds the id taken
    assert run_id_taken(tmp_path / "runs", "job")
    with pytest.raises(ConfigError, match="already exists"):
        claim_run_dir(folder)
    release_run_dir(folder, token)
    assert not folder.exists()
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, cwd=Path(__file__).parents[2])
    assert not is_run_dir(folder)  # to a reader: no run was ever written there (a live claim: the next test)
    assert create_run_dir(tmp_path / "runs", "job") == folder and list(folder.iterdir()) == []


def test_a_folder_whose_processes_are_starting_is_a_run_folder_with_a_live_writer(tmp_path):
    """For the seconds torchrun takes to start, a job's folder holds only its launcher's claim: a reader took
    it for no run folder at all."""
    folder = tmp_path / "runs" / "job"
    token = claim_run_dir(folder)
    try:
        assert is_run_dir(folder) and run_state(folder).state == "running"
    finally:
        release_run_dir(folder, token)
