"""JSON from files a user or another program may have written, parsed so that any damage is a ValueError.

``json.loads`` raises ``RecursionError`` for deeply nested arrays (``[[[[…]]]]``) and a ValueError
that is not a ``JSONDecodeError`` for an integer of more than 4,300 digits: a reader that catches
``JSONDecodeError`` alone would end in a traceback on either.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``; every kind of damage is a ValueError (``JSONDecodeError`` included)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # Python's own words advise a call to its interpreter: say what is in the text
        if "integer string conversion" not in str(exc):
            raise
        raise ValueError(f"an integer of more than {sys.get_int_max_str_digits():,} digits") from None
