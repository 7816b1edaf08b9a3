"""Shared test set-up: offscreen Qt, private data/cache folders, tiny configs."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

# Before any Qt import: tests never need a display (a user's QT_QPA_PLATFORM=xcb opened real windows).
os.environ["QT_QPA_PLATFORM"] = "offscreen"
# Runs and tokenizer caches of the test session never touch the user's folders.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="speedboard-tests-"))
_OWNER = os.getpid()
# Removed when this process ends (each pytest worker makes its own): every session left one in the temporary
# folder, runs and token stores included. Not by a forked child: the folder is its parent's.
atexit.register(lambda: shutil.rmtree(_SESSION_HOME, ignore_errors=True) if os.getpid() == _OWNER else None)
# Set, not defaulted: a user's exported SPEEDBOARD_CACHE_DIR received the tests' token stores.
os.environ["SPEEDBOARD_HOME"] = str(_SESSION_HOME / "home")
os.environ["SPEEDBOARD_CACHE_DIR"] = str(_SESSION_HOME / "cache")
# Inductor's disk cache is shared by the session's compile tests (warm after the first).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "speedboard-inductor-cache"))
# The tests send SIGHUP as a closed terminal does. A runner started under nohup (or by a CI service) hands SIGHUP
# ignored to itself and every child, and Speedboard honours that as it should (tests/core/test_stopping.py):
# restore a terminal's default here, so that the tests see what they model wherever they are run.
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _signal_handlers_as_they_were():
    """A command called in-process installs its start handlers (``core.interrupts``) for good, as a process
    would: put the runner's own back after each test, so that no test depends on which ran before it."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _older_objects_frozen():
    """What earlier tests left alive is frozen (``gc.freeze``), as an application freezes its start-up objects:
    the full collections that Speedboard makes on purpose (a window's last one, ``gui.gc_pin``; a trial's end,
    ``core.trials.release``) then walk this test's objects, not the whole session's. The cyclic garbage of
    earlier tests is collected first; frozen objects are still freed by their reference counts."""
    gc.collect()
    gc.freeze()


def micro_config(tmp_path: Path | None = None, **overrides):
    """A model of a few thousand parameters on the built-in corpus: a step takes milliseconds."""
    from core.config import DataConfig, ModelConfig, RunConfig, TrainConfig

    base = RunConfig(
        model=ModelConfig(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=64, max_position_embeddings=64),
        data=DataConfig(seq_len=32, vocab_size=512),
        train=TrainConfig(micro_batch=4, accum_steps=1, budget=4, lr=1e-2, min_lr=1e-3, warmup_ratio=0.25,
                          eval_every=0, eval_batches=2, sample_tokens=4, device="cpu", precision="fp32"),
        preset="micro",
        out_dir=str(tmp_path / "runs") if tmp_path is not None else None,
    )
    return base.replace(**overrides) if overrides else base


@pytest.fixture
def micro(tmp_path):
    """``micro(**overrides)`` -> a tiny RunConfig writing under this test's tmp_path."""

    def make(**overrides):
        return micro_config(tmp_path, **overrides)

    return make
