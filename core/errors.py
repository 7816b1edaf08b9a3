"""User-facing error types.

Every mistake a user can make (a bad flag, a bad file, a checkpoint that does not
fit) raises a subclass of ``SpeedboardError``. It is a ``ValueError`` so callers
that only know the standard library still catch it; the CLI prints its message
as one line and exits with code 2, the GUI shows it in a dialog or under the
control named by ``field``.
"""

from __future__ import annotations


class SpeedboardError(ValueError):
    """A problem with the user's input, explained in one line."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        """The setting the problem is about (a config field name such as ``micro_batch``), when there is one."""


class ConfigError(SpeedboardError):
    """An invalid setting or combination of settings."""


class DataError(SpeedboardError):
    """A corpus that cannot be read or is too small."""

    def __init__(self, message: str, field: str | None = "source") -> None:
        super().__init__(message, field)


class SourceChanged(DataError):
    """A corpus file written to while it was prepared: its fingerprint no longer describes its text."""


class CheckpointError(SpeedboardError):
    """A checkpoint that cannot be saved or loaded."""


class NotFinite(SpeedboardError):
    """Numbers that went to NaN or inf: a loss, a gradient norm or a model's outputs (lower the learning rate)."""


class Cancelled(SpeedboardError):
    """Work stopped on request (Ctrl-C, the dashboard's Stop) before it finished; nothing half-done was kept."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one readable line: its message's first line, or its type's name.

    Some libraries put a paragraph on one line: past ``limit`` it is cut at a
    sentence end when there is one, else with an ellipsis.
    """
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    if len(line) > limit:
        cut = line.find(". ")
        line = line[:cut] if 0 < cut < limit else line[:limit] + "…"
    return line


def describe_exception(exc: BaseException) -> str:
    """A user's mistake is its own message; anything else is prefixed with its type (it is a bug or an OS fault)."""
    if isinstance(exc, SpeedboardError):
        return str(exc)
    text = first_line(exc)
    return text if text == type(exc).__name__ else f"{type(exc).__name__}: {text}"


class JobTerminated(KeyboardInterrupt):
    """SIGTERM: the job is ended hard (torchrun, after another rank failed; ``kill``). Here, with no torch
    import, so that a handler can name it while torch itself is still being imported."""
