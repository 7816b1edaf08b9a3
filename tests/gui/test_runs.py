"""Training from the window: live curves, the run table, Continue, pause, failures, closing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from core.trainer import Trainer
from tests.gui.conftest import RUN_TIMEOUT_MS, child, click, read_jsonl, run_once, wait_idle, wait_steps

LONG = {"train": {"budget": 1_000_000}}  # a run that only ends when stopped
LONG_NO_WARMUP = {"train": {"budget": 1_000_000, "warmup_ratio": 0.0}}  # its schedule past any warmup at once


def _steps(events: list[dict], warmup: bool | None = None) -> list[dict]:
    return [e for e in events if e["event"] == "step" and (warmup is None or e["warmup"] == warmup)]


def _xy(curve) -> tuple[np.ndarray, np.ndarray]:
    x, y = curve.getOriginalDataset()
    return np.asarray(x), np.asarray(y)


def test_curves_hold_the_points_of_metrics_jsonl(qtbot, window):
    record = run_once(qtbot, window)
    assert record.state == "finished"
    events = read_jsonl(record.folder)
    steps = _steps(events)
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    window.plots.refresh()
    plots = {name: child(window, name) for name in ("lossPlot", "lrPlot", "throughputPlot", "memoryPlot")}

    for axis in ("step", "tokens", "time"):
        window.plots.set_x_axis(axis)
        x, y = _xy(plots["lossPlot"].curve(record.key, "train"))
        np.testing.assert_array_equal(x, [e[axis] for e in steps])
        np.testing.assert_array_equal(y, [e["loss"] for e in steps])
    window.plots.set_x_axis("step")
    vals = [e for e in events if e["event"] == "validation"]
    x, y = _xy(plots["lossPlot"].curve(record.key, "val"))
    np.testing.assert_array_equal(x, [e["step"] for e in vals])
    np.testing.assert_array_equal(y, [e["loss"] for e in vals])
    x, y = _xy(plots["lrPlot"].curve(record.key, "lr"))
    np.testing.assert_array_equal(y, [e["lr"] for e in steps])
    x, y = _xy(plots["throughputPlot"].curve(record.key, "steady"))
    np.testing.assert_array_equal(x, [e["step"] for e in _steps(events, warmup=False)])
    np.testing.assert_array_equal(y, [e["tokens_per_s"] for e in _steps(events, warmup=False)])
    x, y = plots["throughputPlot"].data(record.key, "warmup")  # drawn at the edge when beyond the range
    np.testing.assert_array_equal(y, [e["tokens_per_s"] for e in _steps(events, warmup=True)])
    x, y = _xy(plots["memoryPlot"].curve(record.key, "mem"))
    baseline = events[0]["mem_baseline_gib"]  # the training's own memory: above the process before the model
    assert baseline > 0
    np.testing.assert_allclose(y, [e["mem_gib"] - baseline for e in steps])
    assert plots["throughputPlot"].region(record.key) is None  # eager: no compile warm-up to shade

    finished = events[-1]
    assert finished["event"] == "finished"
    table = child(window, "runTable")
    assert table.item(0, table.column("State")).text() == "finished"
    assert table.item(0, table.column("Tokens/s")).text() == f"{finished['median_tokens_per_s']:,.0f}"
    assert table.item(0, table.column("Loss")).text() == f"{finished['final_loss']:.4f}"
    assert window.sample.text.toPlainText()  # the end-of-run sample is shown
    assert child(window, "saveButton").isEnabled() and child(window, "continueButton").isEnabled()

    child(window, "smoothingSlider").setValue(3)
    window.plots.refresh()
    smooth = plots["lossPlot"].curve(record.key, "smooth")
    _, ys = _xy(smooth)
    losses = np.array([e["loss"] for e in steps])
    assert ys[-1] == pytest.approx(losses[-3:].mean())
    assert smooth.isVisible()


def test_the_learning_rate_plot_shows_the_gradient_norm_on_request(qtbot, window):
    record = run_once(qtbot, window)
    window.plots.refresh(force=True)
    steps = _steps(read_jsonl(record.folder))
    plot = child(window, "lrPlot")
    _, ys = _xy(plot.curve(record.key, "lr"))
    assert list(ys) == pytest.approx([e["lr"] for e in steps])
    child(window, "gradNormCheck").setChecked(True)
    _, ys = _xy(plot.curve(record.key, "lr"))
    assert list(ys) == pytest.approx([e["grad_norm"] for e in steps])
    assert plot.title.startswith("Gradient norm")
    child(window, "gradNormCheck").setChecked(False)
    assert plot.title == "Learning rate"
    _, ys = _xy(plot.curve(record.key, "lr"))
    assert list(ys) == pytest.approx([e["lr"] for e in steps])


def test_second_run_with_other_accumulation_gets_a_row_and_a_speedup(qtbot, window):
    first = run_once(qtbot, window)
    child(window, "accumStepsSpin").setValue(2)
    second = run_once(qtbot, window)
    assert second.state == "finished"
    table = child(window, "runTable")
    assert table.rowCount() == 2
    assert table.item(1, table.column("Accum")).text() == "2"
    tps = [read_jsonl(r.folder)[-1]["median_tokens_per_s"] for r in (first, second)]
    speedup = table.column("Speedup")
    assert table.item(0, speedup).text() == "1.00× (base)"
    assert table.item(1, speedup).text().startswith(f"{tps[1] / tps[0]:.2f}×")

    table.item(1, 0).setCheckState(Qt.CheckState.Checked)  # the user picks run 2 as the baseline
    assert table.baseline == second.key
    assert table.item(0, speedup).text().startswith(f"{tps[0] / tps[1]:.2f}×")
    assert table.item(1, speedup).text() == "1.00× (base)"

    window.plots.refresh()
    table.selectRow(0)  # selecting a row shows only its curves
    loss = child(window, "lossPlot")
    assert loss.curve(first.key, "train").isVisible()
    assert not loss.curve(second.key, "train").isVisible()
    table.clearSelection()
    assert loss.curve(second.key, "train").isVisible()


def test_continue_with_other_accumulation_starts_where_the_parent_ended(qtbot, window):
    parent = run_once(qtbot, window)
    child(window, "accumStepsSpin").setValue(2)
    child(window, "seqLenSpin").setValue(16)  # the model's and data's: the continued run keeps 32, and says so
    click(window, "continueButton")
    note = f"Continue keeps {parent.label}'s model and data (sequence length 32); the settings shown for them " \
           f"apply to Start"
    assert any(note in line for line in window.log.messages())
    budget = window.config_panel.config.train.budget
    plan = f"Continue: {budget:,g} steps more after {parent.label}'s step {parent.step}, a new cosine from the peak"
    assert any(plan in line for line in window.log.messages())  # the parent finished its budget
    wait_idle(qtbot, window)
    child_run = window.session.records[-1]
    assert child_run.state == "finished" and child_run.config["data"]["seq_len"] == 32
    assert child_run.parent_id == parent.run_id and child_run.parent_number == parent.number
    assert "← #1" in child_run.label
    table = child(window, "runTable")
    assert table.item(1, table.column("Run")).text() == child_run.label

    events = read_jsonl(child_run.folder)
    started = events[0]
    assert started["event"] == "run_started" and started["parent"] == parent.run_id
    assert started["config"]["resume"] == parent.checkpoint
    assert (started["start_step"], started["start_tokens"]) == (parent.step, parent.tokens)
    first_step = _steps(events)[0]
    assert first_step["step"] == parent.step + 1
    assert first_step["tokens"] == parent.tokens + 2 * 4 * 32  # micro-batch 4 × accumulation 2 × 32 tokens

    window.plots.set_x_axis("tokens")
    x_parent, _ = _xy(child(window, "lossPlot").curve(parent.key, "train"))
    x_child, _ = _xy(child(window, "lossPlot").curve(child_run.key, "train"))
    assert x_child[0] > x_parent[-1]


def test_continue_is_not_stopped_by_model_or_data_settings_it_does_not_use(qtbot, window, dialogs, tmp_path):
    """Data that does not exist, or a sequence length beyond the preset's positions, greyed Continue ("Cannot run
    these settings: …") though the continued run keeps its parent's data and sequence length."""
    parent = run_once(qtbot, window)
    dialogs.files["getOpenFileName"] = str(tmp_path / "gone.txt")
    child(window, "dataFileButton").click()
    child(window, "seqLenSpin").setValue(child(window, "seqLenSpin").maximum())
    start, cont = child(window, "startButton"), child(window, "continueButton")
    assert not start.isEnabled() and start.toolTip().startswith("Cannot run these settings")
    assert cont.isEnabled() and not cont.toolTip().startswith("Cannot")
    child(window, "accumStepsSpin").setValue(2)
    click(window, "continueButton")
    assert any(f"Continue keeps {parent.label}'s model and data (data builtin, sequence length 32)" in line
               for line in window.log.messages())
    wait_idle(qtbot, window)
    continued = window.session.records[-1]
    assert continued.state == "finished" and continued.parent_id == parent.run_id and not dialogs.messages
    assert continued.config["data"]["seq_len"] == 32 and continued.config["train"]["accum_steps"] == 2
    # A training setting it does take greys it, and says which.
    child(window, "budgetKindCombo").setCurrentIndex(child(window, "budgetKindCombo").findData("steps"))
    child(window, "budgetSpin").setValue(0)
    assert not cont.isEnabled() and cont.toolTip().startswith("Cannot run these settings: ")
    assert "budget" in cont.toolTip()


def test_continue_with_several_runs_selected_names_none_of_them(qtbot, window, dialogs):
    """Two runs selected, Continue went on from a third, the latest, without a word but a log line."""
    from PySide6.QtCore import QItemSelectionModel

    first, second = run_once(qtbot, window), run_once(qtbot, window)
    run_once(qtbot, window)
    table, cont = child(window, "runTable"), child(window, "continueButton")
    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
    for record in (first, second):
        table.selectionModel().select(table.model().index(table.keys.index(record.key), 1), flags)
    assert table.selected_keys() == {first.key, second.key}
    assert not cont.isEnabled()
    assert cont.toolTip() == "2 runs are selected: select the one to continue, or none to continue the latest"
    window.runs.continue_run()  # (its shortcut, pressed as the selection grew)
    assert dialogs.messages[-1][1:] == ("Cannot continue", cont.toolTip()) and len(window.session.records) == 3
    table.clearSelection()
    assert cont.isEnabled()


@pytest.mark.parametrize("damage", ["state missing", "weights cut short"])
def test_continue_from_a_checkpoint_with_a_file_missing_or_cut_short_is_a_dialog(qtbot, window, dialogs, damage):
    """A parent whose trainer_state.pt was deleted, or whose weights a copy left short, became a failed row
    ("… is incomplete: trainer_state.pt is missing") where a parent's folder that is gone is a dialog."""
    parent = run_once(qtbot, window)
    folder = Path(parent.checkpoint)
    if damage == "state missing":
        (folder / "trainer_state.pt").unlink()
        why = f"checkpoint {folder} is incomplete: trainer_state.pt is missing"
    else:
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
        why = f"model.safetensors in {folder} is truncated or damaged"
    click(window, "continueButton")
    (kind, title, text), = dialogs.messages
    assert title == "Cannot continue" and why in text, text
    assert len(window.session.records) == 1 and not window.session.running
    # The log's "Continue: … goes on …" line came before the refusal: it told of a run that never was.
    assert not [line for line in window.log.messages() if "Continue" in line]


def test_continue_during_a_run_stops_it_and_continues_from_its_last_step(qtbot, make_window):
    window = make_window(**LONG)
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 2)
    child(window, "accumStepsSpin").setValue(2)
    click(window, "continueButton")
    assert window.status.currentMessage().startswith("Stopping; the run then continues")
    records = window.session.records
    qtbot.waitUntil(lambda: len(records) == 2 and records[-1].step > parent.step, timeout=90_000)
    assert parent.state == "stopped"
    qtbot.waitUntil(lambda: window.status.currentMessage() == "")  # the continued run in focus: said and done
    continued = window.session.records[-1]
    assert continued.parent_id == parent.run_id
    assert continued.start_step == parent.step
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert continued.state == "stopped"
    # Counted when clicked, the steps more were off by the steps the run made before it stopped (several with
    # several processes): the plan says where it goes, not a count it cannot know yet.
    assert any(f"Continue: {parent.label} goes on to its budget of" in line and "from the step it stops at" in line
               for line in window.log.messages())


def test_continue_while_a_run_is_set_up_is_refused_and_leaves_it_going(qtbot, make_window, dialogs):
    """Continue in set-up stopped the run (keeping nothing), then said there was nothing to continue from."""
    window = make_window(**LONG)
    click(window, "startButton")
    click(window, "continueButton")  # before its first event reaches the window: no step yet
    (warning,) = dialogs.warnings()
    assert warning.startswith("Cannot continue: ") and "is still being set up" in warning
    record = wait_steps(qtbot, window, 1)  # not stopped: it trains on
    assert len(window.session.records) == 1 and record.state not in ("stopping", "stopped")
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_continue_of_a_stopped_run_says_where_it_goes_and_refuses_a_budget_used_up(qtbot, make_window, dialogs):
    window = make_window(**LONG_NO_WARMUP)
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 2)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    window.config_panel.budget.setValue(parent.step)  # steps in all, counted from the lineage's start
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: a budget of {parent.step} steps is already used up: "
                                  f"{parent.label} stopped at step {parent.step}; give a larger budget (the steps "
                                  f"in all, counted from its start)"]
    assert len(window.session.records) == 1  # no failed row
    window.config_panel.budget.setValue(parent.step + 2)
    click(window, "continueButton")
    assert any(f"Continue: {parent.label} goes on along its schedule to {parent.step + 2} steps in all" in line
               for line in window.log.messages())
    wait_idle(qtbot, window)
    assert window.session.records[-1].step == parent.step + 2


def test_continue_during_a_run_refuses_a_budget_it_has_passed_and_leaves_the_run_going(qtbot, make_window, dialogs):
    """Judged before the run is stopped: no stopped parent and failed child for a budget already used up."""
    window = make_window(**LONG)
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 2)
    click(window, "pauseButton")
    qtbot.waitUntil(lambda: parent.state == "paused")
    window.config_panel.budget.setValue(parent.step)
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: a budget of {parent.step} steps is already used up: "
                                  f"{parent.label} is at step {parent.step}; give a larger budget (the steps "
                                  f"in all, counted from its start)"]
    assert parent.state == "paused" and len(window.session.records) == 1
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_continue_to_a_total_inside_the_warmup_is_a_dialog_not_a_failed_row(qtbot, make_window, dialogs):
    """The run refuses a total that would end it still warming up (core.schedule); the window says so first."""
    window = make_window(**LONG)  # 5% of a million steps of warmup
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 2)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    window.config_panel.budget.setValue(parent.step + 2)
    click(window, "continueButton")
    (warning,) = dialogs.warnings()
    assert f"ends inside {parent.label}'s learning-rate warmup" in warning
    assert len(window.session.records) == 1  # nothing started, no failed row


def test_continue_of_a_continued_run_to_a_total_inside_the_lineages_warmup_is_a_dialog(qtbot, make_window, dialogs):
    """The check was skipped for a parent that was itself continued (its warmup is its lineage's): the new run
    started and failed, and one continued from a running run stopped it first."""
    window = make_window(**LONG)  # 5% of a million steps of warmup
    click(window, "startButton")
    first = wait_steps(qtbot, window, 2)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    click(window, "continueButton")  # the same budget: on along the lineage's schedule, still warming up
    second = window.session.records[-1]
    qtbot.waitUntil(lambda: second.step >= first.step + 2)
    assert second.warmup_end_tokens == first.warmup_end_tokens > second.tokens
    window.config_panel.budget.setValue(second.step + 50)
    click(window, "continueButton")  # while it trains: refused, and it trains on
    (warning,) = dialogs.warnings()
    assert f"ends inside {second.label}'s learning-rate warmup" in warning
    assert second.state == "training" and len(window.session.records) == 2
    click(window, "stopButton")
    wait_idle(qtbot, window)
    window.config_panel.budget.setValue(second.step + 2)
    click(window, "continueButton")
    assert len(dialogs.warnings()) == 2 and len(window.session.records) == 2  # nothing started, no failed row


def test_continue_counts_the_steps_of_its_token_horizon_and_refuses_tokens_already_trained(qtbot, make_window,
                                                                                           dialogs):
    """The budget is kept in tokens: with twice the accumulation, the steps left are half as many, and the plan
    says so; a budget in tokens already trained is a dialog, not a failed row."""
    import shutil

    window = make_window(**LONG_NO_WARMUP)
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 2)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    panel = window.config_panel
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("tokens"))
    panel.budget.setValue(parent.tokens)
    click(window, "continueButton")
    assert dialogs.warnings() == [f"Cannot continue: a budget of {parent.tokens:,} tokens is already used up: "
                                  f"{parent.label} stopped at {parent.tokens:,} tokens (step {parent.step}); give a "
                                  f"larger budget (the tokens in all, counted from its start)"]
    assert len(window.session.records) == 1

    per_step = 4 * 2 * 32  # micro-batch 4 × accumulation 2 × the parent's 32 tokens
    panel.budget.setValue(parent.tokens + 3 * per_step)
    child(window, "accumStepsSpin").setValue(2)
    click(window, "continueButton")
    plan = (f"Continue: {parent.label} goes on along its schedule to {parent.tokens + 3 * per_step:,} tokens in all "
            f"({3 * per_step:,} tokens more: 3 steps of {per_step:,} tokens)")
    assert any(plan in line for line in window.log.messages())
    wait_idle(qtbot, window)
    assert window.session.records[-1].step == parent.step + 3

    shutil.rmtree(window.session.records[-1].folder)  # its checkpoint with it
    window.table.selectRow(1)
    click(window, "continueButton")
    assert len(dialogs.warnings()) == 2 and "no longer exists" in dialogs.warnings()[-1]
    assert len(window.session.records) == 2  # no failed row


def test_continue_to_the_parents_own_budget_counts_the_steps_at_the_new_batch(qtbot, make_window):
    window = make_window(train={"budget": 400})  # never reached: the parent is stopped, and so is its child
    click(window, "startButton")
    parent = wait_steps(qtbot, window, 1)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert parent.state == "stopped" and parent.budget_tokens == 400 * 4 * 32
    child(window, "accumStepsSpin").setValue(2)
    click(window, "continueButton")
    left = parent.budget_tokens - parent.tokens
    steps = -(-left // (4 * 2 * 32))
    plan = (f"Continue: {parent.label} goes on to its budget of {parent.budget_tokens:,} tokens ({left:,} tokens "
            f"more: {steps} steps of 256 tokens)")
    assert any(plan in line for line in window.log.messages())
    records = window.session.records
    qtbot.waitUntil(lambda: len(records) == 2 and records[-1].total_steps > 0, timeout=90_000)
    assert records[-1].total_steps == parent.step + steps  # what the trainer planned: what the log said
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_pause_and_resume(qtbot, make_window):
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    click(window, "pauseButton")
    qtbot.waitUntil(lambda: record.state == "paused")  # acknowledged by the trainer, between two steps
    qtbot.waitUntil(lambda: window.status.currentMessage() == "")  # "Pausing …" is over: the state says paused
    paused_at = record.step
    assert child(window, "pauseButton").text() == "Resume"
    assert window.store.run(record.key).steps["step"][-1] == paused_at
    click(window, "pauseButton")
    qtbot.waitUntil(lambda: record.step > paused_at)
    assert child(window, "pauseButton").text() == "Pause"
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert record.state == "stopped"
    steps = [e["step"] for e in _steps(read_jsonl(record.folder))]
    assert steps == list(range(1, record.step + 1))  # nothing lost or repeated across the pause


def test_a_paused_run_that_is_stopped_is_not_said_to_resume(qtbot, make_window):
    """Stop wakes a paused run only to stop it: the log said "stopping …", then "resumed"."""
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    click(window, "pauseButton")
    qtbot.waitUntil(lambda: record.state == "paused")
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert record.state == "stopped"
    said = [line for line in window.log.messages() if record.label in line]
    assert any("stopping after the current optimizer step" in line for line in said)
    assert not any(line.endswith("resumed") for line in said), said


def test_resume_before_the_pause_came_withdraws_pausing_from_the_status_bar(qtbot, make_window):
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    click(window, "pauseButton")
    click(window, "pauseButton")  # Resume at once: the trainer may never have paused
    assert not window.session.paused
    qtbot.waitUntil(lambda: record.step > 1 and record.state == "training")
    window._show_focus()  # what each redraw does: the message goes, long before its 5 s timeout
    assert window.status.currentMessage() == ""  # not "Pausing …" beside "training"
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_core_exception_becomes_a_failed_row_and_the_next_run_works(qtbot, window, monkeypatch):
    original = Trainer._optimizer_step

    def failing_step(self):
        if self.step == 2:
            raise RuntimeError("simulated kernel failure")
        return original(self)

    monkeypatch.setattr(Trainer, "_optimizer_step", failing_step)
    failed = run_once(qtbot, window)
    assert failed.state == "failed"
    assert "RuntimeError: simulated kernel failure" in failed.message
    table = child(window, "runTable")
    state = table.item(0, table.column("State"))
    # The reason is in the row itself, not only in its tooltip.
    assert state.text() == "failed: RuntimeError: simulated kernel failure"
    assert "simulated kernel failure" in state.toolTip()
    assert any("simulated kernel failure" in line for line in window.log.messages())
    assert read_jsonl(failed.folder)[-1]["event"] == "failed"
    assert "simulated kernel failure" in window.status.currentMessage()
    # The model of its last good step is still there: Save stays offered (the menu and the button alike).
    assert window.session.can_save and child(window, "saveButton").isEnabled()
    assert window.actions["Save model…"].isEnabled()

    monkeypatch.undo()
    ok = run_once(qtbot, window)
    assert ok.state == "finished" and ok.step == 4
    assert table.rowCount() == 2
    assert window.status.currentMessage() == ""  # the failure was #1's: not shown beside the next run


def test_closing_while_a_continue_waits_for_the_stop_says_the_continue_is_cancelled(qtbot, make_window, dialogs):
    """The window closed without a word about the Continue the user had asked for: the log's last line still
    read "Continue: #1 … goes on …"."""
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    click(window, "continueButton")  # stops the run, then continues it
    assert window.session.continue_pending and window.session.stopping
    window.close()
    assert dialogs.questions() == []  # the run stops already: nothing to ask
    assert window.log.messages()[-1].endswith("warning: Continue cancelled: the window closes once the run has "
                                              "stopped (its final checkpoint is saved; Continue from it in the next "
                                              "session)")
    qtbot.waitUntil(window.isHidden, timeout=RUN_TIMEOUT_MS)
    assert record.state == "stopped" and len(window.session.records) == 1


def test_close_during_a_run_asks_then_stops_and_ends_the_thread(qtbot, make_window, dialogs):
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    controller = window.session.controller

    dialogs.question_answer = dialogs.question_answer.No
    window.close()
    assert window.isVisible() and window.session.controller.running  # the user said no
    assert len(dialogs.questions()) == 1

    # While compiling, the question and the status say the wait is for the compile (it cannot be cut short).
    record.state = "compiling"  # as CompileStarted sets it, without a compile's half minute
    window.close()
    assert "torch.compile cannot be cut short" in dialogs.questions()[-1] and window.isVisible()
    # Once stopping, a second close still says that the wait is for the compile (it said "optimizer step").
    record.state, record._stopped_compiling = "stopping", True  # as StopRequested during the compile leaves it
    window.session._closing = True  # as the first close, answered Yes, leaves it
    window.close()
    assert window.status.currentMessage() == ("Still stopping: the window closes after the compile in progress "
                                              "and the step after it …")
    window.session._closing = False
    record.state, record._stopped_compiling = "training", False

    dialogs.question_answer = dialogs.question_answer.Yes
    window.close()
    assert window.status.currentMessage() == "Stopping: the window closes after the current optimizer step …"
    qtbot.waitUntil(lambda: controller.thread_finished, timeout=90_000)
    qtbot.waitUntil(window.isHidden)
    assert record.state == "stopped"
    events = read_jsonl(record.folder)
    assert events[-1]["event"] == "finished" and events[-1]["stopped"] is True
    assert [e["step"] for e in _steps(events)] == list(range(1, record.step + 1))


def test_the_run_training_here_is_not_removed_and_the_status_says_to_stop_it(qtbot, make_window):
    from PySide6.QtCore import Qt

    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    window.table.selectRow(window.table.row_of(record.key))
    window.table.setFocus()
    qtbot.keyClick(window.table, Qt.Key.Key_Delete)
    assert not record.removed and window.table.rowCount() == 1
    assert window.status.currentMessage() == "The run training here cannot be removed: stop it first"
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_a_run_paused_before_its_first_step_is_still_in_set_up_for_stop_continue_save_and_close(
        qtbot, make_window, dialogs):
    """Paused as it came out of set-up (its RunStarted, and so its run id, already there), a run was taken for a
    trained one: Stop said a final checkpoint would be saved and the run ended *failed*; Continue stopped it and
    then found nothing to continue from; Save offered "RUN-step0" for what is written after step 1; closing
    promised a final checkpoint and deleted the run folder."""
    window = make_window(**LONG)
    click(window, "startButton")
    click(window, "pauseButton")  # asked in set-up: the trainer holds before its first step
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.state == "paused" and bool(record.run_id))
    assert record.step == 0 and record.before_training
    assert window.session.save_name() == f"{record.run_id}-checkpoint"  # written after the first step

    click(window, "continueButton")
    (warning,) = dialogs.warnings()
    assert "is still being set up (paused before its first step)" in warning
    assert record.state == "paused"  # left as it was, not stopped

    window.close()
    (question,) = dialogs.questions()
    assert "paused before its first step" in question and "nothing of it is kept" in question
    wait_idle(qtbot, window)
    assert record.state == "stopped" and "nothing was kept" in record.message
    assert not Path(record.folder).exists()  # the trainer removes what it had begun: no step, no folder
    assert not any(f"{record.label}: failed" in line for line in window.log.messages())


def test_a_run_resumed_from_a_pause_before_its_first_step_stops_after_a_step(qtbot, make_window):
    window = make_window(**LONG)
    click(window, "startButton")
    click(window, "pauseButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.state == "paused" and bool(record.run_id))
    click(window, "pauseButton")  # Resume: on into its first step
    qtbot.waitUntil(lambda: record.state != "paused")
    assert not record.before_training
    click(window, "stopButton")
    window.status.show_run(record, None)  # as the refresh timer shows the run in focus
    assert child(window, "stateLabel").full_text().endswith(
        "stopping… (after the current optimizer step; a final checkpoint is saved)")
    assert window.status.currentMessage() == ""  # the state says it: a message beside it said it again
    wait_idle(qtbot, window)
    assert record.state == "stopped" and record.step >= 1 and record.checkpoint is not None


def test_stop_before_the_first_step_keeps_nothing_as_it_says(qtbot, make_window, tmp_path):
    """Stop right after Start said "nothing to save yet", then the run validated at step 0, saved a step-0
    checkpoint and offered Continue from it."""
    from core.prepare import prepare_corpus
    from tests.conftest import micro_config

    prepare_corpus(micro_config(tmp_path).data)  # its store is ready: set-up has no preparation to cancel
    window = make_window(**LONG)
    click(window, "startButton")
    click(window, "stopButton")  # before the torch thread's first event reaches the window: in set-up
    assert any("nothing to save yet" in line for line in window.log.messages())
    assert window.status.currentMessage() == ""
    window.status.show_run(window.session.records[-1], None)  # as the refresh timer shows the run in focus
    assert child(window, "stateLabel").full_text().endswith("stopping… (its set-up: nothing is kept)")
    wait_idle(qtbot, window)
    record = window.session.records[-1]
    assert record.state == "stopped" and record.checkpoint is None and record.folder is None, record.message
    assert "nothing was kept" in record.message
    assert not any("checkpoint at step" in line or "validation at step" in line for line in window.log.messages())
    runs = tmp_path / "runs"  # the micro preset's out_dir
    assert not runs.exists() or not any(runs.iterdir())  # no run folder made and left


def test_closing_during_set_up_promises_no_run_folder_or_checkpoint(qtbot, make_window, dialogs):
    window = make_window(**LONG)
    click(window, "startButton")
    dialogs.question_answer = dialogs.question_answer.No
    window.close()  # before its first event reaches the window: no step trained
    (question,) = dialogs.questions()
    assert "nothing of it is kept" in question and "checkpoint" not in question
    dialogs.question_answer = dialogs.question_answer.Yes
    window.close()
    assert window.status.currentMessage() == "Stopping: the window closes after its set-up has stopped …"
    qtbot.waitUntil(window.isHidden, timeout=90_000)
    assert window.session.records[-1].state == "stopped"


def test_closing_while_a_compile_is_announced_before_the_first_step_promises_nothing_either(qtbot, make_window,
                                                                                            dialogs):
    """CompileStarted comes in set-up, before the run has a folder, and the compile itself in the first step: a
    stop then ends the set-up, where the question promised a final checkpoint and a wait for the compile."""
    window = make_window(**LONG)
    click(window, "startButton")
    window.session.records[-1].state = "compiling"  # as CompileStarted sets it, before RunStarted
    dialogs.question_answer = dialogs.question_answer.No
    window.close()
    (question,) = dialogs.questions()
    assert "nothing of it is kept" in question and "checkpoint" not in question and "compile" not in question


def test_continue_during_a_run_whose_data_is_gone_stops_nothing(qtbot, make_window, dialogs, tmp_path):
    """The run was stopped first, then Continue said its data no longer exists: a training run lost to a Continue
    that could never start."""
    from tests.core.checkpoint_helpers import corpus_file

    window = make_window(train={"budget": 1_000_000})
    window.config_panel.set_source(str(corpus_file(tmp_path)))
    qtbot.waitUntil(lambda: window.config_panel.config is not None and not window.config_panel.checking_source,
                    timeout=RUN_TIMEOUT_MS)
    click(window, "startButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.step >= 1, timeout=RUN_TIMEOUT_MS)
    (tmp_path / "corpus.txt").unlink()
    window.runs.continue_run()
    kind, title, text = dialogs.messages[-1]
    assert title == "Cannot continue" and "no longer exists" in text, text
    assert record.state == "training" and not window.session.stopping and len(window.session.records) == 1
