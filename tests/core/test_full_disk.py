"""A full disk, simulated by a file-size limit in a subprocess: every write that cannot be done is one clear
line or one warning, the run goes on, and nothing half-written is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import checkpoint as ck
from core.config import DataConfig
from core.data import prepare_data
from tests.core.checkpoint_helpers import corpus_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each test starts a process


def limited(scenario: str, limit: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tests.core.full_disk_entry", scenario, str(limit), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_checkpoint_that_does_not_fit_is_one_error_and_leaves_the_previous_one(tmp_path):
    """safetensors ("File too large") and torch.save ("unexpected pos") both fail as one CheckpointError that
    names the limit; the temporary folder is gone and the earlier checkpoint is intact."""
    proc = limited("save", 400_000, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    messages = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("weights", "trainer_state", "replace", "export"):
        what = "export" if name == "export" else "checkpoint"
        assert messages[name] is not None, name
        assert messages[name].startswith(f"cannot write the {what} to "), messages[name]
        assert "file-size limit" in messages[name] and "\n" not in messages[name], messages[name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first"]  # no second, no export, nothing hidden
    assert ck.read_checkpoint(tmp_path / "first").meta["step"] == 1  # intact, replaced by nothing


def test_a_full_metrics_file_is_said_once_and_the_run_goes_on_to_its_final_checkpoint(tmp_path):
    corpus = str(corpus_file(tmp_path))
    proc = limited("metrics", 100, str(tmp_path), corpus)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    warnings = [e["message"] for e in seen if e["event"] == "warning"]
    assert len(warnings) == 1 and "metrics.jsonl" in warnings[0] and "file-size limit" in warnings[0], warnings
    assert [e["step"] for e in seen if e["event"] == "step"] == list(range(1, 9))  # training went on
    assert [e["step"] for e in seen if e["event"] == "checkpoint_failed"] == [4]  # the disk was full then
    assert [e["step"] for e in seen if e["event"] == "checkpoint"] == [8]  # space came back: final checkpoint
    (run_dir,) = (tmp_path / "runs").iterdir()
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]  # whole lines only: a cut line was taken back
    steps = [e["step"] for e in lines if e["event"] == "step"]
    assert steps[:3] == [1, 2, 3] and 4 not in steps and steps[-1] == 8
    assert lines[-1]["event"] == "finished"
    assert ck.read_checkpoint(run_dir).meta["step"] == 8


def test_a_run_folder_deleted_mid_run_is_said_once_and_the_run_goes_on(tmp_path):
    """Deleted while the run wrote it, metrics.jsonl took every later line without a word: a finished run with
    its whole history gone."""
    import shutil

    from core.events import ListSink, StepMetrics, WarningRaised
    from core.trainer import Trainer
    from tests.conftest import micro_config

    events = ListSink()

    def sink(event):
        events(event)
        if isinstance(event, StepMetrics) and event.step == 2:
            shutil.rmtree(trainer.run_dir)

    trainer = Trainer(micro_config(tmp_path, train={"budget": 4}), sink=sink)
    trainer.run()
    warnings = [w.message for w in events.of(WarningRaised)]
    assert len(warnings) == 1 and "metrics.jsonl (it was deleted while the run wrote it)" in warnings[0], warnings
    assert sorted({e.step for e in events.of(StepMetrics)}) == [1, 2, 3, 4]  # trained to its end


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="a moved file's new name is read from /proc")
def test_a_run_folder_renamed_mid_run_is_followed(tmp_path):
    """Renamed while its run trained, the folder kept the metrics while later checkpoints went to a recreated
    runs/a/checkpoints, without a word: a resume of the renamed folder went back to its step before the move."""
    from core.events import ListSink, RunFinished, StepMetrics, WarningRaised
    from core.runs import HEARTBEAT_FILE, run_state
    from core.trainer import Trainer
    from tests.conftest import micro_config

    events = ListSink()
    moved = tmp_path / "runs" / "renamed"

    def sink(event):
        events(event)
        if isinstance(event, StepMetrics) and event.step == 2:
            os.rename(trainer.run_dir, moved)

    trainer = Trainer(micro_config(tmp_path, train={"budget": 4, "save_every": 1, "keep": 10}), sink=sink)
    trainer.run()
    (warning,) = [w.message for w in events.of(WarningRaised)]
    assert warning.endswith(f"was moved to {moved} while the run trained: the run follows it (its checkpoints and "
                            f"heartbeat go there)")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["renamed"]  # nothing recreated at the old name
    assert sorted(p.name for p in (moved / "checkpoints").iterdir())[-1] == "step_0000004"
    assert events.of(RunFinished)[0].checkpoint == str(moved / "checkpoints" / "step_0000004")
    assert not (moved / HEARTBEAT_FILE).exists() and run_state(moved).state == "finished"


def test_a_run_on_a_full_disk_trains_to_its_end_and_says_why_nothing_is_saved(tmp_path):
    corpus = str(corpus_file(tmp_path))
    prepare_data(DataConfig(source=corpus, vocab_size=300, seq_len=32))  # the token store is written here
    limit = 12_000  # room for the run folder's config and tokenizer, not for checkpoints or all metrics
    proc = limited("cli", limit, "train", "--data", corpus, "--vocab-size", "300", "--seq-len", "32",
                   "--micro-batch", "2", "--steps", "60", "--save-every", "20", "--eval-every", "0",
                   "--log-every", "20", "--no-progress", "--out", str(tmp_path / "runs"))
    output = proc.stdout + proc.stderr
    # Trained to its end, but without its final checkpoint the weights are lost: not a success for a script.
    assert proc.returncode == 1, output
    assert proc.stderr.strip().splitlines()[-1] == ("speedboard: error: the run finished at step 60, but its final "
                                                    "checkpoint could not be saved (see the warning above)")
    assert "Traceback" not in output
    assert output.count("cannot write") and output.count("metrics.jsonl") == 1, output  # said once
    # Steps 20, 40 and 60; the final save tries step 60 again, and failing for the same reason says nothing new.
    assert output.count("checkpoint not saved") == 3, output
    assert "step     60 |" in output  # trained to its end
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not (run_dir / "checkpoints").exists()  # no temporary folders, nor the empty folder made for them
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # whole lines, however the disk filled up


def test_a_run_folder_that_cannot_be_written_at_set_up_is_one_line_and_is_removed(tmp_path):
    corpus = str(corpus_file(tmp_path))
    prepare_data(DataConfig(source=corpus, vocab_size=300, seq_len=32))  # the tokenizer cache is written here
    proc = limited("cli", 3_000, "train", "--data", corpus, "--vocab-size", "300", "--seq-len", "32",
                   "--steps", "1", "--no-progress", "--out", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("speedboard: error: cannot write the run folder ") and \
        proc.stderr.count("\n") == 1, proc.stderr
    assert "file-size limit of 3,000 bytes" in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing half-written left, nor the folder created for it
