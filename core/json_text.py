"""JSON from files a user or another program may have written, parsed so that any damage is a ValueError;
and JSON that any reader parses.

``json.loads`` raises ``RecursionError`` for deeply nested arrays (``[[[[…]]]]``) and a ValueError
that is not a ``JSONDecodeError`` for an integer of more than 4,300 digits: a reader that catches
``JSONDecodeError`` alone would end in a traceback on either. ``json.dumps`` writes ``NaN`` and
``Infinity``, which are not JSON: strict readers (JavaScript's, jq's, most outside Python) refuse the
whole file. ``finite_json`` writes them as ``null``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def parse_json(text: str | bytes, unique_keys: bool = False) -> Any:
    """``json.loads(text)``; every kind of damage is a ValueError (``JSONDecodeError`` included). ``unique_keys``:
    a key given twice in one object is such damage too (a file a user wrote, where JSON would keep the last)."""
    try:
        return json.loads(text, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # Python's own words advise a call to its interpreter: say what is in the text
        if "integer string conversion" not in str(exc):
            raise
        raise ValueError(f"an integer of more than {sys.get_int_max_str_digits():,} digits") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} is given twice in one object")
        seen[key] = value
    return seen


def finite_json(value: Any, **dumps_kwargs: Any) -> str:
    """``json.dumps(value, **dumps_kwargs)`` with every NaN or infinity written as ``null``: a number that is
    not finite (a diverged loss, a ratio to a zero) has no JSON of its own."""
    return json.dumps(_finite(value), allow_nan=False, **dumps_kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
