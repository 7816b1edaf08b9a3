"""A two-process (torchrun, gloo) run started with QProcess, followed live, stopped cleanly."""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path

import pytest

from core.events import DataPreparationProgress, DataPreparationStarted, RunFinished, RunStarted, StepMetrics
from core.launch import prepare_launch
from core.runs import read_events
from gui.process_run import ProcessRun
from tests.conftest import micro_config


@pytest.mark.slow
def test_two_processes_follow_live_and_stop_every_rank(qtbot, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"document {i} " + "some words " * (1 + i % 7)})
                                for i in range(80)))
    cfg = micro_config(tmp_path).replace(data={"source": str(corpus), "vocab_size": 300},
                                         train={"micro_batch": 2, "budget": 100_000, "eval_every": 0})
    run = ProcessRun(prepare_launch(cfg, 2))
    seen = []
    run.event.connect(seen.append)
    run.start()
    qtbot.waitUntil(lambda: any(isinstance(e, StepMetrics) for e in seen), timeout=120_000)
    started = next(e for e in seen if isinstance(e, RunStarted))
    assert started.world_size == 2
    with qtbot.waitSignal(run.ended, timeout=120_000) as ended:
        run.stop()
    code, message = ended.args
    assert code == 0, "\n".join(run.output[-20:])
    finished = [e for e in seen if isinstance(e, RunFinished)]
    assert finished and finished[0].stopped and finished[0].checkpoint
    # What the window saw is the launcher's preparation of the corpus (before any run folder), then what the run
    # folder holds.
    launcher = seen[:seen.index(started)]
    assert isinstance(launcher[0], DataPreparationStarted) and launcher[0].run_id == ""
    assert all(isinstance(e, (DataPreparationStarted, DataPreparationProgress)) for e in launcher), launcher
    assert [e.to_dict() for e in read_events(run.spec.run_dir)] == [e.to_dict() for e in seen[len(launcher):]]
    assert not any("speedboard-event" in line for line in run.output)
    assert not run.spec.config_file.exists() and not run.running


def test_the_launchers_line_on_the_rank_that_died_is_the_jobs_last_word(tmp_path):
    """A rank killed with SIGKILL: rank 0's own error line ("another process of this job failed") was preferred
    to the launcher's, and the window never said which rank died, nor how."""
    run = ProcessRun(prepare_launch(micro_config(tmp_path), 2))
    run.output = ["step 3 | loss 5.1",
                  "speedboard: error: another process of this job failed (rank 1 of 2 went away at step 3)",
                  "speedboard: rank 1 died (signal 9, SIGKILL); rank 0 exited with code 1"]
    assert run.error_line() == "rank 1 died (signal 9, SIGKILL); rank 0 exited with code 1"
    run.output = ["speedboard: error: --nproc 2 needs 2 CPU cores"]  # a refusal before any rank ran
    assert run.error_line() == "--nproc 2 needs 2 CPU cores"
    run.output = ["speedboard: interrupted"]
    assert run.error_line() == "interrupted"
    # The launcher itself killed (kill -9): rank 0 recorded only torchrun's SIGTERM; the window says what ended.
    from PySide6.QtCore import QProcess

    ended = []
    run.ended.connect(lambda code, line: ended.append((code, line)))
    run.output = []
    run._on_finished(9, QProcess.ExitStatus.CrashExit)
    assert ended == [(9, "the launcher of the job was killed or crashed, and its processes ended with it")]
    run.spec.config_file.write_text("{}")  # (removed by _on_finished; the line below expects it)
    run.process.deleteLater()
    run.spec.config_file.unlink()  # (never started: nothing else removes it)


def test_a_launcher_that_cannot_start_ends_the_job_with_its_reason(qtbot, tmp_path):
    """Its Python gone (a virtual environment deleted while the window ran): QProcess sends no ``finished``, and
    the job stayed "running" for good, no other run could be started."""
    import dataclasses

    spec = prepare_launch(micro_config(tmp_path), 2)
    run = ProcessRun(dataclasses.replace(spec, argv=[str(tmp_path / "gone" / "python"), *spec.argv[1:]]))
    with qtbot.waitSignal(run.ended, timeout=30_000) as ended:
        run.start()
    code, message = ended.args
    assert code == 1 and not run.running and not spec.config_file.exists()
    assert message.startswith(f"the training processes could not be started ({tmp_path / 'gone' / 'python'}: ")


@pytest.mark.slow
def test_a_job_whose_window_is_killed_stops_and_a_terminals_ctrl_c_is_the_windows_alone(tmp_path):
    """The window's process killed (kill -9): its job trained on, unseen, with nothing left to stop it. And the
    launcher shared the window's process group, so a Ctrl-C typed in the window's terminal stopped the job while
    the window still asked whether to. The window here is a stand-in process that starts the launcher as
    ``ProcessRun`` does (its argv and environment)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from core.launch import run_outcome

    root = Path(__file__).resolve().parents[2]

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"document {i} " + "some words " * (1 + i % 7)})
                                for i in range(80)))
    cfg = micro_config(tmp_path).replace(data={"source": str(corpus), "vocab_size": 300},
                                         train={"micro_batch": 2, "budget": 100_000, "eval_every": 0})
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    window = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import json, os, subprocess, sys, time
            from core.config import RunConfig
            from core.launch import prepare_launch
            spec = prepare_launch(RunConfig.from_dict(json.load(open({str(tmp_path / 'config.json')!r}))), 2)
            launcher = subprocess.Popen(spec.argv, env={{**os.environ, **spec.env}}, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
            print(launcher.pid, spec.run_dir, flush=True)
            time.sleep(600)
        """)], cwd=root, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid, run_dir = window.stdout.readline().split(maxsplit=1)
        pid, run_dir = int(pid), Path(run_dir.strip())
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").is_file() or \
                not any(isinstance(e, StepMetrics) for e in read_events(run_dir)):
            assert time.monotonic() < deadline, "the job trained no step"
            time.sleep(0.2)
        assert os.getpgid(pid) == pid != os.getpgid(window.pid)  # the terminal's Ctrl-C reaches the window alone
        os.killpg(window.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the window's group
        os.kill(window.pid, signal.SIGKILL)
        window.wait(30)
        gone, _ = psutil.wait_procs([psutil.Process(pid)], timeout=120)
        assert gone, "the job outlived its window"
    finally:
        window.kill()
        with contextlib.suppress(psutil.Error):
            for process in psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]:
                process.kill()
    assert run_outcome(run_dir) == "stopped"  # at a step, saved, as by the window's Stop
    assert list((run_dir / "checkpoints").iterdir())
