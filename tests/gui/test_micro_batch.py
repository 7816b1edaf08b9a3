"""Self-fitting micro-batches in the window: the offer before Start, the run table after an out-of-memory step."""

from __future__ import annotations

import torch
from PySide6.QtWidgets import QMessageBox

from core.memory_budget import GIB, MemoryEstimate
from core.model import LlamaForCausalLM
from tests.gui.conftest import child, click, run_once


def tight_memory(monkeypatch, gib: float) -> None:
    """A device of ``gib`` GiB where a micro-batch of n sequences needs n GiB."""
    monkeypatch.setattr("core.memory_budget.estimate_training_memory",
                        lambda model, micro_batch, seq_len, precision="fp32", shards=1:
                        MemoryEstimate(0, 0, 0, micro_batch * GIB))
    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (int(gib * GIB), "test memory"))


def test_start_offers_the_split_that_fits_and_yes_applies_it(qtbot, window, dialogs, monkeypatch):
    # Micro preset: micro-batch 4 × accumulation 1. A CPU run is fitted to half of the 5 GiB (the estimate is a
    # lower bound, and running out would close the window): 2 fits there.
    tight_memory(monkeypatch, 5.0)
    record = run_once(qtbot, window)
    (question,) = dialogs.questions()
    assert "micro-batch 4 × 32 tokens needs at least 4.0 GiB" in question
    assert "more than half of the 5.0 GiB of test memory, what a CPU run is fitted to" in question
    assert "micro-batch 2 × accumulation 2 instead" in question and "(4 sequences per" in question
    assert (child(window, "microBatchSpin").value(), child(window, "accumStepsSpin").value()) == (2, 2)
    assert record.state == "finished"
    assert (record.train["micro_batch"], record.train["accum_steps"]) == (2, 2)
    table = child(window, "runTable")
    assert table.item(0, table.column("Micro")).text() == "2"


def test_no_starts_as_set(qtbot, window, dialogs, monkeypatch):
    tight_memory(monkeypatch, 6.0)  # 4 GiB: more than the half a split is fitted to, less than all of it
    dialogs.question_answer = QMessageBox.StandardButton.No
    record = run_once(qtbot, window)
    (question,) = dialogs.questions()
    assert question.endswith("No starts as set.") and "cannot start at all" not in question
    assert (child(window, "microBatchSpin").value(), child(window, "accumStepsSpin").value()) == (4, 1)
    assert record.state == "finished" and (record.train["micro_batch"], record.train["accum_steps"]) == (4, 1)


def test_a_split_that_needs_more_than_all_the_memory_is_not_started_as_set(qtbot, window, dialogs, monkeypatch):
    """No started the run as set, which failed at once ("more than the … available RAM"): a row for nothing."""
    tight_memory(monkeypatch, 2.5)
    dialogs.question_answer = QMessageBox.StandardButton.No
    click(window, "startButton")
    (question,) = dialogs.questions()
    assert "As set it cannot start at all: that is more than all of the memory." in question
    assert question.endswith("No changes nothing.")
    assert window.session.records == [] and not window.session.running
    assert (child(window, "microBatchSpin").value(), child(window, "accumStepsSpin").value()) == (4, 1)
    dialogs.question_answer = QMessageBox.StandardButton.Yes
    record = run_once(qtbot, window)
    assert record.state == "finished" and (record.train["micro_batch"], record.train["accum_steps"]) == (1, 4)


def test_no_question_when_the_split_fits(qtbot, window, dialogs):
    assert run_once(qtbot, window).state == "finished"
    assert dialogs.questions() == []


def test_the_run_table_shows_the_new_split_after_an_out_of_memory_step(qtbot, window, monkeypatch):
    original, calls = LlamaForCausalLM.forward, [0]

    def forward(model, *args, **kwargs):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == 2:  # step 2's only micro-step
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return original(model, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "forward", forward)
    record = run_once(qtbot, window)
    assert record.state == "finished" and record.split_changes == 1
    table = child(window, "runTable")
    row = table.row_of(record.key)
    assert (table.item(row, table.column("Micro")).text(), table.item(row, table.column("Accum")).text()) == ("2", "2")
    assert "Changed 1×" in table.item(row, table.column("Micro")).toolTip()
    # The settings follow, so the next Start or Continue trains with what fits.
    assert (child(window, "microBatchSpin").value(), child(window, "accumStepsSpin").value()) == (2, 2)
    assert any("warning: " in line and "out of memory in micro-step 1 of 1 of step 2 at micro-batch 4" in line
               and "from step 2 micro-batch 2 × accumulation 2" in line for line in window.log.messages())
