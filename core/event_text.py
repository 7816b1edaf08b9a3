"""Events as readable lines: one formatter for the command line and the dashboard's log."""

from __future__ import annotations

from dataclasses import dataclass

from core import events as ev


@dataclass(frozen=True)
class EventLine:
    text: str
    level: str = "info"
    """``info``, ``warning`` or ``error``."""


def one_line(text: str) -> str:
    """A name quoted in a line (a path with a line break in it) kept on that line: breaks written as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def counted(n: int, noun: str) -> str:
    """``1 setting``, ``2 settings``: a count with its noun in the right number (regular plurals)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _number(value: float | None, fmt: str = ".4f") -> str:
    return "n/a" if value is None else format(value, fmt)


def step_line(event: ev.StepMetrics, mem_baseline_gib: float = 0.0) -> str:
    """One optimizer step, as the command line prints every ``--log-every`` steps.

    Its memory is the training's own peak so far, as the dashboard's Train GiB and the finish line say:
    the process's peak less ``mem_baseline_gib``, what it held before the model existed (``RunStarted``).
    """
    tag = " (warm-up)" if event.warmup else ""
    mem = max(0.0, event.peak_mem_gib - mem_baseline_gib)
    return (f"step {event.step:6d} | loss {event.loss:.4f} | lr {event.lr:.2e} | grad {event.grad_norm:.2f} | "
            f"{event.tokens_per_s:9,.0f} tok/s{tag} | mfu {event.mfu * 100:4.1f}% | mem {mem:.2f} GiB")


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def data_progress_line(event: ev.DataPreparationProgress) -> str:
    """Preparation progress as one line (where no progress bar is drawn)."""
    if event.stage == "waiting":
        return "waiting for another process that is preparing this corpus …"
    if event.stage == "tokenizer-training":
        return f"training the tokenizer on {counted(event.documents_done, 'document')} …"
    what = "reading the tokenizer's training documents" if event.stage == "tokenizer" else "tokenizing"
    share = (f" {100 * event.bytes_done / event.bytes_total:.0f}% of {_size(event.bytes_total)}"
             if event.bytes_total else f" {counted(event.documents_done, 'document')}")
    eta = f", {_duration(event.eta_seconds)} left" if event.eta_seconds is not None else ""
    tokens = f", {event.tokens_done:,} tokens" if event.stage == "tokens" else ""
    return f"{what}:{share}{tokens}{eta}"


_HELD_OUT = (" (validation)", " (test)")
"""How ``core.sources`` marks a held-out split's file among those not read."""


def skipped_files(names, shown: int = 3) -> str:
    """Files a source folder holds but does not read: every held-out split, named first (its one file, or the
    split with its number of files: sorted by path, a split whose files came after three others went unsaid), then
    a few of the rest (binary files, a README beside shards, files of no split)."""
    splits: dict[str, list[str]] = {}
    rest = []
    for name in names:
        mark = next((m for m in _HELD_OUT if name.endswith(m)), None)
        if mark is None:
            rest.append(name)
        else:
            splits.setdefault(mark, []).append(name)
    said = [files[0] if len(files) == 1 else f"the {mark.strip(' ()')} split ({len(files)} files)"
            for mark, files in splits.items()]
    more = f" and {len(rest) - shown} more" if len(rest) > shown else ""
    return ", ".join(said + rest[:shown]) + more


def tokenizer_line(event: ev.DataPrepared) -> str:
    return (f"tokenizer: {event.tokenizer}, {event.vocab_size:,} tokens; BOS {event.bos}, EOS {event.eos}, "
            f"PAD {event.pad if event.pad is not None else '(none: packed layout only)'}")


def _peak(event: ev.RunStarted) -> str:
    """The MFU denominator, so the step lines' MFU can be checked."""
    if not event.matmul_peak_flops:
        return ""
    each = f"{event.world_size} × " if event.world_size > 1 else ""  # every process's GEMMs: the job's peak
    return f", MFU of {each}{event.matmul_peak_flops / 1e9:,.0f} GFLOP/s {event.precision} GEMMs"


def event_line(event: ev.Event) -> EventLine | None:
    """What a person wants to read about ``event``; None for events shown otherwise (steps, samples)."""
    if isinstance(event, ev.DataPreparationStarted):
        size = f", {_size(event.bytes_total)}" if event.bytes_total is not None else ""
        # Rows, as the files' metadata counts them: a null or blank text is a row but no document.
        docs = f", {counted(event.documents_total, 'row')}" if event.documents_total else ""
        first = " (a tokenizer is trained first)" if event.train_tokenizer else ""
        skipped = f"; not read: {skipped_files(event.skipped)}" if event.skipped else ""
        files = f", {counted(event.files, 'file')}" if event.source_kind not in ("builtin", "hub") else ""
        return EventLine(f"preparing {one_line(event.source)} ({event.source_kind}{files}{size}{docs}{skipped}) "
                         f"into its token store, once{first} …")
    if isinstance(event, ev.DataPrepared):
        where = ("from its token store" if event.from_store
                 else f"prepared in {_duration(event.seconds)}")
        skipped = f"; not read: {skipped_files(event.skipped)}" if event.skipped and event.from_store else ""
        return EventLine(f"data: {counted(event.documents, 'document')}, {counted(event.tokens, 'token')}, "
                         f"{where} ({one_line(event.store)}){skipped}\n"
                         f"{tokenizer_line(event)}")
    if isinstance(event, ev.RunStarted):
        where = f" from step {event.start_step}" if event.start_step else ""
        precision = event.precision
        if event.precision_reason and event.config.get("train", {}).get("precision") == "auto":
            precision += f" — auto: {event.precision_reason.partition(': ')[2]};"
        else:
            precision += ","
        return EventLine(f"started{where} on {event.device} ({precision} "
                         f"{event.num_parameters / 1e6:.2f}M parameters, {event.tokens_per_step:,} tokens/step, "
                         f"→ step {event.total_steps}{_peak(event)}) in {one_line(event.run_dir)}")
    if isinstance(event, ev.CompileStarted):
        return EventLine(f"compiling ({event.mode}, {event.scope}) during the first steps …")
    if isinstance(event, ev.CompileFinished):
        if event.fallback:
            return EventLine(f"torch.compile ({event.mode}, {event.scope}) failed: the run continues eagerly",
                             "warning")
        return EventLine(f"compile warm-up {event.seconds:.1f} s over {counted(event.warmup_steps, 'step')} "
                         f"({event.mode}, {event.scope})")
    if isinstance(event, ev.ValidationDone):
        return EventLine(f"validation at step {event.step}: loss {event.loss:.4f}, perplexity {event.perplexity:.1f}")
    if isinstance(event, ev.CheckpointSaved):
        return EventLine(f"checkpoint at step {event.step}: {one_line(event.path)}")
    if isinstance(event, ev.CheckpointFailed):
        return EventLine(f"checkpoint not saved: {event.message}", "warning")
    if isinstance(event, ev.WarningRaised):
        return EventLine(event.message, "warning")
    if isinstance(event, ev.MicroBatchChanged):
        return EventLine(f"{event.reason}: from step {event.step} micro-batch {event.new_micro} × accumulation "
                         f"{event.new_accum} (was {event.old_micro} × {event.old_accum}), the same effective "
                         f"batch and the same update", "warning")
    if isinstance(event, ev.MatmulPeakMeasured):
        rose = event.matmul_peak_flops > event.previous_flops
        return EventLine(f"step {event.step} ran at {event.step_share:.0%} of the {event.precision} matmul peak "
                         f"cached for this machine ({event.previous_flops / 1e9:,.1f} GFLOP/s), which was measured "
                         f"again: " + (f"{event.matmul_peak_flops / 1e9:,.1f} GFLOP/s, MFU's denominator from here"
                                       if rose else "no higher now (a busy machine); MFU is shown at most 100%"),
                         "warning" if not rose else "info")
    if isinstance(event, ev.RunFinished):
        tps = (f"median {event.median_tokens_per_s:,.0f} tokens/s after warm-up" if event.median_tokens_per_s
               else "no steady steps")
        comp = f", compile {event.compile_seconds:.1f} s" if event.compile_seconds is not None else ""
        state = "stopped" if event.stopped else "finished"
        mem = f"peak mem {event.peak_mem_gib:.2f} GiB"
        if event.train_mem_gib is not None and event.peak_mem_gib - event.train_mem_gib >= 0.005:
            # On a CPU the process's resident set holds Python, torch and (in the dashboard) the window too.
            mem = f"peak mem {event.train_mem_gib:.2f} GiB for training ({event.peak_mem_gib:.2f} GiB the process)"
        if event.world_size > 1:  # each process holds its own model, optimizer and share of the batch
            mem += f" in rank 0, one of {event.world_size} processes"
        return EventLine(f"{state} at step {event.step}: train loss {_number(event.final_loss)}, "
                         f"val loss {_number(event.val_loss)}, {tps}{comp}, {mem}")
    if isinstance(event, ev.RunFailed):
        return EventLine(f"failed at step {event.step}: {event.message}", "error")
    return None
