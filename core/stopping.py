"""How a command-line run answers signals: stop at a safe point, abort promptly, and record how it ended.

- SIGINT (Ctrl-C): the first stops the run after the current optimizer step,
  which saves a final checkpoint; during torch.compile's first step it says
  that the stop comes once compilation has finished. A second Ctrl-C aborts.
  During set-up, where there is nothing to save yet, the first one aborts.
- SIGHUP (the terminal was closed): stops after the current step and saves, as
  a first Ctrl-C does; nobody reads the console any more, so nothing is said.
- SIGTERM: aborts (torchrun ends a job this way when another process failed).

A signal that comes once the run's outcome is decided (it finished, or it
failed and is recording why: under torchrun, a peer's death reaches this
process both as a failed collective and as torchrun's SIGTERM) does not replace
that outcome: the process goes on ending as it was, under the watchdog below.

An abort raises an exception in the main thread, which the trainer records in
``metrics.jsonl`` on its way out. Python runs signal handlers wherever the
main thread happens to be, and an exception raised inside a weakref callback
or ``__del__`` (frequent while torch.compile runs) is printed and discarded.
So such a discarded abort is raised again at once, outside the callback
(``core.interrupts.DiscardedRaiser``), and every abort also arms a watchdog
thread: if the process is still running ``ABORT_GRACE_S`` seconds later, the
watchdog records the ending itself and ends the process. From the first abort
on, a further Ctrl-C ends the process at once (the system's default action).

A SIGHUP that ``nohup`` set to be ignored stays ignored. SIGINT is always
handled: a shell ignores it in background jobs to shield them from the
terminal's Ctrl-C, but ``kill -INT`` is how scripts and the dashboard ask a
run to stop.

What an ending must not leave behind, whichever way it comes: the temporary
files and folders the work is writing (``removed_on_forced_exit``), which
an exit by the watchdog (``exit_now``) removes as the work's own clean-up
would have; and worker threads busy in native code (``native_worker``: a
tokenizer's training, a batch's encoding), which a cut-short command leaves
running rather than waiting for. Python's shutdown would stop such a thread by
unwinding it through its Rust frames, which aborts the process ("FATAL:
exception not rethrown", exit code 134): a command that ends with one still
running ends at once instead (``leave_workers``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

from core.errors import JobTerminated
from core.interrupts import DiscardedRaiser, end_at_once_on_signals

T = TypeVar("T")

ABORT_GRACE_S = 5.0
"""How long an abort may take to reach the training loop before the watchdog ends the process."""
SAME_INTERRUPT_S = 0.05
"""A SIGINT this soon after the last one is the same Ctrl-C delivered twice (``timeout -s INT`` signals both the
command and its process group), not a second key press: it neither turns a stop into an abort nor ends an abort
at once."""


class InterruptClock:
    """Counts Ctrl-C key presses for a SIGINT handler: the same one delivered twice (``SAME_INTERRUPT_S``) is one,
    and two pressed while the main thread was inside one long native call are two.

    Python's C-level handler only flags a signal; the Python handler runs once the main thread is back in
    bytecode, once however many signals came meanwhile. Two Ctrl-Cs pressed during a large matmul or a compiler's
    C++ step ran it once: the second was lost, and the run only stopped. While ``watch`` is on (main thread, no
    other wakeup fd set), the C-level handler also writes each SIGINT to a pipe (``signal.set_wakeup_fd``), which a
    thread timestamps as it comes (the main thread's native calls leave it the GIL); the handler counts them."""

    def __init__(self) -> None:
        self._last = float("-inf")
        self._pending: list[float] = []  # deliveries timestamped by the watcher, not counted yet
        self._lock = threading.Lock()
        self._read_fd: int | None = None
        self._write_fd: int | None = None

    def watch(self) -> None:
        if self._write_fd is not None or threading.current_thread() is not threading.main_thread():
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)  # the C-level handler must never block on it
        if signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False) != -1:  # someone else's (an event loop)
            signal.set_wakeup_fd(-1)
            os.close(read_fd)
            os.close(write_fd)
            return
        self._read_fd, self._write_fd = read_fd, write_fd
        threading.Thread(target=self._timestamp, args=(read_fd,), name="speedboard-interrupt-clock",
                         daemon=True).start()

    def unwatch(self) -> None:
        if self._write_fd is None:
            return
        with contextlib.suppress(ValueError):  # not the main thread any more: the process is ending
            signal.set_wakeup_fd(-1)
        os.close(self._write_fd)  # the watcher reads the end of the pipe, closes it and ends
        self._write_fd = None

    def _timestamp(self, read_fd: int) -> None:
        import select

        try:
            while True:
                select.select([read_fd], [], [])
                with self._lock:
                    try:
                        data = os.read(read_fd, 64)
                    except BlockingIOError:  # the handler took them first
                        continue
                    if not data:
                        return
                    now = time.monotonic()
                    self._pending += [now] * data.count(signal.SIGINT)
        except OSError:
            return
        finally:
            with self._lock:
                os.close(read_fd)
                if self._read_fd == read_fd:
                    self._read_fd = None

    def presses(self) -> int:
        """Called by a SIGINT handler first: the key presses since its last call; 0 when this SIGINT repeats the
        last press (ignore it)."""
        now = time.monotonic()
        with self._lock:
            if self._read_fd is not None:  # what the watcher has not read yet came just now
                with contextlib.suppress(OSError):
                    self._pending += [now] * os.read(self._read_fd, 64).count(signal.SIGINT)
            times, self._pending = self._pending or [now], []
        presses = 0
        for t in times:
            presses += t - self._last >= SAME_INTERRUPT_S
            self._last = t
        return presses


def abort_on_interrupt_again(clock: InterruptClock, speak: bool = True) -> None:
    """Called as an abort begins: a Ctrl-C after it ends the process at once, as Python's default would, but
    removes what the work was writing (``exit_now``: a half store, a lock file) and says so in one line."""

    def again(signum, frame) -> None:
        if not clock.presses():
            return
        if speak:
            with contextlib.suppress(OSError, ValueError):
                print("speedboard: aborted", file=sys.stderr, flush=True)
        exit_now(128 + signal.SIGINT)

    signal.signal(signal.SIGINT, again)


class HungUp(JobTerminated):
    """SIGHUP during set-up, or a second one: the terminal is gone and the run cannot stop gently."""

    exit_code = 128 + getattr(signal, "SIGHUP", 1)


class Run(Protocol):
    """What the signal handlers need to know about the trainer."""

    @property
    def stoppable(self) -> bool: ...

    @property
    def ending(self) -> bool: ...

    compiling: bool

    def record_abort(self, message: str) -> None: ...


class StopSignals:
    """Installs the handlers for one run (main thread only); ``restore`` puts the previous ones back."""

    def __init__(self, control, run: Run, *, speak: bool = True, grace_s: float = ABORT_GRACE_S) -> None:
        self.control = control
        self.run = run
        self.speak = speak
        self.grace_s = grace_s
        self._previous: dict[int, object] = {}
        self._finished = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._again: DiscardedRaiser | None = None  # the first abort, raised again should Python discard it
        self._aborted_with: int | None = None  # the exit code of the abort raised, if one was
        self._interrupts = InterruptClock()

    # ------------------------------------------------------------------ installing
    def install(self) -> StopSignals:
        handlers = {signal.SIGINT: self._on_interrupt, signal.SIGTERM: self._on_terminate}
        if hasattr(signal, "SIGHUP"):
            handlers[signal.SIGHUP] = self._on_hangup
        for signum, handler in handlers.items():
            if signum == getattr(signal, "SIGHUP", None) and signal.getsignal(signum) is signal.SIG_IGN:
                continue  # nohup: closing the terminal must not stop the run
            self._previous[signum] = signal.signal(signum, handler)
        self._interrupts.watch()
        return self

    def restore(self, decided: bool = False) -> None:
        """The run is over (its ending recorded): disarm the watchdog, put the previous handlers back; ``decided``
        (the command's outcome is said and its exit code known): a Ctrl-C or SIGTERM from now on ends the process
        at once (``end_at_once_on_signals``): raised as the command returns, it landed in a finalizer as a
        traceback, or said a second outcome ("interrupted" after "stopped at")."""
        self._finished.set()
        if self._aborted_with is not None:  # its data preparation may have left a tokenizer training
            leave_workers(self._aborted_with)
        if self._again is not None:
            self._again.disarm()
        ends = (signal.SIGINT, signal.SIGTERM) if decided else ()
        for signum, handler in self._previous.items():
            if signum not in ends or handler is signal.SIG_IGN:  # the rest go to end_at_once, with no gap
                signal.signal(signum, handler)
        self._previous.clear()
        self._interrupts.unwatch()
        if decided:
            end_at_once_on_signals()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

    # ------------------------------------------------------------------ handlers
    def _say(self, text: str) -> None:
        if not self.speak:
            return
        try:
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):  # the terminal is gone: saying it is best-effort
            pass

    def _stop_message(self) -> str | None:
        """What a gentle stop means now; None when there is no step to stop after (set-up: abort instead)."""
        if not self.run.stoppable:
            return None
        if self.run.compiling:
            return ("\nstopping after this step: torch.compile is compiling it, so the run stops once "
                    "compilation has finished (Ctrl-C again to abort) …")
        return "\nstopping after this step (Ctrl-C again to abort) …"

    def _on_interrupt(self, signum, frame) -> None:
        presses = self._interrupts.presses()
        if not presses:
            return
        message = self._stop_message()
        if self.control.stop_requested or message is None or presses > 1:  # the second press aborts
            self._abort(KeyboardInterrupt("interrupted (Ctrl-C)"), 128 + signal.SIGINT, signal.SIGINT)
            return  # the outcome was decided already (the abort did not raise): nothing to stop, nothing to say
        self.control.stop()
        self._say(message)

    def _on_hangup(self, signum, frame) -> None:
        if self.control.stop_requested or self._stop_message() is None:
            self._abort(HungUp("the terminal was closed (SIGHUP)"), HungUp.exit_code, signal.SIGHUP)
        self.control.stop()

    def _on_terminate(self, signum, frame) -> None:
        from core.distributed import launched_by_torchrun

        why = ": the job was ended, by its launcher when another process failed, or by the user" \
            if launched_by_torchrun() else ""  # one process: nobody but the user (or what runs it) ended it
        self._abort(JobTerminated(f"terminated (SIGTERM){why}"), 128 + signal.SIGTERM, signal.SIGTERM)

    def _abort(self, exc: BaseException, exit_code: int, signum: int) -> None:
        abort_on_interrupt_again(self._interrupts, self.speak)  # from now on Ctrl-C ends the process at once
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, args=(str(exc), exit_code),
                                              name="speedboard-abort-watchdog", daemon=True)
            self._watchdog.start()
        if self.run.ending:
            return  # its outcome is recorded or being recorded: raising here would print another one
        if self._again is None:
            self._again = DiscardedRaiser(signum)
            self._again.arm(exc)
            self._aborted_with = exit_code
        raise exc

    def _watch(self, message: str, exit_code: int) -> None:
        if self._finished.wait(self.grace_s):
            return  # the exception reached the loop and the run recorded its ending
        # The exception was swallowed where the signal landed: end the process from here.
        self.run.record_abort(f"{message}; ended at once: the interrupt did not reach the training loop")
        self._say("speedboard: aborted")
        exit_now(exit_code)


# ----------------------------------------------------------------------------- what an ending leaves behind
_writing: dict[Path, None] = {}
"""Temporary files and folders being written now, in the order they were begun."""
_native_workers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_left: list[tuple[threading.Thread, int]] = []
"""Native workers of a command that was cut short, each with the exit code its process ends with."""


@contextlib.contextmanager
def removed_on_forced_exit(path: str | os.PathLike[str]) -> Iterator[None]:
    """While the block runs, ``path`` (a temporary file or folder, or a lock file held) is the work's to remove
    should it be cut short; a forced exit (``exit_now``), which skips the work's own clean-up, removes it too."""
    path = Path(path)
    _writing[path] = None
    try:
        yield
    finally:
        _writing.pop(path, None)


def native_worker(call: Callable[[], T], name: str) -> Future[T]:
    """``call()`` run in a daemon thread that spends its time in native code with the GIL released (Rust), its
    outcome in the future returned: a caller cut short leaves it to finish on its own, its result unused, instead
    of waiting for it (a ``ThreadPoolExecutor`` waits for its threads as the process ends)."""
    future: Future[T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            result = call()
        except BaseException as exc:  # handed to the caller's thread
            future.set_exception(exc)
        else:
            future.set_result(result)

    worker = threading.Thread(target=run, name=name, daemon=True)
    _native_workers.add(worker)
    worker.start()
    return future


def leave_workers(exit_code: int) -> None:
    """The command was cut short and its process ends with ``exit_code``: should a native worker it started still
    run when Python shuts down, the process ends then, at once, with that code (``exit_now``)."""
    alive = [worker for worker in _native_workers if worker.is_alive()]
    if alive and not _left:
        atexit.register(_end_before_shutdown)  # after the command's own line and clean-up, before finalization
    _left.extend((worker, exit_code) for worker in alive)


def _end_before_shutdown() -> None:
    for worker, exit_code in _left:
        if worker.is_alive():
            exit_now(exit_code)


def exit_now(exit_code: int) -> NoReturn:
    """End the process at once, leaving nothing it had begun to write: the paths of ``removed_on_forced_exit``
    are removed and what was printed is flushed; no thread is waited for, none is unwound."""
    for path in reversed(list(_writing)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(exit_code)
