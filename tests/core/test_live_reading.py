"""Reading a run while it is written: a reader reads a checkpoint whole or moves on to the newest one; keep-
rotation never shows a half-deleted checkpoint; what crashed processes left behind is cleared."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from core import checkpoint as ck
from core.checkpoint import folders
from core.checkpoint import read as read_mod
from core.errors import CheckpointError
from core.events import ListSink, RunStarted
from core.runs import METRICS_FILE
from core.trainer import train
from tests.conftest import micro_config
from tests.core.checkpoint_helpers import corpus_file, make_model

pytestmark = pytest.mark.usefixtures("single_thread")


def run_folder(tmp_path: Path, tok, steps=(1, 2)) -> Path:
    """A run folder as a live run leaves it: checkpoints with trainer states, newest last."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / METRICS_FILE).write_text("")
    for step in steps:
        ck.save_checkpoint(run / "checkpoints" / f"step_{step:07d}", make_model(step), tokenizer=tok, step=step,
                           trainer_state={"step": step})
    return run


def rotate_during_first(monkeypatch, name: str, run: Path) -> list[Path]:
    """Make the first call of ``read_mod.<name>`` happen just after keep-rotation removed the newest checkpoint."""
    real, removed = getattr(read_mod, name), []

    def late(path, *args, **kwargs):
        if not removed:
            newest = ck.list_checkpoints(run / "checkpoints")[-1]
            assert ck.remove_folder(newest)
            removed.append(newest)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(read_mod, name, late)
    return removed


@pytest.mark.parametrize("stage", ["_read_json", "_load_safetensors", "_torch_load"])
def test_a_checkpoint_removed_mid_read_is_replaced_by_the_next_newest(stage, tmp_path, tok, monkeypatch):
    run = run_folder(tmp_path, tok)
    monkeypatch.setattr(read_mod, "_check_trainer_state", lambda state, path: state)
    removed = rotate_during_first(monkeypatch, stage, run)
    loaded = ck.read_checkpoint(run, trainer_state=True)
    assert removed and removed[0].name == "step_0000002"
    assert loaded.source.name == "step_0000001"
    assert loaded.meta["step"] == 1 and loaded.trainer_state == {"step": 1}  # read whole, from one checkpoint


def test_a_named_checkpoint_removed_mid_read_is_one_line(tmp_path, tok, monkeypatch):
    run = run_folder(tmp_path, tok)
    rotate_during_first(monkeypatch, "_load_safetensors", run)
    with pytest.raises(CheckpointError, match="step_0000002 does not exist"):
        ck.read_checkpoint(run / "checkpoints" / "step_0000002")


def test_resume_from_a_live_run_takes_the_newest_checkpoint_that_is_there(tmp_path, monkeypatch):
    """``--resume LIVE``: rotation removed the checkpoint being read; the run resumes from the next one
    instead of claiming there is no trainer state."""
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(tmp_path))},
                       train={"budget": 3, "save_every": 1, "keep": 3})
    parent = train(cfg)
    removed = rotate_during_first(monkeypatch, "_torch_load", parent.run_dir)
    sink = ListSink()
    child = train(cfg.replace(resume=str(parent.run_dir), train={"budget": 4}), sink=sink)
    assert removed[0].name == "step_0000003"
    assert sink.of(RunStarted)[0].start_step == 2 and child.step == 4
    assert sink.of(RunStarted)[0].config["resume"] == str(parent.run_dir / "checkpoints" / "step_0000002")


def test_readers_never_fail_while_a_run_saves_and_rotates(tmp_path, tok, monkeypatch):
    """A writer saves and rotates (keep 1) as fast as it can; every read is whole, whatever the interleaving."""
    monkeypatch.setattr(read_mod, "_check_trainer_state", lambda state, path: state)  # a token state will do
    run = run_folder(tmp_path, tok, steps=(1,))
    stop, errors = threading.Event(), []
    model = make_model(0)

    def writer():
        step = 1
        try:
            while not stop.is_set():
                step += 1
                ck.save_checkpoint(run / "checkpoints" / f"step_{step:07d}", model, tokenizer=tok, step=step,
                                   trainer_state={"step": step})
                for old in ck.list_checkpoints(run / "checkpoints")[:-1]:
                    ck.remove_folder(old)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(30):
            loaded = ck.read_checkpoint(run, trainer_state=True)
            assert loaded.trainer_state["step"] == loaded.meta["step"]  # weights, config and state of one save
    finally:
        stop.set()
        thread.join(120)
    assert not errors


def test_rotation_renames_aside_before_deleting(tmp_path, monkeypatch):
    """A deletion cut short (a kill mid-way) leaves only a hidden folder, never a checkpoint with missing parts."""
    real_rmtree = shutil.rmtree

    def cut_short(path, *args, **kwargs):  # deletes one file, then the process "dies"
        if ".del-" in Path(path).name:
            (Path(path) / ck.WEIGHTS_FILE).unlink()
            return None
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(folders.shutil, "rmtree", cut_short)
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(tmp_path))},
                       train={"budget": 3, "save_every": 1, "keep": 1})
    result = train(cfg)
    checkpoints = result.run_dir / "checkpoints"
    visible = ck.list_checkpoints(checkpoints)
    assert [p.name for p in visible] == ["step_0000003"]
    hidden = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("."))
    assert len(hidden) == 2 and all(".del-" in name for name in hidden)
    assert ck.read_checkpoint(checkpoints / "step_0000003").meta["step"] == 3  # complete


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_run_clears_what_dead_processes_left_in_its_output_folder(tmp_path, tok):
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(tmp_path))}, train={"budget": 1})
    old_run = train(cfg).run_dir / "checkpoints"
    dead, here = _dead_pid(), folders._host_tag()
    kept = ck.list_checkpoints(old_run)
    removed = {f".step_0000001.tmp-{dead}@{here}-aaaaaa",  # an unfinished save of a dead process
               f".step_0000001.del-{dead}-bbbbbb"}  # a deletion cut short (the older name, without a host)
    moved_aside = f".step_0000007.old-{dead}@{here}-cccccc"  # a checkpoint moved aside: put back under its name
    left_alone = {f".step_0000001.tmp-{os.getpid()}@{here}-dddddd",  # a live process's save
                  f".step_0000001.tmp-{dead}@elsewhere-eeeeee"}  # another machine's (shared storage)
    for name in removed | left_alone | {moved_aside}:
        shutil.copytree(kept[-1], old_run / name)
    meta_file = old_run / moved_aside / ck.CONFIG_FILE  # it is step 7's: its name is put back
    meta = {**json.loads(meta_file.read_text()), "step": 7}
    meta_file.write_text(json.dumps({**meta, ck.CONFIG_CHECKSUM: ck.config_checksum(meta)}))
    train(cfg)  # a new run starts in the same output folder
    names = {p.name for p in old_run.iterdir()}
    assert not names & removed and left_alone <= names and moved_aside not in names
    restored = ck.read_checkpoint(old_run / "step_0000007")
    assert torch.equal(restored.state_dict["model.norm.weight"],
                       ck.read_checkpoint(kept[-1]).state_dict["model.norm.weight"])


def test_an_event_tail_skips_lines_that_are_no_events_and_keeps_those_around_them(tmp_path):
    """A foreign or damaged line (a JSON list or number, text) is skipped; it once raised out of the reader
    and took the events read with it."""
    import json

    from core.events import WarningRaised
    from core.runs import EventTail

    good = [WarningRaised("r", float(t), f"w{t}").to_dict() for t in range(3)]
    lines = [json.dumps(good[0]), "[1, 2]", "5", "not json", '{"event": "no such event"}', json.dumps(good[1]),
             "null", json.dumps(good[2])]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert [e.message for e in EventTail(path).poll()] == ["w0", "w1", "w2"]


def test_a_line_too_long_to_be_an_event_is_skipped_in_time_linear_in_its_length(tmp_path):
    """A damaged 100 MB first line, joined a piece per poll, froze the window that opened its folder for 40 s;
    it is read on to its end and dropped, and the events around it are read. A writer that cuts off the long
    line it could not finish (a full disk) is followed back to its last whole line."""
    import json

    from core.events import WarningRaised
    from core.runs import MAX_EVENT_LINE, EventTail

    w0, w1, w2 = (json.dumps(WarningRaised("r", float(t), f"w{t}").to_dict()).encode() + b"\n" for t in range(3))
    path = tmp_path / "metrics.jsonl"
    long_line = b'{"event": "warning", "pad": "' + b"x" * (3 * MAX_EVENT_LINE) + b'"}\n'
    path.write_bytes(w0 + long_line + w1)
    tail = EventTail(path)
    seen, polls = [], 0
    while True:
        seen += [e.message for e in tail.poll(64 * 1024)]
        polls += 1
        if not tail.behind:
            break
    assert seen == ["w0", "w1"]
    assert polls <= len(long_line) // (64 * 1024) + 3  # each poll reads a piece, none goes back over the line
    assert tail._partial == b"" and not tail._skipping

    with path.open("ab") as f:  # a writer begins a long line, the disk fills, it cuts the line off again
        f.write(b'{"event": "warning", "pad": "' + b"y" * (2 * MAX_EVENT_LINE))
    while tail.poll(64 * 1024) or tail.behind:
        pass
    assert tail._skipping
    with path.open("r+b") as f:
        f.truncate(len(w0) + len(long_line) + len(w1))
    path.write_bytes(path.read_bytes() + w2)
    assert [e.message for e in tail.poll()] == ["w2"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_in_place_of_metrics_jsonl_is_one_error_at_once(tmp_path):
    """Opening it blocked the reader (the dashboard's window) until something wrote to the pipe, and then said
    'File or stream is not seekable'."""
    from core.runs import EventTail

    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(OSError, match=r"metrics\.jsonl is not a regular file \(a named pipe or a device\)"):
        EventTail(tmp_path).poll()  # returns: a blocked open would hang the test (its timeout)
