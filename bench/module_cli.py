"""What every ``python -m bench.<module>`` shares with ``speedboard bench``: a parser whose mistakes are one line and
exit code 2, argument types that check their range before anything is measured, and an entry point that turns a
user's mistake found later (a ``SpeedboardError``: an unknown preset, a device that is absent) or Ctrl-C into one
line instead of a traceback."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

from core.cli import OneLineParser, _number
from core.config import MAX_COUNT
from core.errors import SpeedboardError

EXIT_INTERRUPTED = 130


def module_parser(module: str, doc: str | None = None) -> OneLineParser:
    """The parser of ``python -m bench.<module>``; its description is the first line of ``doc``."""
    return OneLineParser(prog=f"python -m bench.{module}", description=doc.strip().splitlines()[0] if doc else None)


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer from ``low`` to the 64-bit counters every count ends up in."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {low}, got {value}")
        if value > MAX_COUNT:
            raise argparse.ArgumentTypeError(f"expected an integer ≤ 2**63 - 1, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """A finite number above zero (NaN and inf refused)."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def positive_numbers(text: str) -> tuple[float, ...]:
    """A comma-separated list of positive numbers, at least one."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers, got {text!r}")
    return tuple(positive_number(part) for part in parts)


def output_file(text: str) -> Path:
    """A file the results go to, checked before anything is measured (a path that cannot be written was a
    traceback at the end, everything measured lost), as ``speedboard tune`` checks its report's
    (``core.tune.check_report_path``: not a folder or a device, its folder writable, a file creatable there)."""
    from core.errors import ConfigError
    from core.tune import check_report_path

    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got an empty one")
    try:
        return check_report_path(text, flag=None, what="the results file")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def write_output(path: Path, text: str) -> None:
    """``text`` into ``path`` (its folder made); a write that fails after all (a full disk) is one line."""
    from core.paths import why_write_failed

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SpeedboardError(f"cannot write {path}: {why_write_failed(exc, path.parent)}") from None


def run_module(main: Callable[[], int], module: str) -> int:
    """``main()``, with a mistake found after parsing said as one line (exit 2) and Ctrl-C as one line (130)."""
    prog = f"python -m bench.{module}"
    try:
        return main()
    except SpeedboardError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
