"""Save and Load through the buttons, with the file dialogs answered by the test."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from tests.gui.conftest import child, click, read_jsonl, run_once, wait_idle, wait_steps

LONG = {"train": {"budget": 1_000_000}}


def _keys(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def _tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _assert_plain_keys(keys: set[str]) -> None:
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" in keys
    assert "model.layers.1.self_attn.q_proj.weight" in keys
    assert not any("_orig_mod" in k or k.startswith("module.") for k in keys)


def test_save_after_a_run_then_load_its_weights_into_the_next_run(qtbot, window, dialogs, tmp_path):
    first = run_once(qtbot, window)
    target = tmp_path / "saved"
    dialogs.files["getSaveFileName"] = str(target)
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    assert not dialogs.warnings()
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
    second = run_once(qtbot, window)
    assert second.state == "finished" and second.start_step == first.step
    assert read_jsonl(second.folder)[0]["config"]["resume"] == first.checkpoint


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
    dialogs.files["getSaveFileName"] = str(target)
    click(window, "saveButton")
    qtbot.waitUntil(lambda: window.session.pending_save is None)
    _assert_plain_keys(_keys(target))
    saved_step = json.loads((target / "config.json").read_text())["step"]
    assert saved_step >= 1
    qtbot.waitUntil(lambda: record.step > saved_step)  # still training
    click(window, "stopButton")
    wait_idle(qtbot, window)
    assert record.state == "stopped"


def test_save_refuses_a_folder_with_other_files(qtbot, window, dialogs, tmp_path):
    run_once(qtbot, window)
    busy = tmp_path / "documents"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    dialogs.files["getSaveFileName"] = str(busy)
    click(window, "saveButton")
    (message,) = dialogs.warnings()
    assert "other files" in message
    assert (busy / "notes.txt").read_text() == "mine"
