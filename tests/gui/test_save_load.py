"""Save and Load through the buttons, with the file dialogs answered by the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from PySide6.QtWidgets import QMessageBox
from safetensors import safe_open

from core.trainer import Trainer
from tests.gui.conftest import RUN_TIMEOUT_MS, child, click, read_jsonl, run_once, wait_idle, wait_steps

LONG = {"train": {"budget": 1_000_000}}


def _keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def _tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _same_weights(a: Path, b: Path) -> bool:
    first, second = _tensors(a), _tensors(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def _assert_plain_keys(keys: set[str]) -> None:
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" in keys
    assert "model.layers.1.self_attn.q_proj.weight" in keys
    assert not any("_orig_mod" in k or k.startswith("module.") for k in keys)


def test_save_after_a_run_then_load_its_weights_into_the_next_run(qtbot, window, dialogs, tmp_path):
    first = run_once(qtbot, window)
    target = tmp_path / "saved"
    dialogs.files["ask_save_target"] = str(target)
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert not dialogs.warnings()
    # The run's own metrics.jsonl is closed by now: saving is no event of that run, and no warning says it is.
    assert not any("warning" in line for line in window.log.messages()), window.log.messages()
    assert any(str(target) in line for line in window.log.messages())
    _assert_plain_keys(_keys(target))
    final = Path(first.checkpoint)
    saved, reference = _tensors(target), _tensors(final)  # the model as the run left it
    assert saved.keys() == reference.keys()
    assert all(torch.equal(saved[k], reference[k]) for k in saved)
    assert json.loads((target / "config.json").read_text())["step"] == first.step

    dialogs.files["getOpenFileName"] = str(target / "config.json")  # a folder is picked by its config.json
    dialogs.load_mode = "init"
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    assert window.config_panel.start_from == (str(target), "init")
    assert len(dialogs.load_questions) == 1  # it has trainer state, so the user was asked
    assert "saved" in child(window, "startFromLabel").text()

    second = run_once(qtbot, window)
    assert second.state == "finished"
    started = read_jsonl(second.folder)[0]
    assert started["config"]["init_from"] == str(target) and started["start_step"] == 0
    assert window.config_panel.start_from is None  # a load feeds one run


def test_load_to_resume_continues_the_step_count(qtbot, window, dialogs):
    first = run_once(qtbot, window)
    dialogs.files["getOpenFileName"] = str(first.folder + "/metrics.jsonl")  # a run folder: its last checkpoint
    dialogs.load_mode = "resume"
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    path, mode = window.config_panel.start_from
    assert mode == "resume" and path == first.checkpoint
    assert window.config_panel.start_lineage == ("fp32", "cpu")  # what auto keeps on resume: the parent's
    second = run_once(qtbot, window)
    assert second.state == "finished" and second.start_step == first.step
    assert read_jsonl(second.folder)[0]["config"]["resume"] == first.checkpoint


def test_a_resume_whose_budget_is_used_up_is_refused_in_a_dialog_at_start(qtbot, make_window, dialogs):
    """Load (resume exactly), then a budget the checkpoint has passed: Start added a failed row, where Continue
    says the same in a dialog."""
    window = make_window(train={"budget": 1_000_000, "warmup_ratio": 0.0})  # no warmup a new total could end in
    click(window, "startButton")
    first = wait_steps(qtbot, window, 6)
    click(window, "stopButton")
    wait_idle(qtbot, window)
    dialogs.files["getOpenFileName"] = first.checkpoint + "/config.json"
    dialogs.load_mode = "resume"
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    child(window, "budgetSpin").setValue(3)
    rows = len(window.session.records)
    click(window, "startButton")
    assert len(window.session.records) == rows  # no run, no failed row
    assert f"a budget of 3 steps is already used up: the checkpoint is at step {first.step}" in dialogs.warnings()[-1]
    assert window.config_panel.start_from == (first.checkpoint, "resume")  # the choice stays for a larger budget
    child(window, "budgetSpin").setValue(first.step + 2)
    resumed = run_once(qtbot, window)
    assert resumed.state == "finished" and resumed.start_step == first.step and resumed.step == first.step + 2


def test_a_run_trained_for_epochs_resumes_to_its_own_budget(qtbot, make_window, dialogs, tmp_path):
    """The panel has no epochs: it kept its own budget (4 steps), and the resume of a run stopped at step 6 failed
    as a row, 'a budget of 4 steps is already used up'. The budget is shown as the tokens it came to."""
    from core.control import Control
    from core.events import StepMetrics
    from tests.conftest import micro_config

    control = Control()

    def stop_at_6(event):
        if isinstance(event, StepMetrics) and event.step == 6:
            control.stop()

    cfg = micro_config(tmp_path / "cli").replace(train={"budget_kind": "epochs", "budget": 0.02})
    parent = Trainer(cfg, control, stop_at_6).run()
    assert parent.stopped and parent.step == 6
    window = make_window()
    dialogs.files["getOpenFileName"] = str(parent.checkpoint)
    dialogs.load_mode = "resume"
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    end_tokens = torch.load(Path(parent.checkpoint) / "trainer_state.pt", weights_only=True)["schedule"]["end_tokens"]
    assert child(window, "budgetKindCombo").currentData() == "tokens"
    assert child(window, "budgetSpin").value() == end_tokens
    resumed = run_once(qtbot, window)
    planned = read_jsonl(Path(parent.checkpoint).parent.parent)[0]["total_steps"]  # the parent's own horizon
    assert resumed.state == "finished" and resumed.start_step == 6 and resumed.step == planned


def test_loading_a_bad_file_shows_a_plain_message_and_changes_nothing(qtbot, window, dialogs, tmp_path):
    bad = tmp_path / "weights.pt"
    bad.write_bytes(b"this is not a checkpoint")
    dialogs.files["getOpenFileName"] = str(bad)
    click(window, "loadButton")
    qtbot.waitUntil(lambda: bool(dialogs.warnings()))
    (message,) = dialogs.warnings()
    assert "weights.pt" in message and "Traceback" not in message
    assert "corrupted" in message or "not a PyTorch" in message
    assert window.config_panel.start_from is None
    assert not window.session.inspecting

    dialogs.files["getOpenFileName"] = str(tmp_path / "missing.safetensors")
    click(window, "loadButton")
    qtbot.waitUntil(lambda: len(dialogs.warnings()) == 2)
    assert "does not exist" in dialogs.warnings()[1]


def test_a_damaged_checkpoint_is_refused_at_load_not_at_start(qtbot, window, dialogs, tmp_path):
    first = run_once(qtbot, window)
    weights = Path(first.checkpoint) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the last tensor: same size, other bytes
    weights.write_bytes(bytes(data))
    dialogs.files["getOpenFileName"] = str(Path(first.checkpoint) / "config.json")
    click(window, "loadButton")
    qtbot.waitUntil(lambda: bool(dialogs.warnings()))
    (message,) = dialogs.warnings()
    assert "model.safetensors" in message and "checksum differs" in message
    assert window.config_panel.start_from is None and not dialogs.load_questions
    assert window.session.records == [first]  # no run started, no failed row


@pytest.mark.parametrize("change", ["deleted", "rewritten"])
def test_a_checkpoint_changed_between_load_and_start_is_a_dialog_not_a_failed_run(qtbot, window, dialogs, tmp_path,
                                                                               change):
    """Deleted or rewritten after Load, each Start added a failed row ("… does not exist", "checksum differs")."""
    import shutil

    first = run_once(qtbot, window)
    copy = tmp_path / "copy"
    shutil.copytree(first.checkpoint, copy)
    dialogs.files["getOpenFileName"] = str(copy / "config.json")
    dialogs.load_mode = "init"
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    if change == "deleted":
        shutil.rmtree(copy)
    else:
        weights = copy / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    click(window, "startButton")
    message = dialogs.warnings()[-1]
    said = "no longer exists (moved or deleted since it was loaded)" if change == "deleted" else \
        "changed since it was loaded: Load it again"
    assert said in message, message
    assert window.session.records == [first]  # no failed row
    assert window.config_panel.start_from == (str(copy), "init")  # the choice stays, to be cleared or loaded


def test_load_during_a_run_is_refused(qtbot, make_window, dialogs):
    window = make_window(**LONG)
    click(window, "startButton")
    wait_steps(qtbot, window, 1)
    click(window, "loadButton")
    (message,) = dialogs.warnings()
    assert "during a run" in message
    assert "getOpenFileName" not in dialogs.file_calls  # refused before any dialog
    click(window, "stopButton")
    wait_idle(qtbot, window)


def test_save_during_a_run_happens_at_the_next_step_and_the_run_goes_on(qtbot, make_window, dialogs, tmp_path):
    window = make_window(**LONG)
    click(window, "startButton")
    record = wait_steps(qtbot, window, 1)
    target = tmp_path / "mid-run"
    dialogs.files["ask_save_target"] = str(target)
    click(window, "saveButton")
    # It saves at a step still to come: the name offered holds none, which could only be wrong.
    assert dialogs.save_dialog[1] == f"{record.run_id}-checkpoint"
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    _assert_plain_keys(_keys(target))
    saved_step = json.loads((target / "config.json").read_text())["step"]
    assert saved_step >= 1
    qtbot.waitUntil(lambda: record.step > saved_step)  # still training
    click(window, "pauseButton")
    qtbot.waitUntil(lambda: record.state == "paused")
    click(window, "saveButton")  # paused: it saves the step the run stands at, at once
    assert "Saving …" in window.status.currentMessage()
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    paused_at = json.loads((target / "config.json").read_text())["step"]
    assert dialogs.save_dialog[1] == f"{record.run_id}-step{record.step}" and paused_at == record.step
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert record.state == "stopped"


def test_only_a_place_that_was_saved_to_is_where_the_next_save_opens(qtbot, window, dialogs, tmp_path,
                                                                     monkeypatch):
    from core.errors import CheckpointError

    run_once(qtbot, window)
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    dialogs.files["ask_save_target"] = str(good / "model")
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert window.checkpoints.folders.save() == str(good)

    def fail(self, path):
        raise CheckpointError(f"cannot write {path}: no space left on device")

    monkeypatch.setattr(Trainer, "save", fail)
    dialogs.files["ask_save_target"] = str(bad / "model")
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert any("no space left" in line for line in window.log.messages())
    assert window.checkpoints.folders.save() == str(good)  # the failed place is not offered next time
    assert window.status.message.text() == ""  # "Saving …" is over with the failure, not 10 s later


def test_save_refuses_a_folder_with_other_files(qtbot, window, dialogs, tmp_path):
    run_once(qtbot, window)
    busy = tmp_path / "documents"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    dialogs.files["ask_save_target"] = str(busy)
    click(window, "saveButton")
    (message,) = dialogs.warnings()
    assert "other files" in message
    assert (busy / "notes.txt").read_text() == "mine"
    for below in (busy / "notes.txt" / "model", busy / "notes.txt" / "sub" / "model"):  # not "does not exist"
        dialogs.files["ask_save_target"] = str(below)
        click(window, "saveButton")
        assert dialogs.warnings()[-1] == f"Cannot save there: {busy / 'notes.txt'} is a file, not a folder; " \
                                         f"choose a folder to save in."
    dialogs.files["ask_save_target"] = str(tmp_path / "my\nmodel")  # typed where the dialog is not ours
    click(window, "saveButton")
    assert dialogs.warnings()[-1] == "Cannot save there: the name 'my\\nmodel' holds a control character ('\\n'), " \
                                     "which would break every line that names it; choose another name."
    assert not (tmp_path / "my\nmodel").exists()


def test_save_over_a_checkpoint_never_deletes_the_users_files_beside_it(qtbot, window, dialogs, tmp_path):
    """"Replace the checkpoint?" swapped the whole folder: notes kept beside the weights were deleted."""
    run_once(qtbot, window)
    target = tmp_path / "ckpt"
    dialogs.files["ask_save_target"] = str(target)
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    (target / "notes.txt").write_text("mine")
    click(window, "saveButton")
    assert dialogs.warnings() == [f"Cannot save there: {target}: it holds a checkpoint and other files that "
                                  f"replacing it would delete (notes.txt); choose a new name."]
    assert (target / "notes.txt").read_text() == "mine" and (target / "model.safetensors").is_file()


def test_a_name_too_long_for_the_file_system_is_said_in_the_save_dialog(qtbot, tmp_path):
    """Each keystroke and Save raised "File name too long" into Qt's event loop; the dialog said nothing."""
    from gui.checkpoint_paths import save_target_problem
    from gui.dialogs import SaveTargetDialog

    dialog = SaveTargetDialog(None, str(tmp_path), "x" * 300, save_target_problem)
    qtbot.addWidget(dialog)
    dialog.show()
    says = "Cannot save there: a name in the path is 300 bytes long: more than the 255 its file system allows"
    assert dialog.target_label.text().startswith(says)
    accepted = []
    dialog.accepted.connect(lambda: accepted.append(True))
    dialog.buttons.button(dialog.buttons.StandardButton.Save).click()
    assert not accepted and dialog.problem_label.text().startswith(says)


def test_a_diverged_run_leaves_no_model_to_save(qtbot, window, dialogs, tmp_path, monkeypatch):
    """Its weights are not finite: Save stayed enabled, asked for a folder, then said nothing could be saved."""
    real_step = Trainer._optimizer_step_with_fallback

    def diverging_step(self, *args, **kwargs):  # a step that blows the weights up, as a too-high learning rate
        # does on one CPU and not on another: the same NaN everywhere
        result = real_step(self, *args, **kwargs)
        with torch.no_grad():
            for param in self.model.parameters():
                param.fill_(float("nan"))
        return (float("nan"), *result[1:])

    monkeypatch.setattr(Trainer, "_optimizer_step_with_fallback", diverging_step)
    record = run_once(qtbot, window)
    assert record.state == "failed" and "became" in record.message, record.message
    assert not child(window, "saveButton").isEnabled()


# --------------------------------------------------------------------------- the fit, checked at Load
def _state_dict_file(path: Path, rotary: bool = False, **model_changes) -> Path:
    """A bare state dict (``.pth``) of a micro model; ``rotary`` saves its rotary tables beside the weights
    (as the article series does), which tell the head size and so the whole architecture."""
    from tests.core.checkpoint_helpers import make_model

    model = make_model(3, **model_changes)
    state = dict(model.state_dict())
    if rotary:
        state["model.rotary_emb.cos"] = model.model.rotary_emb.cos.clone()
        state["model.rotary_emb.sin"] = model.model.rotary_emb.sin.clone()
    torch.save(state, path)
    return path


def _load(qtbot, window, dialogs, path: Path) -> None:
    count = len(dialogs.messages)
    before = window.config_panel.start_from
    dialogs.files["getOpenFileName"] = str(path)
    click(window, "loadButton")
    qtbot.waitUntil(lambda: not window.session.inspecting
                    and (window.config_panel.start_from != before or len(dialogs.messages) > count))


def test_load_refuses_weights_of_another_architecture_at_once_and_keeps_the_choice(qtbot, window, dialogs,
                                                                                     tmp_path):
    """A state dict of another architecture was accepted ("loaded … 0.46M parameters") and failed only after
    Start, clearing the choice. Now Load names the first differing keys and shapes, and the earlier choice
    stays."""
    good = _state_dict_file(tmp_path / "good.pth")
    _load(qtbot, window, dialogs, good)
    assert window.config_panel.start_from == (str(good), "init") and not dialogs.warnings()
    assert "preset's architecture" in window.log.toPlainText()

    wrong = _state_dict_file(tmp_path / "wrong_arch.pth", intermediate_size=96, num_layers=3)
    _load(qtbot, window, dialogs, wrong)
    (message,) = dialogs.warnings()
    assert message.startswith("These weights do not fit: wrong_arch.pth does not fit the model of the micro preset")
    assert "mlp.gate_proj.weight: expected (64, 32), found (96, 32)" in message
    assert window.config_panel.start_from == (str(good), "init")  # the earlier choice is kept
    assert str(good) in child(window, "startFromLabel").toolTip()

    record = run_once(qtbot, window)  # and it trains from it
    assert record.state == "finished", record.message
    assert read_jsonl(record.folder)[0]["config"]["init_from"] == str(good)


def test_load_refuses_a_vocabulary_no_trained_tokenizer_fits_and_keeps_the_choice(qtbot, window, dialogs,
                                                                                  tmp_path):
    """A state dict whose embedding has 100 rows fits the preset's architecture, but a run from it would train
    a tokenizer of 100 tokens, fewer than the bytes alone: it was accepted, replaced a good choice, and greyed
    Start with "vocabulary size must be between 300 and 1,000,000". Load refuses it now; the choice stays."""
    good = _state_dict_file(tmp_path / "good.pth")
    _load(qtbot, window, dialogs, good)
    assert window.config_panel.start_from == (str(good), "init") and not dialogs.warnings()

    small = _state_dict_file(tmp_path / "vocab100.pth", vocab_size=100)
    _load(qtbot, window, dialogs, small)
    (message,) = dialogs.warnings()
    assert message.startswith("Cannot start from these weights: vocab100.pth has a vocabulary of 100 tokens")
    assert "--tokenizer FILE" in message
    assert window.config_panel.start_from == (str(good), "init")
    assert "not loaded: vocab100.pth has a vocabulary of 100 tokens" in window.log.toPlainText()
    assert child(window, "startButton").isEnabled()


def test_load_adopts_the_architecture_a_state_dict_shows(qtbot, window, dialogs, tmp_path):
    """Rotary tables saved with the weights tell the head size: the whole architecture is read from the file
    and the next run builds that model, whatever the preset's."""
    other = _state_dict_file(tmp_path / "wider.pth", rotary=True, hidden_size=48, num_heads=6, num_kv_heads=3,
                             intermediate_size=80)
    _load(qtbot, window, dialogs, other)
    assert not dialogs.warnings()
    assert window.config_panel.start_from == (str(other), "init")
    cfg = window.config_panel.config
    assert (cfg.model.hidden_size, cfg.model.num_heads, cfg.model.intermediate_size) == (48, 6, 80)
    assert "read from its tensors" in window.log.toPlainText()
    record = run_once(qtbot, window)
    assert record.state == "finished", record.message
    assert read_jsonl(record.folder)[0]["config"]["model"]["hidden_size"] == 48


def test_a_state_dict_gone_between_load_and_start_keeps_the_choice(qtbot, window, dialogs, tmp_path):
    """The file went away between Load and Start: a dialog says so (each Start was a failed run), and the choice
    is still there to fix."""
    good = _state_dict_file(tmp_path / "good.pth")
    _load(qtbot, window, dialogs, good)
    good.unlink()
    click(window, "startButton")
    assert "no longer exists" in dialogs.warnings()[-1] and window.session.records == []
    assert window.config_panel.start_from == (str(good), "init")


def test_the_load_question_names_the_run(qtbot, window, dialogs):
    first = run_once(qtbot, window)
    dialogs.files["getOpenFileName"] = str(Path(first.checkpoint) / "config.json")
    click(window, "loadButton")
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    (question,) = dialogs.load_questions
    assert question.startswith(f"{first.run_id} / {Path(first.checkpoint).name} (Speedboard checkpoint")


# --------------------------------------------------------------------------- Save over an existing checkpoint
def test_save_over_an_existing_checkpoint_asks_then_replaces_it(qtbot, window, dialogs, tmp_path):
    """Typing an existing checkpoint folder's name in the old file dialog opened that folder instead of
    choosing it; now the folder is a target like any other, and replacing it is confirmed first."""
    first = run_once(qtbot, window)
    target = tmp_path / "keep"
    dialogs.files["ask_save_target"] = str(target)
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert not dialogs.questions()
    assert _same_weights(target, Path(first.checkpoint))

    second = run_once(qtbot, window)
    dialogs.question_answer = QMessageBox.StandardButton.No
    click(window, "saveButton")
    assert dialogs.save_dialog == (str(tmp_path), f"{second.run_id}-step{second.step}")  # where it saved last
    (question,) = dialogs.questions()
    assert str(target) in question and "Replace" in question
    assert window.session.pending_save is None  # declined: nothing written
    assert _same_weights(target, Path(first.checkpoint))

    dialogs.question_answer = QMessageBox.StandardButton.Yes
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert len(dialogs.questions()) == 2 and not dialogs.warnings()
    assert _same_weights(target, Path(second.checkpoint))
    modes = {f.name: f.stat().st_mode & 0o777 for f in target.iterdir()}
    assert len(set(modes.values())) == 1, modes  # model.safetensors was 0600, the rest 0644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")] == []  # no leftovers


def test_the_save_dialogs_wrapped_lines_get_their_height(qtbot, tmp_path):
    """Its help line wraps onto two lines when the name is cleared (or a long target is named): the dialog kept
    the height it opened with, both lines squeezed into one's room, clipped at the top and bottom."""
    from gui.dialogs import SaveTargetDialog

    dialog = SaveTargetDialog(None, str(tmp_path), "ckpt")
    qtbot.addWidget(dialog)
    dialog.show()
    label = dialog.target_label

    def whole() -> bool:
        return label.height() >= label.heightForWidth(label.width())

    for name in ("", "y" * 120, "ckpt"):
        dialog.name.setText(name)
        qtbot.waitUntil(whole)
    dialog.resize(300, dialog.height())  # narrower: more lines, and the room for them
    qtbot.waitUntil(whole)


def test_the_save_dialog_chooses_a_folder_and_a_name_and_never_opens_the_target(qtbot, dialogs, tmp_path):
    from gui.dialogs import SaveTargetDialog

    existing = tmp_path / "ckpt"
    existing.mkdir()
    (existing / "config.json").write_text("{}")
    dialog = SaveTargetDialog(None, str(tmp_path), "ckpt")
    qtbot.addWidget(dialog)
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    assert dialog.target() == str(existing) and save.isEnabled()
    assert "Replaces" in dialog.target_label.text()

    dialog.name.setText("new-name")
    assert dialog.target() == str(tmp_path / "new-name") and "Writes" in dialog.target_label.text()
    for bad in ("", "a/b", "..", "a\nb", "tab\there"):  # a line break would break every line naming it
        dialog.name.setText(bad)
        assert dialog.target() is None and not save.isEnabled()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dialogs.files["getExistingDirectory"] = str(elsewhere)
    dialog.name.setText("model")
    dialog.browse.click()
    assert dialog.target() == str(elsewhere / "model")


def test_the_load_line_of_a_state_dict_fitting_the_preset_names_its_own_vocabulary():
    """The settings' widths with the vocabulary of the embedding it holds: not "the preset's architecture,
    vocabulary 4096" when the preset's is 2048."""
    from gui.checkpoint_paths import architecture_note
    from gui.controller import CheckpointSummary

    model = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 4096}
    info = CheckpointSummary("other_vocab.pt", "state_dict", 1_840_000, False, model_config=model,
                             architecture="settings")
    assert architecture_note(info) == ("; its tensors fit the preset's architecture (hidden 128, 4 layers, 4 heads) "
                                       "with a vocabulary of 4096, its embedding's")


def test_a_save_to_a_path_through_dot_dot_finishes_and_the_next_save_is_not_refused(qtbot, window, dialogs,
                                                                                     tmp_path):
    """The run names the folder it saved absolutely ("a/../b" as "b"): the window waited for "a/../b" for good,
    "Saving …" stayed, and every later Save was refused as "in progress"."""
    run_once(qtbot, window)
    (tmp_path / "a").mkdir()
    dialogs.files["ask_save_target"] = f"{tmp_path}/a/../b"
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert (tmp_path / "b" / "config.json").is_file() and not dialogs.warnings()
    assert window.status.currentMessage() == f"Model saved to {tmp_path / 'b'}"
    dialogs.files["ask_save_target"] = str(tmp_path / "c")
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert (tmp_path / "c" / "config.json").is_file() and not dialogs.warnings()


def test_the_save_dialog_says_why_a_place_cannot_be_written_and_keeps_what_was_typed(qtbot, tmp_path):
    """A folder that does not exist: the dialog closed, a message box said so, and the next Save model… opened
    with neither the folder nor the name typed."""
    from gui.checkpoint_paths import save_target_problem
    from gui.dialogs import SaveTargetDialog

    dialog = SaveTargetDialog(None, str(tmp_path / "saves" / "new"), "ck1", save_target_problem)
    qtbot.addWidget(dialog)
    dialog.show()
    accepted = []
    dialog.accepted.connect(lambda: accepted.append(True))
    save = dialog.buttons.button(dialog.buttons.StandardButton.Save)
    save.click()
    assert not accepted and dialog.isVisible()
    assert dialog.problem_label.isVisibleTo(dialog)
    assert dialog.problem_label.text() == f"Cannot save there: the folder {tmp_path / 'saves' / 'new'} does not exist."
    assert dialog.folder.text() == str(tmp_path / "saves" / "new") and dialog.name.text() == "ck1"
    dialog.name.setText("ck2")  # edited: the reason said of the old target goes
    assert not dialog.problem_label.isVisibleTo(dialog)
    (tmp_path / "saves" / "new").mkdir(parents=True)  # made meanwhile: Save checks again
    save.click()
    assert accepted and dialog.target() == str(tmp_path / "saves" / "new" / "ck2")


def test_the_save_dialog_takes_no_relative_folder(qtbot, tmp_path, monkeypatch):
    """A relative folder was taken from the directory the window was started in, which the dialog never shows."""
    from gui.dialogs import SaveTargetDialog

    monkeypatch.chdir(tmp_path)
    dialog = SaveTargetDialog(None, "ckpts", "model")
    qtbot.addWidget(dialog)
    assert dialog.target() is None and "full path" in dialog.target_label.text()
    assert not dialog.buttons.button(dialog.buttons.StandardButton.Save).isEnabled()
    dialog.folder.setText(f"{tmp_path}/x/..")
    assert dialog.target() == str(tmp_path / "model")


def test_a_save_asked_for_in_set_up_then_stop_says_once_that_the_run_had_no_model(qtbot, make_window, dialogs,
                                                                                  tmp_path):
    """Two identical "Save failed" dialogs said "there is no model to save yet: start a run first" to a user who
    had started one: the torch thread answered the request, then the window asked again once the run ended."""
    window = make_window(**LONG)
    click(window, "startButton")
    dialogs.files["ask_save_target"] = str(tmp_path / "early")
    click(window, "saveButton")
    click(window, "stopButton")
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    (warning,) = dialogs.warnings()
    assert "the run ended before its first step: there is no model to save" in warning
    assert not (tmp_path / "early").exists()


def test_weights_whose_model_no_memory_holds_are_refused_at_load_not_at_start(tmp_path):
    """A Hugging Face folder whose config.json says 10**12 positions was loaded, and the run failed at Start
    ("the model alone needs about 59,604.65 GiB")."""
    pytest.importorskip("transformers")
    from core.errors import ConfigError
    from gui.controller import summarize_checkpoint
    from tests.core.checkpoint_helpers import hf_llama, make_tokenizer, save_hf_folder

    folder = save_hf_folder(hf_llama(3), tmp_path / "hf", make_tokenizer())
    config = json.loads((folder / "config.json").read_text())
    assert summarize_checkpoint(str(folder)).kind == "huggingface"  # as written, it loads
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 10**12}))
    with pytest.raises(ConfigError, match="rotary tables alone need about"):
        summarize_checkpoint(str(folder))


@pytest.mark.parametrize("damage, says", [
    ("integers", "holds non-float tensors for weights"),
    ("nan", "are not finite (NaN or inf in model.embed_tokens.weight)"),
])
def test_weights_no_run_can_train_from_are_refused_at_load_and_the_choice_stays(qtbot, window, dialogs, tmp_path,
                                                                                damage, says):
    """Integer or NaN weights of the right shapes were loaded ("loaded w.pt (state dict, 51.4k parameters)"),
    and the run failed at Start."""
    good = _state_dict_file(tmp_path / "good.pth")
    _load(qtbot, window, dialogs, good)
    state = torch.load(good)
    if damage == "integers":
        state = {k: v.to(torch.int64) for k, v in state.items()}
    else:
        state["model.embed_tokens.weight"][0, 0] = float("nan")
    bad = tmp_path / "w.pt"
    torch.save(state, bad)
    _load(qtbot, window, dialogs, bad)
    (message,) = dialogs.warnings()
    assert "w.pt" in message and says in message, message
    assert window.config_panel.start_from == (str(good), "init")  # the earlier choice is kept


def test_a_save_asked_for_once_the_model_is_built_then_stop_writes_no_untrained_weights(qtbot, make_window, dialogs,
                                                                                        tmp_path, monkeypatch):
    """Save, then Stop, late in set-up (the model built and compiled, no step yet): the log said "nothing was
    kept" and the untrained weights were written where the user asked, with no dialog."""
    import threading

    original = Trainer._compile
    reached, go = threading.Event(), threading.Event()

    def held(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        reached.set()
        go.wait(60)
        return compiled

    monkeypatch.setattr(Trainer, "_compile", held)
    window = make_window(**LONG)
    click(window, "startButton")
    qtbot.waitUntil(reached.is_set, timeout=60_000)
    dialogs.files["ask_save_target"] = str(tmp_path / "late")
    click(window, "saveButton")
    click(window, "stopButton")
    go.set()
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    (warning,) = dialogs.warnings()
    assert "the run ended before its first step: there is no model to save" in warning
    assert not (tmp_path / "late").exists()
    record = window.session.records[-1]
    assert record.state == "stopped" and record.folder is None and "nothing was kept" in record.message
    assert not child(window, "saveButton").isEnabled()  # no model to save afterwards either


def _held_reads(monkeypatch):
    """The torch thread's reading of a checkpoint waits for the event returned (a large file's checksums)."""
    import threading

    from gui.controller import TorchThread

    held, real = threading.Event(), TorchThread._inspect

    def slow_inspect(self, *args, **kwargs):
        held.wait(timeout=60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchThread, "_inspect", slow_inspect)
    return held


def test_start_waits_for_weights_being_read_and_their_question(qtbot, window, dialogs, monkeypatch):
    """Start stayed enabled while Load read its file: the run started without the weights, the Load question then
    came during that run, and its answer changed the settings under it."""
    first = run_once(qtbot, window)
    held = _held_reads(monkeypatch)
    dialogs.files["getOpenFileName"] = str(first.folder + "/metrics.jsonl")
    dialogs.load_mode = "resume"
    click(window, "loadButton")
    for name in ("startButton", "continueButton", "loadButton", "saveButton"):
        assert not child(window, name).isEnabled(), name
    assert "weights being read" in child(window, "startButton").toolTip()
    held.set()
    qtbot.waitUntil(lambda: window.config_panel.start_from is not None)
    assert child(window, "startButton").isEnabled() and child(window, "loadButton").isEnabled()
    second = run_once(qtbot, window)
    assert second.start_step == first.step  # it started from the weights read


def test_a_read_that_ends_after_the_window_closed_asks_nothing(qtbot, make_window, dialogs, monkeypatch):
    """Closing while weights are read: the window waited for the torch thread (frozen for as long as a large
    checkpoint takes); it now closes once the read has ended, and asks nothing of it."""
    window = make_window()
    first = run_once(qtbot, window)
    held = _held_reads(monkeypatch)
    dialogs.files["getOpenFileName"] = str(first.folder + "/metrics.jsonl")
    click(window, "loadButton")
    window.close()  # returns at once: the read goes on
    assert window.isVisible() and window.status.currentMessage().startswith("The window closes once the weights")
    held.set()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=RUN_TIMEOUT_MS)
    assert dialogs.load_questions == [] and not dialogs.messages
    assert "was read as the window closed: not loaded" in window.log.toPlainText()


def test_closing_during_a_save_waits_for_it_without_holding_the_window(qtbot, make_window, tmp_path):
    """close() waited for the torch thread's save in the GUI thread: the window froze for as long as it took."""
    from core.checkpoint import verify_checkpoint

    window = make_window()
    run_once(qtbot, window)
    target = tmp_path / "saved"
    window.session.save(str(target))
    window.close()
    assert window.isVisible() and window.status.currentMessage() == "The window closes once the model is saved …"
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=RUN_TIMEOUT_MS)
    verify_checkpoint(str(target))  # whole
