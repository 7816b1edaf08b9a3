"""Every way a run can end is recorded: Ctrl-C (once: stop and save; twice: abort, always), a closed
terminal, SIGTERM, a closed stdout pipe; and a run killed with kill -9 reads as not running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from core import checkpoint as ck
from core.control import Control
from core.errors import JobTerminated
from core.runs import HEARTBEAT_FILE, METRICS_FILE, Heartbeat, RunState, run_state, writer_alive
from core.stopping import HungUp, StopSignals
from tests.core.checkpoint_helpers import corpus_file

ROOT = Path(__file__).resolve().parents[2]


class FakeRun:
    """What the handlers see of a trainer."""

    def __init__(self, stoppable: bool = True, compiling: bool = False, ending: bool = False) -> None:
        self.stoppable, self.compiling, self.ending, self.aborts = stoppable, compiling, ending, []

    def record_abort(self, message: str) -> None:
        self.aborts.append(message)


@pytest.fixture
def key_presses(monkeypatch):
    """Every SIGINT a handler is called with here is a key press of its own, however soon after the last."""
    import core.stopping

    monkeypatch.setattr(core.stopping, "SAME_INTERRUPT_S", 0.0)


# --------------------------------------------------------------------------- the handlers themselves
def test_first_ctrl_c_stops_gently_and_says_when_a_compile_delays_it(capsys, key_presses, monkeypatch):
    import core.stopping

    control, run = Control(), FakeRun(compiling=True)
    before = signal.getsignal(signal.SIGINT)  # Python's, or the command line's start handler once imported
    with StopSignals(control, run) as signals:
        signals._on_interrupt(signal.SIGINT, None)
        assert control.stop_requested
        assert "once compilation has finished" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):  # the second one aborts
            signals._on_interrupt(signal.SIGINT, None)
        ended = []
        monkeypatch.setattr(core.stopping, "exit_now", ended.append)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # a third ends the process at once, cleaning up
        assert ended == [128 + signal.SIGINT] and capsys.readouterr().err == "speedboard: aborted\n"
    assert signal.getsignal(signal.SIGINT) is before  # restored
    signals._watchdog.join(60)
    assert not signals._watchdog.is_alive()
    assert run.aborts == []  # the abort reached the caller: the watchdog stood down


def test_one_ctrl_c_delivered_twice_is_one_ctrl_c(capsys, monkeypatch):
    """`timeout -s INT` signals the command and its process group: two SIGINTs in a row turned a stop into an
    abort, and during set-up the second killed the process with Python's default before it removed its lock
    file."""
    import core.stopping

    clock = [100.0]
    monkeypatch.setattr(core.stopping, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    control = Control()
    with StopSignals(control, FakeRun()) as signals:
        signals._on_interrupt(signal.SIGINT, None)
        clock[0] += core.stopping.SAME_INTERRUPT_S / 2
        signals._on_interrupt(signal.SIGINT, None)  # the same one: still a gentle stop
        assert control.stop_requested and signals._watchdog is None
        clock[0] += 1.0
        with pytest.raises(KeyboardInterrupt):  # a second key press aborts
            signals._on_interrupt(signal.SIGINT, None)
        ended = []
        monkeypatch.setattr(core.stopping, "exit_now", ended.append)
        clock[0] += core.stopping.SAME_INTERRUPT_S / 2
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # the abort's Ctrl-C again: not a third press
        assert ended == []
        clock[0] += 1.0
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        assert ended == [130]
        signals._finished.set()  # the abort "reached the loop": the watchdog stands down


def test_two_ctrl_c_that_python_handles_once_are_two_presses():
    """Python runs its handler once for however many SIGINTs came while the main thread was inside one native
    call (a large matmul): the second Ctrl-C was lost, and the run only stopped. The clock counts the deliveries
    the C-level handler wrote to its pipe, each timestamped as it came."""
    import core.stopping

    clock, late = core.stopping.InterruptClock(), []
    before = signal.signal(signal.SIGINT, lambda signum, frame: late.append(signum))  # counts nothing yet
    clock.watch()
    try:
        for n in (1, 2):
            signal.raise_signal(signal.SIGINT)
            deadline = time.monotonic() + 60
            while len(clock._pending) < n and time.monotonic() < deadline:  # timestamped by its thread
                time.sleep(0.01)
            time.sleep(2 * core.stopping.SAME_INTERRUPT_S)  # a second key press, not one delivered twice
        assert late == [signal.SIGINT] * 2 and clock.presses() == 2  # the handler, once, sees both presses
    finally:
        clock.unwatch()
        signal.signal(signal.SIGINT, before)
    assert signal.set_wakeup_fd(-1) == -1  # unwatched: the process' wakeup fd is as it was


def test_two_presses_in_one_handler_call_abort_train_prepare_and_tune(capsys, monkeypatch):
    import core.cli
    import core.stopping

    monkeypatch.setattr(core.stopping.InterruptClock, "presses", lambda self: 2)
    control = Control()
    with StopSignals(control, FakeRun()) as signals, pytest.raises(KeyboardInterrupt):
        signals._on_interrupt(signal.SIGINT, None)
    signals._watchdog.join(60)
    monkeypatch.setattr(core.stopping, "exit_now", lambda code: None)  # the watchdog's, after a grace of 0 s
    handler = core.cli._stop_on_first_sigint(Control(), grace_s=0.0)
    before = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        handler.again.disarm()
    finally:
        signal.signal(signal.SIGINT, before)


def test_prepare_and_tune_also_take_one_ctrl_c_delivered_twice_as_one(capsys, monkeypatch):
    import core.cli
    import core.stopping

    clock = [100.0]
    monkeypatch.setattr(core.stopping, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    ended, said = [], []
    monkeypatch.setattr(core.stopping, "exit_now", ended.append)  # the abort's watchdog's too
    monkeypatch.setattr(core.cli, "_error_line", said.append)
    control = Control()
    handler = core.cli._stop_on_first_sigint(control, grace_s=0.0)
    before = signal.signal(signal.SIGINT, handler)
    try:
        handler(signal.SIGINT, None)
        clock[0] += core.stopping.SAME_INTERRUPT_S / 2
        handler(signal.SIGINT, None)  # the same one
        assert control.stop_requested and capsys.readouterr().err.count("stopping") == 1
        clock[0] += 1.0
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
        handler.again.disarm()
        deadline = time.monotonic() + 60
        while not ended and time.monotonic() < deadline:  # the watchdog of a grace of 0 s has ended it
            time.sleep(0.01)
        assert ended == [130] and said == ["speedboard: aborted"]
        clock[0] += 1.0
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # a Ctrl-C after the abort began ends it too
        assert ended == [130, 130]
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_set_up_aborts_at_once_and_sighup_stops_like_ctrl_c():
    with StopSignals(Control(), FakeRun(stoppable=False)) as signals, pytest.raises(KeyboardInterrupt):
        signals._on_interrupt(signal.SIGINT, None)  # nothing to save yet
    control = Control()
    with StopSignals(control, FakeRun()) as signals:
        signals._on_hangup(signal.SIGHUP, None)
        assert control.stop_requested  # stop after this step, and save
        with pytest.raises(HungUp):
            signals._on_hangup(signal.SIGHUP, None)
        with pytest.raises(JobTerminated):
            signals._on_terminate(signal.SIGTERM, None)


def test_a_signal_once_the_outcome_is_decided_does_not_replace_it_but_the_watchdog_still_ends_the_process(
        monkeypatch):
    """Under torchrun a dead peer reaches rank 0 twice: a failed collective (recorded and printed as one line)
    and torchrun's SIGTERM. The SIGTERM must not raise a second ending over the first; if the exit then
    hangs, the watchdog records nothing new (the run's own ending stands) and ends the process."""
    run = FakeRun(ending=True)
    signals = StopSignals(Control(), run, grace_s=0.2)
    signals.install()
    exits = []
    monkeypatch.setattr("core.stopping.os._exit", exits.append)  # the watchdog's exit, recorded instead
    try:
        signals._on_terminate(signal.SIGTERM, None)  # no exception
        signals._watchdog.join(60)
    finally:
        signals.restore()
    assert exits == [128 + signal.SIGTERM]
    assert run.aborts and run.aborts[0].startswith("terminated (SIGTERM)")  # a no-op on a recorded trainer


def test_a_ctrl_c_once_the_outcome_is_decided_says_nothing_and_then_ends_the_process_at_once(capsys):
    """After "stopped at …" a second Ctrl-C printed "None" (no stop message to give); once the run's handlers are
    put away with the outcome decided, a signal ends the process at once (not a traceback from a finalizer it
    lands in, not a second outcome)."""
    control = Control()
    control.stop()
    signals = StopSignals(control, FakeRun(stoppable=False, ending=True), grace_s=60).install()
    try:
        signals._on_interrupt(signal.SIGINT, None)  # no exception: the outcome stands
    finally:
        signals.restore(decided=True)
    assert capsys.readouterr().err == ""
    for signum in (signal.SIGINT, signal.SIGTERM):
        assert signal.getsignal(signum).__qualname__.startswith("end_at_once_on_signals"), signum


def test_nohup_keeps_sighup_ignored_but_kill_int_always_stops():
    """``nohup speedboard train``: closing the terminal must not stop the run. A background job's ignored
    SIGINT is still handled: ``kill -INT`` is how scripts and the dashboard stop a run."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGHUP, signal.SIGINT)}
    try:
        with StopSignals(Control(), FakeRun()) as signals:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) == signals._on_interrupt
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored as it was
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# The second Ctrl-C lands in a weakref callback, as it can while torch.compile runs (in a run or a tune trial):
# the handler runs there and Python discards what it raises. The abort is raised again outside the callback,
# where the work meets it; should that not happen either, the watchdog ends the process.
SWALLOW_SECOND_CTRL_C = textwrap.dedent("""
    import sys
    if sys.argv[1] == "no-raise-again":  # the watchdog's case: the abort never reaches the work
        from core.interrupts import DiscardedRaiser
        DiscardedRaiser.arm = lambda self, exc: None

    class Thing:
        pass

    def callback(ref):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here
            pass

    time.sleep(0.2)  # a second key press, not the first one delivered twice (core.stopping.SAME_INTERRUPT_S)
    thing = Thing()
    ref = weakref.ref(thing, callback)
    try:
        del thing
        print("the interrupt was swallowed", flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.01)
        print("still running", flush=True)
    except KeyboardInterrupt as exc:
        print(f"the work met {exc!r}", flush=True)
        sys.exit(130)
""")


SWALLOWED = textwrap.dedent("""
    import os, signal, time, weakref
    from core.control import Control
    from core.stopping import StopSignals

    class Run:
        stoppable, compiling, ending = True, True, False
        def record_abort(self, message):
            print("recorded:", message, flush=True)

    StopSignals(Control(), Run(), grace_s=1.0).install()
    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: stop after this step

""") + SWALLOW_SECOND_CTRL_C


@pytest.mark.slow
@pytest.mark.parametrize("again", ["raise-again", "no-raise-again"])
def test_a_second_ctrl_c_that_python_swallows_still_aborts_and_records_it(again):
    proc = subprocess.run([sys.executable, "-c", SWALLOWED, again], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert "the interrupt was swallowed" in proc.stdout  # the case being guarded against really happened
    assert "still running" not in proc.stdout
    assert proc.returncode == 128 + signal.SIGINT, (proc.returncode, proc.stdout, proc.stderr)
    assert "once compilation has finished" in proc.stderr
    if again == "raise-again":  # the loop meets the abort and records it on its way out, as any abort
        assert "the work met KeyboardInterrupt('interrupted (Ctrl-C)')" in proc.stdout
        assert "recorded:" not in proc.stdout and "Exception ignored" not in proc.stderr
    else:
        assert "recorded: interrupted (Ctrl-C); ended at once" in proc.stdout
        assert "speedboard: aborted" in proc.stderr


SWALLOWED_OUTSIDE_TRAIN = textwrap.dedent("""
    import os, signal, time, weakref
    from core.cli import _stop_on_first_sigint
    from core.control import Control

    control = Control()
    signal.signal(signal.SIGINT, _stop_on_first_sigint(control, grace_s=1.0))  # as prepare and tune install it
    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: stop at the next safe point
    assert control.stop_requested

""") + SWALLOW_SECOND_CTRL_C


@pytest.mark.parametrize("again", ["raise-again", "no-raise-again"])
def test_a_second_ctrl_c_that_python_swallows_still_aborts_prepare_and_tune(again):
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_OUTSIDE_TRAIN, again], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "the interrupt was swallowed" in proc.stdout  # the case being guarded against really happened
    assert "still running" not in proc.stdout
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    if again == "raise-again":
        assert "the work met KeyboardInterrupt()" in proc.stdout and "Exception ignored" not in proc.stderr
    else:
        assert "speedboard: aborted" in proc.stderr


TERMINATED_IN_A_CALLBACK = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from core import cli
    from core.errors import JobTerminated

    class Thing:
        pass

    def callback(ref):
        os.kill(os.getpid(), signal.SIGTERM)  # as tune's torch.compile runs a weakref callback when it arrives
        for _ in range(1000):  # the handler runs here: its exception is discarded
            pass

    t0 = time.monotonic()
    try:
        with cli._terminable():
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing
            for _ in range(10_000):  # the work goes on: the discarded exception must arrive here
                time.sleep(0.001)
            print("the work finished as if never terminated", flush=True)
    except JobTerminated:
        print(f"terminated after the callback in {time.monotonic() - t0:.1f} s", flush=True)
        sys.exit(143)
""")


def test_a_sigterm_that_python_discards_in_a_callback_is_raised_again_at_once():
    """tune, SIGTERM'd while torch.compile ran a weakref callback: Python printed the discarded JobTerminated and
    the tune went on (exit 0, the report written) or the watchdog ended it 5 s later, a trial's folder left."""
    proc = subprocess.run([sys.executable, "-c", TERMINATED_IN_A_CALLBACK], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 143, (proc.stdout, proc.stderr)
    assert proc.stdout.startswith("terminated after the callback in 0.") and proc.stderr == "", proc.stderr


def test_an_abort_under_way_prints_no_warning_and_its_end_restores_them():
    """A second Ctrl-C landing in a compile's traced backward pass made autograd print its anomaly report (a
    UserWarning with the forward's traceback) before the one line."""
    import warnings

    from core.interrupts import DiscardedRaiser

    raiser = DiscardedRaiser(signal.SIGINT)
    before = warnings.filters[:]
    raiser.arm(KeyboardInterrupt())
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("Error detected in NllLossBackward0", UserWarning, stacklevel=1)
    raiser.disarm()
    assert caught == [] and warnings.filters == before


CUT_OFF_IMPORT = textwrap.dedent("""
    import sys

    from core import cli

    def command(args, argv):
        import half_imported  # noqa: F401 - Ctrl-C arrives while it is being imported (as torch, at start)

    sys.path.insert(0, sys.argv[1])
    cli.COMMANDS["prepare"] = command
    code = cli.main(["prepare", "x"])
    print("returned: the interpreter would shut down with the half-imported module", code)
""")


def test_ctrl_c_while_a_module_is_imported_is_one_line_and_exit_130(tmp_path):
    """The first second of any command imports torch: Ctrl-C there gave chained tracebacks (the handler imported
    the half-imported torch again) or a C++ abort at shutdown (exit 134)."""
    (tmp_path / "half_imported.py").write_text("raise KeyboardInterrupt\n")
    proc = subprocess.run([sys.executable, "-c", CUT_OFF_IMPORT, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "speedboard: interrupted\n", "")


HELD_DURING_IMPORT = textwrap.dedent("""
    import sys, time

    from core import cli

    def command(args, argv):
        import slow_import  # noqa: F401 - Ctrl-C arrives while it is being imported (as torch's C part calls Python)
        for _ in range(1000):  # the held Ctrl-C is delivered now, as a KeyboardInterrupt of set-up
            time.sleep(0.01)
        print("never delivered")
        return 0

    sys.path.insert(0, sys.argv[1])
    cli.COMMANDS["prepare"] = command
    sys.exit(cli.main(["prepare", "x"]))
""")

SLOW_IMPORT = textwrap.dedent("""
    import os, signal, time

    SWALLOWED = False
    try:  # what C++ code that calls Python does with an exception it cannot pass on: drops it
        os.kill(os.getpid(), int(os.environ["SIGNAL"]))
        for _ in range(20):
            time.sleep(0.01)
    except BaseException:
        SWALLOWED = True
    # Said by the import itself: the held Ctrl-C may be delivered as soon as the import is over.
    print("imported whole: True swallowed:", SWALLOWED, flush=True)
""")


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "speedboard: interrupted"),
                                                (signal.SIGTERM, 143, "speedboard: terminated (SIGTERM)")])
def test_a_signal_during_an_import_is_held_until_the_import_is_over(tmp_path, signum, code, line):
    """A KeyboardInterrupt raised inside an import that a C extension drives was swallowed there (the Ctrl-C lost,
    numpy left half imported, a traceback later) or became a C++ abort: it now waits for the import to finish.
    SIGTERM ended a command in its first second or two silently (no handler yet): now one line, exit 143."""
    (tmp_path / "slow_import.py").write_text(SLOW_IMPORT)
    proc = subprocess.run([sys.executable, "-c", HELD_DURING_IMPORT, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "SIGNAL": str(int(signum))})
    assert proc.stdout == "imported whole: True swallowed: False\n"
    assert (proc.returncode, proc.stderr) == (code, line + "\n")


SIGNAL_IN_TEARDOWN = textwrap.dedent("""
    import atexit, os, signal, sys, time

    from core import cli

    def command(args, argv):
        print("stopped at step 3: the outcome is said")  # block-buffered: the exit must still flush it
        # Runs first at exit, as weakref finalizers and torch's library destructors do: the signal lands there.
        atexit.register(lambda: (os.kill(os.getpid(), int(os.environ["SIGNAL"])), time.sleep(5), print("went on")))
        return 0

    cli.COMMANDS["prepare"] = command
    sys.argv = ["speedboard", "prepare", "x"]
    sys.exit(cli.entry())
""")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_interpreter_tears_down_ends_it_at_once_and_quietly(signum):
    """A second Ctrl-C just after "stopped at …" came during the interpreter's teardown: a KeyboardInterrupt
    traceback from an atexit callback, and an exit code of 0 or 130 by chance. Now 128 + the signal, as the
    signal's own default action gives in the interpreter's last moments."""
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_TEARDOWN], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SIGNAL": str(int(signum))})
    assert (proc.returncode, proc.stdout, proc.stderr) == (128 + signum, "stopped at step 3: the outcome is said\n", "")


def test_the_held_ctrl_c_goes_to_the_handler_installed_after_the_import():
    """Held during an import, the Ctrl-C reaches whatever handles SIGINT by then (here a command's own stop)."""
    import core.interrupts as interrupts

    handler = interrupts._InterruptOutsideImports()
    got = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: got.set())
    try:
        def importing_frame():
            code = compile("import sys; frame = sys._getframe()", "<fake module>", "exec")
            scope = {"__name__": "fake_module"}
            exec(code, scope)
            return scope["frame"]

        # The handler runs on a thread of its own whose stack is the test's alone: the main thread's is not
        # under pytest-xdist, whose worker runs inside a module body (remote.py) and so reads as importing.
        held, done = [], threading.Event()

        def signalled_thread():
            handler(signal.SIGINT, importing_frame())  # inside an import: held, nothing raised
            held.append(handler.held)
            done.wait(30)  # alive and not importing: the held Ctrl-C is delivered now

        thread = threading.Thread(target=signalled_thread)
        thread.start()
        deadline = time.monotonic() + 30
        while not held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held == [True]
        deadline = time.monotonic() + 30
        while not got.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)  # the eval loop runs between sleeps: the delivered Ctrl-C reaches the handler there
        done.set()
        thread.join()
        assert got.is_set() and not handler.held
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- real runs
def start_run(tmp_path: Path, *extra: str, stdout=subprocess.DEVNULL) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "runs"
    args = [sys.executable, "-m", "core.cli", "train", "--data", str(corpus_file(tmp_path)), "--vocab-size", "300",
            "--seq-len", "32", "--micro-batch", "2", "--eval-every", "0", "--no-progress", "--out", str(out), *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env), out


def wait_for_steps(out: Path, proc: subprocess.Popen, count: int = 2, timeout: float = 240) -> Path:
    """The run folder once it has recorded ``count`` steps (polls the file the run appends to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        for metrics in out.glob(f"*/{METRICS_FILE}"):
            if metrics.read_text().count('"event": "step"') >= count:
                return metrics.parent
        time.sleep(0.05)
    raise AssertionError("the run recorded no steps")


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("interruption", [KeyboardInterrupt, JobTerminated])
def test_a_run_interrupted_in_set_up_after_its_folder_exists_keeps_nothing(tmp_path, monkeypatch, interruption):
    """A torchrun job's rank 0 makes its folder seconds before its first step; Ctrl-C then left the folder
    with its config, tokenizer and one "failed" line. An interruption later than set-up keeps what it made."""
    from core.trainer import Trainer
    from tests.conftest import micro_config

    def interrupted(self):
        assert self.run_dir is not None and self.run_dir.is_dir()
        raise interruption("interrupted")

    monkeypatch.setattr(Trainer, "_prepare_measurements", interrupted)
    cfg = micro_config(tmp_path, train={"budget": 2})
    with pytest.raises(interruption):
        Trainer(cfg).run()
    assert list(Path(cfg.out_dir).iterdir()) == []
    monkeypatch.undo()

    def failed(self):
        raise RuntimeError("a failure, not an interruption")

    monkeypatch.setattr(Trainer, "_prepare_measurements", failed)
    with pytest.raises(RuntimeError):
        Trainer(cfg).run()
    (kept,) = Path(cfg.out_dir).iterdir()  # the failure is recorded where it happened
    assert "a failure, not an interruption" in (kept / METRICS_FILE).read_text()


def test_closing_the_terminal_stops_after_the_step_and_saves(tmp_path):
    proc, out = start_run(tmp_path, "--steps", "100000")
    run_dir = wait_for_steps(out, proc)
    assert run_state(run_dir).state == "running" and writer_alive(run_dir)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(240) == 0, proc.stderr.read()
    last = events(run_dir)[-1]
    assert last["event"] == "finished" and last["stopped"], last
    assert ck.read_checkpoint(run_dir).meta["step"] == last["step"]
    assert not (run_dir / HEARTBEAT_FILE).exists() and run_state(run_dir) == RunState("stopped")


@pytest.mark.slow
def test_sigterm_ends_a_single_process_run_in_one_line_that_names_no_rank(tmp_path):
    proc, out = start_run(tmp_path, "--steps", "100000")
    run_dir = wait_for_steps(out, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(240) == 128 + signal.SIGTERM
    err = proc.stderr.read()
    # One process: no launcher or other process to name (a torchrun job's line says those may have ended it).
    assert err.strip().splitlines()[-1] == "speedboard: terminated (SIGTERM)" and "rank" not in err, err
    assert "Traceback" not in err
    last = events(run_dir)[-1]
    assert last["event"] == "failed" and last["message"] == "terminated (SIGTERM)", last


@pytest.mark.slow
def test_a_run_killed_with_kill_9_reads_as_not_running(tmp_path):
    proc, out = start_run(tmp_path, "--steps", "100000")
    run_dir = wait_for_steps(out, proc)
    assert run_state(run_dir).state == "running"
    proc.kill()
    proc.wait(60)
    assert events(run_dir)[-1]["event"] == "step"  # no ending could be recorded
    state = run_state(run_dir)
    assert state.state == "not running" and state.ended and "process is gone" in state.message
    assert not writer_alive(run_dir)


@pytest.mark.slow
def test_a_closed_stdout_pipe_silences_the_console_not_the_run(tmp_path):
    """``speedboard train … | head -3``: the run trains to its end and saves its checkpoint."""
    proc, out = start_run(tmp_path, "--steps", "30", "--log-every", "1", stdout=subprocess.PIPE)
    lines = []  # like ``head``: read until the run has started and a step line has come, then go
    while not (lines and lines[-1].startswith("step")) and len(lines) < 20:
        lines.append(proc.stdout.readline())
    proc.stdout.close()  # head exits
    assert proc.wait(240) == 0
    err = proc.stderr.read()
    assert "BrokenPipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    started = next(i for i, line in enumerate(lines) if line.startswith("started"))  # data preparation before it
    assert lines[started + 1].startswith("step")
    (run_dir,) = out.iterdir()
    assert events(run_dir)[-1]["event"] == "finished"
    assert ck.read_checkpoint(run_dir).meta["step"] == 30


# --------------------------------------------------------------------------- liveness, without processes
def test_liveness_from_the_heartbeat_and_for_older_run_folders(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert run_state(run_dir).state == "not running"  # nothing at all
    beat = Heartbeat(run_dir, every_s=0.05).start()
    try:
        assert writer_alive(run_dir) and run_state(run_dir).state == "running"
        later = time.time() + 3600  # an hour without a beat: a writer on another machine that is gone
        info = json.loads((run_dir / HEARTBEAT_FILE).read_text())
        assert info["pid"] == os.getpid()
        assert writer_alive(run_dir, now=later) is False
    finally:
        beat.stop()
    assert not (run_dir / HEARTBEAT_FILE).exists()
    # A heartbeat of a process that is gone on this machine: not running at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run_dir / HEARTBEAT_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename}))
    assert not writer_alive(run_dir)
    # A folder written before heartbeats: its metrics file's age decides.
    (run_dir / HEARTBEAT_FILE).unlink()
    (run_dir / METRICS_FILE).write_text('{"event": "warning", "run_id": "r", "time": 1.0, "message": "x"}\n')
    assert run_state(run_dir).state == "running"
    assert run_state(run_dir, now=time.time() + 3600).state == "not running"


def test_a_heartbeat_keeps_beating_while_the_main_thread_is_busy(tmp_path):
    """As during a long compile: the main thread never waits, the heartbeat still gets its turn."""
    path = tmp_path / HEARTBEAT_FILE
    beat = Heartbeat(tmp_path, every_s=0.01).start()
    first = path.stat().st_mtime_ns
    deadline = time.monotonic() + 60
    try:
        while path.stat().st_mtime_ns == first and time.monotonic() < deadline:
            sum(range(10_000))  # busy, never sleeping
        assert path.stat().st_mtime_ns != first
    finally:
        beat.stop()


@pytest.mark.parametrize("late", ["_compile", "set_up"])
def test_a_stop_late_in_set_up_or_before_the_first_step_keeps_nothing_and_saves_nothing(tmp_path, monkeypatch,
                                                                                        late):
    """The dashboard's Stop after the model was compiled (or after set-up, before the first step) kept the set-up's
    model as "a model to save": a Save asked for in set-up wrote the untrained weights where the user asked,
    or the run saved a step-0 checkpoint, validated at step 0 and finished, keeping its folder."""
    from core.errors import Cancelled
    from core.trainer import Trainer
    from tests.conftest import micro_config

    control = Control()
    original = getattr(Trainer, late)

    def then_stop(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        control.request_save(str(tmp_path / "asked"))
        control.stop()
        return result

    monkeypatch.setattr(Trainer, late, then_stop)
    cfg = micro_config(tmp_path, train={"budget": 2})
    seen: list = []
    trainer = Trainer(cfg, control, seen.append)
    with pytest.raises(Cancelled, match="nothing was kept"):
        trainer.run()
    assert not trainer.has_model  # nothing for a later Save to write
    assert list(Path(cfg.out_dir).iterdir()) == [] and not (tmp_path / "asked").exists()
    assert control.take_save_requests() == [str(tmp_path / "asked")]  # left for the caller to answer
    assert not any(type(e).__name__ in ("CheckpointSaved", "ValidationResult", "RunFinished") for e in seen)
