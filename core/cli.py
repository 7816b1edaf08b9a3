"""The engine's commands: ``train``, ``prepare``, ``generate``, ``export``.

``speedboard`` (the ``speedboard`` package) adds the benchmark and the
dashboard to these; this module is also the torchrun entry point:
``torchrun --nproc-per-node N -m core.cli train …``. Every user mistake prints
one line and exits with code 2.

Console output is best-effort: a closed pipe (``| head``) or a closed terminal
silences it, and training, checkpoints and the run folder go on. Every path a
user gives is resolved once, by ``core.paths.user_path``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from typing import Any

from core.interrupts import DiscardedRaiser, install_start_handlers
from core.json_text import parse_json

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2, not a usage dump. Flags are taken only
    whole: an abbreviation (``--ru`` for ``--run-id``) read here would reach torchrun's own parser with
    ``--nproc``, where it is ambiguous, after the data was prepared."""

    _NEGATIVE_NUMBER = re.compile(r"-\.?\d|-(inf|infinity|nan)$", re.IGNORECASE)
    """A value that begins so is a (negative) number, not a flag (every flag here begins with ``--``): argparse
    before Python 3.13 took only ``-1`` and ``-0.5`` for numbers, and ``--lr -1e-3`` read "expected one
    argument" instead of the setting's own message."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self._NEGATIVE_NUMBER

    def error(self, message: str) -> None:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _integer(text: str) -> int:
    """An integer; its range is checked by the config it lands in, whose message names the setting."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return value


def _at_least_one(text: str) -> int:
    """An integer ≥ 1, for the settings that belong to the command line alone (``--log-every``)."""
    from core.config import MAX_COUNT

    value = _integer(text)
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 2**63 - 1, got {value}")
    return value


def _micro_batch(text: str) -> int | str:
    """``auto`` or an integer (its range is checked by the config)."""
    return "auto" if text.strip().lower() == "auto" else _integer(text)


def path_arg(text: str) -> str:
    """A path as the user meant it: ``~`` expanded, absolute (see ``core.paths.user_path``)."""
    from core.paths import unnameable, user_path

    if not text.strip():  # "" would silently mean the current folder
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    if (why := unnameable(text)) is not None:
        raise argparse.ArgumentTypeError(why)
    return str(user_path(text))


def _number(text: str) -> float:
    try:
        return float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


DESCRIPTION = "Train a Llama-style model; see what torch.compile and gradient accumulation buy."


def build_parser() -> argparse.ArgumentParser:
    """The parser of the engine's commands (``speedboard`` adds the benchmark and the dashboard)."""
    parser = OneLineParser(prog="speedboard", description=DESCRIPTION)
    add_commands(parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser))
    return parser


DATA_HELP = ("'builtin', a .txt/.md/.jsonl(.gz/.zst)/.parquet/.arrow file, a folder of one of these formats, "
             "a Hugging Face save_to_disk folder, or hf:NAME[:CONFIG[:SPLIT]]")


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-field", help="text column of Parquet/Arrow/hub data, text key of JSONL (default: text)")
    p.add_argument("--tokenizer", help="an existing tokenizer.json to use instead of training one")
    p.add_argument("--tokenizer-docs", type=_integer, dest="tokenizer_train_docs",
                   help="documents (the corpus' first) a new tokenizer is trained on (default 100000; 64 Mi "
                        "characters at most)")


def _add_settings_flags(t: argparse.ArgumentParser) -> None:
    """The settings of a run: model, data, batch, speedups, schedule (``train`` and ``tune`` take them all)."""
    from core.config import COMPILE_MODES, COMPILE_SCOPES, LAYOUTS, PRECISIONS, PRESETS, TrainConfig

    t.add_argument("--preset", choices=list(PRESETS), help="model size (default: tiny on CPU, small on a GPU)")
    t.add_argument("--data", help=DATA_HELP)
    _add_data_flags(t)
    t.add_argument("--layout", choices=LAYOUTS)
    t.add_argument("--vocab-size", type=_integer)
    budget = t.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=_integer, help="budget in optimizer steps")
    budget.add_argument("--tokens", type=_number, help="budget in tokens (e.g. 2e6)")
    budget.add_argument("--epochs", type=_number, help="budget in passes over the training samples")
    t.add_argument("--micro-batch", type=_micro_batch,
                   help="sequences per forward/backward pass; 'auto': the preset's (or the resumed or --config "
                        "run's), lowered to the largest that fits in memory with --accum raised to keep the "
                        "effective batch")
    t.add_argument("--accum", type=_integer, help="micro-batches per optimizer step")
    t.add_argument("--seq-len", type=_integer)
    t.add_argument("--lr", type=_number)
    t.add_argument("--min-lr", type=_number)
    t.add_argument("--warmup", type=_number, help="warmup as a share of the budget (default 0.05)")
    t.add_argument("--weight-decay", type=_number)
    t.add_argument("--grad-clip", type=_number)
    t.add_argument("--compile", choices=COMPILE_MODES, dest="compile_mode")
    t.add_argument("--compile-scope", choices=COMPILE_SCOPES)
    t.add_argument("--precision", choices=PRECISIONS)
    t.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps")
    t.add_argument("--seed", type=_integer, help=f"weights and sample order (default {TrainConfig.seed})")
    t.add_argument("--out", type=path_arg, help="folder for run folders (default: runs/ in the per-user data folder)")
    t.add_argument("--eval-every", type=_integer)
    t.add_argument("--eval-batches", type=_integer)
    t.add_argument("--sample-every", type=_integer)
    t.add_argument("--save-every", type=_integer)
    t.add_argument("--keep", type=_integer, help="periodic checkpoints to keep")
    t.add_argument("--config", type=path_arg,
                   help="a run configuration JSON file (RunConfig.to_dict()); flags override it")


def add_commands(sub: argparse._SubParsersAction) -> None:
    from core.config import PRESETS

    t = sub.add_parser("train", help="train a model (headless)")
    _add_settings_flags(t)
    start = t.add_mutually_exclusive_group()
    start.add_argument("--resume", type=path_arg, help="checkpoint (or run folder) to continue exactly; its settings "
                                                     "are the defaults, flags override them")
    start.add_argument("--init-from", type=path_arg,
                       help="checkpoint, run folder, Hugging Face folder or .pt/.pth/.bin/.ckpt/.safetensors "
                            "weights to start a new run from (fresh optimizer and schedule); a bare state dict's "
                            "architecture is read from its tensors, or given by --preset/--config")
    t.add_argument("--log-every", type=_at_least_one, default=10, help="steps between printed lines (default 10)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--nproc", type=_integer, help="processes (GPUs, or CPU processes) via torchrun")
    t.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=None,
                   help="with several processes: shard the model and optimizer state (FSDP2) instead of DDP; "
                        "--no-fsdp: DDP (a resumed FSDP run keeps FSDP otherwise)")
    t.add_argument("--run-id", help="name of the run folder to create (default: date, settings, random suffix)")

    from core.tune_cli import add_tune_command

    add_tune_command(sub, _add_settings_flags)

    p = sub.add_parser("prepare", help="tokenize a corpus into its token store ahead of training")
    p.add_argument("data", nargs="?", help=DATA_HELP)
    p.add_argument("--preset", choices=list(PRESETS),
                   help="take the preset's vocabulary size, as train --preset does (default: tiny on CPU, "
                        "small on a GPU)")
    p.add_argument("--vocab-size", type=_integer)
    _add_data_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list the prepared token stores (DATA's, when given)")
    p.add_argument("--remove", action="store_true",
                   help="remove the token stores of DATA (all its tokenizers and text fields, and those of its "
                        "earlier versions; only those of --text-field when given) and the tokenizers trained on it, "
                        "or those of every corpus with 'all'")

    g = sub.add_parser("generate", help="generate text from a run or checkpoint")
    g.add_argument("checkpoint", type=path_arg,
                   help="run folder, checkpoint folder, Hugging Face folder, or a .pt/.pth/.bin/.ckpt/.safetensors "
                        "state dict")
    g.add_argument("--tokenizer", type=path_arg, help="tokenizer.json for a checkpoint without one (a bare state dict)")
    g.add_argument("--preset", choices=list(PRESETS),
                   help="the architecture of a bare state dict whose tensors do not tell it")
    g.add_argument("--config", type=path_arg, help="a run configuration JSON file whose model is a bare state dict's")
    g.add_argument("--prompt", default="The")
    g.add_argument("--max-new-tokens", type=_integer, default=64)
    g.add_argument("--temperature", type=_number, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=_integer)
    g.add_argument("--seed", type=_integer, help="of the sampling (default 0; with --temperature > 0 only)")
    g.add_argument("--device", default="auto")

    e = sub.add_parser("export", help="export a checkpoint to another format")
    e.add_argument("checkpoint", type=path_arg)
    e.add_argument("out", type=path_arg)
    e.add_argument("--format", choices=["hf"], default="hf")



# ----------------------------------------------------------------------------- train
def _train_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from core.paths import user_path
    from core.sources import source_location

    # Paths recorded absolute (an empty one is refused by the config as such).
    data = {k: v for k, v in {"source": source_location(args.data) if args.data else args.data,
                              "layout": args.layout, "seq_len": args.seq_len,
                              "vocab_size": args.vocab_size, "text_field": args.text_field,
                              "tokenizer": str(user_path(args.tokenizer)) if args.tokenizer else args.tokenizer,
                              "tokenizer_train_docs": args.tokenizer_train_docs}.items() if v is not None}
    train: dict[str, Any] = {
        "micro_batch": args.micro_batch, "accum_steps": args.accum, "lr": args.lr, "min_lr": args.min_lr,
        "warmup_ratio": args.warmup, "weight_decay": args.weight_decay, "grad_clip": args.grad_clip,
        "compile_mode": args.compile_mode, "compile_scope": args.compile_scope, "precision": args.precision,
        "device": args.device, "seed": args.seed, "eval_every": args.eval_every,
        "eval_batches": args.eval_batches, "sample_every": args.sample_every, "save_every": args.save_every,
        "keep": args.keep, "fsdp": args.fsdp,
    }
    train["budget_given"] = False  # a resumed run's own config.json may say True: not inherited
    for kind in ("steps", "tokens", "epochs"):
        if getattr(args, kind) is not None:
            train["budget_kind"], train["budget"], train["budget_given"] = kind, getattr(args, kind), True
    if args.micro_batch == "auto":
        train["micro_batch"], train["auto_micro_batch"] = None, True
    elif args.micro_batch is not None:
        train["auto_micro_batch"] = False  # an explicit micro-batch is trained as given, or refused
    train = {k: v for k, v in train.items() if v is not None}
    return {"data": data, "train": train}


def config_from_args(args: argparse.Namespace):
    """Preset defaults, then the resumed checkpoint's settings, then explicit flags.

    ``resume``/``init_from`` keep the path as given: a run folder means its newest
    checkpoint when the trainer reads it (a live run may have rotated the one seen here).
    """
    import torch

    from core.checkpoint import cannot_resume, infer_model_config, peek_checkpoint, read_checkpoint
    from core.config import PRESETS, config_from_preset

    overrides: dict[str, Any] = _train_overrides(args)
    file_data = _read_config_data(args.config) if args.config else None
    # A --config file's start checkpoint (the dashboard hands a continued torchrun run over that way; a resumed
    # run's config.json holds one) is checked as the flag's would be; --init-from given beside it replaces it.
    start = _start_in(file_data, args.config) if file_data is not None and not args.init_from else {}
    source = args.resume or args.init_from or start.get("resume") or start.get("init_from")
    resuming = bool(args.resume or start.get("resume"))
    info = peek_checkpoint(source) if source else None  # config.json only; weights load in the trainer
    if resuming and not info.holds_trainer_state:  # before any setting: none can make it resumable
        read_checkpoint(source)  # but damage is said as such (a file that is no weights, a truncated one)
        raise cannot_resume(source)
    _refuse_ignored_flags(args, info, resumed_by=("--resume" if args.resume else
                                                  f"the resume in {args.config}" if resuming else None))
    file_config = _config_beside(file_data, args.config, info) if file_data is not None else None
    own = info.run_config if info is not None else None
    if args.resume:
        base = own or config_from_preset(args.preset or "tiny")
        base = base.replace(resume=source)
    elif file_config is not None:
        base = file_config
        if args.init_from:
            base = base.replace(init_from=source, resume=None)
    else:
        # Weights that bring their architecture train under their own preset's name and settings, unless
        # one is given (it must be theirs): a tiny model is not labelled "small".
        name = args.preset or (own.preset if own is not None and own.preset in PRESETS else None) or \
            ("small" if torch.cuda.is_available() else "tiny")
        base = config_from_preset(name, init_from=source)
    if args.lr is not None and args.min_lr is None:
        # --lr scales the whole schedule: the floor keeps its ratio to the peak (a tenth for a preset; a
        # resumed or --config run's own, e.g. a floor of 0 stays 0).
        ratio = base.train.min_lr / base.train.lr
        overrides["train"]["min_lr"] = args.lr * ratio
    if info is not None and info.model_config is not None:
        overrides["model"] = info.model_config  # the architecture is the checkpoint's own
    elif info is not None and info.kind == "state_dict" and not (args.preset or args.config):
        overrides["model"] = infer_model_config(info.shapes(), str(info.path))  # or one line asking for it
    return base.replace(out_dir=args.out or base.out_dir, **overrides)


def _refuse_ignored_flags(args: argparse.Namespace, info, resumed_by: str | None = None) -> None:
    """Flags a start checkpoint makes void are refused, not recorded and ignored: a seed where the run resumes
    its saved random streams, a warmup where it keeps its lineage's schedule, a preset that is not its
    architecture, and the settings of a new tokenizer where one is given or the checkpoint has its own.
    ``resumed_by`` names what resumes the run ("--resume", a --config file's resume), None for a new run."""
    from core.config import config_from_preset
    from core.errors import ConfigError
    from core.tokenizer import TOKENIZER_FILE

    if resumed_by and args.seed is not None:
        raise ConfigError(f"--seed does not apply to {resumed_by}: a resumed run continues the random streams its "
                          "checkpoint saved, exactly; leave --seed out (or use --init-from for a new run)", "seed")
    if resumed_by and getattr(args, "warmup", None) is not None:
        raise ConfigError(f"--warmup does not apply to {resumed_by}: a resumed run keeps its lineage's warmup (one "
                          "whose parent finished its budget goes on without one); leave --warmup out (or use "
                          "--init-from for a new run)", "warmup_ratio")
    tokenizer = (f"the tokenizer {args.tokenizer}" if args.tokenizer else
                 f"the tokenizer of {info.path}" if info is not None and info.path.is_dir()
                 and (info.path / TOKENIZER_FILE).is_file() else None)
    for flag, value in (("--vocab-size", args.vocab_size), ("--tokenizer-docs", args.tokenizer_train_docs)):
        if value is not None and tokenizer is not None:
            raise ConfigError(f"{flag} is for training a new tokenizer, but this run uses {tokenizer}; "
                              f"leave {flag} out", "tokenizer")
    if info is None or info.model_config is None:
        return
    if args.preset and not config_from_preset(args.preset).model.same_architecture(info.model_config):
        raise ConfigError(f"{info.path} brings its own architecture, not the {args.preset} preset's; leave "
                          f"--preset out (it is for a bare state dict)", "preset")


def _start_in(data: dict[str, Any], path: str) -> dict[str, str]:
    """The start checkpoint a --config file's sections name ({"resume": …} or {"init_from": …}), or none."""
    from core.errors import ConfigError

    start = {key: data[key] for key in ("resume", "init_from") if data.get(key) is not None}
    if any(not isinstance(value, str) or not value.strip() for value in start.values()):
        return {}  # the config's own check says what is wrong with it
    if len(start) > 1:
        raise ConfigError(f"{path} names both a checkpoint to resume and one to start from; keep one", "config")
    return start


def _config_beside(data: dict[str, Any], path: str, info):
    """The --config file's RunConfig from its sections (read once): where it has a "model" section, that must be
    the architecture the start checkpoint ``info`` brings (a config for a bare state dict, refused rather than
    ignored)."""
    from core.errors import ConfigError

    config = _config_of(data, path)
    if info is not None and info.model_config is not None and data.get("model") is not None \
            and not config.model.same_architecture(info.model_config):
        raise ConfigError(f"{info.path} brings its own architecture, not the model of {path}; remove "
                          f"its \"model\" section (it is for a bare state dict) or start from scratch", "config")
    return config


def _read_config_file(path: str):
    """A RunConfig saved as JSON (``RunConfig.to_dict()``, or a run folder's config.json)."""
    return _config_of(_read_config_data(path), path)


def _model_of_config_file(path: str):
    """The model of a configuration file, for ``generate``: its training settings play no part there (a file
    holding only a ``model`` section was refused for the default sequence length, past a small model's
    positions), so a ``model`` section is read alone, still checked as a file a user wrote."""
    from core.config import ModelConfig
    from core.errors import ConfigError

    data = _read_config_data(path)
    if "model" not in data:  # a preset named: the whole file says which model
        return _config_of(data, path).model
    try:
        return ModelConfig.from_dict(data["model"], strict=True)
    except (TypeError, OverflowError) as exc:
        raise ConfigError(f"{path} is not a valid run configuration ({exc})") from None


def _config_of(data: dict[str, Any], path: str):
    """The RunConfig of a configuration file's sections (``_read_config_data``), one line where they hold none."""
    from core.config import RunConfig
    from core.errors import ConfigError

    try:
        return RunConfig.from_dict(data, strict=True)
    except (TypeError, OverflowError) as exc:  # OverflowError: a number too large for a float (lr: 1e400 as an int)
        raise ConfigError(f"{path} is not a valid run configuration ({exc})") from None


def _read_config_data(path: str) -> dict[str, Any]:
    """The sections a configuration file gives, as written (a run folder's config.json: its ``config``)."""
    import stat

    from core.errors import ConfigError
    from core.paths import user_path

    try:
        if not stat.S_ISREG(os.stat(user_path(path)).st_mode):  # a FIFO or a device would block or never end
            raise ConfigError(f"the configuration file {path} is not a regular file", "config")
        # A byte order mark (Windows' editors) is no JSON; a key given twice was taken as its last value.
        data = parse_json(user_path(path).read_text(encoding="utf-8-sig"), unique_keys=True)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError and every JSON damage
        raise ConfigError(f"cannot read the configuration file {path} ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        # A run folder's config.json holds the RunConfig under "config"; a setting written beside it (an edit
        # at the wrong level) was silently ignored.
        from core.runs import RUN_CONFIG_KEYS

        beside = sorted(k for k in data if k not in RUN_CONFIG_KEYS)
        if beside:
            raise ConfigError(f"{path}: unknown key '{beside[0]}' beside 'config', which holds a run folder's "
                              f"settings; move it into 'config' (or remove it)", "config")
        data = data["config"]
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a run configuration (a JSON object)")
    from core.checkpoint import FORMAT

    if data.get("format") == FORMAT:  # was "unknown key 'format' in the configuration"
        folder = user_path(path).parent
        raise ConfigError(f"{path} is a checkpoint's config.json, not a run configuration: give the checkpoint "
                          f"folder itself ({folder}), which brings its model, tokenizer and settings, or its run "
                          f"folder's config.json", "config")
    return data


def silence_stream(stream) -> None:
    """Send what is still buffered for ``stream``, and all it gets later, to the null device.

    After a closed pipe Python would otherwise report the failed flush when it exits.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to flush at exit
        pass


class ConsoleSink:
    """A progress bar with ETA and one readable line every ``log_every`` steps.

    Best-effort: a console that cannot be written (a closed pipe, ``| head``, or
    a closed terminal) is silenced; the run, which never depends on it, goes on.
    """

    def __init__(self, log_every: int, progress: bool) -> None:
        assert log_every >= 1, log_every  # the parser refuses anything else
        self.log_every = log_every
        self.progress = progress
        self.bar = None
        self.lines_ok = True
        """Lines can still be written to stdout."""
        self.mem_baseline_gib = 0.0
        """What the process held before the model existed (``RunStarted``): step lines show the training's own."""

    def _print(self, text: str) -> None:
        if not self.lines_ok:
            return
        try:
            if self.bar is not None:
                self.bar.write(text)
            else:
                print(text, flush=True)
        except OSError:  # BrokenPipeError, or EIO from a terminal that is gone
            self.lines_ok = False
            silence_stream(sys.stdout)

    def _say(self, line) -> None:
        if line.level == "info":
            self._print(line.text)
        else:
            self._warn(f"{line.level}: {line.text}")

    def _warn(self, text: str) -> None:
        """A warning goes where errors go (standard error), so that ``> log`` keeps the steps and the terminal
        still shows what went wrong, and the final error line's "see the warning above" is true."""
        try:
            if self.bar is not None:
                self.bar.write(text, file=sys.stderr)
            else:
                print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):  # a closed or absent standard error: nowhere left to say it
            pass

    def _drop_bar(self) -> None:
        bar, self.bar, self.progress = self.bar, None, False
        try:
            bar.close()
        except (OSError, ValueError):
            pass
        silence_stream(sys.stderr)

    def __call__(self, event) -> None:
        from core import events as ev
        from core.event_text import event_line, step_line

        if isinstance(event, (ev.DataPreparationStarted, ev.DataPreparationProgress, ev.DataPrepared)):
            self._data_event(event)
            return
        if isinstance(event, ev.StepMetrics):
            if self.bar is not None:
                try:
                    # The step's figures first, then the count, whose update draws the bar: the other way round
                    # drew each step's count beside the step before's loss and tokens/s.
                    self.bar.set_postfix(loss=f"{event.loss:.3f}", tok_s=f"{event.tokens_per_s:,.0f}",
                                         refresh=False)
                    self.bar.update(event.step - self.bar.n)
                except OSError:
                    self._drop_bar()
            if event.step % self.log_every == 0:
                self._print(step_line(event, self.mem_baseline_gib))
            return
        if isinstance(event, ev.RunStarted):
            self.mem_baseline_gib = event.mem_baseline_gib
        if isinstance(event, (ev.RunFinished, ev.RunFailed)):
            self.close()
        if isinstance(event, ev.SampleGenerated):
            self._print(f"sample at step {event.step}: {event.text!r}")
        elif isinstance(event, ev.RunFailed):
            return  # the command's own error line says it
        line = event_line(event)
        if line is not None:
            self._say(line)
        if isinstance(event, ev.RunStarted) and self.progress:
            from tqdm import tqdm

            try:
                self.bar = tqdm(total=event.total_steps, initial=event.start_step, unit="step",
                                dynamic_ncols=True, leave=False, file=sys.stderr)
            except OSError:
                self.progress = False

    def close(self) -> None:
        if self.bar is not None:
            try:
                self.bar.close()
            except OSError:
                silence_stream(sys.stderr)
            self.bar = None

    def _data_event(self, event) -> None:
        """Preparation: a byte (or document) bar with ETA on a terminal, a line every 30 s elsewhere."""
        import time

        from core import events as ev
        from core.event_text import data_progress_line, event_line

        if isinstance(event, ev.DataPreparationProgress):
            total = event.bytes_total or event.documents_total
            done = event.bytes_done if event.bytes_total else event.documents_done
            if event.stage == "tokenizer-training":  # one event, no progress to draw: a line
                self.close()
                self._print(data_progress_line(event))
            elif self.progress:
                from tqdm import tqdm

                key = (event.stage, bool(event.bytes_total))
                if self.bar is None or getattr(self, "_bar_key", None) != key:
                    self.close()
                    unit = "B" if event.bytes_total else "doc"
                    self.bar = tqdm(total=total, unit=unit, unit_scale=True, dynamic_ncols=True, leave=False,
                                    desc=event.stage, file=sys.stderr)
                    self._bar_key = key
                self.bar.set_postfix(tokens=f"{event.tokens_done:,}", refresh=False)
                self.bar.update(max(0, done - self.bar.n))
            elif time.monotonic() - getattr(self, "_last_line", 0.0) >= 30 or event.stage == "waiting":
                self._last_line = time.monotonic()
                self._print(data_progress_line(event))
            return
        self.close()
        line = event_line(event)
        if line is not None:
            self._say(line)


def _without_option(argv: list[str], name: str, takes_value: bool = True) -> list[str]:
    """``argv`` without ``--name VALUE`` / ``--name=VALUE`` (as argparse reads them)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = takes_value
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def _handover_to_torchrun(args: argparse.Namespace, argv: list[str]) -> int:
    """``--nproc N``: run this command in N processes under PyTorch's own launcher, torchrun.

    The configuration is checked here first, and the run folder named, so the
    exit code can follow the run's outcome (see ``core.launch.run_torchrun``).
    """
    from core.control import Control
    from core.errors import Cancelled, ConfigError
    from core.launch import (
        LAUNCH_EVENTS_ENV,
        check_before_launch,
        check_nproc,
        crowded_cpu,
        event_line,
        follow_the_dashboard,
        run_torchrun,
        worker_env,
    )
    from core.runs import check_run_root, plan_run_dir

    if os.environ.get(LAUNCH_EVENTS_ENV) == "1":  # started by the dashboard: stops with its window, alone
        follow_the_dashboard()
    config = config_from_args(args)
    check_nproc(args.nproc, config.train.device)
    check_run_root(config.out_dir)  # one line here, not one traceback per process
    run_id, run_dir = plan_run_dir(config, args.nproc, args.run_id)
    if run_dir.exists():
        raise ConfigError(f"run folder {run_dir} already exists; choose another run id", "run_id")
    # Everything one process checks before it starts, checked here once: the corpus is prepared into
    # its token store (the workers then only open it), the samples, the model and its memory.
    control = Control()
    console = ConsoleSink(1, progress=not args.no_progress and sys.stderr.isatty())

    def sink(event) -> None:
        console(event)
        if os.environ.get(LAUNCH_EVENTS_ENV) == "1":  # the dashboard's launcher: its preparation's progress too
            print(event_line(event), flush=True)

    try:
        with _interruptible(control):
            check_before_launch(config, args.nproc, sink=sink, should_stop=lambda: control.stop_requested)
    finally:
        console.close()
    if control.stop_requested:  # a stop that came while the checks ran no step of theirs could poll
        raise Cancelled("stopped before training began; nothing was started or kept")
    crowded = crowded_cpu(args.nproc, config.train.device)
    if crowded:  # once the job is sure to start: a refused one says its one line alone
        print(f"warning: {crowded}", file=sys.stderr, flush=True)
    rest = _without_option(_without_option(argv, "--nproc"), "--run-id")
    return run_torchrun(args.nproc, [*rest, "--run-id", run_id], run_dir,
                        env=worker_env(args.nproc, config.train.device))


def _stop_on_first_sigint(control, grace_s: float | None = None):
    """A SIGINT handler: the first Ctrl-C asks the work to stop at its next safe point, the second aborts.

    As for ``train`` (``core.stopping``): Python discards an exception raised while it runs a weakref
    callback (frequent during a tune trial's torch.compile), so the abort is raised again outside it
    (``DiscardedRaiser``) and also arms a watchdog that ends the process ``grace_s`` seconds later; any
    further Ctrl-C ends it at once.
    """
    import threading

    from core.stopping import ABORT_GRACE_S, InterruptClock, abort_on_interrupt_again, exit_now

    def watchdog():
        threading.Event().wait(ABORT_GRACE_S if grace_s is None else grace_s)
        _error_line("speedboard: aborted")
        exit_now(130)

    again = DiscardedRaiser(signal.SIGINT)
    clock = InterruptClock()

    def handler(signum, frame):
        presses = clock.presses()
        if not presses:
            return  # the same Ctrl-C, delivered twice
        if control.stop_requested or presses > 1:  # two pressed during one native call: the second aborts
            abort_on_interrupt_again(clock)
            threading.Thread(target=watchdog, name="speedboard-abort-watchdog", daemon=True).start()
            exc = KeyboardInterrupt()
            again.arm(exc)  # raised again should Python discard it
            raise exc
        print("\nstopping … (Ctrl-C again to abort)", file=sys.stderr, flush=True)
        control.stop()

    handler.again = again  # disarmed by ``_interruptible`` once the work is over
    handler.clock = clock  # watched while the handler is installed (``_interruptible``)
    return handler


@contextlib.contextmanager
def _terminable():
    """SIGTERM ends the work now, as an exception (``JobTerminated``) that lets it remove what it had begun to
    write (an export's temporary folder, a tune trial's run folder) and end what it printed (generate's line);
    ``_run_command`` says so in one line, exit code 143. A second SIGTERM ends the process at once. SIGHUP (the
    terminal closed) does the same with exit code 129 where nothing else answers it (export, generate; prepare
    and tune stop gently on it, ``_interruptible``): its default killed the process with the folder half written.

    Python discards an exception raised while it runs a weakref callback (frequent during torch.compile: the
    work went on, or a tune finished and exited 0): such a discarded ``JobTerminated`` is raised again at once
    (``DiscardedRaiser``), and a watchdog ends the process should it still not have left the work. Either forced
    exit removes what the work was writing (``core.stopping.exit_now``).

    Work cut short (SIGTERM, Ctrl-C, a stop) may leave a worker thread in native code, a tokenizer still training:
    the process then ends as soon as the command has said why, not in Python's shutdown, which would abort it
    (``core.stopping.leave_workers``)."""
    import threading

    from core.errors import Cancelled, JobTerminated
    from core.stopping import ABORT_GRACE_S, HungUp, exit_now, leave_workers

    unwound = threading.Event()  # the exception left the work: the caller ends the process itself
    again = DiscardedRaiser(signal.SIGTERM)

    def end_now(exc: JobTerminated) -> None:
        _error_line(f"speedboard: {exc}")
        exit_now(_signal_exit_code(exc))

    def watchdog(exc: JobTerminated):
        if not unwound.wait(ABORT_GRACE_S):
            end_now(exc)

    def terminate(signum, frame):
        if again.exc is not None:  # a second SIGTERM (or SIGHUP)
            end_now(again.exc)
        exc = HungUp("the terminal was closed (SIGHUP)") if signum == _SIGHUP else \
            JobTerminated("terminated (SIGTERM)")
        threading.Thread(target=watchdog, args=(exc,), name="speedboard-term-watchdog", daemon=True).start()
        again.arm(exc)
        raise exc

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, terminate)}
    if _SIGHUP is not None and signal.getsignal(_SIGHUP) is signal.SIG_DFL:  # nohup's SIG_IGN stays
        previous[_SIGHUP] = signal.signal(_SIGHUP, terminate)
    try:
        yield
        if again.exc is not None:  # discarded where nothing could raise it again: the work must not look finished
            raise again.exc
    except JobTerminated as exc:
        unwound.set()
        leave_workers(_signal_exit_code(exc))
        raise
    except (KeyboardInterrupt, Cancelled):  # exit code 130, as ``_run_command`` gives it
        leave_workers(128 + signal.SIGINT)
        raise
    finally:
        again.disarm()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_SIGHUP = getattr(signal, "SIGHUP", None)


def _signal_exit_code(exc: BaseException) -> int:
    """128 + the signal that ended the work: SIGTERM's 143 unless the exception names another (SIGHUP's 129)."""
    return getattr(exc, "exit_code", 128 + signal.SIGTERM)


@contextlib.contextmanager
def _interruptible(control):
    """Signals for a command that works toward a result it can cut short (prepare, tune, the launcher's checks).

    Ctrl-C: the first asks ``control`` to stop at the next safe point, the second aborts (``_stop_on_first_sigint``).
    SIGHUP (the terminal closed): as a first Ctrl-C, silently; one that ``nohup`` ignores stays ignored.
    SIGTERM: ends the work now (``_terminable``).
    """
    stop = _stop_on_first_sigint(control)
    handlers = {signal.SIGINT: stop}
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        handlers[hangup] = lambda signum, frame: control.stop()
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    stop.clock.watch()
    try:
        with _terminable():
            yield
    finally:
        stop.again.disarm()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop.clock.unwatch()


def cmd_prepare(args: argparse.Namespace, argv: list[str]) -> int:
    """``speedboard prepare DATA``: tokenize once (like nanoGPT's prepare.py); ``--list``, ``--remove``."""
    import torch

    from core.config import config_from_preset
    from core.control import Control
    from core.errors import Cancelled, ConfigError
    from core.paths import user_path
    from core.prepare import prepare_corpus
    from core.sources import source_location
    from core.token_store import list_stores

    if args.list and args.remove:
        raise ConfigError("give --list or --remove, not both")
    if args.data == "":  # as train's --data '': it would name the current folder
        raise ConfigError("data source is empty")
    # Named as train names them, by absolute path: each line (a store's tokenizer recorded, "no token stores of
    # DATA", a missing file) says which file, as typed relative paths would name different files alike.
    if args.data is not None and args.data != "all":
        args.data = source_location(args.data)
    if args.tokenizer:
        args.tokenizer = str(user_path(args.tokenizer))
    if args.list or args.remove:
        for flag, value in (("--vocab-size", args.vocab_size), ("--tokenizer-docs", args.tokenizer_train_docs),
                            ("--preset", args.preset)):
            if value is not None:
                raise ConfigError(f"{flag} does not apply to --{'list' if args.list else 'remove'}: it takes DATA, "
                                  f"--text-field and --tokenizer (the stores of that tokenizer only)")
        if args.text_field is not None and args.data in (None, "all"):  # ignored, --remove all removed every store
            raise ConfigError(f"--text-field picks the stores of one corpus: give DATA with it (--"
                              f"{'list' if args.list else 'remove'} DATA --text-field {args.text_field})")
        if args.text_field is not None:
            _check_text_field(args.data, args.text_field)
    if args.list:
        stores = _stores_of(args.data, args.text_field, args.tokenizer) if args.data is not None else \
            _made_with(list_stores(), args.tokenizer)
        if not stores:
            _out(_no_stores(args.data, args.tokenizer))
        for m in stores:
            if "damaged" in m:  # its manifest says nothing more: named by its path
                _out(f"{m['path']}: damaged ({m['damaged']}), {_room(m['bytes'])}; preparing its corpus "
                      f"again replaces it, --remove all removes it")
                continue
            tok, source = m.get("tokenizer") or {}, m.get("source") or {}
            field = f" --text-field {source['text_field']}" if source.get("kind") not in ("text", "builtin", None) \
                else ""
            _out(f"{m.get('created', '?')}  {m.get('documents', 0):>12,} docs  {m.get('tokens', 0):>15,} tokens  "
                  f"{_room(m['bytes']):>10}  {_where(m)}{field}  "
                  f"[{tok.get('origin', '?')}, {tok.get('vocab_size', '?')} tokens]  {m['path']}"
                  + (f"  damaged ({m['fault']}): preparing its corpus again replaces it" if "fault" in m else ""))
        if args.data in (None, "all") and args.tokenizer is None:
            _list_leftovers()
        return 0
    if not args.data:
        raise ConfigError("give the data to prepare (or --list, or --remove DATA|all)")
    if args.remove:
        return _remove_stores(args.data, args.text_field, args.tokenizer)
    _refuse_ignored_flags(args, None)  # --vocab-size or --tokenizer-docs beside --tokenizer, as train refuses them
    base = config_from_preset(args.preset or ("small" if torch.cuda.is_available() else "tiny")).data
    overrides = {k: v for k, v in {"source": args.data, "vocab_size": args.vocab_size,
                                   "text_field": args.text_field, "tokenizer": args.tokenizer,
                                   "tokenizer_train_docs": args.tokenizer_train_docs}.items() if v is not None}
    import dataclasses

    cfg = dataclasses.replace(base, **overrides)
    control = Control()
    sink = ConsoleSink(1, progress=not args.no_progress and sys.stderr.isatty())
    try:
        with _interruptible(control):
            prepared = prepare_corpus(cfg, sink=sink, should_stop=lambda: control.stop_requested)
    finally:
        sink.close()
    if control.stop_requested:  # after the store's last check: complete, and kept; `prepare && train` stops here
        raise Cancelled("data preparation stopped once its store was complete; the store is kept")
    store = prepared.store
    if not prepared.from_store:
        chars = store.manifest.get("text_chars", 0)
        rate = chars / 1e6 / max(store.manifest.get("seconds", 0) or prepared.seconds, 1e-9)
        _out(f"{store.num_tokens / max(store.num_documents, 1):,.0f} tokens per document, "
              f"{store.manifest['dtype']}, {rate:.1f} M characters/s")
    return 0


def _out(text: str) -> None:
    """A line of a command's own output: standard output that cannot be written (a full disk or device behind
    it, ``> /dev/full``) is one error line, as for ``generate``; a reader gone (``| head``) stays quiet."""
    from core.event_text import one_line

    try:
        print(one_line(text), flush=True)  # one line each: a path with a line break in it stays on it
    except BrokenPipeError:
        raise
    except OSError as exc:
        from core.errors import SpeedboardError

        raise SpeedboardError(f"cannot write to standard output ({exc.strerror or exc})") from None


def _list_leftovers() -> None:
    """The half stores of killed preparations (gigabytes on a large corpus), which belong to no corpus listed."""
    from core.token_store import leftovers

    found = leftovers()
    if found:
        many = len(found) > 1
        _out(f"also {len(found)} unfinished store{'s' * many} of killed preparations or removals "
             f"({_room(sum(size for _, size in found))}: {found[0][0]}{' …' if many else ''}); "
             f"the next preparation or any prepare --remove deletes {'them' if many else 'it'}")


def _room(size: int) -> str:
    """A store's room on disk: a half store of 4 MB read "0.00 GiB" in GiB alone."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _made_with(stores: list[dict], tokenizer: str | None) -> list[dict]:
    """The stores made with the tokenizer file ``tokenizer`` (all of them without one)."""
    if tokenizer is None:
        return stores
    from core.token_store import tokenizer_sha256
    from core.tokenizer import load_tokenizer_file

    sha = tokenizer_sha256(load_tokenizer_file(tokenizer))
    return [m for m in stores if (m.get("tokenizer") or {}).get("sha256") == sha]


def _check_text_field(data: str, text_field: str) -> None:
    """--list/--remove DATA --text-field: refused as ``prepare`` refuses it (an empty field, or one of plain text,
    which has no fields), not taken as a filter that matched all of plain text's stores, or the tokenizers of
    an empty field's: --remove deleted them."""
    from core.errors import ConfigError, DataError
    from core.sources import resolve_source

    if not text_field.strip():
        raise ConfigError("text field is empty", "text_field")
    try:
        resolve_source(data, text_field)
    except DataError as exc:
        if exc.field == "text_field":
            raise
        # Gone or unreadable now: its stores still name what it was, with their own fields.


def _stores_of(data: str, text_field: str | None, tokenizer: str | None = None) -> list[dict]:
    """The token stores of DATA (every store for 'all'): prepared from the same place (any version of the
    file: an edited corpus leaves its older stores behind), or from the same content under another name.
    The fingerprint counts the text field (of JSONL, Parquet, …): each store is matched with its own, so
    stores prepared with --text-field count too (or only those of the --text-field given); ``tokenizer``:
    only those made with that tokenizer file."""
    from core.errors import DataError
    from core.paths import locale_free
    from core.sources import resolve_source, source_location
    from core.token_store import list_stores

    stores = list_stores()
    if data == "all":
        return _made_with(stores, tokenizer)  # "all" with --tokenizer: every corpus' stores of that tokenizer
    location = source_location(data)
    fingerprints: dict[str, str | None] = {}

    def fingerprint(field: str) -> str | None:
        if field not in fingerprints:
            try:
                fingerprints[field] = resolve_source(data, field).fingerprint()
            except DataError:
                fingerprints[field] = None  # gone or unreadable now: its place still names its stores
        return fingerprints[field]

    def is_data(m: dict) -> bool:
        source = m.get("source") or {}
        field = source.get("text_field") or "text"
        if text_field is not None and field != text_field and source.get("kind") not in ("text", "builtin"):
            return False
        # Names compared as their bytes: the same file under another locale (LC_ALL=C) is the same corpus.
        return locale_free(source.get("location") or "") == locale_free(location) or \
            m.get("fingerprint") == fingerprint(field)

    stores = _made_with([m for m in stores if "damaged" not in m and is_data(m)], tokenizer)
    if not stores:
        resolve_source(data, text_field or "text")  # a missing source is one line, not "no token store"
    return stores


def _remove_stores(data: str, text_field: str | None, tokenizer: str | None = None) -> int:
    """The stores of DATA, then the tokenizers trained on it (kept so that its next start finds its store at once:
    with no store left, they only hold a disk's room); with ``tokenizer``, only the stores made with it."""
    from core.errors import DataError
    from core.sources import resolve_source
    from core.token_store import list_stores, remove_store, sweep_stale
    from core.tokenizer_cache import remove_trained_tokenizers, sweep_stale_tokenizers

    _wait_for_preparations(None if data == "all" else data)
    # And the leftovers of killed preparations (half stores, temporary files, write probes), whose corpus they
    # cannot tell: only --remove all swept them, and a kill -9's half store stayed through --remove DATA.
    sweep_stale()
    sweep_stale_tokenizers()
    damaged = [m["path"] for m in list_stores() if "damaged" in m] if data != "all" else []
    stores = _stores_of(data, text_field, tokenizer)
    # A store prepared from another corpus that is still there, whose content DATA shares (a copy that kept its
    # times: the same fingerprint), is that corpus' too: --remove of a backup removed the original's store.
    shared = [m for m in stores if data != "all" and _prepared_elsewhere(m, data)]
    stores = [m for m in stores if m not in shared]
    for m in stores:
        remove_store(m["path"])
        _out(f"removed {m['path']} ({_room(m['bytes'])}, {_where(m)})")
    for m in shared:
        _out(f"kept {m['path']}: prepared from {_where(m)}, whose content {data} shares; "
             f"`speedboard prepare --remove {_where(m)}` removes it")
    if damaged:  # their manifests no longer say whose they are
        many = len(damaged) > 1
        _out(f"not removed: {len(damaged)} damaged store{'s' * many} whose corpus cannot be told "
             f"({damaged[0]}{' …' if many else ''}); --remove all removes {'them' if many else 'it'}")
    if tokenizer is not None:  # the stores of one tokenizer file: the tokenizers trained on DATA stay
        if not stores and not shared:
            _out(_no_stores(data, tokenizer))
        return 0
    fingerprints = None
    if data != "all":
        fingerprints = {m["fingerprint"] for m in stores if m.get("fingerprint")}
        try:
            fingerprints.add(resolve_source(data, text_field or "text").fingerprint())
        except DataError:
            pass  # gone or unreadable now: its stores named what it was
        # The tokenizers of a kept store stay with it (those trained on DATA's own place still go).
        fingerprints -= {m.get("fingerprint") for m in shared}
    tokenizers = remove_trained_tokenizers(fingerprints, None if data == "all" else data, text_field)
    if tokenizers:
        _out(f"removed {len(tokenizers)} tokenizer{'s' * (len(tokenizers) > 1)} trained on "
              f"{'the corpora' if data == 'all' else data} ({sum(size for _, size in tokenizers) / 2**20:.1f} MiB, "
              f"{tokenizers[0][0].parent})")
    if not stores and not tokenizers and not shared:
        _out(_no_stores(data, None))
    return 0


def _prepared_elsewhere(manifest: dict, data: str) -> bool:
    """The store was prepared from another corpus that is still there: not DATA moved away, nor DATA named through
    a link."""
    from core.sources import source_location

    where = (manifest.get("source") or {}).get("location")
    if not where or not os.path.exists(where):
        return False
    try:
        return not os.path.samefile(where, source_location(data))
    except OSError:  # DATA itself is gone: the store is another corpus'
        return True


def _wait_for_preparations(data: str | None) -> None:
    """Let the preparations of DATA (of every corpus for None) running now finish first: a store they put in
    place after the removal would be DATA's again at once."""
    from core.sources import source_location
    from core.token_store import preparation_lock, preparations_of

    for fingerprint in preparations_of(None if data is None else source_location(data)):
        def waiting() -> None:
            _out(f"waiting for another process that is preparing {data or 'a corpus'} …")

        with preparation_lock(fingerprint, on_wait=waiting):
            pass  # it has ended: its store, if it made one, is listed with the others


def _where(manifest: dict) -> str:
    """The corpus a store was prepared from, as its absolute path (the name of builtin or hub corpora)."""
    if "damaged" in manifest:  # its manifest cannot say
        return f"damaged: {manifest['damaged']}"
    source = manifest.get("source") or {}
    return source.get("location") or source.get("spec") or "?"


def _no_stores(data: str | None, tokenizer: str | None) -> str:
    """What --list or --remove found none of: DATA's stores, or (no DATA, or 'all') the cache folder's."""
    from core.token_store import stores_dir

    made_with = f" made with {tokenizer}" if tokenizer else ""
    return f"no token stores in {stores_dir()}{made_with}" if data in (None, "all") else \
        f"no token stores of {data}{made_with}"


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from core.control import Control
    from core.distributed import PeerLost, launched_by_torchrun, shutdown
    from core.errors import ConfigError, JobTerminated
    from core.launch import check_nproc
    from core.split import OutOfMemory
    from core.stopping import StopSignals
    from core.trainer import Trainer

    if args.config and (args.preset or args.resume):
        raise ConfigError("--config holds the whole configuration; use flags other than --preset/--resume with it")
    if args.nproc is not None:
        check_nproc(args.nproc)
    if args.fsdp and not (args.nproc and args.nproc > 1) and not launched_by_torchrun():
        raise ConfigError("--fsdp shards over several processes: give --nproc N (N ≥ 2) with it, or leave it out",
                          "fsdp")
    if args.nproc and args.nproc > 1 and not launched_by_torchrun():
        return _handover_to_torchrun(args, argv)
    config = config_from_args(args)
    control = Control()
    rank = int(os.environ.get("RANK", "0"))
    rank0 = rank == 0
    sink = ConsoleSink(args.log_every, progress=not args.no_progress and rank0 and _isatty(sys.stderr))
    trainer = Trainer(config, control, sink if rank0 else (lambda e: None), run_id=args.run_id)
    signals = StopSignals(control, trainer, speak=rank0).install()
    code: int | None = None  # decided and said: from then on a signal ends the process at once
    try:
        code = _train_exit_code(trainer.run(), rank0)
    except PeerLost as exc:
        from core.runs import CLAIM_ENV

        # Under `train --nproc` the survivors stay quiet: the launcher names the failed ranks in one line (this
        # line came first when the collective failed before torchrun's SIGTERM reached this rank).
        if CLAIM_ENV not in os.environ:
            _error_line(f"speedboard: error: {exc}")
        code = 1
    except OutOfMemory as exc:
        # Every rank of a job ends so; rank 0 (which names the checkpoint it saved) and a rank that ran out
        # say it, not each rank that only heard of it.
        if rank0 or exc.here or not launched_by_torchrun():
            _error_line(f"speedboard: error: {exc}")
        code = 2
    except JobTerminated as exc:
        from core.runs import CLAIM_ENV

        if not launched_by_torchrun():
            _error_line(f"speedboard: {exc}")
        elif rank0 and CLAIM_ENV not in os.environ:  # under `train --nproc`, the launcher says it once for all
            _error_line(f"speedboard: rank {rank}: {exc}")
        code = getattr(exc, "exit_code", 128 + signal.SIGTERM)
    finally:
        sink.close()
        shutdown()
        signals.restore(decided=code is not None)
    return code


def _train_exit_code(result, rank0: bool) -> int:
    from core.distributed import launched_by_torchrun

    if rank0 and result.checkpoint is None:
        # Each failed save was a warning and training went on; without the final one the weights are lost,
        # which a script chaining `train && generate` must not take for success.
        ended = "was stopped" if result.stopped else "finished"
        _error_line(f"speedboard: error: the run {ended} at step {result.step}, but its final checkpoint could "
                    f"not be saved (see the warning above)")
        return 0 if launched_by_torchrun() else 1  # under torchrun the launcher reports the run's outcome
    return 0


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):  # AttributeError: None, a stream the shell closed (2>&-)
        return False


def _error_line(text: str) -> None:
    """One line on stderr, best-effort (the terminal may be gone). A line break inside it (a file named with one,
    quoted in a message) is written as ``\\n``, so the message stays one line."""
    from core.event_text import one_line

    try:
        # One write: processes of a job that print at once (torchrun's ranks) do not run into each other's line.
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ----------------------------------------------------------------------------- generate / export
def _bare_architecture(loaded, args: argparse.Namespace):
    """The model config of a bare state dict: from --config or --preset (vocabulary from its embedding),
    else read from its tensors, or one line asking for one of them."""
    from dataclasses import replace

    from core.checkpoint import embedding_rows, infer_model_config
    from core.config import preset

    if args.config:
        model = _model_of_config_file(args.config)
    elif args.preset:
        model = preset(args.preset).model
    else:
        return infer_model_config(loaded.state_dict, str(loaded.source))
    rows = embedding_rows(loaded.state_dict)
    return replace(model, vocab_size=rows) if rows else model


def _utf8_prompt(prompt: str) -> str:
    """The prompt's text. Python decodes argv in the locale's encoding, bytes it cannot decode as lone
    surrogates: under a non-UTF-8 locale a UTF-8 prompt ("Thé") arrives so. Its bytes are read as UTF-8; bytes
    that are no UTF-8 either are refused (no tokenizer takes surrogates)."""
    from core.errors import ConfigError

    try:
        prompt.encode("utf-8")
        return prompt
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(prompt).decode("utf-8")
    except UnicodeError:
        raise ConfigError("the prompt is not UTF-8 text", "prompt") from None


def _generation_tokenizer(loaded, path: str | None):
    """The checkpoint's own tokenizer; --tokenizer is for a checkpoint without one, or must be that same one
    (its weights learned those ids), compared as train --resume/--init-from compare them."""
    from core.tokenizer import load_tokenizer_file, require_checkpoint_tokenizer

    if loaded.tokenizer is None:
        return load_tokenizer_file(path) if path else None
    if path:
        require_checkpoint_tokenizer(path, loaded.tokenizer, str(loaded.source))
    return loaded.tokenizer


def _prompt_ids(tok, prompt: str) -> list[int]:
    """The prompt's ids as training tokenized documents: a special token's name written in it is text. A prompt
    the tokenizer cannot encode (a Unigram vocabulary without an unknown token) is one line, naming the first
    character it has no token for; one whose unknown characters it drops without a trace says so."""
    from core.errors import ConfigError, first_line
    from core.token_store import plain_text_tokenizer
    from core.tokenizer import dropped_characters, drops_unknown_text

    plain = plain_text_tokenizer(tok)

    def encode(text: str):
        return plain.encode(text, add_special_tokens=False)

    try:
        encoding = encode(prompt)
    except Exception as exc:  # tokenizers raises a bare Exception
        char = next((c for c in dict.fromkeys(prompt) if not _encodes(encode, c)), None)
        what = f" {char!r} (U+{ord(char):04X})" if char is not None else ""
        raise ConfigError(f"the tokenizer cannot encode the prompt's character{what}: {first_line(exc)}",
                          "prompt") from None
    if drops_unknown_text(tok):
        dropped = dropped_characters(plain, prompt)
        if dropped:
            _error_line(f"warning: the tokenizer has no token for {''.join(dropped[:10])!r} and "
                        f"no unknown token: left out of the prompt")
    return encoding.ids


def _encodes(encode, text: str) -> bool:
    try:
        encode(text)
    except Exception:  # tokenizers raises a bare Exception
        return False
    return True


def cmd_generate(args: argparse.Namespace, argv: list[str]) -> int:
    with _terminable():  # the text printed so far ends its line, then one line says why it ended
        return _generate(args)


def _generate(args: argparse.Namespace) -> int:
    import torch

    from core.checkpoint import check_finite, check_tokenizer_fits, load_weights, read_checkpoint
    from core.config import GenerationConfig
    from core.device import resolve_device
    from core.errors import CheckpointError, ConfigError
    from core.model import LlamaForCausalLM

    settings = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_k=args.top_k, seed=0 if args.seed is None else args.seed)  # before any read
    if args.seed is not None and settings.temperature == 0:  # every seed gave the same text, and nothing said so
        raise ConfigError("--seed chooses the samples drawn when sampling: give --temperature > 0 with it (0, the "
                          "default, is greedy: the same text whatever the seed)", "seed")
    args.prompt = _utf8_prompt(args.prompt)
    if sys.stdout is None:  # `>&-`: the text would go nowhere, and the command said nothing
        raise ConfigError("standard output is closed: there is nowhere to write the generated text")
    if args.preset and args.config:
        raise ConfigError("--preset and --config each give a bare state dict's architecture; use one of them")
    loaded = read_checkpoint(args.checkpoint)
    if loaded.model_config is not None and (args.preset or args.config):
        raise ConfigError(f"{loaded.source} brings its own architecture; --preset and --config are for a bare "
                          f"state dict")
    model_config = loaded.model_config or _bare_architecture(loaded, args)
    tok = _generation_tokenizer(loaded, args.tokenizer)
    if tok is None:
        raise CheckpointError(f"{loaded.source} has no tokenizer: pass --tokenizer TOKENIZER.json, the one its "
                              f"model was trained with")
    check_tokenizer_fits(tok, model_config)
    device = resolve_device(args.device)
    model = LlamaForCausalLM(model_config)
    check_finite(loaded.state_dict, str(loaded.source), "generate from an earlier checkpoint")
    load_weights(model, loaded.state_dict, str(loaded.source))
    model.to(device).eval()
    ids = ([tok.bos_id] if tok.bos_id is not None else []) + _prompt_ids(tok, args.prompt)
    positions = model_config.max_position_embeddings
    if len(ids) > positions:
        _error_line(f"warning: the prompt is {len(ids):,} tokens (its BOS included) and the model has "
                    f"{positions:,} positions: its first {len(ids) - positions:,} are not read")
    gen = torch.Generator(device=device).manual_seed(settings.seed)
    stream = _TextStream(tok, ids)  # the text as it grows, not all of it at the end
    try:
        stream.add(None)  # the prompt, printed where a Ctrl-C after it still ends its line
        # An embedding with more rows than the tokenizer has tokens: ids past them would print as nothing.
        model.generate(torch.tensor([ids], device=device), settings.max_new_tokens,
                       temperature=settings.temperature, top_k=settings.top_k, eos_id=tok.eos_id, generator=gen,
                       on_token=stream.add, vocab_limit=tok.vocab_size)
    finally:
        stream.close()  # the text ends its line, also when an error line or Ctrl-C's line follows
    # Said once the text is there, of the text there is: `--max-new-tokens` above the positions warned before a
    # text that ended at its EOS long before them. The last token is printed, never read.
    if len(ids) <= positions < len(stream.ids) - 1:
        _error_line(f"warning: the text grew past {positions:,} tokens (its BOS included): each token after "
                    f"them was chosen from the last {positions:,} only (the model's positions)")
    return 0


_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 controls but the line feed and the tab: what a terminal acts on instead of showing."""


class _TextStream:
    """Prints generated text as tokens come: what decoding the tokens since the last print adds to the text.

    A token is decoded with the tokens of the previous print before it, never alone: SentencePiece-style
    decoders (Metaspace, Llama's Strip) drop a word's leading space when its token stands first, and a
    byte-level token may hold half of a character (U+FFFD until the rest comes). The window decoded is
    the last print's tokens and those since, so a long generation costs no more per token."""

    def __init__(self, tok, prompt_ids: list[int]) -> None:
        self.tok, self.ids = tok, list(prompt_ids)
        self.prefix = 0
        """Where the tokens decoded before the new ones begin."""
        self.read = 0
        """Where the tokens not printed yet begin (the prompt is printed with the first token)."""

    def _added(self) -> str:
        before = self.tok.decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        return self.tok.decode(self.ids[self.prefix:])[len(before):]

    def add(self, token: int | None) -> None:
        if token is not None:
            self.ids.append(token)
        added = self._added()
        if added and not added.endswith("\ufffd"):
            self._print(added, end="")
            self.prefix, self.read = self.read, len(self.ids)

    def close(self) -> None:
        self._print(self._added() if self.read < len(self.ids) else "")

    @staticmethod
    def _print(text: str, end: str = "\n") -> None:
        if _isatty(sys.stdout):
            # A model's text may hold an escape sequence (trained on logs with colours): on a terminal it would
            # recolour, move the cursor or retitle the window. Shown as escapes there; a pipe gets the text as is.
            text = _TERMINAL_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
        try:
            print(text, end=end, flush=True)
        except BrokenPipeError:
            raise  # a reader that went away (| head): as quiet as other tools (run_command)
        except OSError as exc:  # a full disk or device behind stdout (> /dev/full)
            from core.errors import SpeedboardError

            raise SpeedboardError(f"cannot write the generated text ({exc.strerror or exc})") from None


def cmd_export(args: argparse.Namespace, argv: list[str]) -> int:
    from core.checkpoint import export_hf

    with _terminable():  # the folder being written is removed (AtomicFolder), then one line says why
        out = export_hf(args.checkpoint, args.out)  # a run folder means its newest checkpoint
    with contextlib.suppress(OSError, ValueError, AttributeError):  # the export is whole: saying so is best-effort
        print(f"exported to {out}", flush=True)
    return 0


def cmd_tune(args: argparse.Namespace, argv: list[str]) -> int:
    from core.tune_cli import cmd_tune as tune

    return tune(args, argv)


COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "generate": cmd_generate, "export": cmd_export,
            "tune": cmd_tune}


def run_command(args: argparse.Namespace, argv: list[str]) -> int:
    """Run a parsed engine command; a user's mistake is one line on stderr and exit code 2.

    A torchrun worker of ``train`` does not come back: its run's ending is recorded and printed and its
    process group destroyed, so it ends here (``core.distributed.exit_without_teardown``).
    """
    code = _run_command(args, argv)
    if args.command == "train":
        from core.distributed import exit_without_teardown, launched_by_torchrun

        if launched_by_torchrun():
            exit_without_teardown(code)
    return code


def _run_command(args: argparse.Namespace, argv: list[str]) -> int:
    from core.errors import Cancelled, SpeedboardError

    install_start_handlers()
    try:
        return COMMANDS[args.command](args, argv)
    except Cancelled as exc:
        print(f"speedboard: {exc}", file=sys.stderr)
        return 130
    except SpeedboardError as exc:
        _error_line(f"speedboard: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # nothing here may import torch: it may be half imported
        from core.runs import CLAIM_ENV

        # A worker of ``train --nproc`` (its launcher's claim in its environment) stopped before its run began:
        # the launcher says it once for all, as it says a run's start (torchrun's own SIGTERM to the other
        # workers would add a line naming a SIGTERM the user never sent).
        code = interrupted(exc, say=CLAIM_ENV not in os.environ)
        if _during_import(exc):
            # A module cut off while it was being imported (torch's C++ part, in the first second or so) can
            # crash the interpreter as it shuts down (an abort, exit 134): end the process here instead.
            _flush_and_exit(code)
        return code
    except BrokenPipeError:  # the reader of stdout went away (| head): as quiet as other command-line tools
        silence_stream(sys.stdout)
        return 128 + getattr(signal, "SIGPIPE", 13)


def _during_import(exc: BaseException) -> bool:
    """``exc`` was raised while a module was being imported: its traceback, which starts inside a command,
    passes through a module's body (the import machinery's own frames are left out of tracebacks)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "<module>":
            return True
        tb = tb.tb_next
    return False


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def interrupted(exc: KeyboardInterrupt, say: bool = True) -> int:
    """The exit code of a Ctrl-C (130) or a SIGTERM (``JobTerminated``, 143: ``_terminable``), said in one line:
    in a command, or while the command line is read (``main``'s imports and parsing)."""
    from core.errors import JobTerminated

    terminated = isinstance(exc, JobTerminated)
    if say:
        _error_line(f"speedboard: {exc}" if terminated else "speedboard: interrupted")
    return _signal_exit_code(exc) if terminated else 130


CONSOLE_ERRORS = "speedboard-console"
"""The console streams' error handler: what ``backslashreplace`` does, except for the bytes of a file name that
are not UTF-8, which Python holds as lone surrogates (U+DC80..U+DCFF): written as the byte (``\\xe9``), not as
the surrogate (``\\udce9``), which is no form of the name a user can type or recognise."""


def _console_escape(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    chunk = err.object[err.start:err.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else
                   c.encode("ascii", "backslashreplace").decode("ascii") for c in chunk), err.end


def console_writes_every_line() -> None:
    """A character the console's encoding lacks ("…", "×", "é" under ``PYTHONIOENCODING=ascii`` or a C locale)
    is written as its escape (``\\u2026``): the line that held it was dropped whole, and a generated "café"
    printed as "caf". A file name's byte that is not UTF-8 is written as that byte's escape (``CONSOLE_ERRORS``)."""
    import codecs

    try:
        codecs.lookup_error(CONSOLE_ERRORS)
    except LookupError:
        codecs.register_error(CONSOLE_ERRORS, _console_escape)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # not a text file of its own (a test's capture)
            stream.reconfigure(errors=CONSOLE_ERRORS)


def working_folder_problem() -> str | None:
    """Why the command cannot start here: its current folder was deleted (or moved) after the shell entered it.
    A relative path cannot be resolved there, and torch's own import fails with an error about oneMKL."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return "the current folder no longer exists (deleted or moved since the shell entered it); cd to an " \
               "existing folder and run the command again"
    return None


def main(argv: list[str] | None = None) -> int:
    install_start_handlers()
    console_writes_every_line()
    if (problem := working_folder_problem()) is not None:
        _error_line(f"speedboard: error: {problem}")
        return EXIT_USAGE
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt as exc:
        return interrupted(exc)
    return run_command(args, argv)


def entry() -> int:
    """The program's entry point (``python -m core.cli``, torchrun's workers): ``main``, then an exit that no signal
    turns into a traceback."""
    from core.interrupts import end_at_once_on_signals

    code = main()
    end_at_once_on_signals()
    return code


if __name__ == "__main__":
    sys.exit(entry())
