"""torchrun as ``speedboard train --nproc`` starts it: ``python -m core.launch_torchrun``, then torchrun's own ``main``.

Two things differ from a bare ``torchrun``. Its own messages go where ``TORCHRUN_STDERR_ENV`` says, apart from
its workers' output, which keeps fd 2 (the launcher's stderr). And a Ctrl-C or SIGTERM that the launcher passes
on before the workers exist ends it quietly, in one line said by the launcher: raised as KeyboardInterrupt while
torch was imported, or during torchrun's rendezvous, it printed a traceback of 10 to 50 lines.

Should the launcher itself be killed (kill -9), torchrun ends with it (its parent-death signal) and says
nothing: its messages had nobody to read them, and writing them into the broken pipe ended in Python's
"lost sys.stderr" dump on the terminal. Its log folder, which the launcher removes, is removed here then.
"""

import os
import shutil
import signal
import sys


class _ToLauncher:
    """torchrun's stderr: the launcher's pipe, and nothing once the launcher is gone (a write to it fails)."""

    def __init__(self, fd: int) -> None:
        self._stream = open(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115

    def _lost(self) -> None:
        self._stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:  # BrokenPipeError: the launcher was killed
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._lost()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _log_dir(argv: list[str]) -> str | None:
    """The ``--log-dir`` the launcher gave torchrun (``core.launch.torchrun_argv``)."""
    own = argv[:argv.index("-m")] if "-m" in argv else argv  # torchrun's arguments, not the training's
    for i, arg in enumerate(own[:-1]):
        if arg == "--log-dir":
            return own[i + 1]
    return None


def _before_torchrun_starts(signum, frame) -> None:  # pragma: no cover - torchrun's process
    os._exit(128 + signum)  # nothing is started yet


# First, before any import that a signal could cut short.
_BEFORE = {s: signal.signal(s, _before_torchrun_starts) for s in (signal.SIGINT, signal.SIGTERM)}


def main() -> int:  # pragma: no cover - runs as torchrun, in its own process
    from core.launch import TORCHRUN_STDERR_ENV

    launcher = os.getppid()
    fd = os.environ.pop(TORCHRUN_STDERR_ENV, None)
    if fd:
        os.set_inheritable(int(fd), False)  # the workers' stderr is the launcher's own
        sys.stderr = _ToLauncher(int(fd))
    from torch.distributed.run import main as torchrun

    for signum, handler in _BEFORE.items():  # torchrun's own handling from here on
        signal.signal(signum, handler)
    try:
        torchrun()
    except KeyboardInterrupt:
        # Passed on during the rendezvous, before the workers began: torchrun has ended what it started on the
        # way out (its agent's shutdown), and the launcher says why in one line.
        return 130
    finally:
        logs = _log_dir(sys.argv)
        if logs and os.getppid() != launcher:  # the launcher is gone, and its clean-up with it
            shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
