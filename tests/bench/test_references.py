"""The references: Speedboard's Trainer, the bare loop and HF's Llama see the same weights and batches."""

from __future__ import annotations

import pytest
import torch

from bench.bare_loop import plan_batches
from bench.cells import Cell
from bench.runners import run_reference, run_speedboard
from core.data import SampleOrder, prepare_data


def test_bare_loop_reads_the_trainers_global_batches(micro):
    config = micro()
    data = prepare_data(config.data)
    plan = plan_batches(data, seed=7, effective_batch=4, micro_batch=2, steps=3)
    order = SampleOrder(len(data.train), 7)
    for step, micro_batches in enumerate(plan):
        window = data.train.batch(order.take(step * 4, 4))
        assert len(micro_batches) == 2
        assert torch.equal(torch.cat([x for x, _ in micro_batches]), window.inputs)
        assert torch.equal(torch.cat([y for _, y in micro_batches]), window.targets)


def test_trainer_bare_loop_and_hf_model_train_to_the_same_loss(micro):
    pytest.importorskip("transformers")
    config = micro(train={"lr": 1e-2, "warmup_ratio": 0.25})
    data = prepare_data(config.data)
    cell = Cell("off", "model", accum=2, micro_batch=2)
    device = torch.device("cpu")
    ours = run_speedboard(config, cell, total_steps=4, repeat=0)
    bare = run_reference("bare", config, data, cell, 4, 0, device)
    hf = run_reference("hf", config, data, cell, 4, 0, device)
    assert len(ours.losses) == len(bare.losses) == len(hf.losses) == 4
    assert ours.losses[-1] < ours.losses[0]  # it trained
    assert ours.losses == pytest.approx(bare.losses, abs=1e-5)
    assert bare.losses == pytest.approx(hf.losses, abs=1e-4)
    # Warm-up (1 step, eager) is left out of the timed window.
    assert ours.timed_steps == bare.timed_steps == hf.timed_steps == 3
    assert len(ours.step_seconds) == 3 and all(t > 0 for t in ours.step_seconds)
    assert ours.tokens_per_s > 0 and bare.tokens_per_s > 0
