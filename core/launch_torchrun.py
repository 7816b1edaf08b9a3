"""torchrun as ``speedboard train --nproc`` starts it: ``python -m core.launch_torchrun``, then torchrun's own ``main``.

Two things differ from a bare ``torchrun``. Its own messages go where ``TORCHRUN_STDERR_ENV`` says, apart from
its workers' output, which keeps fd 2 (the launcher's stderr). And a Ctrl-C or SIGTERM that the launcher passes
on before the workers exist ends it quietly, in one line said by the launcher: raised as KeyboardInterrupt while
torch was imported, or during torchrun's rendezvous, it printed a traceback of 10 to 50 lines.
"""

import os
import signal
import sys


def _before_torchrun_starts(signum, frame) -> None:  # pragma: no cover - torchrun's process
    os._exit(128 + signum)  # nothing is started yet


# First, before any import that a signal could cut short.
_BEFORE = {s: signal.signal(s, _before_torchrun_starts) for s in (signal.SIGINT, signal.SIGTERM)}


def main() -> int:  # pragma: no cover - runs as torchrun, in its own process
    from core.launch import TORCHRUN_STDERR_ENV

    fd = os.environ.pop(TORCHRUN_STDERR_ENV, None)
    if fd:
        os.set_inheritable(int(fd), False)  # the workers' stderr is the launcher's own
        sys.stderr = open(int(fd), "w", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    from torch.distributed.run import main as torchrun

    for signum, handler in _BEFORE.items():  # torchrun's own handling from here on
        signal.signal(signum, handler)
    try:
        torchrun()
    except KeyboardInterrupt:
        # Passed on during the rendezvous, before the workers began: torchrun has ended what it started on the
        # way out (its agent's shutdown), and the launcher says why in one line.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
