"""Events read back from a run folder: a line of the wrong shape is refused as a whole, never half-built."""

from __future__ import annotations

import json

import pytest

from core.events import RunStarted, StepMetrics, event_from_dict
from core.runs import EventTail
from tests.conftest import micro_config


def step(**changes) -> dict:
    line = {"event": "step", "run_id": "r", "time": 1.5, "step": 3, "tokens": 96, "loss": 2.5, "lr": 1e-3,
            "grad_norm": 0.5, "tokens_per_s": 1000.0, "step_time": 0.1, "peak_mem_gib": 0.2, "mem_gib": 0.1,
            "mfu": 0.1}
    return {**line, **changes}


def started(**config_changes) -> dict:
    config = micro_config().to_dict()
    for key, value in config_changes.items():
        section, _, name = key.partition(".")
        if name:
            config[section][name] = value
        else:
            config[section] = value
    return {"event": "run_started", "run_id": "r", "time": 0.0, "run_dir": "/x", "config": config, "device": "cpu",
            "precision": "fp32", "num_parameters": 10, "tokens_per_step": 32, "budget_tokens": 320,
            "total_steps": 10}


def test_lines_of_the_right_types_are_read_as_written():
    event = event_from_dict(step())
    assert isinstance(event, StepMetrics) and event.step == 3 and event.loss == 2.5
    assert event_from_dict(step(loss=float("nan"))).loss != event.loss  # a diverged run's NaN is a number
    assert event_from_dict(step(tokens_per_s=1000)).tokens_per_s == 1000  # JSON writes 1000.0 as 1000 at times
    assert isinstance(event_from_dict(started()), RunStarted)
    assert event_from_dict(started(**{"train.future_setting": [1, 2]})).config["train"]["future_setting"] == [1, 2]


@pytest.mark.parametrize("line", [
    step(step="abc"), step(loss="x"), step(tokens_per_s="fast"), step(time="noon"), step(peak_mem_gib=[1, 2]),
    step(run_id=7), step(step=True), step(step=10**30), step(step=1e30),
    started(train="fast"), started(model=[1]), started(**{"train.accum_steps": "4"}),
    started(**{"train.compile_mode": 1}), started(preset=3), {**started(), "config": "text"},
    {**started(), "total_steps": "10"},
], ids=lambda line: json.dumps(line)[:60])
def test_a_line_with_a_value_of_the_wrong_type_is_refused_whole(line):
    """The window's table and plots failed on such values on every refresh (a traceback per tick)."""
    with pytest.raises(ValueError):
        event_from_dict(line)


def test_a_damaged_value_of_a_field_with_a_default_falls_back_to_it():
    event = event_from_dict({**started(), "world_size": "two", "at": "damaged"})
    assert event.world_size == 1 and isinstance(event.at, float)


def test_a_tail_skips_wrongly_typed_lines_and_reads_the_rest(tmp_path):
    lines = [started(), step(step=1), step(step="two"), step(step=3, loss=[1]), step(step=4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    events = EventTail(tmp_path).poll()
    assert [type(e).__name__ for e in events] == ["RunStarted", "StepMetrics", "StepMetrics"]
    assert [e.step for e in events[1:]] == [1, 4]


def test_a_folder_read_elsewhere_than_it_was_written_names_its_own_paths(tmp_path):
    """A run folder moved, copied or mounted under another path: its run and its checkpoints are where it is
    read, not where it was written (the window followed the old path and called a live run gone)."""
    old, seen = "/gone/runs/r", tmp_path / "r"
    seen.mkdir()
    lines = [{**started(), "run_dir": old},
             {"event": "checkpoint", "run_id": "r", "time": 2.0, "step": 4, "tokens": 128,
             "path": f"{old}/checkpoints/s4"},
             {"event": "checkpoint_failed", "run_id": "r", "time": 2.5, "step": 5, "path": "/elsewhere/mine",
              "message": "disk full"},
             {"event": "finished", "run_id": "r", "time": 3.0, "step": 5, "tokens": 160, "stopped": False,
              "final_loss": 2.0, "val_loss": None, "median_tokens_per_s": 1.0, "compile_seconds": None,
              "peak_mem_gib": 0.1, "checkpoint": f"{old}/checkpoints/s4"}]
    (seen / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run, saved, failed, finished = EventTail(seen).poll()
    assert run.run_dir == str(seen)
    assert saved.path == finished.checkpoint == str(seen / "checkpoints" / "s4")
    assert failed.path == "/elsewhere/mine"  # a save asked for outside the folder stays where it was asked
    # Read where it was written: unchanged.
    (seen / "metrics.jsonl").write_text(json.dumps({**started(), "run_dir": str(seen)}) + "\n")
    assert EventTail(seen / "metrics.jsonl").poll()[0].run_dir == str(seen)


def test_numbers_that_are_not_finite_are_written_as_null_and_read_back_as_nan(tmp_path):
    """NaN and Infinity are not JSON: a strict reader (JavaScript's, jq) refused the whole metrics.jsonl of a
    run whose validation or MFU was not finite."""
    import math

    from core.events import StepMetrics as Step
    from core.runs import JsonlSink, write_json

    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink(event_from_dict(step(loss=float("nan"), mfu=float("inf"))))
    sink.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    line = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the file"))
    assert line["loss"] is None and line["mfu"] is None
    read = event_from_dict(line)
    assert isinstance(read, Step) and math.isnan(read.loss) and math.isnan(read.mfu)
    write_json(tmp_path / "config.json", {"speedup": float("inf"), "nested": [1.0, float("-inf")]})
    assert json.loads((tmp_path / "config.json").read_text()) == {"speedup": None, "nested": [1.0, None]}


def test_lines_of_one_document_say_document_not_documents():
    """The status bar read "training the tokenizer on 1 documents"."""
    from core.event_text import data_progress_line, event_line
    from core.events import DataPreparationProgress, DataPrepared

    def progress(stage, done):
        return DataPreparationProgress("r", 0.0, stage, 0, None, done, None, 0, None)

    assert data_progress_line(progress("tokenizer-training", 1)) == "training the tokenizer on 1 document …"
    assert data_progress_line(progress("tokens", 1)) == "tokenizing: 1 document, 0 tokens"
    assert data_progress_line(progress("tokens", 2_000)) == "tokenizing: 2,000 documents, 0 tokens"
    prepared = DataPrepared("r", 0.0, "c.txt", 1, 1, True, "/s", 0.0, "tok.json", 300, "[BOS]", "[EOS]", None)
    assert event_line(prepared).text.startswith("data: 1 document, 1 token, from its token store")
    from core.config import DataConfig
    from core.prepare import trained_origin

    assert trained_origin(DataConfig(tokenizer_train_docs=1)).startswith("trained on the corpus' first document, ")


def test_a_job_of_several_processes_says_whose_memory_and_which_peak():
    """Its memory figures are rank 0's and MFU divides by every process's peak: the lines said neither."""
    from core.event_text import event_line
    from core.events import RunFinished

    def started(world_size):
        return RunStarted("r", 0.0, run_dir="/r", config={}, device="cpu", precision="fp32", num_parameters=1,
                          tokens_per_step=1, budget_tokens=1, total_steps=1, world_size=world_size,
                          matmul_peak_flops=91e9)

    assert "→ step 1, MFU of 91 GFLOP/s fp32 GEMMs) in" in event_line(started(1)).text
    assert "→ step 1, MFU of 2 × 91 GFLOP/s fp32 GEMMs) in" in event_line(started(2)).text

    def finished(world_size):
        return RunFinished("r", 1.0, 20, 100, False, 3.0, None, 9424.0, None, 0.56, None, train_mem_gib=0.32,
                           world_size=world_size)

    assert event_line(finished(1)).text.endswith("peak mem 0.32 GiB for training (0.56 GiB the process)")
    assert event_line(finished(2)).text.endswith("peak mem 0.32 GiB for training (0.56 GiB the process) in rank 0, "
                                                 "one of 2 processes")


def test_a_path_with_a_line_break_stays_on_its_line():
    """A run folder or checkpoint named with a line break split the started and checkpoint lines in two."""
    from core.event_text import event_line
    from core.events import CheckpointSaved

    line = event_line(CheckpointSaved("r", 1.0, 3, 96, "/runs/odd\nname/checkpoints/step_0000003")).text
    assert line == "checkpoint at step 3: /runs/odd\\nname/checkpoints/step_0000003"
