"""``speedboard tune``: the speed advisor on the command line (the engine is ``core.tune``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _positive_number(text: str) -> float:
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    from core.config import MAX_COUNT

    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 2**63 - 1, got {value}")
    return value


def _precisions(text: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not values or any(v not in ("fp32", "bf16", "fp16") for v in values):
        raise argparse.ArgumentTypeError(f"expected fp32, bf16 or fp16 separated by commas, got {text!r}")
    return values


def add_tune_command(sub: argparse._SubParsersAction,
                     add_settings_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    # No import of core.tune here: building the parser must not load torch (every command builds it).
    u = sub.add_parser("tune", help="find the fastest settings for this machine (short interleaved trials)",
                       description="Trains the current settings and their alternatives (compile modes, precisions, "
                                   "micro-batch × accumulation splits of the same effective batch) for a few steps "
                                   "each, interleaved, and recommends the fastest whose loss agrees. Takes the "
                                   "settings flags of train; its budget flags are not used (every trial trains "
                                   "the same few steps).")
    # One prefix for every tune error: the flag errors as the checks' own (``speedboard: error: …``).
    u.error = lambda message: u.exit(2, f"speedboard: error: {message}\n")
    add_settings_flags(u)
    u.add_argument("--budget-seconds", type=_positive_number,
                   help="time for all the trials (estimated up front; default 600)")
    from core.cli import path_arg

    u.add_argument("--json", type=path_arg, help="write the report here (default: the per-user data folder's tune/)")
    u.add_argument("--trial-steps", type=_count, help="timed optimizer steps per trial, after its warm-up (default 3)")
    u.add_argument("--repeats", type=_count, help="interleaved repeats of all the trials (default 2)")
    u.add_argument("--precisions", type=_precisions,
                   help="precisions to try (default: fp32, and bf16 where the device runs it)")
    u.add_argument("--cells", help="only the settings whose names match these comma-separated shell patterns, "
                                   "e.g. 'off-*,default-model-a1-*' (the current settings are always measured)")
    u.set_defaults(resume=None, init_from=None, fsdp=None)


class TuneConsole:
    """One line per trial as it ends; best-effort like the train command's console."""

    def __init__(self) -> None:
        self.ok = True

    def say(self, text: str) -> None:
        if not self.ok:
            return
        try:
            print(text, flush=True)
        except OSError:  # a closed pipe or terminal: the tune goes on, its report is still written
            self.ok = False

    def __call__(self, event) -> None:
        from core.tune import TrialFinished, TrialStarted

        if isinstance(event, TrialStarted):
            self._started = event
        elif isinstance(event, TrialFinished):
            r, started = event.result, self._started
            where = f"[{started.index}/{started.total}] {started.label}"
            if r["error"]:
                self.say(f"{where}: FAILED: {r['error']}")
                return
            compile_s = r["compiler_seconds"] if r["compiler_seconds"] is not None else r["compile_seconds"]
            extra = f", compile {compile_s:.1f} s" if compile_s else ""
            # The median step, as the table counts it: the whole window's mean would carry a first trial's
            # one-time set-up (a 7 s step among 0.6 s ones) and disagree with the table's row.
            rate = r["median_tokens_per_s"]
            self.say(f"{where}: {rate:,.0f} tok/s (median step), loss {r['losses'][-1]:.4f}{extra}"
                     f"  (about {event.eta_seconds / 60:.1f} min left)")


def _planned(config, options, plan_tune, cancelled):
    """``plan_tune``, said on a terminal while it runs (and erased after): it prepares the corpus and measures the
    machine (matmul peaks, auto's probe, a few passes), seconds to minutes with nothing else on the screen."""
    import sys

    shown = sys.stderr.isatty()
    if shown:
        sys.stderr.write("speedboard tune: planning: checking the settings, preparing the corpus, measuring this "
                         "machine …")
        sys.stderr.flush()
    try:
        return plan_tune(config, options, cancelled=cancelled)
    finally:
        if shown:
            sys.stderr.write("\r\033[K")  # the line goes: the plan, or the one error line, takes its place
            sys.stderr.flush()


def cmd_tune(args: argparse.Namespace, argv: list[str]) -> int:
    from core.cli import _interruptible, config_from_args
    from core.control import Control
    from core.errors import ConfigError
    from core.tune import (
        ReportNotSaved,
        TuneOptions,
        check_report_path,
        default_report_path,
        format_report,
        not_tried,
        plan_tune,
        run_tune,
    )

    # Everything is checked before the first trial: a mistake is one line and exit code 2.
    given = {"budget_seconds": args.budget_seconds, "steps": args.trial_steps, "repeats": args.repeats}
    options = TuneOptions(**{k: v for k, v in given.items() if v is not None}, precisions=args.precisions,
                          patterns=args.cells)
    report_path = check_report_path(args.json) if args.json is not None else None
    config = config_from_args(args)
    if report_path is None:
        try:
            report_path = check_report_path(default_report_path(config), flag=None)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; give --json FILE to write it elsewhere", "json") from None
    control = Control()
    console = TuneConsole()
    # Ctrl-C or SIGHUP: stop (while planning: nothing measured, nothing kept; in the trials: report what was
    # measured); SIGTERM: end now (143). Planning too: a closed terminal killed it with a token store half written.
    with _interruptible(control):
        plan = _planned(config, options, plan_tune, cancelled=lambda: control.stop_requested)
        console.say(f"speedboard tune: {config.preset} on {plan.device_name}, effective batch "
                    f"{config.train.micro_batch * config.train.accum_steps} × {config.data.seq_len} tokens; "
                    f"{plan.describe()}")
        left_out = not_tried(plan.to_dict())
        if left_out:
            console.say(f"not tried: {', '.join(x['cell'] + ' (' + x['reason'] + ')' for x in left_out[:3])}"
                        + (f" and {len(left_out) - 3} more" if len(left_out) > 3 else ""))
        try:
            report = run_tune(plan, console, cancelled=lambda: control.stop_requested, report_path=report_path,
                              keep_existing=args.json is None)  # a default name never replaces a report
        except ReportNotSaved as exc:
            # The measurements are shown before the error line: they took the whole budget to make.
            console.say("")
            console.say(format_report(exc.report))
            raise
    console.say("")
    console.say(format_report(report))
    console.say(f"report: {report['path']}")
    # Cut short (Ctrl-C, a closed terminal): 130, as while planning and as the bench, so that a script tells a
    # cancelled tune from a finished one; what was measured is printed and saved either way.
    return 130 if report.get("cancelled") else 0
