"""Timed training runs of one cell: Speedboard's Trainer, the bare loop on our model, the bare loop on HF's.

Every run starts from the same seed (same initial weights), reads the same
global batches and trains the same number of optimizer steps, so their final
losses must agree. Timing leaves out the warm-up steps in which compilation
happens; on a GPU the clock is read only after the queued work is done.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from bench.bare_loop import bare_train, compile_forward, plan_batches
from core.config import ModelConfig, RunConfig, config_from_preset
from core.data import Data, prepare_data
from core.model import LlamaForCausalLM
from core.schedule import LRSchedule
from core.trials import (  # noqa: F401  (re-exported: the benchmark's probes and scripts import them from here)
    Cell,
    MeasurementDone,
    TimingSink,
    TrialResult,
    cell_config,
    compiler_seconds,
    release,
    run_trial,
)

RunRecord = TrialResult
"""One timed run of one cell by one runner (the core's trial result: the advisor's runs have the same shape)."""


def run_speedboard(base: RunConfig, cell: Cell, total_steps: int, repeat: int) -> RunRecord:
    """One run of Speedboard's Trainer, exactly as the CLI and the dashboard start it (``core.trials.run_trial``).

    The run ends right after its last step's metrics event; a cell that fails is a record with its error.
    """
    return run_trial(base, cell, total_steps, repeat)


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
                  device: torch.device) -> RunRecord:
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
                            device=device, precision=cell.precision, grad_clip=tc.grad_clip,
                            weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2),
                            warmup_steps=cell.warmup_steps)
        compiler_s = compiler_seconds() if cell.compiled else None
    finally:
        del model, compiled, forward, batches
        release()
    return RunRecord(cell=cell.name, runner=runner, repeat=repeat,
                     tokens_per_s=result.timed_steps * tokens_per_step / result.window_seconds,
                     tokens_per_step=tokens_per_step, timed_steps=result.timed_steps,
                     window_seconds=result.window_seconds, warmup_seconds=result.warmup_seconds,
                     losses=result.losses, step_seconds=result.step_seconds, compiler_seconds=compiler_s)
