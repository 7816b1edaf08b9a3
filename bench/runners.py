"""Timed training runs of one cell: Speedboard's Trainer, the bare loop on our model, the bare loop on HF's.

Every run starts from the same seed (same initial weights), reads the same
global batches and trains the same number of optimizer steps, so their final
losses must agree. Timing leaves out the warm-up steps in which compilation
happens; on a GPU the clock is read only after the queued work is done.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from bench.bare_loop import bare_train, compile_forward, plan_batches
from bench.cells import Cell
from core.compile import reset_compiler
from core.config import ModelConfig, RunConfig, config_from_preset
from core.control import Control
from core.data import Data, prepare_data
from core.events import CompileFinished, Event, RunStarted, StepMetrics, WarningRaised
from core.model import LlamaForCausalLM
from core.schedule import LRSchedule
from core.trainer import Trainer


@dataclass
class RunRecord:
    """One timed run of one cell by one runner."""

    cell: str
    runner: str
    repeat: int
    tokens_per_s: float
    """Tokens of the timed steps over their wall time (warm-up excluded)."""
    tokens_per_step: int
    timed_steps: int
    window_seconds: float
    warmup_seconds: float
    losses: list[float]
    step_seconds: list[float] = field(default_factory=list)
    """Each timed step: the Trainer's from its metrics events, the bare loop's from its ``StepClock``."""
    compile_seconds: float | None = None
    """The Trainer's own compile figure (warm-up minus the same steps at steady speed), in this process."""
    compiler_seconds: float | None = None
    """Time inside torch.compile during the run (``compiler_seconds()``)."""
    bookkeeping_seconds: list[float] = field(default_factory=list)
    """Trainer only: each timed step's loop iteration minus the optimizer step the Trainer timed itself
    (control polling, metrics event, run-folder line): the bookkeeping's own cost, free of run-to-run noise."""
    warnings: list[str] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    def to_dict(self) -> dict:
        return asdict(self)


def cell_config(base: RunConfig, cell: Cell, total_steps: int, out_dir: str | None) -> RunConfig:
    """The Trainer's config for ``cell``: a fixed number of steps, no periodic validation, sample or save."""
    return base.replace(out_dir=out_dir, train={
        "micro_batch": cell.micro_batch, "accum_steps": cell.accum, "compile_mode": cell.mode,
        "compile_scope": cell.scope, "budget_kind": "steps", "budget": total_steps,
        "eval_every": 0, "eval_batches": 1, "sample_every": 0, "sample_tokens": 1, "save_every": 0, "keep": 1,
    })


class MeasurementDone(BaseException):
    """Raised by the sink after the last measured step, to skip the run's closing work.

    The end-of-run validation, sample and checkpoint are not part of any
    figure; cutting them saves seconds per run. A BaseException, so it passes
    any ``except Exception`` on its way out of the Trainer, like Ctrl-C does.
    """


class TimingSink:
    """Stamps each step's metrics event with the wall clock as it arrives.

    The interval between two consecutive events is one whole iteration of the
    Trainer's loop: control polling, the optimizer step, its host sync and the
    bookkeeping around it. With ``stop_after`` the run ends right after that step's event.
    """

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.started = 0.0
        self.steps: list[tuple[float, StepMetrics]] = []
        self.compile: CompileFinished | None = None
        self.warnings: list[str] = []

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        if isinstance(event, RunStarted):  # the last thing before the loop starts
            self.started = now
        elif isinstance(event, StepMetrics):
            self.steps.append((now, event))
            if event.step == self.stop_after:
                raise MeasurementDone
        elif isinstance(event, CompileFinished):
            self.compile = event
        elif isinstance(event, WarningRaised):
            self.warnings.append(event.message)

    def window(self) -> tuple[float, float, list[float]]:
        """Warm-up seconds, timed-window seconds, and the seconds of each timed step."""
        warm = [t for t, e in self.steps if e.warmup]
        timed = [t for t, e in self.steps if not e.warmup]
        assert warm and timed, "a timed run needs warm-up steps and timed steps"
        assert warm[-1] < timed[0], "warm-up steps come first"
        edges = [warm[-1], *timed]
        return warm[-1] - self.started, timed[-1] - warm[-1], [b - a for a, b in zip(edges, edges[1:], strict=False)]


def run_speedboard(base: RunConfig, cell: Cell, total_steps: int, repeat: int) -> RunRecord:
    """One run of Speedboard's Trainer, exactly as the CLI and the dashboard start it.

    The run ends right after its last step's metrics event (``MeasurementDone``).
    """
    out = tempfile.mkdtemp(prefix="speedboard-bench-run-")
    sink = TimingSink(stop_after=total_steps)
    config = cell_config(base, cell, total_steps, out)
    compiler_s = None
    try:
        with contextlib.suppress(MeasurementDone):
            Trainer(config, Control(), sink).run()
        compiler_s = compiler_seconds() if cell.compiled else None
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the run folder and its final checkpoint
        _release()
    warmup_s, window_s, steps = sink.window()
    timed_events = [e for _, e in sink.steps if not e.warmup]
    bookkeeping = [interval - e.step_time for interval, e in zip(steps, timed_events, strict=True)]
    tokens_per_step = config.tokens_per_step()
    return RunRecord(cell=cell.name, runner="speedboard", repeat=repeat,
                     tokens_per_s=len(steps) * tokens_per_step / window_s, tokens_per_step=tokens_per_step,
                     timed_steps=len(steps),
                     window_seconds=window_s, warmup_seconds=warmup_s,
                     losses=[e.loss for _, e in sink.steps], step_seconds=steps,
                     compile_seconds=sink.compile.seconds if sink.compile else None, compiler_seconds=compiler_s,
                     bookkeeping_seconds=bookkeeping, warnings=sink.warnings)


def model_config_for(base: RunConfig, data: Data) -> ModelConfig:
    """The run's architecture with the vocabulary its tokenizer produced, as the Trainer builds it."""
    return replace(base.model, vocab_size=data.tokenizer.vocab_size)


def preset_model(preset: str, seed: int = 0) -> tuple[RunConfig, Data, LlamaForCausalLM]:
    """A preset's config, its data and a freshly initialised model (seeded), for the one-off bench scripts."""
    cfg = config_from_preset(preset)
    data = prepare_data(cfg.data)
    torch.manual_seed(seed)
    return cfg, data, LlamaForCausalLM(model_config_for(cfg, data))


def run_reference(runner: str, base: RunConfig, data: Data, cell: Cell, total_steps: int, repeat: int,
                  device: torch.device, precision: str) -> RunRecord:
    """The bare loop on our model (``bare``) or on Hugging Face's (``hf``), same weights and batches."""
    tc = base.train
    model_cfg = model_config_for(base, data)
    torch.manual_seed(tc.seed)  # the Trainer's seed: identical initial weights
    model = LlamaForCausalLM(model_cfg)
    if runner == "hf":
        from bench.hf_reference import build_hf_model, hf_forward

        model = build_hf_model(model_cfg, model.state_dict())
    model = model.to(device)
    compiled = compile_forward(model, cell.mode, cell.scope)
    forward = hf_forward(compiled) if runner == "hf" else compiled
    effective = cell.micro_batch * cell.accum
    tokens_per_step = effective * base.data.seq_len
    batches = plan_batches(data, tc.seed, effective, cell.micro_batch, total_steps)
    schedule = LRSchedule(tc.lr, tc.min_lr, int(tc.warmup_ratio * total_steps * tokens_per_step),
                          total_steps * tokens_per_step)
    compiler_s = None
    try:
        result = bare_train(model, forward, batches, lr_at=lambda step: schedule((step + 1) * tokens_per_step),
                            device=device, precision=precision, grad_clip=tc.grad_clip,
                            weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2),
                            warmup_steps=cell.warmup_steps)
        compiler_s = compiler_seconds() if cell.compiled else None
    finally:
        del model, compiled, forward, batches
        _release()
    return RunRecord(cell=cell.name, runner=runner, repeat=repeat,
                     tokens_per_s=result.timed_steps * tokens_per_step / result.window_seconds,
                     tokens_per_step=tokens_per_step, timed_steps=result.timed_steps,
                     window_seconds=result.window_seconds, warmup_seconds=result.warmup_seconds,
                     losses=result.losses, step_seconds=result.step_seconds, compiler_seconds=compiler_s)


def compiler_seconds() -> float | None:
    """Seconds spent inside torch.compile (Dynamo, AOTAutograd, Inductor; forward and backward) since the last
    ``reset_compiler()``: the compiler's own clock, free of the noise of subtracting step times."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        return float(calculate_time_spent()["total_wall_time"])
    except (ImportError, KeyError, AttributeError):  # a private API: absent in some releases
        return None


def _release() -> None:
    """Free the run's compiled graphs and tensors before the next run starts."""
    reset_compiler()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
