"""Plain-data events the trainer reports through a sink.

Every event is a frozen dataclass of numbers and strings: no torch, no Qt. The
same events are written to a run's ``metrics.jsonl``, sent to the GUI thread
through one signal, and replayed from a run folder written by the CLI or by
rank 0 of a torchrun job. Names are past tense: they report what happened.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Event:
    run_id: str
    time: float
    """Seconds since the run started (wall clock)."""
    at: float = field(default_factory=time.time, kw_only=True, compare=False)
    """When it happened, in seconds since the epoch: its creation, or the ``at`` its ``metrics.jsonl`` line
    holds, so a run folder opened later shows when its events happened (a line written before this field
    existed gets the time it was read)."""

    @property
    def kind(self) -> str:
        return _KIND_OF[type(self)]

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class RunStarted(Event):
    run_dir: str
    config: dict[str, Any]
    device: str
    precision: str
    num_parameters: int
    tokens_per_step: int
    budget_tokens: int
    """Token positions the whole lineage trains for (the schedule's horizon)."""
    total_steps: int
    """Optimizer step at which this run ends, at its current effective batch."""
    start_step: int = 0
    start_tokens: int = 0
    start_time: float = 0.0
    """Wall time its parent had trained, so a continued run's curves join its parent's."""
    parent: str | None = None
    world_size: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    precision_reason: str = ""
    """Why this precision: as set, or what ``auto`` measured ("bf16: training 5.6× faster than fp32 on this CPU")."""
    matmul_peak_flops: float = 0.0
    """The MFU denominator per process: the best GEMM FLOP/s in the run's precision on this machine."""
    flops_per_token: float = 0.0
    """Training FLOPs per token, the MFU numerator per token."""
    mem_baseline_gib: float = 0.0
    """Memory in use before the model existed (CUDA allocated, or the process's resident set on CPU);
    memory figures minus this are the training's own, as ``speedboard bench`` reports them."""
    warmup_end_tokens: int | None = None
    """Token position where its schedule's learning-rate warmup ends (the lineage's, on resume): a continued
    run's new total must lie past it. None from writers before it was recorded."""


@dataclass(frozen=True)
class DataPreparationStarted(Event):
    """A corpus is being tokenized into its token store (it had none for this tokenizer); set-up waits for it."""

    source: str
    """The data source as given (a path, ``builtin``, ``hf:NAME``)."""
    source_kind: str
    """``builtin``, ``text``, ``jsonl``, ``parquet``, ``arrow`` or ``hub``."""
    files: int
    bytes_total: int | None
    """Bytes of the source files (None for a streamed hub dataset)."""
    documents_total: int | None
    """Rows when the format says so cheaply (Parquet, Arrow), else None: an upper bound of the documents (a row
    whose text is null or blank is none)."""
    train_tokenizer: bool
    """True when a tokenizer is trained first (on the corpus' first documents)."""
    skipped: tuple[str, ...] = ()
    """Files of a source folder that are not read: binary files, a README beside data shards."""


@dataclass(frozen=True)
class DataPreparationProgress(Event):
    stage: str
    """``waiting`` (another process prepares this corpus), ``tokenizer`` (reading the documents a new
    tokenizer is trained on), ``tokenizer-training`` (training it on them: one event, at its start, with
    their count) or ``tokens`` (tokenizing the corpus into the store)."""
    bytes_done: int
    bytes_total: int | None
    documents_done: int
    documents_total: int | None
    tokens_done: int
    eta_seconds: float | None
    """Seconds left in this stage, from the rate so far; None when the total is unknown."""


@dataclass(frozen=True)
class DataPrepared(Event):
    """The corpus is ready: read from its token store, or just prepared into it."""

    source: str
    documents: int
    tokens: int
    from_store: bool
    """True when an existing store was used (no tokenization at this start)."""
    store: str
    """The store's folder."""
    seconds: float
    """Time spent preparing (0 when it came from the store)."""
    tokenizer: str
    """Where the tokenizer came from: a file, a checkpoint, or ``trained on N documents``."""
    vocab_size: int
    bos: str | None
    eos: str | None
    pad: str | None
    """The tokens taken as beginning, end of text and padding."""
    skipped: tuple[str, ...] = ()
    """Files of a source folder that are not read (as ``DataPreparationStarted.skipped``): said at every start,
    also from the store, where nothing else says that part of a folder is left out."""


@dataclass(frozen=True)
class CompileStarted(Event):
    mode: str
    scope: str


@dataclass(frozen=True)
class CompileFinished(Event):
    mode: str
    scope: str
    seconds: float
    """Wall time of the warm-up steps that compiled, minus the same steps at steady speed."""
    warmup_steps: int
    """Optimizer steps treated as warm-up and left out of throughput figures."""
    fallback: bool = False
    """True when compilation failed and the run continued eagerly."""


@dataclass(frozen=True)
class StepMetrics(Event):
    step: int
    tokens: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time: float
    peak_mem_gib: float
    mem_gib: float
    mfu: float
    warmup: bool = False
    """A compile warm-up step: excluded from throughput summaries."""


@dataclass(frozen=True)
class ValidationDone(Event):
    step: int
    tokens: int
    loss: float
    perplexity: float


@dataclass(frozen=True)
class SampleGenerated(Event):
    step: int
    prompt: str
    text: str


@dataclass(frozen=True)
class CheckpointSaved(Event):
    step: int
    tokens: int
    path: str


@dataclass(frozen=True)
class CheckpointFailed(Event):
    """A checkpoint could not be written (a full disk, a bad path); the run goes on."""

    step: int
    path: str
    """Where it was to be written."""
    message: str


@dataclass(frozen=True)
class WarningRaised(Event):
    message: str


@dataclass(frozen=True)
class MicroBatchChanged(Event):
    """The run trains with another split of the same effective batch from ``step`` on.

    Before the run (``auto_micro_batch``: the set micro-batch does not fit), or
    during it (a micro-step ran out of memory: step ``step`` was redone from its
    start with the new split, the same samples and so the same update).
    """

    step: int
    """The first optimizer step trained with the new split."""
    old_micro: int
    old_accum: int
    new_micro: int
    new_accum: int
    reason: str


@dataclass(frozen=True)
class RunFinished(Event):
    step: int
    tokens: int
    stopped: bool
    """True when a stop request ended the run before its budget."""
    final_loss: float | None
    val_loss: float | None
    median_tokens_per_s: float | None
    compile_seconds: float | None
    peak_mem_gib: float
    """The process's peak: CUDA max allocated, or on a CPU the sampled resident set (the window included)."""
    checkpoint: str | None
    train_mem_gib: float | None = None
    """The training's own peak: ``peak_mem_gib`` minus what the process held before the model existed, as
    the dashboard's Train GiB and ``speedboard bench`` report it (None in runs recorded before it existed)."""
    world_size: int = 1
    """The job's processes: its memory figures are rank 0's, one process's (tokens/s and MFU are the job's)."""


@dataclass(frozen=True)
class RunFailed(Event):
    message: str
    step: int = 0
    peer_lost: bool = False
    """A process of a torchrun job that failed only because another one did (``core.distributed.PeerLost``):
    the process that failed, or the launcher once the job has ended, says the first failure."""


@dataclass(frozen=True)
class MatmulPeakMeasured(Event):
    """A step reached ``core.mfu.PEAK_CHECK_MFU`` of the cached matmul peak, which was measured again
    (once a run): MFU divides by ``matmul_peak_flops`` from ``step`` on (``RunStarted`` held the one before)."""

    step: int
    precision: str
    matmul_peak_flops: float
    previous_flops: float
    step_share: float
    """The step's model FLOP/s over ``previous_flops``: 1.27 for a step at 127% of the peak it was divided by."""


_KIND_OF: dict[type, str] = {
    RunStarted: "run_started",
    DataPreparationStarted: "data_preparation_started",
    DataPreparationProgress: "data_preparation_progress",
    DataPrepared: "data_prepared",
    CompileStarted: "compile_started",
    CompileFinished: "compile_finished",
    StepMetrics: "step",
    ValidationDone: "validation",
    SampleGenerated: "sample",
    CheckpointSaved: "checkpoint",
    CheckpointFailed: "checkpoint_failed",
    WarningRaised: "warning",
    MicroBatchChanged: "micro_batch_changed",
    MatmulPeakMeasured: "matmul_peak_measured",
    RunFinished: "finished",
    RunFailed: "failed",
}
_TYPE_OF = {v: k for k, v in _KIND_OF.items()}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_dict``; unknown keys (a newer writer) are ignored. Anything but an event's
    object (a list, a number: a damaged or foreign line) is a ValueError, as an unknown event is, and so is
    a field whose value is not of its type (a step that is text, a loss that is a list, a run's config whose
    train section is a number): a reader skips the line, where the value failed later, in the window's
    table or plots, on every refresh. A field that has a default (when it happened, a world size) falls back
    to it instead."""
    if not isinstance(data, dict):
        raise ValueError(f"not an event: a JSON {type(data).__name__}")
    cls = _TYPE_OF.get(data.get("event", ""))
    if cls is None:
        raise ValueError(f"unknown event {data.get('event')!r}")
    hints, checks = _hints(cls), _checks(cls)
    values = {}
    for name, value in data.items():
        check = checks.get(name)
        if check is None:
            continue
        if value is None and hints[name] is float:
            value = math.nan  # how a writer records a number that is not finite (``core.json_text.finite_json``)
        if check(value):
            values[name] = value
        elif name not in _optional(cls):
            raise ValueError(f"{data['event']} event: {name} is {_short(value)}, not {hints[name]}")
        # else: a damaged value of a field with a default (when it happened, a world size): the default
    if cls is RunStarted:
        _check_run_config(values.get("config"))
    return cls(**values)


_MAX_INT = 2**63 - 1  # what a count of the engine is at most (core.config.MAX_COUNT)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The types of a dataclass's fields (resolved from their annotations' text), by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


@functools.cache
def _checks(cls: type) -> dict[str, Callable[[Any], bool]]:
    """``_fits`` of each field of an event class, by name."""
    return {name: _checker(hint) for name, hint in _hints(cls).items()}


@functools.cache
def _optional(cls: type) -> frozenset[str]:
    """The fields of a dataclass that have a default."""
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)


def _fits(value: Any, hint: Any) -> bool:
    """``value``, as JSON gives it, is of type ``hint`` (a type this check does not know is taken as it is)."""
    return _checker(hint)(value)


@functools.cache
def _checker(hint: Any) -> Callable[[Any], bool]:
    """The check of ``_fits`` for one type, built once: working the type out again for every field of every line
    took most of the time of reading a long metrics.jsonl (100,000 steps: 4.8 s of 6.5 s)."""
    if hint is Any:
        return lambda value: True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = tuple(_checker(a) for a in args)
        return lambda value: any(part(value) for part in parts)
    if hint is type(None):
        return lambda value: value is None
    if hint is bool:
        return lambda value: isinstance(value, bool)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _MAX_INT
    if hint is float:  # NaN and infinities are numbers a diverged run reports
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return lambda value: isinstance(value, str)
    if dict in (hint, origin):
        if not args:
            return lambda value: isinstance(value, dict)
        key, item = _checker(args[0]), _checker(args[1])
        return lambda value: isinstance(value, dict) and all(key(k) and item(v) for k, v in value.items())
    if hint in (list, tuple) or origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        if not inner:
            return lambda value: isinstance(value, (list, tuple))
        each = _checker(inner[0])
        return lambda value: isinstance(value, (list, tuple)) and all(each(v) for v in value)
    return lambda value: True


def _check_run_config(config: dict[str, Any] | None) -> None:
    """A run's config as the window reads it: its sections are objects, and each setting it holds is of its
    type (settings of a newer writer it does not know are left as they are)."""
    from core.config import DataConfig, ModelConfig, RunConfig, TrainConfig

    if config is None:
        return
    top = _hints(RunConfig)
    for key, section in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig)):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"run_started event: config's {key} is {_short(value)}, not an object")
        fields = _hints(section)
        for name, setting in value.items():
            if name in fields and not _fits(setting, fields[name]):
                raise ValueError(f"run_started event: {key}.{name} is {_short(setting)}, not {fields[name]}")
    for name, value in config.items():
        if name in top and name not in ("model", "data", "train") and not _fits(value, top[name]):
            raise ValueError(f"run_started event: config's {name} is {_short(value)}, not {top[name]}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Sink(Protocol):
    def __call__(self, event: Event) -> None: ...


def null_sink(event: Event) -> None:
    """A sink that drops everything."""


class ListSink:
    """Collects events in memory (tests, the benchmark)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, cls: type) -> list:
        return [e for e in self.events if isinstance(e, cls)]
