"""The engine's messages as this window says them: its controls named where a message names a command-line flag
(a run started here that fails on its data says "choose another text field (the Text field)", not "--text-field")."""

from __future__ import annotations

import re

_CONTROLS = {"--data": "the Data control", "--text-field": "the Text field"}
"""The command line's flags that the engine's messages about data name, and this window's controls for them."""


def in_window_words(message: str) -> str:
    """An engine message as the window says it: its controls named where the message names a command-line flag."""
    for flag, control in _CONTROLS.items():
        message = re.sub(rf"{flag}(?![\w-])", control, message)
    return message
