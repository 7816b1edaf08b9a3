"""`speedboard prepare` ended by SIGTERM or Ctrl-C in the middle of a stage that holds it for long (a batch's
encoding, the tokenizer's training): one line, its exit code, and nothing left in the cache; and what a
killed process leaves is swept by the next preparation."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.token_store import ensure_writable, stores_dir, sweep_stale
from core.tokenizer_cache import sweep_stale_tokenizers, tokenizers_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(folder))
    monkeypatch.setenv("SPEEDBOARD_HOME", str(tmp_path / "home"))
    return folder


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i}: " + " ".join(f"w{(i * j) % 97}" for j in range(20))
                                for i in range(200)), encoding="utf-8")
    return path


def _held_then_signalled(stage: str, signum: int, *args: str) -> tuple[int, str]:
    """``speedboard ARGS…`` held at ``stage`` (``prepare_signal_entry``), sent ``signum`` there: its exit code and
    its stderr."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.core.prepare_signal_entry", stage, *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # waits for the stage, however long the imports take
            if line.strip() == stage:
                break
        else:
            raise AssertionError(f"the process ended before {stage}: {proc.stderr.read()}")
        proc.send_signal(signum)
        code = proc.wait(timeout=100)  # the stage is held for longer than this
        return code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob(".*"))


@pytest.mark.slow
def test_sigterm_while_a_batch_is_encoded_removes_the_half_store_and_its_lock_at_once(tmp_path, cache):
    """The batch being encoded is not waited for (a batch of a real corpus takes seconds, past the abort
    watchdog, whose exit left the half-written store and the lock behind)."""
    code, err = _held_then_signalled("tokens", signal.SIGTERM, "prepare", str(_corpus(tmp_path)), "--vocab-size",
                                     "300", "--no-progress")
    assert code == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["speedboard: terminated (SIGTERM)"], err
    assert _leftovers(cache) == [] and list((cache / "stores").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, line", [
    (signal.SIGTERM, 143, "speedboard: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "speedboard: data preparation stopped; nothing was kept"),
])
def test_a_signal_while_the_tokenizer_trains_ends_in_one_line(signum, code, line, tmp_path, cache):
    """The training, left to finish in its thread, went on inside Rust while Python shut down: taking the GIL
    again then unwound the thread through Rust, which aborted the process ("FATAL: exception not rethrown",
    exit code 134) after the line."""
    exit_code, err = _held_then_signalled("training", signum, "prepare", str(_corpus(tmp_path)), "--vocab-size",
                                          "300", "--no-progress")
    assert exit_code == code, err
    assert err.strip().splitlines()[-1:] == [line] and err.count("speedboard:") == 1, err  # after Ctrl-C's "stopping …"
    assert "FATAL" not in err and "Traceback" not in err, err
    assert _leftovers(cache) == []


def test_a_write_probe_is_deleted_whatever_stops_it_and_a_killed_ones_is_swept(tmp_path, cache, monkeypatch):
    """SIGTERM's JobTerminated between the probe's creation and its deletion left a `.probe-…` file that nothing
    removed, `prepare --remove all` included."""
    import core.token_store
    from core.errors import JobTerminated
    from core.paths import probe_prefix

    real_close = os.close

    def terminated_on_close(fd):
        real_close(fd)
        raise JobTerminated("terminated (SIGTERM)")

    with monkeypatch.context() as patched, pytest.raises(JobTerminated):
        patched.setattr(core.token_store.os, "close", terminated_on_close)
        ensure_writable(stores_dir())
    assert list(stores_dir().iterdir()) == []

    # What SIGKILL leaves: a probe of a process gone, and one too old to be a live one's, whoever made it.
    tokenizers_dir().mkdir(parents=True)
    host = socket.gethostname()
    dead = [stores_dir() / f".probe-{host}-999999999-abc123", tokenizers_dir() / f".probe-{host}-999999999-x_1"]
    old, live = stores_dir() / ".probe-k2j4_x9z", stores_dir() / f"{probe_prefix()}live1234"
    for path in (*dead, old, live):
        path.touch()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert sorted(sweep_stale()) == sorted([dead[0], old]) and sweep_stale_tokenizers() == [dead[1]]
    assert live.exists() and not any(p.exists() for p in (*dead, old))


def test_a_lock_file_whose_holder_was_killed_is_swept_one_held_stays(tmp_path, cache):
    """A preparation killed outright (kill -9, or a second Ctrl-C before it could let go) left its corpus'
    `.lock-…` file for good: neither later preparations nor `prepare --remove all` removed it."""
    import fcntl

    from core.cli import main
    from core.token_store import preparation_lock

    stores_dir().mkdir(parents=True)
    orphan, held = stores_dir() / ".lock-0123456789abcdef", stores_dir() / ".lock-fedcba9876543210"
    orphan.touch()
    with preparation_lock("fedcba9876543210"):
        assert held.exists()
        assert sweep_stale() == [orphan] and held.exists()  # held by a live preparation: left to it
    assert not held.exists()  # its holder let go of it, as always
    orphan.touch()
    fd = os.open(orphan, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process holds it (another open file here): it stays
        assert sweep_stale() == [] and orphan.exists()
    finally:
        os.close(fd)
    assert main(["prepare", "--remove", "all"]) == 0 and not orphan.exists()
