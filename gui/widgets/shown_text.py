"""Text from a run (a model's sample, a warning quoting a file or a document) as a view shows it: as written, and
at a length the view lays out at once.

Unicode's direction controls (U+202A-U+202E, U+2066-U+2069) reorder the characters around them on screen: a
sample holding U+202E showed "evil" as "live". They are shown as their code points instead. And a line of
hundreds of thousands of characters without a space took the log seconds to minutes to lay out, again at every
later line and every resize: a log message is cut to ``LOG_MESSAGE_CHARS``, saying how much was left out.
"""

from __future__ import annotations

import re

LOG_MESSAGE_CHARS = 2_000
"""The most of one message the log shows (a warning quoting a whole document or line says the rest is cut)."""
_DIRECTION_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def as_written(text: str) -> str:
    """``text`` with its direction controls shown as ``<U+202E>``: nothing reorders what is around them."""
    return _DIRECTION_CONTROLS.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)


def log_message(text: str) -> str:
    """One log message as shown: as written, and at most ``LOG_MESSAGE_CHARS`` characters of it."""
    if len(text) > LOG_MESSAGE_CHARS:
        text = f"{text[:LOG_MESSAGE_CHARS]} … ({len(text) - LOG_MESSAGE_CHARS:,} characters more)"
    return as_written(text)
