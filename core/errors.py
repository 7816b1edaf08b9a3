"""User-facing error types.

Every mistake a user can make (a bad flag, a bad file, a checkpoint that does not
fit) raises a subclass of ``SpeedboardError``. It is a ``ValueError`` so callers
that only know the standard library still catch it; the CLI prints its message
as one line and exits with code 2, the GUI shows it in a dialog.
"""

from __future__ import annotations


class SpeedboardError(ValueError):
    """A problem with the user's input, explained in one line."""


class ConfigError(SpeedboardError):
    """An invalid setting or combination of settings."""


class DataError(SpeedboardError):
    """A corpus that cannot be read or is too small."""


class CheckpointError(SpeedboardError):
    """A checkpoint that cannot be saved or loaded."""
