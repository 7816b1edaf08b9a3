"""The engine's messages as this window says them: its controls named where a message names a command-line flag
(a run started here that fails on its data says "choose another text field (the Text field)", not "--text-field";
a micro-batch that cannot fit names the Micro-batch and Accumulation that do, not their flags)."""

from __future__ import annotations

import re

_CONTROLS = {"--data": "the Data control", "--text-field": "the Text field"}
"""The command line's flags that the engine's messages about data name, and this window's controls for them."""


_PHRASES = (
    # A split that fits (core.memory_budget): "(--micro-batch 512 --accum 8)".
    (re.compile(r"\(--micro-batch (\d+) --accum (\d+)\)"), r"(Micro-batch \1, Accumulation \2)"),
    # A run id taken meanwhile (another job's folder): the window names its runs itself, afresh at each Start.
    (re.compile(r"; choose another run id\b"), "; start again: a new run takes a new id"),
    # The speed advisor's budget (core.tune): its field is the Time budget.
    (re.compile(r"give --budget-seconds (\d+) or more"),
     lambda m: f"set the Time budget to {int(m.group(1)):,} s or more"),
)
"""Advice that names flags with values, and the window's fields for them."""


def in_window_words(message: str) -> str:
    """An engine message as the window says it: its controls named where the message names a command-line flag."""
    for pattern, words in _PHRASES:
        message = pattern.sub(words, message)
    for flag, control in _CONTROLS.items():
        message = re.sub(rf"{flag}(?![\w-])", control, message)
    return message
