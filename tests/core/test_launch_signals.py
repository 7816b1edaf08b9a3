"""How ``speedboard train --nproc N`` ends: signals to the launcher, a killed rank, and torchrun's own messages.

The launcher reads torchrun's own stderr apart from its workers' output and
keeps back what only echoes how the job ended; the two real jobs here (slow)
end by SIGTERM and by a kill -9 of rank 0.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from core.events import RunFailed
from core.launch import TorchrunOutput, _record_failed_ranks, failure_summary
from core.runs import CLAIM_FILE, HEARTBEAT_FILE, METRICS_FILE, JsonlSink, read_events
from tests.core.dist_helpers import python_env, uneven_corpus

LOG = "W1205 07:13:53.394000 1663 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
FRAMES = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
"""
SIGNALLED = f"""{LOG}agent/server/api.py:753] Received 15 death signal, shutting down workers
{LOG}multiprocessing/api.py:1028] Sending process 1667 closing signal SIGTERM
{FRAMES}torch.distributed.elastic.multiprocessing.api.SignalException: Process 1663 got signal: 15
"""
CHILD_FAILED = f"""{LOG}multiprocessing/api.py:1028] Sending process 1814 closing signal SIGTERM
{LOG}multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 1815) of binary: /venv/bin/python
{FRAMES}torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
core.cli FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_07:19:14
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 1815)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1815
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_07:19:14
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1814)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
OTHER_ERROR = f"""{FRAMES}torch.distributed.DistNetworkError: The server socket has failed to listen.
"""
BANNER = f"{LOG}run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 by default\n"


def torchrun_said(text: str, quiet: bool = False) -> tuple[str, str | None]:
    """What the launcher passes on of torchrun's stderr ``text``, and its summary line."""
    read, write = os.pipe()
    out = io.StringIO()
    output = TorchrunOutput(read, out)
    with os.fdopen(write, "w") as f:
        f.write(text)
    summary = output.finish(quiet=quiet)
    return out.getvalue(), summary


def test_torchruns_echo_of_a_signal_or_a_failed_rank_is_kept_back():
    assert torchrun_said(BANNER + SIGNALLED) == (BANNER, None)
    assert torchrun_said(BANNER + CHILD_FAILED) == (
        BANNER, "speedboard: rank 1 died (signal 9, SIGKILL); rank 0 exited with code 1")
    assert torchrun_said(CHILD_FAILED, quiet=True) == ("", None)  # the launcher's own signal ended the job


def test_torchruns_word_on_a_worker_it_had_to_kill_is_kept_back():
    """Seen after a Ctrl-C during set-up, before the launcher's one line ("speedboard: interrupted")."""
    killed = f"{LOG}api.py:1047] Unable to shutdown process 28922 via 15, forcefully exiting via 9\n"
    assert torchrun_said(BANNER + killed) == (BANNER, None)


def test_any_other_message_of_torchrun_is_passed_on_whole():
    assert torchrun_said(BANNER + OTHER_ERROR) == (BANNER + OTHER_ERROR, None)
    unknown_report = CHILD_FAILED.replace("exitcode  :", "exit status :")
    said, summary = torchrun_said(unknown_report)
    assert summary is None and "ChildFailedError" in said and "rank      : 1" in said


def test_failure_summary_names_each_failed_rank():
    assert failure_summary("  rank      : 3 (local_rank: 1)\n  exitcode  : 17 (pid: 9)\n") == \
        "speedboard: rank 3 exited with code 17"
    assert failure_summary("no report") is None
    # A signal a rank handled ends it with 128 + its number: said by name.
    assert failure_summary("  rank      : 1 (local_rank: 1)\n  exitcode  : 143 (pid: 9)\n") == \
        "speedboard: rank 1 exited with code 143 (SIGTERM)"


@pytest.mark.parametrize("rank_0_said", ["rank 0: another process of this job failed or stopped",
                                         "terminated (SIGTERM)"])
def test_the_recorded_ending_names_rank_0_once(tmp_path, rank_0_said):
    """A peer that hung: rank 0's own message begins with its rank, and the ending read "(rank 0: rank 0: …)"."""
    sink = JsonlSink(tmp_path / METRICS_FILE)
    sink(RunFailed("r", 1.0, rank_0_said, 5))
    sink.close()
    _record_failed_ranks(tmp_path, "r", "speedboard: rank 1 died (signal 9, SIGKILL)")
    last = read_events(tmp_path)[-1]
    assert last.message == ("rank 1 died (signal 9, SIGKILL); the job ended with it (rank 0: "
                            f"{rank_0_said.removeprefix('rank 0: ')})")


def test_a_rank_torchrun_stopped_comes_after_the_rank_that_died():
    """Rank 1 killed during set-up: torchrun stopped rank 0 with SIGTERM, and the line began with rank 0."""
    report = ("  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 8)\n"
              "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 9)\n"
              "  rank      : 2 (local_rank: 2)\n  exitcode  : 1 (pid: 10)\n")
    assert failure_summary(report) == ("speedboard: rank 1 died (signal 9, SIGKILL); rank 0 died (signal 15, "
                                       "SIGTERM); rank 2 exited with code 1")


# ----------------------------------------------------------------------------- real jobs
@pytest.fixture
def start_job(tmp_path):
    """Starts a 2-process CPU job of the tiny preset, far from its end once its first step is printed; whatever
    a test leaves running is killed (the launcher's death takes torchrun and its workers with it)."""
    started: list[subprocess.Popen] = []

    def start(**env: str) -> tuple[subprocess.Popen, Path]:
        argv = [sys.executable, "-m", "core.cli", "train", "--nproc", "2", "--preset", "tiny", "--device", "cpu",
                "--data", uneven_corpus(tmp_path), "--layout", "document", "--seq-len", "32", "--vocab-size", "300",
                "--micro-batch", "2", "--steps", "100000", "--eval-every", "0", "--sample-every", "0",
                "--out", str(tmp_path / "runs"), "--run-id", "job", "--no-progress", "--log-every", "1"]
        proc = subprocess.Popen(argv, env=python_env(SPEEDBOARD_CACHE_DIR=str(tmp_path / "cache"), **env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        started.append(proc)
        for line in proc.stdout:
            if line.startswith("step      1 |"):
                return proc, tmp_path / "runs" / "job"
        proc.wait(timeout=60)
        pytest.fail(f"the job ended before its first step: {proc.stderr.read()}")

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def finish(proc: subprocess.Popen) -> list[str]:
    _, err = proc.communicate(timeout=120)
    return err.strip().splitlines()


@pytest.mark.slow
def test_sigterm_to_the_launcher_ends_every_rank_and_exits_143_in_one_line(start_job):
    proc, run_dir = start_job()
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == 143, err
    assert err[-1] == "speedboard: terminated (SIGTERM)" and err.count(err[-1]) == 1, err
    assert not any("Traceback" in line or "SignalException" in line or "death signal" in line for line in err), err
    assert not any(line.startswith("speedboard: rank") for line in err), err  # the launcher says it, once
    last = read_events(run_dir)[-1]  # rank 0 records its SIGTERM, or a peer that ended before it
    assert isinstance(last, RunFailed), last
    assert "terminated (SIGTERM)" in last.message or "another process of this job failed" in last.message
    assert not (run_dir / CLAIM_FILE).exists()


@pytest.mark.slow
def test_a_killed_rank_0_is_one_line_and_its_ending_is_recorded(start_job):
    proc, run_dir = start_job()
    torchrun = next(p for p in psutil.Process(proc.pid).children() if "core.launch_torchrun" in p.cmdline())
    rank0 = next(p for p in torchrun.children() if p.environ().get("RANK") == "0")
    rank0.kill()
    err = finish(proc)
    assert proc.returncode == 1, err
    assert not any("Traceback" in line or "ChildFailedError" in line or "exitcode" in line for line in err), err
    summary = [line for line in err if "died" in line]
    assert len(summary) == 1 and summary[0].startswith("speedboard: rank 0 died (signal 9, SIGKILL)"), err
    # The run folder says which rank died and how, as the terminal does (it said "killed?").
    last = read_events(run_dir)[-1]
    assert isinstance(last, RunFailed) and last.message.startswith("rank 0 died (signal 9, SIGKILL)"), last.message
    assert last.message.endswith("; torchrun exited with code 1"), last.message
    assert not (run_dir / HEARTBEAT_FILE).exists()


@pytest.mark.slow
def test_a_killed_rank_1_is_named_in_the_runs_ending_too(start_job):
    """The terminal said rank 1 died; metrics.jsonl kept rank 0's "terminated (SIGTERM): the job was ended, by its
    launcher when another process failed, or by the user", and a folder read later never said which rank died."""
    proc, run_dir = start_job()
    torchrun = next(p for p in psutil.Process(proc.pid).children() if "core.launch_torchrun" in p.cmdline())
    next(p for p in torchrun.children() if p.environ().get("RANK") == "1").kill()
    err = finish(proc)
    assert proc.returncode == 1, err
    (summary,) = [line for line in err if line.startswith("speedboard: rank")]
    assert summary.startswith("speedboard: rank 1 died (signal 9, SIGKILL)"), err
    assert not any(line.startswith("speedboard: error:") for line in err), err  # the survivor stays quiet
    last = read_events(run_dir)[-1]
    assert isinstance(last, RunFailed) and last.message.startswith(summary.removeprefix("speedboard: ")), last
    assert "the job ended with it (rank 0: " in last.message


@pytest.mark.slow
def test_a_killed_torchrun_is_one_line_and_the_exit_code_of_its_signal(start_job):
    proc, run_dir = start_job()
    torchrun = next(p for p in psutil.Process(proc.pid).children() if "core.launch_torchrun" in p.cmdline())
    workers = torchrun.children()
    for worker in workers:
        worker.suspend()  # held, so that none ends before it is seen adopted
    torchrun.kill()
    torchrun.wait(60)
    # The launcher adopts the workers and waits for them: its line comes after theirs (a rank's "another process
    # of this job failed" came after it, the launcher gone), and none outlives it.
    assert {w.ppid() for w in workers} == {proc.pid}
    for worker in workers:
        worker.resume()
    err = finish(proc)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE], err
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert err[-1] == ("speedboard: torchrun, the launcher of the processes, was ended by signal 9, SIGKILL; "
                       "the run ended with it"), err
    assert not any("Traceback" in line for line in err), err


@pytest.mark.slow
def test_a_killed_launcher_takes_the_job_with_it_quietly_and_leaves_no_temporary_folder(start_job, tmp_path):
    """torchrun wrote its traceback into the dead launcher's pipe: Python's "lost sys.stderr" dump reached the
    terminal, and torchrun's log folder stayed in the temporary folder."""
    (tmp_path / "tmp").mkdir()
    proc, _ = start_job(TMPDIR=str(tmp_path / "tmp"))
    job = psutil.Process(proc.pid).children(recursive=True)
    assert list((tmp_path / "tmp").glob("speedboard-torchrun-*"))  # torchrun's log folder, while it runs
    proc.kill()
    _, alive = psutil.wait_procs(job, timeout=90)
    assert not alive, alive
    err = proc.stderr.read()
    assert "lost sys.stderr" not in err and "SignalException" not in err, err
    assert not list((tmp_path / "tmp").glob("speedboard-torchrun-*"))


def test_a_first_ctrl_c_before_the_run_began_ends_the_job_and_after_it_stops_it(tmp_path):
    """A SIGINT passed on to workers still starting Python printed KeyboardInterrupt tracebacks from their
    interpreter's start-up; before rank 0 has announced the run there is no step to stop after anyway."""
    from core.launch import _Job

    run_dir = tmp_path / "job"
    run_dir.mkdir()

    def first_ctrl_c() -> list[int | None]:
        job, passed = _Job(2, [], {}, run_dir), []
        job.proc, job._pass_on = object(), passed.append  # torchrun is running
        job.on_signal(signal.SIGINT, None)
        return passed

    assert first_ctrl_c() == [None]  # no metrics.jsonl yet: torchrun is ended (SIGTERM)
    (run_dir / "metrics.jsonl").write_text('{"event": "data_prepared", "run_id": "job"}\n')
    assert first_ctrl_c() == [None]  # set-up
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"event": "run_started", "run_id": "job"}\n')
    assert first_ctrl_c() == [signal.SIGINT]  # the workers stop after their step


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGHUP])
def test_a_second_ctrl_c_reaches_the_workers_as_itself_and_a_third_ends_torchrun(tmp_path, monkeypatch, second):
    """A second Ctrl-C went to torchrun as SIGTERM: the run's recorded ending said "terminated (SIGTERM): the job
    was ended, by its launcher when another process failed, or by the user" for what the user knew as Ctrl-C.
    The workers now abort on it as one process does on a second Ctrl-C (or a second SIGHUP), and record that."""
    import core.launch
    from core.launch import _Job

    run_dir = tmp_path / "job"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"event": "run_started", "run_id": "job"}\n')
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(core.launch, "_children", lambda pid: [11, 12])
    monkeypatch.setattr(core.launch.os, "kill", lambda pid, signum: sent.append((pid, signum)))
    job = _Job(2, [], {}, run_dir)
    job.proc = type("Torchrun", (), {"pid": 10})()
    job.on_signal(signal.SIGINT, None)
    job.on_signal(second, None)
    job.on_signal(signal.SIGINT, None)
    assert sent == [(11, signal.SIGINT), (12, signal.SIGINT), (11, second), (12, second), (10, signal.SIGTERM)]
    assert job.ending(stopped_cleanly=False) == second  # said "interrupted" (or the SIGHUP's line), 128 + it

    sent.clear()
    job = _Job(2, [], {}, run_dir)
    job.proc = type("Torchrun", (), {"pid": 10})()
    job.on_signal(signal.SIGINT, None)
    job.on_signal(signal.SIGTERM, None)  # a SIGTERM ends the job through torchrun, whatever came before
    assert sent[-1] == (10, signal.SIGTERM)
