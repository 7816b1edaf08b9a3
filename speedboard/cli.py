"""``speedboard train | generate | export | bench | gui``: one command line over the engine and its front ends."""

from __future__ import annotations

import argparse
import sys

from core.interrupts import end_at_once_on_signals, install_start_handlers

install_start_handlers()  # first: Ctrl-C, kill -INT (a background job too) and SIGTERM, never mid-import

from core import cli as _cli  # noqa: E402 - after the handler
from core.cli import DESCRIPTION, EXIT_USAGE, OneLineParser, add_commands, run_command  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="speedboard", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    add_commands(sub)
    b = sub.add_parser("bench", help="benchmark compile modes × accumulation", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER, help="options of the benchmark (speedboard bench --help)")
    sub.add_parser("gui", help="open the dashboard")
    return parser


def _bench(args: list[str]) -> int:
    from bench.run import main as bench_main

    return bench_main(args)


def _gui() -> int:
    try:
        from gui.app import main as gui_main
    except ImportError as exc:
        print(f"speedboard: error: the dashboard needs PySide6 and pyqtgraph ({exc})", file=sys.stderr)
        return EXIT_USAGE
    return gui_main()


def main(argv: list[str] | None = None) -> int:
    install_start_handlers()  # again: main may be called without this module's import (tests, a second call)
    _cli.console_writes_every_line()
    if (problem := _cli.working_folder_problem()) is not None:
        print(f"speedboard: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options, --help included
        return _bench(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except KeyboardInterrupt as exc:
        return _cli.interrupted(exc)
    if args.command == "gui":
        return _gui()
    return run_command(args, argv)


def entry() -> int:
    """The ``speedboard`` command: ``main``, then its exit, which a signal ends at once (no traceback)."""
    code = main()
    end_at_once_on_signals()
    return code


if __name__ == "__main__":
    sys.exit(entry())
