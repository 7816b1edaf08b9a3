"""Ctrl-C and SIGTERM while a command starts: never inside an import.

A ``KeyboardInterrupt`` raised while a module is being imported leaves it half
built, and one raised inside Python code that a C extension's initialisation
calls back (torch's, numpy's: the first second of every command) is swallowed
there, so the command ran on, the Ctrl-C lost, with numpy half imported (and
failed later with a traceback), or it became a C++ abort. Speedboard's commands
therefore start with a SIGINT handler that, during an import, holds the Ctrl-C
back until the import is over and then delivers it to whatever handler is
installed by then: set-up's ``KeyboardInterrupt`` (one line, exit 130), or a
running command's own stop. SIGTERM, which ended a command silently until it
had installed its own handler (the first second or two, importing torch), is
handled alike: ``JobTerminated``, one line, exit code 143.

Standard library only (``core.errors`` imports nothing): the command line installs these before importing
anything else.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
import warnings

_POLL_S = 0.02
"""How often a held-back Ctrl-C checks whether the import is over."""


def _importing(frame) -> bool:
    """A module body other than the program's own runs on this stack: an import is under way."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
            return True
        frame = frame.f_back
    return False


class _InterruptOutsideImports:
    """A base handler of ``signum``: ``KeyboardInterrupt`` (SIGINT) or ``JobTerminated`` (SIGTERM), held back
    while a module is being imported."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        self.signum = signum
        self.held = False

    def __call__(self, signum, frame) -> None:
        if not _importing(frame):
            self.held = False
            if self.signum == signal.SIGTERM:
                from core.errors import JobTerminated

                raise JobTerminated("terminated (SIGTERM)")
            raise KeyboardInterrupt
        if not self.held:  # a second Ctrl-C during the same import adds nothing
            self.held = True
            threading.Thread(target=self._deliver_after_import, args=(threading.get_ident(),),
                             name="speedboard-held-ctrl-c", daemon=True).start()

    def _deliver_after_import(self, main_ident: int) -> None:
        while self.held:
            time.sleep(_POLL_S)
            frame = sys._current_frames().get(main_ident)
            if frame is None:  # the main thread has ended
                return
            importing = _importing(frame)
            frame = None  # a frame kept here would keep its locals alive
            if not importing and self.held:
                self.held = False
                # The handler installed now (this one, or the command's own) gets it, as if it came now.
                _thread.interrupt_main(self.signum)
                return


def install_start_handlers() -> None:
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM ``JobTerminated``, never inside an import; SIGINT also where
    the command was started ignoring it.

    A shell ignores SIGINT in background jobs (`… &`), shielding them from the terminal's Ctrl-C; ``kill -INT``
    is still how a script asks any command (train, bench, …) to stop. A SIGTERM that the caller ignores stays
    ignored. A handler of the caller's own (a test, the dashboard) is left in place; so is everything outside
    the main thread, where handlers cannot be set.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is signal.SIG_IGN or current is signal.default_int_handler:
        signal.signal(signal.SIGINT, _InterruptOutsideImports(signal.SIGINT))
    # A torchrun worker keeps SIGTERM's default until its run installs its own: torchrun ends the workers of a
    # stopped job with it, and one held through torch's import outlived torchrun's grace (it was SIGKILLed).
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "RANK" in os.environ
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and not under_torchrun:
        signal.signal(signal.SIGTERM, _InterruptOutsideImports(signal.SIGTERM))


class DiscardedRaiser:
    """Raises again an exception that a signal handler raised and Python discarded.

    Python drops an exception raised while it runs a weakref callback or a finalizer (frequent during
    torch.compile), printing "Exception ignored in …": the Ctrl-C or SIGTERM that raised it was lost, and the
    work went on. Armed with the exception its handler raises (``arm``, in that handler), this hook raises
    it again about 10 ms later, outside the callback, through a one-shot handler of ``signum``, until
    ``disarm``. Main thread only, as signal handlers are.

    While armed, Python's warnings are silenced: an abort that lands inside a
    compile's traced backward pass made autograd print its anomaly report ("Error
    detected in NllLossBackward0. Traceback of forward call …") before the
    command's one line.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exc: BaseException | None = None
        self._previous_hook = None
        self._quiet: warnings.catch_warnings | None = None

    def arm(self, exc: BaseException) -> None:
        self.exc = exc
        if self._previous_hook is None:
            self._previous_hook = sys.unraisablehook
            sys.unraisablehook = self._hook
        if self._quiet is None:
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()  # left in disarm: the filters as they were
            warnings.simplefilter("ignore")

    def disarm(self) -> None:
        self.exc = None
        if self._previous_hook is not None:
            if sys.unraisablehook == self._hook:
                sys.unraisablehook = self._previous_hook
            self._previous_hook = None
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None

    def _hook(self, unraisable) -> None:
        exc = self.exc
        if exc is None or unraisable.exc_value is not exc:
            (self._previous_hook or sys.__unraisablehook__)(unraisable)
            return
        installed = signal.getsignal(self.signum)

        def raise_it(signum, frame):
            signal.signal(self.signum, installed)
            if self.exc is exc:
                raise exc

        signal.signal(self.signum, raise_it)  # the hook runs where the callback ran: the main thread
        threading.Thread(target=self._deliver, name="speedboard-raise-again", daemon=True).start()

    def _deliver(self) -> None:
        time.sleep(0.01)  # the main thread has left the callback, and this hook, by then
        _thread.interrupt_main(self.signum)


def end_at_once_on_signals() -> None:
    """Once a command's outcome is decided and said (a stopped run's checkpoint saved): a Ctrl-C or SIGTERM ends the
    process at once with 128 + the signal's number, as the signal's default action does in the interpreter's last
    moments, quietly. Raised as a ``KeyboardInterrupt``, it landed in an atexit callback or a finalizer (weakref
    callbacks, torch's library destructors) and printed a traceback there, and the exit code came out 0 or 130 by
    chance. Main thread only; an ignored signal (nohup's) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return

    def end(signum, frame) -> None:
        for stream in (sys.stdout, sys.stderr):  # what was said reaches its reader; os._exit flushes nothing
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, end)
