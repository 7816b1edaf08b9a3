"""Values read back from the settings file (``QSettings``), which a user may have edited by hand or a crash may
have cut short: each reader gives a value of the type asked for, or None (or the default given), and never
raises. The window then keeps its own default for what it cannot read, instead of failing to open.

An INI file gives text for everything (``geometry=garbage``), a list for a value with commas, ``@Invalid()`` as
None; the native formats give what was stored. Every value read goes through one of these.
"""

from __future__ import annotations

import json
import math
from typing import Any

from PySide6.QtCore import QByteArray, QDataStream, QSettings


def stored_text(settings: QSettings, key: str) -> str | None:
    value = settings.value(key)
    return value if isinstance(value, str) else None


def stored_number(settings: QSettings, key: str, lo: float, hi: float, whole: bool = False) -> float | None:
    """A finite number in ``[lo, hi]`` (a whole one when ``whole``), from a number or its text."""
    value = settings.value(key)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):  # text that is no number; an int past a double's range
        return None
    if not math.isfinite(number) or not lo <= number <= hi or (whole and not number.is_integer()):
        return None
    return number


def stored_flag(settings: QSettings, key: str, default: bool) -> bool:
    """``true``/``false`` as INI files and the native formats store them; anything else is ``default``."""
    value = settings.value(key)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return default


def stored_bytes(settings: QSettings, key: str) -> QByteArray | None:
    """What ``saveGeometry``/``saveState`` wrote; text in its place (a hand-edited file) is not it."""
    value = settings.value(key)
    if isinstance(value, bytes):
        return QByteArray(value)
    return value if isinstance(value, QByteArray) else None


def splitter_state_whole(state: QByteArray, panes: int) -> bool:
    """``QSplitter.saveState`` bytes that hold a size for each of ``panes`` and what follows them. Qt's
    ``restoreState`` reads a state cut short as zeros and applies it (the settings column came back collapsed)."""
    stream = QDataStream(state)
    marker, _version, count = stream.readInt32(), stream.readInt32(), stream.readInt32()
    if (marker, count) != (0xFF, panes):
        return False
    for _ in range(panes):
        stream.readInt32()
    stream.readBool()  # children collapsible
    stream.readInt32()  # handle width
    return stream.status() == QDataStream.Status.Ok


def stored_json_list(settings: QSettings, key: str) -> list[Any]:
    """A JSON list kept as text; [] for anything else."""
    text = stored_text(settings, key)
    try:
        value = json.loads(text) if text is not None else []
    except (ValueError, RecursionError):  # not JSON; nested too deep for the parser
        return []
    return value if isinstance(value, list) else []
