"""JSON from files a user or another program may have written, parsed so that any damage is a ValueError.

``json.loads`` raises ``RecursionError`` for deeply nested arrays (``[[[[…]]]]``) and a ValueError
that is not a ``JSONDecodeError`` for an integer of more than 4,300 digits: a reader that catches
``JSONDecodeError`` alone would end in a traceback on either.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``; every kind of damage is a ValueError (``JSONDecodeError`` included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
