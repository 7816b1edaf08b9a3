"""The training loop: set-up, then optimizer steps in readable phases.

Each optimizer step:
1. control: pause, stop, save requests (only ever between steps);
2. the global batch for this step, read by stream position (same samples for
   any split into micro-batches or ranks), and its count of real target tokens;
3. micro-steps: forward, summed cross-entropy divided by that window-wide count,
   backward (DDP/FSDP reduce gradients on the last micro-step only); a micro-step
   that runs out of memory redoes the step with half the micro-batch and twice
   the accumulation, the same update (core.split);
4. unscale, clip, learning rate from tokens consumed, optimizer step;
5. one small all-reduce (global loss, stop requests of every rank), one host
   sync to read loss and grad norm, then the metrics event;
6. periodic validation, sample and checkpoint.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import math
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from core import checkpoint as ckpt_io
from core.compile import CompiledModel, compile_model, compile_unavailable_reason, reset_compiler
from core.config import MIN_VOCAB_SIZE, ModelConfig, RunConfig
from core.control import Control
from core.data import SAMPLE_ORDER, Data, SampleOrder, global_batch_targets, prepare_data
from core.device import (
    GIB,
    autocast,
    device_name,
    import_training_libraries,
    measure_matmul_peak,
    memory_gib,
    peak_memory_gib,
    release_freed_memory,
    reset_peak_memory,
    resolve_device,
    training_flops_per_token,
)
from core.distributed import (
    DistContext,
    PeerLost,
    all_reduce_sum,
    barrier,
    check_same_on_all_ranks,
    full_state_dicts,
    init_distributed,
    is_peer_failure,
    load_full_optimizer_state,
    local_scalar,
    peer_failure_message,
    shard_model,
)
from core.errors import (
    Cancelled,
    CheckpointError,
    ConfigError,
    DataError,
    JobTerminated,
    NotFinite,
    describe_exception,
    first_line,
)
from core.events import (
    CheckpointFailed,
    CheckpointSaved,
    CompileFinished,
    CompileStarted,
    Event,
    MatmulPeakMeasured,
    MicroBatchChanged,
    RunFailed,
    RunFinished,
    RunStarted,
    SampleGenerated,
    Sink,
    StepMetrics,
    ValidationDone,
    WarningRaised,
    null_sink,
)
from core.memory_budget import check_fits, check_model_fits, fit_split
from core.mfu import PEAK_CHECK_MFU, peak_share, utilization
from core.model import LlamaForCausalLM
from core.paths import missing_folders, remove_empty, user_path, why_write_failed
from core.precision import PrecisionChoice, check_precision, decide_precision, lineage_choice, matmul_peak
from core.resume import check_optimizer_state, other_batch, other_stream, rng_state, set_rng_state
from core.runs import (
    CONFIG_FILE,
    HEARTBEAT_FILE,
    METRICS_FILE,
    RUN_CONFIG_KEYS,
    Heartbeat,
    JsonlSink,
    check_run_id,
    check_run_root,
    create_run_dir,
    library_versions,
    new_run_id,
    run_id_taken,
    run_root,
    run_tag,
    write_json,
)
from core.schedule import LRSchedule, Position, make_schedule
from core.split import (
    OomAgreement,
    OutOfMemory,
    average_gradients,
    is_out_of_memory,
    out_of_memory_detail,
    smaller_split,
)
from core.step_times import StepTimes
from core.tokenizer import dropped_characters, drops_unknown_text, require_checkpoint_tokenizer

DEFAULT_PROMPT = "The"
FP16_SLOWER = 1.05
"""fp16 GEMMs this much slower than fp32's on a CPU: the run warns (closer is within the timing's spread)."""

# _TRAINING_MASK: training and validation pass no attention mask, in either layout. The document layout pads
# on the right only, so causal attention already keeps every padding key from every real query, and the
# padding's own queries are left out of the loss: the same loss and gradients as with the mask, while SDPA
# can take its causal kernels (Flash attention on CUDA) and share K/V among query heads (GQA) without copies.
# A batch's mask stays for inspection and for callers that pad on the left.


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    step: int
    tokens: int
    stopped: bool
    final_loss: float | None
    val_loss: float | None
    checkpoint: Path | None
    median_tokens_per_s: float | None
    compile_seconds: float | None


def make_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms); fused where the device has it."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, fused=fused)


def train(config: RunConfig, control: Control | None = None, sink: Sink = null_sink) -> RunResult:
    """Run one training run to its budget or a stop request; see ``Trainer``."""
    return Trainer(config, control, sink).run()


class Phase(enum.Enum):
    """Where a ``Trainer`` is in its life; ``run()`` goes through them in order."""

    NEW = "new"
    SETTING_UP = "setting up"
    TRAINING = "training"
    FINISHED = "finished"
    """Reached its budget or stopped on request; the final checkpoint is written."""
    FAILED = "failed"


COMPILE_WARMUP_STEPS = 3
"""Optimizer steps that may compile (graphs for the first call, then recompiles for
the second and the optimizer's own first step): left out of throughput."""



def _tensor_bytes(held: Any, device: torch.device) -> int:
    """Bytes of the tensors ``held`` keeps (in dicts, lists, tuples and objects' attributes) in ``device``'s kind
    of memory: the process' own for a CPU run, the GPU's for a CUDA one. Each storage counted once."""
    seen: set[int] = set()
    total = 0

    def visit(value: Any, depth: int) -> None:
        nonlocal total
        if depth > 8 or value is None or isinstance(value, (str, bytes, int, float, bool)):
            return
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if value.device.type == device.type and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
            return
        if isinstance(value, dict):
            items = value.values()
        elif isinstance(value, (list, tuple)):
            items = value
        elif hasattr(value, "__dict__"):
            items = vars(value).values()
        else:
            return
        for item in items:
            visit(item, depth + 1)

    visit(held, 0)
    return total

class Trainer:
    """One run. ``sink`` receives plain-data events; ``control`` is polled between steps.

    Everything torch happens on the calling thread; the trainer never waits on
    the sink's consumer (a sink must return quickly, e.g. emit a queued signal).
    ``run()`` sets up (the steps of ``set_up``), trains, and ends with a final
    checkpoint; ``phase`` says how far it got, and ``has_model`` whether there is
    a model that ``save`` can write (set-up finished, whatever happened after).
    """

    def __init__(self, config: RunConfig, control: Control | None = None, sink: Sink = null_sink,
                 run_id: str | None = None) -> None:
        self.cfg = config
        self.requested_run_id = check_run_id(run_id) if run_id is not None else None
        self.control = control or Control()
        self.user_sink = sink
        self.phase = Phase.NEW
        # Where and how: set by _init_device.
        self.dist = DistContext()
        self.device = torch.device("cpu")
        self.precision = "fp32"
        self.precision_choice = PrecisionChoice("fp32", "fp32", "fp32: as set")
        self.fsdp = False
        """FSDP2 across the processes of a torchrun job (DDP otherwise)."""
        # What: set by _prepare_data, _decide_model and _build_model.
        self.data: Data | None = None
        self.model_cfg: ModelConfig | None = None
        self.model: LlamaForCausalLM | None = None
        """The uncompiled model (sharded in place under FSDP): save, evaluate and sample through it."""
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.compiled: CompiledModel | None = None
        """What the training step calls (compiled and/or DDP-wrapped); set last in set-up."""
        # Position in the sample stream and the schedule: set by _start_position.
        self.step, self.tokens, self.samples = 0, 0, 0
        self.seed = config.train.seed
        self.parent: str | None = config.parent
        self.order: SampleOrder | None = None
        self._stream_note = ""  # why a resume cannot continue its parent's sample stream, if it cannot
        self._prompt: tuple[str, list[int]] | None = None
        """The samples' prompt and its ids, found at the first sample (``_sample_prompt``)."""
        self._batch_note = ""  # a resume that trains with another effective batch than its parent's
        self._precision_note = ""  # fp16 on a CPU that emulates it
        self.schedule: LRSchedule | None = None
        self.tokens_per_step = 0
        self.total_steps = 0
        self._rng_state: dict | None = None
        """A resumed run's RNG states, applied at the very end of set-up."""
        # The run folder (rank 0 only) and time.
        self.run_id = ""
        self.run_dir: Path | None = None
        self._jsonl: JsonlSink | None = None
        self._heartbeat: Heartbeat | None = None
        self._metrics_failed = False
        """metrics.jsonl could not be written once (a full disk): said once, training goes on."""
        self._sink_failed = False
        """The user's sink raised once: recorded once, training goes on."""
        self._ended = False
        """A RunFinished or RunFailed was emitted."""
        self.start_time = 0.0
        """Wall seconds the lineage had trained before this run (a resumed parent's)."""
        self.t0 = time.perf_counter()
        self.paused_s = 0.0
        # Measurements: set by _measure_peak and _prepare_measurements.
        self.peak_flops = 0.0
        self.flops_per_token = 0.0
        self.check_peak = True
        """Measure the matmul peak again when a step reaches ``PEAK_CHECK_MFU`` of it (once). A tune trial turns it
        off: its steps are timed between their events, and the tune checks the peak itself, between trials."""
        self.peak_rss = 0.0
        """Resident memory sampled after each step: the CPU peak where the kernel's cannot be reset."""
        self._peak_resets = False
        """The device's own high-water mark restarts at this run's start (CUDA; Linux's peak resident set)."""
        self.mem_baseline = 0.0
        # Loop state.
        self._periodic_step = -1
        """The step of the last periodic checkpoint (the final save skips a step just saved)."""
        self._failed_save: tuple[int, str] | None = None
        """The step and reason of the last checkpoint that could not be written (its retry says nothing new)."""
        self._stop_agreed = False
        """Under torchrun: some rank was asked to stop (read once per step)."""
        self.compiling = False
        """The first step of a compiled model is running: torch.compile is compiling (seconds to minutes)."""
        # Self-fitting micro-batches (core.split).
        self.split_changes: list[dict[str, Any]] = []
        """Every change of micro-batch × accumulation, as recorded in config.json and metrics.jsonl."""
        self._oom: OomAgreement | None = None
        self._split_proven = False
        """A step has trained with the current split (under DDP: its gradients may then sync in the backward)."""
        self._agreed = False
        """This attempt of a step has passed its agreement point (DDP's synchronised backward may be running)."""
        self._micro_index = 0
        self._oom_reason = ""
        self._oom_here = False
        """Whether this process was one that ran out of memory in the attempt ``_oom_reason`` describes."""

    @property
    def stoppable(self) -> bool:
        """Optimizer steps are running: a stop request takes effect after the current one."""
        return self.phase is Phase.TRAINING

    @property
    def ending(self) -> bool:
        """The run's outcome is decided (finished, or failed and recording why): the process is on its way out."""
        return self.phase in (Phase.FINISHED, Phase.FAILED)

    @property
    def has_model(self) -> bool:
        """Set-up finished and the run went on to its steps: there is a model that ``save`` can write (a run
        stopped before its first step has none)."""
        return self.compiled is not None

    # ------------------------------------------------------------------ events
    def now(self) -> float:
        """Wall seconds of this run, pauses excluded, offset by the parent's."""
        return self.start_time + time.perf_counter() - self.t0 - self.paused_s

    def emit(self, event: Event) -> None:
        """Record ``event`` in metrics.jsonl, then hand it to the sink; neither can end the run.

        A metrics file that cannot be written (a full disk) is said once through
        the sink; a sink that raises (a closed pipe, a consumer's bug) is recorded
        once in metrics.jsonl. Training, checkpoints and the run folder never
        depend on either.
        """
        if not self.dist.is_main:
            return
        # After its ending the run's metrics.jsonl is closed: a save the window asks for then (Save model… on a
        # finished run) goes to the window alone, without a warning that the run folder misses events.
        after_the_end = self._ended and self._jsonl is not None and self._jsonl.closed
        if isinstance(event, (RunFinished, RunFailed)):
            self._ended = True
        # The run folder first: nothing is lost if the consumer fails.
        if self._jsonl is not None and not after_the_end and not self._jsonl(event) and not self._metrics_failed:
            self._metrics_failed = True
            reason = why_write_failed(self._jsonl.error, self._jsonl.path.parent) if self._jsonl.error else "closed"
            self._deliver(WarningRaised(self.run_id, self.now(), f"cannot write {self._jsonl.path} ({reason}): "
                                        f"training goes on, but the run folder misses events from step "
                                        f"{self.step} on; checkpoints are still saved"))
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        try:
            self.user_sink(event)
        except Exception as exc:
            if not self._sink_failed:
                self._sink_failed = True
                if self._jsonl is not None:
                    self._jsonl(WarningRaised(self.run_id, self.now(), f"the event consumer failed "
                                              f"({describe_exception(exc)}); training goes on and events are "
                                              f"still recorded here"))

    def warn(self, message: str) -> None:
        self.emit(WarningRaised(self.run_id, self.now(), message))

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        assert self.phase is Phase.NEW, "a Trainer runs once"
        abandoned = False
        try:
            self.set_up()
            self._before_first_step()
            self.phase = Phase.TRAINING
            result = self._loop()
            self.phase = Phase.FINISHED
            return result
        except BaseException as exc:
            phase = self.phase
            abandoned = self.phase is Phase.SETTING_UP and isinstance(exc, (KeyboardInterrupt, Cancelled))
            if abandoned:
                self.compiled = None  # no model to save: set-up's is not what the run was asked to train
            self.phase = Phase.FAILED
            # A collective that failed because a peer died: one clear line, not a backend trace; so is memory that
            # ran out outside a micro-step (those are redone with a smaller split).
            if is_peer_failure(exc, self.dist):
                failure = PeerLost(peer_failure_message(exc, self.dist))
            elif is_out_of_memory(exc) and not isinstance(exc, OutOfMemory):
                failure = OutOfMemory(self._out_of_memory_elsewhere(exc, phase))
            else:
                failure = exc
            if isinstance(failure, KeyboardInterrupt):
                message = str(failure) or "interrupted"
            elif isinstance(failure, PeerLost):
                message = str(failure)
            else:
                message = describe_exception(failure)
            self.emit(RunFailed(self.run_id, self.now(), message.strip() or type(failure).__name__, self.step,
                                peer_lost=isinstance(failure, PeerLost)))
            if failure is not exc:
                raise failure from exc
            raise
        finally:
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self._jsonl is not None:
                self._jsonl.close()
            if abandoned and self.run_dir is not None:
                # Ctrl-C, SIGTERM or a stop before the first step: nothing to keep, so nothing is (the run folder
                # a torchrun job's rank 0 made during its longer set-up stayed, holding one "failed" line).
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def _out_of_memory_elsewhere(self, exc: BaseException, phase: Phase) -> str:
        """One line for memory that ran out where no smaller split helps: set-up, the optimizer step (AdamW's
        state is allocated at the first), validation, sampling."""
        detail = out_of_memory_detail(exc)
        if phase is Phase.TRAINING:
            return (f"out of memory in step {self.step + 1}, outside its micro-steps (the optimizer step, whose "
                    f"state AdamW allocates at the first, validation or sampling) ({detail}); choose a smaller "
                    f"model, fewer --eval-batches or a shorter sample")
        return f"out of memory while setting up the run ({detail}); choose a smaller model or micro-batch"

    def record_abort(self, message: str) -> None:
        """Record a ``RunFailed`` now, from any thread, when the process must end before ``run`` can.

        For a process that ends itself at once (an interrupt its torch thread never
        saw): metrics.jsonl gets its ending and the heartbeat goes; the sink is not called.
        """
        if self._ended or not self.dist.is_main:
            return
        self._ended = True
        if self._jsonl is not None:
            self._jsonl(RunFailed(self.run_id, self.now(), message, self.step))
            self._jsonl.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def set_up(self) -> None:
        """Everything before the first optimizer step, in order; each step names what it sets."""
        self.phase = Phase.SETTING_UP
        self._init_device()
        self._check_output()
        loaded, trainer_state = self.read_start_checkpoint()
        # Its sizes are known: a model no memory holds is said before the corpus is prepared (minutes on a
        # large one); _build_model checks again with the tokenizer's vocabulary.
        local, shards = self._sharing()
        check_model_fits(loaded.model_config if loaded and loaded.model_config else self.cfg.expected_model(),
                         self.device, shards=shards, processes=local)
        self._check_start_weights(loaded)
        self._prepare_data(loaded)
        self._decide_model(loaded)
        self._measure_peak()
        # Libraries loaded, data ready, the probes measured, no model yet: what the process holds apart from
        # training (in the dashboard also the window and earlier runs' leftovers). The modules torch imports at
        # its first optimizer and the probes' GEMM buffers, freed but kept in the C heap, read as training
        # memory: both are settled first. Allocator stats on CUDA: no sync. The start checkpoint's tensors, read
        # already, are the training's own: a continued run's memory was shown a checkpoint's size too low.
        import_training_libraries()
        release_freed_memory()
        self.mem_baseline = memory_gib(self.device) - _tensor_bytes((loaded, trainer_state), self.device) / GIB
        self._build_model(loaded)
        self._start_position(trainer_state)
        self._cancel_if_stopped()
        self._create_run_folder()
        self._prepare_measurements()
        self.compiled = self._compile(self.cfg.train.compile_mode, self.cfg.train.compile_scope)
        self._cancel_if_stopped()
        self._announce(loaded)
        for note in (self._stream_note, self._batch_note, self._precision_note):
            if note:
                self.warn(note)
        if self._rng_state is not None:
            # Last, after everything in set-up that draws random numbers: the
            # loop continues the stream exactly where the parent left it.
            set_rng_state(self._rng_state)

    def _cancel_if_stopped(self) -> None:
        """A stop asked for during set-up (the dashboard's Stop; Ctrl-C aborts set-up itself) ends it here, before
        any step: there is nothing to save, and a validation pass and a step-0 checkpoint are not what was asked.
        Under torchrun the ranks agree on a stop with a step's loss, so set-up goes on to the first step there."""
        if self.control.stop_requested and not self.dist.enabled:
            raise Cancelled("set-up stopped; nothing was kept")

    def _before_first_step(self) -> None:
        """A stop asked for after set-up, before the first step, ends the run as one during set-up does: nothing
        kept (no validation at step 0, no step-0 checkpoint, no run folder). A pause holds the run here; saves
        asked for wait for the first step, as during set-up (there is no trained model to write yet). The
        loop's first step follows at once, without another look at the controls: a stop from now on is a stop
        after that step."""
        if self.dist.enabled:
            return  # the ranks agree on a stop with a step's loss (see _cancel_if_stopped)
        self._hold_while_paused(serve_saves=False)
        self._cancel_if_stopped()

    def _hold_while_paused(self, serve_saves: bool) -> None:
        """Wait while the run is paused (and not stopped), the time kept out of its clock; ``serve_saves``: a save
        asked for meanwhile is written (between steps), else it waits for the first step."""
        if self.control.paused and not self.control.stop_requested:
            t = time.perf_counter()
            while not self.control.wait_while_paused(0.1):
                if serve_saves:
                    self._serve_save_requests()
            self.paused_s += time.perf_counter() - t

    def _init_device(self) -> None:
        """``device``, ``dist`` (the torchrun process group, if any) and ``precision``."""
        tc = self.cfg.train
        device = resolve_device(tc.device)
        self.dist = init_distributed(device.type)
        if self.dist.enabled and device.type == "cuda":
            device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        if tc.precision != "auto":
            check_precision(tc.precision, device)  # bf16 where the device lacks it: before anything is read
        self.fsdp = tc.fsdp and self.dist.enabled
        self._oom = OomAgreement(self.dist)  # under torchrun: a collective, on every rank at this point

    def _decide_precision(self, requested: str, device: torch.device, model: ModelConfig) -> PrecisionChoice:
        """``auto`` may measure (a CPU's bf16 probe at ``model``'s shapes, the tokenizer's vocabulary included,
        cached per machine): under torchrun rank 0 decides for all, so processes never train in different
        precisions or time GEMMs against each other."""
        if not (self.dist.enabled and requested == "auto" and device.type == "cpu"):
            return decide_precision(requested, device, model=model)
        choice = [decide_precision(requested, device, model=model) if self.dist.is_main else None]
        torch.distributed.broadcast_object_list(choice, src=0)
        return choice[0]

    def lineage_precision(self, loaded: ckpt_io.LoadedCheckpoint | None,
                           device: torch.device) -> PrecisionChoice | None:
        """``auto`` on resume: ``core.precision.lineage_choice`` of the parent's checkpoint (also the launcher's
        check of a job of several processes)."""
        if self.cfg.train.precision != "auto" or not (self.cfg.resume and loaded):
            return None
        return lineage_choice(loaded.meta.get("precision"), loaded.meta.get("device_type"), device)

    def _check_output(self) -> None:
        """Before anything is read or created: run folders can be created where this run is to write, and a run id
        asked for is free (found after a corpus' preparation, it cost minutes on a large one)."""
        if self.dist.is_main:
            root = check_run_root(self.cfg.out_dir)
            if self.requested_run_id is not None and run_id_taken(root, self.requested_run_id):
                raise ConfigError(f"run folder {self.requested_run_id} already exists; choose another run id")

    def read_start_checkpoint(self) -> tuple[ckpt_io.LoadedCheckpoint | None, dict[str, Any] | None]:
        """The checkpoint to resume or start from, read once and whole: weights, tokenizer, trainer state.

        A run folder means its newest checkpoint, also while that run still
        writes and rotates them; the config then names the one that was read.
        """
        cfg = self.cfg
        source = cfg.resume or cfg.init_from
        if not source:
            return None, None
        loaded = ckpt_io.read_checkpoint(source, trainer_state=bool(cfg.resume))
        # Every rank read it itself: a run still rotating its checkpoints could hand them different ones.
        check_same_on_all_ranks(str(loaded.source), "checkpoint to start from (name one checkpoint folder of a run "
                                                    "that is still training)", self.dist)
        self.cfg = cfg.replace(**{"resume" if cfg.resume else "init_from": str(loaded.source)})
        if not cfg.resume:
            return loaded, None
        if loaded.trainer_state is None:
            raise ckpt_io.cannot_resume(source)
        return loaded, loaded.trainer_state

    def _check_start_weights(self, loaded: ckpt_io.LoadedCheckpoint | None) -> None:
        """Weights that cannot load into the architecture they are given (a bare state dict of another preset, a
        Hugging Face folder whose config.json does not match its tensors) are said from their shapes alone,
        before the corpus is prepared: found after it, the misfit cost minutes to hours of tokenizing first.
        A bare state dict whose embedding does not tell its vocabulary is checked with the tokenizer's, later."""
        if loaded is None or loaded.kind == "speedboard":  # a Speedboard folder's config is its tensors' (checked)
            return
        rows = ckpt_io.embedding_rows(loaded.state_dict) if not loaded.model_config else None
        if not (loaded.model_config or rows):
            return
        model_cfg = loaded.model_config or replace(self.cfg.model, vocab_size=rows)
        problem = ckpt_io.shape_problem(model_cfg, {k: tuple(v.shape) for k, v in loaded.state_dict.items()},
                                        str(loaded.source))
        if problem:
            raise CheckpointError(problem)

    def _prepare_data(self, loaded: ckpt_io.LoadedCheckpoint | None) -> None:
        """``data``: tokenizer (the checkpoint's own when it has one) and samples read from the
        corpus' token store, which is prepared here if it has none yet (progress events through the sink;
        a stop request cancels it, keeping nothing). Under torchrun one process per machine prepares (a
        lock per corpus), the others wait for it; every rank reads the same files."""
        tokenizer, origin = None, "given"
        if loaded is not None and loaded.tokenizer is not None:
            tokenizer, origin = loaded.tokenizer, f"checkpoint {loaded.source}"
            self._check_tokenizer_setting(tokenizer, loaded)
        self.data = prepare_data(self.cfg.data, tokenizer, tokenizer_origin=origin, sink=self.emit, clock=self.now,
                                 run_id=self.run_id, should_stop=lambda: self.control.stop_requested)
        if self.dist.enabled:  # all ranks must read the same samples: same tokens, tokenizer and layout
            data, tok = self.data, self.data.tokenizer
            tok_hash = hashlib.sha256(tok.to_str().encode()).hexdigest()
            check_same_on_all_ranks(f"{data.corpus.digest} {tok_hash} {len(data.train)} {len(data.val)} "
                                    f"{data.train.seq_len}", "data (corpus, tokenizer, samples)", self.dist)

    def _check_tokenizer_setting(self, tokenizer, loaded: ckpt_io.LoadedCheckpoint) -> None:
        """A tokenizer file given with a checkpoint that has its own must be that one: its weights learned its ids.
        The checkpoint's own run setting (a resumed or continued run inherits it) is not a file given: the
        checkpoint's tokenizer serves whatever lies at that path now (overwritten, gone)."""
        path = self.cfg.data.tokenizer
        run = loaded.meta.get("run") if isinstance(loaded.meta, dict) else None
        data = run.get("data") if isinstance(run, dict) else None
        if not path or (isinstance(data, dict) and data.get("tokenizer") == path):
            return
        if not Path(path).expanduser().is_file():  # as a new run refuses it: not recorded and ignored
            raise DataError(f"tokenizer file {path} does not exist", "tokenizer")
        require_checkpoint_tokenizer(path, tokenizer, str(loaded.source))

    def _sharing(self) -> tuple[int, int]:
        """(processes that share this device's memory, shards of the parameter states): CPU processes of one
        machine share its RAM; FSDP divides the states over the ranks."""
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if self.dist.enabled and self.device.type != "cuda" else 1
        return local, self.dist.world_size if self.fsdp else 1

    def _decide_model(self, loaded: ckpt_io.LoadedCheckpoint | None) -> None:
        """``model_cfg`` and ``precision``, with every check that needs no model: nothing is allocated yet."""
        cfg, tc, device = self.cfg, self.cfg.train, self.device
        tok = self.data.tokenizer
        # The architecture is the checkpoint's own when it has one; a bare state dict loads into cfg.model
        # with the vocabulary of its embedding (the tokenizer must fit in it).
        rows = ckpt_io.embedding_rows(loaded.state_dict) if loaded and not loaded.model_config else None
        model_cfg = (loaded.model_config if loaded and loaded.model_config
                     else replace(cfg.model, vocab_size=rows or tok.vocab_size))
        if cfg.data.seq_len > model_cfg.max_position_embeddings:
            raise ConfigError(f"sequence length {cfg.data.seq_len} is beyond the model's "
                              f"{model_cfg.max_position_embeddings} positions", "seq_len")
        if loaded and not loaded.model_config and not rows:  # with its rows, _check_start_weights has done it
            # The architecture before the tokenizer: a bare state dict of another preset is named as such,
            # not as a tokenizer too large for its embedding.
            problem = ckpt_io.shape_problem(model_cfg, {k: tuple(v.shape) for k, v in loaded.state_dict.items()},
                                            str(loaded.source))
            if problem:
                raise CheckpointError(problem)
        if rows and tok.vocab_size > rows and loaded.tokenizer is None and not cfg.data.tokenizer:
            fix = (f"give --vocab-size {rows} (or the tokenizer its weights were trained with, --tokenizer FILE)"
                   if rows >= MIN_VOCAB_SIZE else  # no tokenizer is trained that small
                   f"give the tokenizer its weights were trained with (--tokenizer FILE): no tokenizer is trained "
                   f"to fewer than {MIN_VOCAB_SIZE} tokens")
            raise ConfigError(f"the tokenizer trained for this run has {tok.vocab_size:,} tokens but the embedding of "
                              f"{loaded.source} has only {rows:,} rows; {fix}", "vocab_size")
        ckpt_io.check_tokenizer_fits(tok, model_cfg)
        # Before anything is allocated: a model or a micro-batch that cannot fit is one line, not an allocation
        # failure; the model first, as auto precision's probe builds one of its layers.
        local, shards = self._sharing()
        check_model_fits(model_cfg, device, shards=shards, processes=local)
        self.precision_choice = (self.lineage_precision(loaded, device)
                                 or self._decide_precision(tc.precision, device, model_cfg))
        self.precision = self.precision_choice.precision
        if tc.auto_micro_batch:
            self._fit_before_run(model_cfg, shards, local)
        else:
            check_fits(model_cfg, tc.micro_batch, cfg.data.seq_len, self.precision, device,
                       shards=shards, processes=local, accum_steps=tc.accum_steps, compile_mode=tc.compile_mode)
        self.model_cfg = model_cfg

    def _build_model(self, loaded: ckpt_io.LoadedCheckpoint | None) -> None:
        """``model`` (with the checkpoint's weights), ``optimizer`` and ``scaler``."""
        tc, device = self.cfg.train, self.device
        torch.manual_seed(tc.seed)
        model = LlamaForCausalLM(self.model_cfg)
        if loaded:
            # Before the load, else the first step's "loss became nan" would name the wrong cause.
            ckpt_io.check_finite(loaded.state_dict, str(loaded.source), "start from an earlier checkpoint")
            ckpt_io.load_weights(model, loaded.state_dict, source=str(loaded.source))
        self.model = model.to(device)
        # FSDP shards in place and replaces the parameters, so it comes before the optimizer.
        if self.fsdp:
            shard_model(self.model, device)
        self.optimizer = make_optimizer(self.model, tc, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")

    def _fit_before_run(self, model_cfg: ModelConfig, shards: int, processes: int) -> None:
        """``auto_micro_batch``: the largest micro-batch that fits, the same on every rank (the smallest of their
        picks: each rank measures its own device), with accumulation raised to keep the effective batch."""
        tc = self.cfg.train
        fit = fit_split(model_cfg, tc.micro_batch, tc.accum_steps, self.cfg.data.seq_len, self.precision,
                        self.device, shards, processes)
        micro = self._oom.smallest(fit.micro_batch)
        if micro != tc.micro_batch:
            reason = fit.reason if fit.changed else "another process of this job has less memory"
            self._set_split(micro, tc.micro_batch * tc.accum_steps // micro,
                            f"micro-batch auto: {reason}", None)

    def _set_split(self, micro: int, accum: int, reason: str, step: int | None) -> None:
        """Train with ``micro × accum`` from optimizer step ``step`` on; recorded in config.json and metrics.jsonl.

        Before the run folder exists the change is only recorded (``step`` None: the run's first step, known
        once the start position is); ``_announce`` reports it.
        """
        tc = self.cfg.train
        old_micro, old_accum = tc.micro_batch, tc.accum_steps
        try:
            self.cfg = self.cfg.replace(train={"micro_batch": micro, "accum_steps": accum})
        except ConfigError as exc:  # e.g. a CUDA-graph compile mode, which refuses accumulation
            raise OutOfMemory(f"{reason}; micro-batch {micro} × accumulation {accum} would fit, but {exc}") from None
        self._split_proven = False
        change = MicroBatchChanged(self.run_id, self.now(), step, old_micro, old_accum, micro, accum, reason)
        self.split_changes.append({k: v for k, v in change.to_dict().items() if k not in ("event", "run_id")})
        if self.run_id:
            self.emit(change)
            self._rewrite_config()

    def _rewrite_config(self) -> None:
        """config.json with the current split and every change so far; a failed write is a warning."""
        if self.run_dir is None:
            return
        try:
            write_json(self.run_dir / CONFIG_FILE, self._run_config_json())
        except OSError as exc:
            self.warn(f"cannot update {self.run_dir / CONFIG_FILE} ({why_write_failed(exc, self.run_dir)}); "
                      f"metrics.jsonl records the new split")

    def _start_position(self, trainer_state: dict[str, Any] | None) -> None:
        """Counters, seed, sample order and schedule: zero, or where a resumed parent stopped."""
        self.tokens_per_step = self.cfg.tokens_per_step(self.dist.world_size)
        if trainer_state is not None:
            self._restore(trainer_state)
            self.seed = trainer_state.get("seed", self.seed)
            self.parent = self.parent or trainer_state.get("run_id")
            self.start_time = float(trainer_state.get("wall_time", 0.0))
        self.order = SampleOrder(len(self.data.train), self.seed)
        if trainer_state is not None:
            self._stream_note = other_stream(trainer_state, len(self.data.train), self.data.corpus.digest)
        self.schedule = make_schedule(self.cfg.train, self._position(), trainer_state)  # counters that fit, too
        remaining = max(0, math.ceil((self.schedule.end_tokens - self.tokens) / self.tokens_per_step))
        self.total_steps = self.step + remaining
        if trainer_state is not None:
            self._batch_note = other_batch(trainer_state, self.tokens_per_step, self.cfg.data.seq_len, remaining)
            self._record_what_the_checkpoint_decides(trainer_state)

    def _record_what_the_checkpoint_decides(self, trainer_state: dict[str, Any]) -> None:
        """A resumed run trains with its checkpoint's seed (the random streams it saved) and its lineage's warmup
        (none in a new segment after a finished budget), whatever the settings it was given say (a --config
        file's, the dashboard's): config.json records what it trains with, and another seed given is said."""
        given = self.cfg.train
        if given.seed != self.seed:
            self.warn(f"seed {given.seed} does not apply: a resumed run continues the random streams its checkpoint "
                      f"saved (seed {self.seed}); config.json records seed {self.seed}")
        lineage = (trainer_state.get("train_config") or {}).get("warmup_ratio", given.warmup_ratio)
        warmup = lineage if self.schedule.warmup_tokens else 0.0
        schedule, saved = self.schedule, trainer_state.get("schedule") or {}
        if warmup and schedule.end_tokens != saved.get("end_tokens"):
            # A new total keeps the lineage's warmup in tokens: recorded as its share of the new total (0.5 of
            # the parent's 100 steps resumed with --steps 60 is 50 steps, 0.83 of 60; 0.5 read as 30).
            warmup = schedule.warmup_tokens / (schedule.end_tokens - schedule.start_tokens)
        # A new segment's "no warmup" is the log's plan, not a value given; and a warmup given as the one this run
        # trains with (a resumed run's own config.json reused) is no news.
        if given.warmup_ratio != lineage and not math.isclose(given.warmup_ratio, warmup, abs_tol=1e-12):
            kept = (f"warmup {warmup * 100:g}% of its budget" if self.schedule.warmup_tokens
                    else "a new cosine without warmup after its finished budget")
            self.warn(f"warmup {given.warmup_ratio * 100:g}% does not apply: a resumed run keeps its schedule "
                      f"({kept}); config.json records warmup_ratio {warmup}")
        self.cfg = self.cfg.replace(train={"seed": self.seed, "warmup_ratio": warmup})

    def _create_run_folder(self) -> None:
        """``run_id`` and, on rank 0, ``run_dir`` with its heartbeat, config.json, tokenizer.json and metrics.jsonl.

        A folder that cannot be written whole (a full disk, a file-size limit) is
        removed again and the run refused in one line: no half-written run folder.
        Hidden folders that crashed saves of earlier runs left next to it (dead
        processes only) are cleared here.
        """
        self.run_id = self.requested_run_id or new_run_id(run_tag(self.cfg, self.dist.world_size))
        for change in self.split_changes:  # made before the start position was known: from the first step on
            if change["step"] is None:
                change["step"] = self.step + 1
        if self.dist.is_main:
            made = missing_folders(run_root(self.cfg.out_dir))  # removed again where the run is refused
            try:
                self.run_dir = create_run_dir(self.cfg.out_dir, self.run_id)
            except FileExistsError:
                raise ConfigError(f"run folder {self.run_id} already exists; choose another run id") from None
            except BaseException:
                remove_empty(made)  # what creating it made on the way (its parents), as a refused run leaves nothing
                raise
            try:
                self._heartbeat = Heartbeat(self.run_dir).start()
                self._write_run_files()
                self._jsonl = JsonlSink(self.run_dir / METRICS_FILE)
            except BaseException as exc:  # also a signal's abort (Ctrl-C, SIGTERM) while the files are written
                if self._heartbeat is not None:
                    self._heartbeat.stop()
                    self._heartbeat = None
                if self._jsonl is not None:
                    self._jsonl.close()
                    self._jsonl = None
                shutil.rmtree(self.run_dir, ignore_errors=True)
                remove_empty(made)
                where, self.run_dir = self.run_dir, None
                if not isinstance(exc, OSError):
                    raise
                raise ConfigError(f"cannot write the run folder {where}: {why_write_failed(exc, where)}",
                                  "out_dir") from None
            ckpt_io.sweep_runs(self.run_dir.parent, ckpt_io.CHECKPOINTS_DIR)
            source = self.cfg.resume or self.cfg.init_from
            if source and Path(source).parent.name == ckpt_io.CHECKPOINTS_DIR:
                ckpt_io.sweep_folder(Path(source).parent)  # the parent run's, wherever it lies
        self.t0 = time.perf_counter()

    def _measure_peak(self) -> None:
        """The MFU denominator (cached per machine; its first measurements take a second or so)."""
        self.peak_flops = measure_matmul_peak(str(self.device), self.precision)
        if self.device.type == "cpu" and self.precision == "fp16":
            # Most CPUs emulate fp16 matrix products (60 GFLOP/s against 233 in fp32 on an AMD EPYC): say so
            # with this machine's figures, measured once and cached like every MFU peak.
            fp32 = measure_matmul_peak(str(self.device), "fp32")
            # Slower beyond the GEMM timing's own spread: a CPU 1.1-1.4× slower in fp16 (a run 30% slower) was
            # not told when the bar was 1.5×.
            if self.peak_flops * FP16_SLOWER < fp32:
                ratio = fp32 / self.peak_flops
                self._precision_note = (f"fp16 matrix products run at {self.peak_flops / 1e9:,.0f} GFLOP/s on this "
                                        f"CPU, {ratio:.{1 if ratio < 10 else 0}f}× slower than fp32's "
                                        f"{fp32 / 1e9:,.0f}: fp16 is for GPUs; bf16 or fp32 train faster here")

    def _prepare_measurements(self) -> None:
        """The MFU numerator, and the memory high-water marks restarted at the run's start."""
        self.flops_per_token = training_flops_per_token(self.model_cfg, self.cfg.data.seq_len)
        self._peak_resets = reset_peak_memory(self.device)
        self.peak_rss = memory_gib(self.device)

    def _announce(self, loaded: ckpt_io.LoadedCheckpoint | None) -> None:
        tc = self.cfg.train
        self.emit(RunStarted(
            self.run_id, self.now(), run_dir=str(self.run_dir), config=self._config_dict(),
            device=device_name(self.device), precision=self.precision,
            precision_reason=self.precision_choice.reason, matmul_peak_flops=self.peak_flops,
            flops_per_token=self.flops_per_token, num_parameters=self.model.num_parameters(),
            tokens_per_step=self.tokens_per_step, budget_tokens=self.schedule.end_tokens,
            total_steps=self.total_steps, start_step=self.step, start_tokens=self.tokens,
            start_time=self.start_time, parent=self.parent, world_size=self.dist.world_size,
            versions=library_versions(), mem_baseline_gib=self.mem_baseline,
            warmup_end_tokens=self.schedule.start_tokens + self.schedule.warmup_tokens))
        for change in self.split_changes:  # chosen before the run folder existed
            self.emit(MicroBatchChanged(self.run_id, self.now(), **{k: v for k, v in change.items() if k != "time"}))
        if tc.fsdp and not self.dist.enabled:
            self.warn("FSDP shards over several processes (--nproc N); this single process trains unsharded")
        if loaded and loaded.tokenizer is None and not self.cfg.data.tokenizer:  # a given one is the user's word
            self.warn(f"{loaded.source} has no tokenizer.json: its weights are trained with a new tokenizer, "
                      f"whose token ids may not be the ones they learned (--tokenizer FILE gives the one they were "
                      f"trained with)")

    def _config_dict(self) -> dict:
        d = self.cfg.to_dict()
        d["model"] = self.model_cfg.to_dict()
        return d

    def _write_run_files(self) -> None:
        write_json(self.run_dir / CONFIG_FILE, self._run_config_json())
        self.data.tokenizer.save(self.run_dir)

    def _run_config_json(self) -> dict[str, Any]:
        corpus, tok = self.data.corpus, self.data.tokenizer
        record = {
            "run_id": self.run_id,
            "parent": self.parent,
            "config": self._config_dict(),
            "device": str(self.device),
            "precision": self.precision,
            "precision_choice": self.precision_choice.to_dict(),
            "world_size": self.dist.world_size,
            "tokens_per_step": self.tokens_per_step,
            # The horizon this run trains to (the config's budget is the lineage's, counted in its own unit:
            # a resume with another batch reaches the same tokens in another number of steps).
            "budget_tokens": self.schedule.end_tokens, "total_steps": self.total_steps,
            "corpus": {**corpus.to_dict(), "train_samples": len(self.data.train), "val_samples": len(self.data.val)},
            "tokenizer": {"origin": corpus.tokenizer_origin, "vocab_size": tok.vocab_size, "bos": tok.bos_token,
                          "eos": tok.eos_token, "pad": tok.pad_token, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
                          "pad_id": tok.pad_id},
            "versions": library_versions(),
            "split_changes": self.split_changes,
        }
        assert record.keys() == RUN_CONFIG_KEYS, record.keys() ^ RUN_CONFIG_KEYS  # what --config of it reads
        return record

    def _position(self) -> Position:
        return Position(self.step, self.tokens, self.tokens_per_step, len(self.data.train) * self.data.train.seq_len)

    def _restore(self, state: dict) -> None:
        check_optimizer_state(self.optimizer, state["optimizer"])
        # This run's hyperparameters (weight decay, betas, eps; the learning rate follows the schedule): the
        # checkpoint gives the moments and step counts only. Else load_state_dict would put the saved ones back,
        # ignoring --weight-decay on resume and taking whatever a crafted file holds (betas "x": a traceback).
        settings = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        try:
            if self.fsdp:  # the saved full state, sharded over the ranks (every rank read the file)
                load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])
            else:
                self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            if is_peer_failure(exc, self.dist):
                raise
            raise CheckpointError(f"the optimizer state does not fit this model ({first_line(exc)})") from None
        for group, own in zip(self.optimizer.param_groups, settings, strict=True):
            params = group["params"]
            group.clear()  # keys of the saving release or device (its fused/foreach flags) go too
            group.update(own, params=params)
        if state.get("scaler") and self.scaler.is_enabled():
            try:
                self.scaler.load_state_dict(state["scaler"])
            except (ValueError, KeyError, TypeError, RuntimeError) as exc:
                raise CheckpointError(f"the loss scaler's state is damaged ({first_line(exc)})") from None
        self.step, self.tokens, self.samples = int(state["step"]), int(state["tokens"]), int(state["samples"])
        self._rng_state = state.get("rng") or None  # applied at the end of set-up

    def trainer_state(self, optimizer_state: dict | None = None) -> dict:
        """Everything an exact resume needs; ``optimizer_state`` is the full one gathered under FSDP."""
        return {
            "step": self.step, "tokens": self.tokens, "samples": self.samples, "seed": self.seed,
            "wall_time": self.now(), "run_id": self.run_id, "world_size": self.dist.world_size,
            "tokens_per_step": self.tokens_per_step, "schedule": self.schedule.to_dict(),
            "optimizer": optimizer_state if optimizer_state is not None else self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "rng": rng_state(), "train_config": self.cfg.train.to_dict(),
            "sample_order": SAMPLE_ORDER, "train_samples": len(self.data.train),
            "data_digest": self.data.corpus.digest,
        }

    # ------------------------------------------------------------------ compile
    def _compile(self, mode: str, scope: str) -> CompiledModel:
        if mode != "off":
            reason = compile_unavailable_reason(self.device)
            if reason:
                self.warn(f"torch.compile ({mode}) is unavailable: {reason}; running eagerly")
                return self._wrap(compile_model(self.model, "off", scope))
            self.emit(CompileStarted(self.run_id, self.now(), mode, scope))
        return self._wrap(compile_model(self.model, mode, scope))

    def _wrap(self, compiled: CompiledModel) -> CompiledModel:
        """DDP wraps what the step calls: compile first, then wrap (per-block: wrap the plain model).

        DDP stays outside the compiled graph, so ``no_sync`` and its bucketed
        all-reduces run as in eager mode. FSDP needs no wrapper: it was applied
        in place before compiling.
        """
        if self.dist.enabled and not self.fsdp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            compiled.module = DDP(compiled.module, device_ids=ids)
        return compiled

    # ------------------------------------------------------------------ loop
    def _loop(self) -> RunResult:
        tc = self.cfg.train
        losses: list[float] = []
        times = StepTimes(COMPILE_WARMUP_STEPS if self.compiled.compiled else 1)
        compile_reported = not self.compiled.compiled
        val_loss = None
        last_val_step = last_sample_step = -1
        stopped = False

        while self.tokens < self.schedule.end_tokens:
            # Before the first step _before_first_step has looked at the controls just now.
            if times.count and self._between_steps():
                stopped = True
                break
            t_step = time.perf_counter()
            loss, grad_norm, lr = self._optimizer_step_with_fallback(first=times.count == 0)
            step_time = time.perf_counter() - t_step  # after the host sync inside the step: real time
            in_warmup = times.add(step_time)
            losses.append(loss)
            if not compile_reported and self.compiled.compiled and times.compile_time_known:
                compile_reported = True
                self._report_compile(times)
            if not math.isfinite(loss):
                # fp16's range is the other usual cause; in fp32 or bf16 only the learning rate is left to say.
                other = " or use fp32/bf16" if self.precision == "fp16" else ""
                raise NotFinite(f"loss became {loss} at step {self.step}; lower the learning rate{other}")
            if not math.isfinite(grad_norm) and not self.scaler.is_enabled():
                # Without fp16's loss scaler (which skips such a step) the update has just put it into the
                # weights: every later loss, evaluation and sample would be NaN.
                raise NotFinite(f"the gradient norm became {grad_norm} at step {self.step}; lower the learning "
                                f"rate or the weight decay")
            self._emit_metrics(loss, grad_norm, lr, step_time, in_warmup)
            if tc.eval_every and self.step % tc.eval_every == 0:
                val_loss = self._validate()
                last_val_step = self.step
            if tc.sample_every and self.step % tc.sample_every == 0:
                self._sample()
                last_sample_step = self.step
            if tc.save_every and self.step % tc.save_every == 0:
                self._save_or_warn(None)
                # Other ranks wait until rank 0 has written it: a crash elsewhere in the
                # next step then cannot cut the checkpoint short (they would wait at
                # the next collective anyway).
                barrier(self.dist)

        if not compile_reported and self.compiled.compiled and times.count:
            self._report_compile(times)  # fewer steady steps than usual: the best figure there is
        compile_seconds = times.compile_seconds() if self.compiled.compiled else None
        if last_val_step != self.step:
            val_loss = self._validate()
        if last_sample_step != self.step:  # a sample of this very step was just shown
            self._sample()
        self._serve_save_requests()  # requests that came in during the last step
        final_ckpt = self._save_or_warn(None, final=True)  # also on stop
        # Ranks leave together: one that tore its process group down while rank 0
        # was still writing could abort in the collective library's threads.
        barrier(self.dist)
        median_tps = times.median_rate(self.tokens_per_step)
        result = RunResult(self.run_id, self.run_dir, self.step, self.tokens, stopped,
                           losses[-1] if losses else None, val_loss, final_ckpt, median_tps,
                           compile_seconds)
        peak = self._peak_mem()
        self.emit(RunFinished(self.run_id, self.now(), self.step, self.tokens, stopped, result.final_loss,
                              val_loss, median_tps, compile_seconds, peak,
                              str(final_ckpt) if final_ckpt else None,
                              train_mem_gib=max(0.0, peak - self.mem_baseline), world_size=self.dist.world_size))
        return result

    def _report_compile(self, times: StepTimes) -> None:
        self.emit(CompileFinished(self.run_id, self.now(), self.compiled.mode, self.compiled.scope,
                                  times.compile_seconds(), len(times.warmup)))

    def _between_steps(self) -> bool:
        """Apply control requests; True when the run must stop.

        Under torchrun every rank must stop after the same step, so the stop
        requests (SIGINT) of all ranks travel with each step's loss all-reduce.
        """
        if self.dist.launcher_gone():
            raise JobTerminated("terminated: the launcher (torchrun) is gone")
        self._serve_save_requests()
        self._hold_while_paused(serve_saves=True)  # saving works while paused
        self._serve_save_requests()
        return self._stop_agreed if self.dist.enabled else self.control.stop_requested

    def _optimizer_step_with_fallback(self, first: bool) -> tuple[float, float, float]:
        if not (first and self.compiled.compiled):
            return self._optimizer_step()
        self.compiling = True
        try:
            return self._optimizer_step()
        except Exception as exc:  # compilation happens here, at the first call
            if is_peer_failure(exc, self.dist) or isinstance(exc, OutOfMemory) or is_out_of_memory(exc):
                raise  # a peer is gone, or memory ran out: not a compile problem
            self.warn(f"torch.compile ({self.compiled.mode}) failed: {type(exc).__name__}: {first_line(exc)}; "
                      f"continuing eagerly")
            self.emit(CompileFinished(self.run_id, self.now(), self.compiled.mode, self.compiled.scope, 0.0, 0,
                                      fallback=True))
            self.optimizer.zero_grad(set_to_none=True)
            reset_compiler()
            self.compiled = self._wrap(compile_model(self.model, "off", self.compiled.scope))
            return self._optimizer_step()
        finally:
            self.compiling = False

    def _optimizer_step(self) -> tuple[float, float, float]:
        tc, dist = self.cfg.train, self.dist
        world = dist.world_size
        sequences = tc.micro_batch * tc.accum_steps * world  # the global batch: the same for every split
        # Phase 2: the global batch by stream position; its real-target count comes
        # from the store's document lengths on the CPU (no batch is built), so
        # normalising by it needs no device sync or collective.
        num_targets = max(global_batch_targets(self.data.train, self.order, self.samples, sequences), 1)
        # Phase 3, redone from the start with a smaller split while some rank runs out of memory.
        while (loss_sum := self._micro_steps(num_targets)) is None:
            self._shrink_split()
        self._split_proven = True
        # Phase 4: clip, schedule, step.
        self.scaler.unscale_(self.optimizer)
        grad_norm = local_scalar(torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip or float("inf")))
        lr = self.schedule(self.tokens + self.tokens_per_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += self.tokens_per_step
        self.samples += sequences
        # Phase 5: one small all-reduce carries the global loss and the ranks'
        # stop requests; then the step's one host sync reads them with the grad norm.
        stop = torch.full((), float(self.control.stop_requested), device=self.device)
        totals = all_reduce_sum(torch.stack([loss_sum, stop]), dist)
        loss_total, stops, norm_value = torch.cat([totals, grad_norm.float().view(1)]).tolist()
        self._stop_agreed = stops > 0
        return loss_total / num_targets, norm_value, lr

    def _micro_steps(self, num_targets: int) -> torch.Tensor | None:
        """Phase 3 with the current split: the summed loss, or None on every rank when some rank ran out of
        memory (gradients then partial: the step is redone). Under DDP each attempt has one agreement point
        on every rank (core.split)."""
        ddp = self.compiled.module if self.dist.enabled and not self.fsdp else None
        probe = ddp is not None and not self._split_proven
        self._agreed = False
        failure = None
        try:
            loss_sum = self._accumulate(num_targets, ddp, probe)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            tc = self.cfg.train
            failure = (f"out of memory in micro-step {self._micro_index + 1} of {tc.accum_steps} of step "
                       f"{self.step + 1} at micro-batch {tc.micro_batch} ({out_of_memory_detail(exc)})")
            if self.fsdp or self._agreed:  # peers are inside a collective this rank cannot join any more
                where = "FSDP" if self.fsdp else "DDP, in the micro-step that all-reduces gradients,"
                raise OutOfMemory(f"{failure}; under {where} a step cannot be redone on one process alone: "
                                  f"lower --micro-batch") from None
            loss_sum = None
        # The traceback, and the activations its frames held, are gone here.
        if ddp is not None and not self._agreed and self._oom.any_rank(failure is not None):
            loss_sum = None
        if loss_sum is None:
            self._oom_reason = failure or f"out of memory on another process in step {self.step + 1}"
            self._oom_here = failure is not None
            return None
        if probe:
            self._average_gradients()
        return loss_sum

    def _average_gradients(self) -> None:
        """A split's first step under DDP: the all-reduce its last backward pass skipped (core.split)."""
        average_gradients(self.model, self.dist.world_size)

    def _accumulate(self, num_targets: int, ddp, probe: bool) -> torch.Tensor | None:
        tc, dist = self.cfg.train, self.dist
        mb, accum, world = tc.micro_batch, tc.accum_steps, dist.world_size
        loss_sum = torch.zeros((), device=self.device)
        # Each loss is a sum over its tokens divided by the window's total, so the
        # accumulated gradient is the true window mean however the real tokens are
        # spread over micro-batches (and over splits). DDP averages over ranks, hence × world.
        scale = world / num_targets
        for j in range(accum):
            self._micro_index = j
            start = (j * world + dist.rank) * mb
            # Micro-step j of rank r is slice j·world + r of the global batch, read from the
            # store's files only now, in its compact dtype: one micro-batch in memory at a time.
            micro = self.data.train.batch(self.order.take(self.samples + start, mb)).to(self.device, with_mask=False)
            last = j == accum - 1
            # no_sync must be entered before the forward pass: DDP decides then. The first step
            # of a split syncs by hand, after the ranks agreed that none ran out of memory.
            sync_ctx = ddp.no_sync() if ddp is not None and (probe or not last) else contextlib.nullcontext()
            if self.fsdp:  # FSDP's equivalent: no reduce-scatter until the last micro-step
                self.model.set_requires_gradient_sync(last)
            if last and ddp is not None and not probe:
                # Before the micro-step DDP synchronises (it prepares its all-reduce in the forward
                # pass): all ranks agree that none ran out of memory so far.
                self._agreed = True
                if self._oom.any_rank(False):
                    return None
            with sync_ctx:
                with autocast(self.device, self.precision):  # the loss itself is fp32 (core.loss)
                    loss = self.compiled(micro.inputs, targets=micro.targets)  # no mask: see _TRAINING_MASK
                self.scaler.scale(loss * scale).backward()
            loss_sum += loss.detach()
        return loss_sum

    def _shrink_split(self) -> None:
        """After an out-of-memory attempt (agreed by every rank): free it, halve the micro-batch, double the
        accumulation; at micro-batch 1 save the last good state (the previous step's) and end the run."""
        reason = self._oom_reason
        self.optimizer.zero_grad(set_to_none=True)  # the failed attempt's partial gradients
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # host sync, once per out-of-memory: the cached blocks go back
        tc = self.cfg.train
        smaller = smaller_split(tc.micro_batch, tc.accum_steps)
        if smaller is None:
            end = "micro-batch 1 does not fit; choose a smaller model or sequence length"
        else:
            end = self._refused_split(*smaller)
        if end:  # the run ends here, with the last completed step saved
            saved = self._save_or_warn(None, final=True)
            barrier(self.dist)
            where = f"; the state after step {self.step} is saved in {saved}" if saved else ""
            raise OutOfMemory(f"{reason}: {end}{where}", here=self._oom_here)
        self._set_split(*smaller, reason, self.step + 1)

    def _refused_split(self, micro: int, accum: int) -> str:
        """Why the run cannot go on with ``micro × accum`` ("" when it can): a CUDA-graph compile mode refuses
        accumulation."""
        try:
            self.cfg.replace(train={"micro_batch": micro, "accum_steps": accum})
        except ConfigError as exc:
            return f"the next split, micro-batch {micro} × accumulation {accum}, cannot be used: {exc}"
        return ""

    def _peak_mem(self) -> float:
        peak = peak_memory_gib(self.device) if self._peak_resets else None
        return max(peak, self.peak_rss) if peak is not None else self.peak_rss

    def _emit_metrics(self, loss: float, grad_norm: float, lr: float, step_time: float, warmup: bool) -> None:
        mem = memory_gib(self.device)
        self.peak_rss = max(self.peak_rss, mem)
        # Global: tokens of all ranks over a step time that ends with an all-reduce every rank joins.
        tps = self.tokens_per_step / step_time
        self._follow_run_folder()  # one stat a step: the heartbeat and the next checkpoint follow a moved folder
        share = peak_share(tps, self.flops_per_token, self.peak_flops, self.dist.world_size) or 0.0
        if share >= PEAK_CHECK_MFU and self.check_peak and not warmup and self.dist.is_main:
            self._measure_peak_again(share)
        self.emit(StepMetrics(self.run_id, self.now(), step=self.step, tokens=self.tokens, loss=loss, lr=lr,
                              grad_norm=grad_norm, tokens_per_s=tps, step_time=step_time,
                              peak_mem_gib=self._peak_mem(), mem_gib=mem,
                              mfu=utilization(tps, self.flops_per_token, self.peak_flops, self.dist.world_size) or 0.0,
                              warmup=warmup))

    def _measure_peak_again(self, share: float) -> None:
        """A step at ``share`` of the peak: a peak cached on a busy machine reads low (steps were shown at 127%
        MFU). Measured again in full (a second or two, between steps: no step's time counts it; on a GPU its
        GEMMs end in a host sync), once a run; the cache keeps the higher figure, and so does this run."""
        self.check_peak = False
        previous = self.peak_flops
        try:
            self.peak_flops = max(previous, matmul_peak(self.device, self.precision, refresh=True))
        except RuntimeError as exc:  # its GEMMs' memory (0.4-0.8 GB on a GPU) beside a run fitted to the rest
            if not is_out_of_memory(exc):
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # host sync, once: the GEMMs' blocks go back to the run
            self.warn(f"step {self.step} ran at {share:.0%} of the cached matmul peak, which could not be measured "
                      f"again beside the run (out of memory); MFU is shown at most 100%")
            return
        self.emit(MatmulPeakMeasured(self.run_id, self.now(), step=self.step, precision=self.precision,
                                     matmul_peak_flops=self.peak_flops, previous_flops=previous, step_share=share))

    # ------------------------------------------------------------------ eval, sample, save
    @torch.no_grad()
    def _validate(self) -> float | None:
        """Mean loss over ``eval_batches`` global batches of validation samples, shared out over the ranks.

        Every rank runs the same number of forward passes (FSDP gathers weights
        in each); a rank without a batch of its own in the last round repeats
        one and leaves it out of the sum.
        """
        tc, val, world, rank = self.cfg.train, self.data.val, self.dist.world_size, self.dist.rank
        # The samples depend on the global batch only, never on its split into micro-batches, accumulation
        # and ranks (nor on a split halved after running out of memory): one curve for every split. They are
        # spread evenly over the held-out samples, which follow the corpus' order, not its first part.
        n = min(len(val), tc.eval_batches * tc.sequences_per_step(world))
        chosen = [i * len(val) // n for i in range(n)]
        batches = [chosen[start:start + tc.micro_batch] for start in range(0, n, tc.micro_batch)]
        count = val.num_targets(chosen)  # on the CPU, the same on every rank
        total = torch.zeros((), device=self.device)
        for i in range(rank, math.ceil(len(batches) / world) * world, world):
            batch = val.batch(batches[min(i, len(batches) - 1)]).to(self.device, with_mask=False)
            with autocast(self.device, self.precision):
                loss = self.model(batch.inputs, targets=batch.targets)  # uncompiled handle; no mask (_TRAINING_MASK)
            if i < len(batches):
                total += loss
        all_reduce_sum(total, self.dist)
        loss = total.item() / max(count, 1)  # host sync: once per validation
        if not math.isfinite(loss):
            # The step's own loss and gradient were finite; its update was not (a weight decay that scales the
            # weights past what fp32 holds): ended here, not recorded as a validation of nan.
            raise NotFinite(f"the validation loss became {loss} at step {self.step}: the last update made the "
                            f"weights diverge; lower the learning rate or the weight decay")
        self.emit(ValidationDone(self.run_id, self.now(), self.step, self.tokens, loss,
                                 math.exp(min(loss, 50.0))))
        return loss

    def _sample(self) -> None:
        # Under FSDP every rank takes part in each forward pass (weights are
        # gathered), so all generate the same number of tokens: no early stop at EOS.
        if not (self.dist.is_main or self.fsdp):
            return
        tok = self.data.tokenizer
        if self._prompt is None:
            self._prompt = self._sample_prompt()
        prompt, prompt_ids = self._prompt
        ids = [tok.bos_id, *prompt_ids]
        gen = torch.Generator(device=self.device).manual_seed(self.seed + self.step)
        with autocast(self.device, self.precision):
            out = self.model.generate(torch.tensor([ids], device=self.device), self.cfg.train.sample_tokens,
                                      temperature=0.8, top_k=40, eos_id=None if self.fsdp else tok.eos_id,
                                      generator=gen, vocab_limit=tok.vocab_size)
        new = out[0, 1:].tolist()
        if tok.eos_id in new:
            new = new[: new.index(tok.eos_id) + 1]
        # A sample cut off by its length may end inside a character a byte-level tokenizer spreads over tokens:
        # that half character is left out, not shown as U+FFFD.
        text = tok.decode(new).rstrip("\ufffd")
        self.emit(SampleGenerated(self.run_id, self.now(), self.step, prompt, text))

    def _sample_prompt(self) -> tuple[str, list[int]]:
        """``DEFAULT_PROMPT`` and its ids; where the tokenizer cannot encode it (a Unigram vocabulary without an
        unknown token, given with --tokenizer), no prompt, said once: the first sample raised the tokenizer's
        bare Exception, and the run failed with no final checkpoint, its training lost."""
        tok = self.data.tokenizer
        try:
            ids = tok.encode(DEFAULT_PROMPT)
        except Exception as exc:  # tokenizers raises a bare Exception
            self.warn(f"the tokenizer cannot encode the samples' prompt {DEFAULT_PROMPT!r} ({first_line(exc)}): "
                      f"samples start from the beginning-of-text token alone")
            return "", []
        dropped = dropped_characters(tok.tok, DEFAULT_PROMPT) if drops_unknown_text(tok) else []
        if dropped:  # a BPE vocabulary without an unknown token: its samples began 'he …', without a word
            self.warn(f"the tokenizer has no token for {''.join(dropped)!r} and no unknown token: the samples' "
                      f"prompt {DEFAULT_PROMPT!r} is read without it")
        return DEFAULT_PROMPT, ids

    def save(self, path: Path) -> Path | None:
        """Save a checkpoint of the current state to ``path`` (call on the torch thread).

        Rank 0 writes. Under FSDP every rank must call this: the sharded weights
        and optimizer state are first gathered into full tensors on rank 0.
        """
        model, optimizer_state = self.model, None
        if self.fsdp:
            weights, optimizer_state = full_state_dicts(self.model, self.optimizer)  # collective
            if self.dist.is_main:
                model = self._plain_model(weights)
        if not self.dist.is_main:
            return None
        if not _finite(model):  # a diverged run's weights would only spread NaN: earlier checkpoints stay
            raise CheckpointError(f"the weights at step {self.step} are not finite (the run diverged); not saved")
        saved = ckpt_io.save_checkpoint(path, model, tokenizer=self.data.tokenizer, run_config=self._config_dict(),
                                        trainer_state=self.trainer_state(optimizer_state),
                                        step=self.step, tokens=self.tokens,
                                        extra={"run_id": self.run_id, "parent": self.parent,
                                               "precision": self.precision, "device_type": self.device.type})
        self.emit(CheckpointSaved(self.run_id, self.now(), self.step, self.tokens, str(saved)))
        return saved

    def _plain_model(self, weights: dict[str, torch.Tensor]) -> LlamaForCausalLM:
        """An unsharded model holding ``weights`` (gathered from FSDP), for saving: no copy, no init."""
        with torch.device("meta"):
            plain = LlamaForCausalLM(self.model_cfg)
        missing, unexpected = plain.load_state_dict(weights, assign=True, strict=False)
        if self.model_cfg.tie_word_embeddings:  # assign replaced the embedding: tie the head to it again
            plain.lm_head.weight = plain.model.embed_tokens.weight
            missing = [k for k in missing if k != "lm_head.weight"]
        assert not missing and not unexpected, (missing, unexpected)
        return plain

    def _serve_save_requests(self) -> None:
        if self.fsdp:  # saving is collective under FSDP; the launcher's processes never get these requests
            for _ in self.control.take_save_requests():
                self.warn("save requests are not supported under FSDP; checkpoints follow --save-every")
            return
        for path in self.control.take_save_requests():
            self._save_or_warn(user_path(path) if path else None)

    def _save_or_warn(self, path: Path | None, final: bool = False) -> Path | None:
        """Save to ``path`` or the run's own folder; a checkpoint that cannot be written
        (disk full, a bad path) is a ``CheckpointFailed`` event, never the end of the run."""
        try:
            return self.save(path) if path is not None else self._save_periodic(final)
        except CheckpointError as exc:
            target = path if path is not None else self.run_dir / ckpt_io.CHECKPOINTS_DIR / f"step_{self.step:07d}"
            failed, self._failed_save = self._failed_save, (self.step, f"{target}: {exc}")
            if not (final and failed == self._failed_save):  # the final save retrying a step that just failed
                self.emit(CheckpointFailed(self.run_id, self.now(), self.step, str(target), str(exc)))
            return None

    def _follow_run_folder(self) -> None:
        """A run folder renamed while the run trains (``mv runs/a runs/b``) is followed: its checkpoints went to a
        recreated ``runs/a/checkpoints`` beside the renamed folder's metrics, splitting the run in two (a resume of
        the renamed folder went back to its last checkpoint before the move, silently). Said once, when seen."""
        moved = self._jsonl.moved_to() if self._jsonl is not None and self.dist.is_main else None
        if moved is None:
            return
        old, self.run_dir = self.run_dir, moved.parent
        self._jsonl.path = moved
        if self._heartbeat is not None:
            self._heartbeat.path = self.run_dir / HEARTBEAT_FILE
        self.warn(f"the run folder {old} was moved to {self.run_dir} while the run trained: the run follows it "
                  f"(its checkpoints and heartbeat go there)")

    def _save_periodic(self, final: bool = False) -> Path | None:
        """``<run>/checkpoints/step_NNNNNNN``, keeping the newest ``keep`` of them."""
        self._follow_run_folder()
        name = f"step_{self.step:07d}"
        if not self.dist.is_main:
            if self.fsdp and not (final and self._periodic_step == self.step):
                self._periodic_step = self.step
                self.save(Path(name))  # gathers the sharded state for rank 0, which writes it
            return None
        folder = self.run_dir / ckpt_io.CHECKPOINTS_DIR
        path = folder / name
        # Under FSDP the other ranks decide without seeing the folder: the same rule here.
        if final and self._periodic_step == self.step and (self.fsdp or path.is_dir()):
            return path  # the run ended right after saving this very step
        if self.fsdp:
            self._periodic_step = self.step
        saved = self.save(path)
        self._periodic_step = self.step
        for old in ckpt_io.list_checkpoints(folder)[: -self.cfg.train.keep]:
            if old != saved:
                ckpt_io.remove_folder(old)  # renamed aside first: never seen half-deleted
        return saved


def _finite(model: torch.nn.Module) -> bool:
    """Every weight is finite. One CPU–GPU sync (the flag is read on the host), paid only when loading or saving."""
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all().item()) if flags else True
