"""Number fields that take what ML engineers type: ``3e-4``, ``1e-5``, ``2.5M``, ``10B``, ``1,000,000``.

Qt's spin boxes refuse a keystroke that would leave their range or their
decimals, silently: ``1e-4`` typed into a five-decimal box stayed ``1`` (a run
at learning rate 1.0), and the tenth digit of a token budget was dropped.
``NumberField`` accepts any number that reads as one, in a range far wider than
sensible settings, shows it in its shortest form, and leaves the judgement to
the config's validation, whose message the settings panel shows under the
field (a negative seed or learning rate too, sign kept); a number past even that
range becomes the bound nearest to it. ``BoundedSpin`` keeps a documented range (accumulation 1-1024) and
takes a number typed past it as its bound, not as its first digits (a negative one as its lowest). What reads
as no number it can hold (a field left empty, a fraction in a whole-number field: ``3.5`` was once taken as
``35``, ``1,5`` as ``15``; ``0x10``, ``2.5M`` as a rate) gives the field back the value it had before it was
edited. Every keystroke is shown as typed until the field is left: none is dropped to keep the rest (``5e9``
was ``59``).
"""

from __future__ import annotations

import math
import re

from PySide6.QtCore import Qt
from PySide6.QtGui import QFocusEvent, QKeyEvent, QValidator
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QSpinBox

EXACT_INTEGERS = 2**53 - 1
"""The largest count a field holds exactly (a double's integers)."""
SUFFIXES = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}

# A count: digits with optional comma groups, a fraction, an exponent, a suffix (k, M, B, T).
_COUNT = re.compile(r"([1-9]\d{0,2}(,\d{3})+|\d+)?(\.\d*)?([eE][+-]?\d*)?([kKMBGT])?")
# A rate: digits, a fraction (after a point or a decimal comma: "0,001" is 0.001), an exponent.
_RATE = re.compile(r"(\d+)?([.,]\d*)?([eE][+-]?\d*)?")


def parse_number(text: str, counts: bool = True) -> float | None:
    """The number ``text`` reads as, or None; ``counts`` allows comma groups and k/M/B/T suffixes. A leading
    sign is read: a minus (a field refuses the negative number as out of its range, it does not drop the sign),
    a plus as the spin boxes of counts take it (it sent a budget or a seed back to the value before)."""
    text = text.strip()
    if text[:1] in ("-", "+"):
        if text[1:2] in ("-", "+"):
            return None
        value = parse_number(text[1:], counts)
        return None if value is None else -value if text[0] == "-" else value
    match = (_COUNT if counts else _RATE).fullmatch(text)
    if match is None or not re.search(r"\d", text.split("e")[0].split("E")[0]):
        return None
    scale = 1.0
    if counts and text[-1] in SUFFIXES:
        scale, text = SUFFIXES[text[-1]], text[:-1]
    try:
        value = float(text.replace(",", "") if counts else text.replace(",", ".")) * scale
    except ValueError:  # an exponent still being typed: "1e", "1e-"
        return None
    return value if math.isfinite(value) else None


class _KeepsValueBefore:
    """Remembers the value a spin box had when the user began this edit (Qt updates ``value()`` with every
    acceptable keystroke: "3" of "3.5" is already 3): on focus, after each edit ended (Enter), after each step
    of the arrows."""

    def focusInEvent(self, event: QFocusEvent) -> None:  # noqa: N802 (Qt's name)
        self._before = self.value()
        super().focusInEvent(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        super().keyPressEvent(event)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):  # the edit is over: the next one starts here
            self._before = self.value()

    def stepBy(self, steps: int) -> None:  # noqa: N802 (Qt's name)
        super().stepBy(steps)
        self._before = self.value()

    def _value_before(self) -> str:
        return self.textFromValue(getattr(self, "_before", self.value()))


class NumberField(_KeepsValueBefore, QDoubleSpinBox):
    """A number typed freely, within ±``maximum``. ``integer``: a count (budget, seed), shown with comma groups;
    else a rate (the learning rate), shown in its shortest form and stepped along 1-2-5 per decade. Its arrows
    stop at 0; a negative number typed is kept, for the config to refuse under the field, never taken as 0."""

    def __init__(self, name: str, maximum: float, integer: bool) -> None:
        super().__init__()
        self.setObjectName(name)
        self._integer = integer
        self.setDecimals(30)  # value() rounds to this many decimals: a rate of 1e-12 must stay itself
        self.setRange(-maximum, maximum)
        # A number past the range becomes its nearest bound once the field is left (fixup), as the field then
        # shows: never the value of the digits typed so far (2000 in a field of at most 1000 was once 200).
        self.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
        self.setSingleStep(1.0)

    def number(self) -> int | float:
        """The value as the config takes it: an int where it is whole (a count typed as 2.5M is one)."""
        value = self.value()
        return int(value) if value.is_integer() else value

    # Qt's hooks: what text is a number, and how a number reads.
    def validate(self, text: str, pos: int):
        stripped = text.strip()
        value = parse_number(stripped, self._integer)
        if value is not None and self.minimum() <= value <= self.maximum():
            return QValidator.State.Acceptable, text, pos
        # Out of range (its bound when the field is left), a number still being typed, or no number at all
        # (the value before the edit when the field is left): shown as typed, never cut to the characters Qt
        # could hold ("2.5M" in the rate field was taken as 2.5).
        return QValidator.State.Intermediate, text, pos

    def valueFromText(self, text: str) -> float:
        value = parse_number(text, self._integer)
        return self.value() if value is None else value

    def textFromValue(self, value: float) -> str:
        if self._integer and float(value).is_integer():
            return f"{int(value):,}"
        return f"{value:.6g}"

    def fixup(self, text: str) -> str:
        value = parse_number(text, self._integer)
        if value is None:  # left empty or half typed ("-", "1e"): never 0, the value it had
            return self._value_before()
        return self.textFromValue(min(max(value, self.minimum()), self.maximum()))

    def stepBy(self, steps: int) -> None:
        if self._integer:
            super().stepBy(steps)
            return
        value = self.value()
        for _ in range(abs(steps)):
            value = _ladder(value, up=steps > 0)
        self.setValue(min(max(value, self.minimum()), self.maximum()))
        self._before = self.value()

    def stepEnabled(self):
        flags = QAbstractSpinBox.StepEnabledFlag.StepNone
        if self.value() < self.maximum():
            flags |= QAbstractSpinBox.StepEnabledFlag.StepUpEnabled
        if self.value() > 0:
            flags |= QAbstractSpinBox.StepEnabledFlag.StepDownEnabled
        return flags


def _ladder(value: float, up: bool) -> float:
    """The next value of the 1-2-5 series per decade (… 1e-4, 2e-4, 5e-4, 1e-3 …) above or below ``value``."""
    if value <= 0:
        return 1e-6 if up else 0.0
    decade = 10.0 ** math.floor(math.log10(value))
    rungs = [decade * m for m in (0.5, 1, 2, 5, 10, 20)]
    tolerance = value * 1e-9
    if up:
        return next(r for r in rungs if r > value + tolerance)
    return next(r for r in reversed(rungs) if r < value - tolerance)


class BoundedSpin(_KeepsValueBefore, QSpinBox):
    """An integer spin box whose number typed past the range becomes the nearest bound (2048 -> 1024, -2 -> 1),
    where Qt's own refuses the keystroke that leaves the range (2048 -> 204, -2 -> 2, 3.5 -> 35); a fraction, or
    nothing, gives back the value it had before the edit."""

    def __init__(self, name: str, lo: int, hi: int, step: int = 1) -> None:
        super().__init__()
        self.setObjectName(name)
        self.setRange(lo, hi)
        self.setSingleStep(step)
        self.setGroupSeparatorShown(True)
        self.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)

    def _typed(self, text: str) -> str:
        """The number typed, without its suffix; its commas kept, as only whole groups of three are groups. The
        suffix typed with the number is one too: Ctrl+A selects the number alone, and "50%" typed over it reads
        "50% %" (refused, the value before came back without a word)."""
        text, suffix = text.strip(), self.suffix().strip()
        while suffix and text.endswith(suffix):
            text = text.removesuffix(suffix).strip()
        unit = suffix.split()[0] if suffix else ""  # "%" of "% of budget": the part a user types with a number
        return text.removesuffix(unit).strip() if unit else text

    def validate(self, text: str, pos: int):
        state = super().validate(text, pos)
        state = state[0] if isinstance(state, tuple) else state
        if state == QValidator.State.Invalid or (state == QValidator.State.Acceptable
                                                 and "," in text and parse_number(self._typed(text)) is None):
            # Past the range, negative, a fraction, "5e9", "0x10": shown as typed, judged once the field is left
            # (fixup), where Qt dropped the keystroke and kept the rest ("5e9" became 59). Qt also takes any
            # comma for a group separator: "1,5" (a decimal comma) was 15.
            return QValidator.State.Intermediate, text, pos
        return state, text, pos

    def fixup(self, text: str) -> str:
        value = parse_number(self._typed(text))  # "5e9", "2k" and "1,024" are whole numbers too
        if value is not None and value.is_integer():
            return self.textFromValue(int(min(max(value, self.minimum()), self.maximum())))
        return self._value_before()
