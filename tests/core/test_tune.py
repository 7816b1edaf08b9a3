"""The speed advisor's engine: trials, their statistics, the plan, the interleaved tune and its report."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from core.trials import Cell, TrialResult, compare, run_trial, splits
from core.tune import (
    TrialFinished,
    TrialStarted,
    TuneFinished,
    TuneOptions,
    TuneStarted,
    check_report_path,
    format_report,
    load_report,
    plan_tune,
    report_settings,
    run_tune,
    save_report,
    table_rows,
)

EAGER = [Cell("off", "model", 1, 4, "fp32"), Cell("off", "model", 2, 2, "fp32"), Cell("off", "model", 1, 4, "bf16")]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Trials' throw-away run folders go here, so a test can see that none is left."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_splits_keep_the_effective_batch_largest_micro_batch_first():
    assert splits(8) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert splits(6) == [(6, 1), (3, 2), (2, 3), (1, 6)]
    for n in range(1, 200):
        assert splits(n) == [(b, n // b) for b in range(n, 0, -1) if n % b == 0]
    huge = splits(10**8)  # every divisor of a huge batch, found from those up to its square root
    assert len(huge) == 81 and huge[0] == (10**8, 1) and huge[-1] == (1, 10**8)
    assert all(b * k == 10**8 for b, k in huge)


def test_trials_start_from_the_same_weights_and_batches_and_leave_no_run_folder(micro, private_tmp):
    config = micro()
    a = run_trial(config, Cell("off", "model", 1, 4), total_steps=3)
    b = run_trial(config, Cell("off", "model", 2, 2), total_steps=3, repeat=1)
    assert a.ok and b.ok, (a.error, b.error)
    # Same initial weights and global batches, exact accumulation: the same losses step by step.
    assert a.losses == pytest.approx(b.losses, abs=1e-5)
    assert a.timed_steps == 2 and len(a.step_seconds) == 2 and a.tokens_per_s > 0
    assert a.peak_mem_gib > 0 and a.mem_before_gib > 0
    assert list(private_tmp.iterdir()) == []  # the run folders are gone
    assert not Path(config.out_dir).exists()  # and none in the configured output folder


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="a CPU peak is read from Linux's VmHWM")
def test_identical_trials_one_after_another_read_about_the_same_training_memory(micro, private_tmp):
    """Each trial reused the pages the last one freed (still resident in the C heap): on a CPU only the first
    trial's training memory was its own, the others read 0.00 GiB (tiny's 16 × 128 tokens: 0.25, then 0.00)."""
    config = micro(model={"hidden_size": 128, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384,
                          "max_position_embeddings": 128},
                   data={"seq_len": 128}, train={"micro_batch": 16})
    own = []
    for repeat in range(3):
        trial = run_trial(config, Cell("off", "model", 1, 16), total_steps=2, repeat=repeat)
        assert trial.ok, trial.error
        own.append(trial.peak_mem_gib - trial.mem_before_gib)
    assert own[0] > 0.05, own  # activations of 16 × 128 tokens through 2 layers of width 128: tens of MB
    assert min(own[1:]) > 0.4 * own[0], own


def test_a_failing_trial_is_a_result_with_its_reason(micro, monkeypatch, private_tmp):
    from core import trainer

    def out_of_memory(self):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer.Trainer, "_optimizer_step", out_of_memory)
    result = run_trial(micro(), Cell("off", "model", 1, 4), total_steps=2)
    assert not result.ok and result.error.startswith("out of memory")
    assert result.tokens_per_s is None
    assert list(private_tmp.iterdir()) == []


def test_an_abort_during_a_cancelled_trial_stays_an_abort(micro, monkeypatch, private_tmp):
    """A second Ctrl-C (KeyboardInterrupt) in a trial whose tune was already stopping: the run's RunFailed went
    to the timing sink, which raised TrialCancelled in its place, and the tune ended as a cancel, exit code 0."""
    from core import trainer

    stopping = []

    def second_ctrl_c(self):
        stopping.append(True)  # the first Ctrl-C asked the tune to stop; the second comes in this step
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Trainer, "_optimizer_step", second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_trial(micro(), Cell("off", "model", 1, 4), total_steps=2, cancelled=lambda: bool(stopping))
    assert list(private_tmp.iterdir()) == []


def test_a_forced_exit_during_a_trial_removes_its_folder(micro, monkeypatch, private_tmp):
    """A SIGTERM Python discarded inside torch.compile ends the process by the watchdog's ``exit_now``, which skips
    the trial's own clean-up: a trial folder was left in TMPDIR."""
    from core import stopping, trainer

    during = []
    monkeypatch.setattr(trainer.Trainer, "_optimizer_step", lambda self: during.append(list(stopping._writing)))
    run_trial(micro(), Cell("off", "model", 1, 4), total_steps=1)
    (folder,) = during[0]
    assert folder.parent == private_tmp and folder.name.startswith("speedboard-trial-")
    assert folder not in stopping._writing and not folder.exists()


@pytest.mark.parametrize("when", ["made", "removing"])
def test_a_signal_as_the_trial_folder_is_made_or_removed_leaves_no_folder(micro, monkeypatch, private_tmp, when):
    """SIGTERM sent as the trial folder appeared (a busy CI machine): it landed in mkdtemp's own Python, after its
    mkdir, and the folder stayed. "removing": the signal, raised again after Python discarded it, cuts the
    removal short."""
    import shutil

    import core.trials
    from core.errors import JobTerminated

    if when == "made":
        real_mkdir = core.trials.os.mkdir

        def mkdir_then_signal(path, mode=0o777):
            real_mkdir(path, mode)
            raise JobTerminated("terminated (SIGTERM)")

        monkeypatch.setattr(core.trials.os, "mkdir", mkdir_then_signal)
    else:
        real_rmtree, calls = shutil.rmtree, []

        def rmtree_cut_short(path, ignore_errors=False):
            calls.append(path)
            if len(calls) == 1:
                raise JobTerminated("terminated (SIGTERM)")
            real_rmtree(path, ignore_errors=ignore_errors)

        monkeypatch.setattr(shutil, "rmtree", rmtree_cut_short)
    with pytest.raises(JobTerminated):
        run_trial(micro(), Cell("off", "model", 1, 4), total_steps=2)
    assert list(private_tmp.iterdir()) == []


def _trial(cell: str, repeat: int, rates: list[float]) -> TrialResult:
    tokens = 1000
    return TrialResult(cell=cell, runner="speedboard", repeat=repeat, tokens_per_s=statistics.median(rates),
                       tokens_per_step=tokens, timed_steps=len(rates), step_seconds=[tokens / r for r in rates],
                       losses=[1.0])


def test_comparison_says_whether_a_margin_is_above_the_noise():
    base = [_trial("a", 0, [100, 101, 99]), _trial("a", 1, [100, 102, 98])]
    faster = [_trial("b", 0, [120, 121, 119]), _trial("b", 1, [121, 119, 120])]
    cmp = compare(faster, base)
    assert cmp.ratio == pytest.approx(1.2, rel=0.02) and cmp.significant
    assert "20.0% faster" in cmp.describe() or "faster than" in cmp.describe()
    noisy = [_trial("c", 0, [60, 103, 150]), _trial("c", 1, [70, 104, 140])]
    cmp = compare(noisy, base)
    assert not cmp.significant and "no significant difference" in cmp.describe()
    # Repeats that disagree on the direction are not significant, however large the median margin.
    mixed = [_trial("d", 0, [130, 130, 130]), _trial("d", 1, [90, 90, 90]), _trial("d", 2, [130, 130, 130])]
    base3 = [*base, _trial("a", 2, [100, 100, 100])]
    assert not compare(mixed, base3).significant
    assert compare([], base) is None
    # Each trial counts by its median step: one slow first step in the baseline's trial does not inflate it.
    slow_start = [_trial("a", 0, [40, 100, 101, 99, 100]), _trial("a", 1, [100, 102, 98, 100, 101])]
    for t in slow_start:  # a trial's tokens/s is its window's: every timed token over the window's time
        t.tokens_per_s = len(t.step_seconds) * t.tokens_per_step / sum(t.step_seconds)
    assert slow_start[0].tokens_per_s < 80
    assert compare(faster, slow_start).ratio == pytest.approx(1.2, rel=0.02)


def test_plan_puts_the_current_settings_first_and_keeps_within_the_budget(micro):
    config = micro(train={"micro_batch": 4, "accum_steps": 2, "compile_mode": "off"})
    plan = plan_tune(config, TuneOptions(budget_seconds=3600))
    assert plan.cells[0].name == plan.current == "off-a2-fp32"
    # Largest micro-batch first, every precision, every mode; the same effective batch everywhere.
    assert plan.cells[1] == Cell("off", "model", 1, 8, "fp32")
    assert plan.cells[2] == Cell("off", "model", 1, 8, "bf16")  # every precision before the next mode
    assert {c.micro_batch * c.accum for c in plan.cells} == {8}
    assert {c.precision for c in plan.cells} == {"fp32", "bf16"}
    assert {c.mode for c in plan.cells} == {"off", "default", "max-autotune-no-cudagraphs"}
    assert "about" in plan.describe() and "cold torch.compile compiles dominate" in plan.describe()
    short = plan_tune(config, TuneOptions(budget_seconds=20))
    assert short.estimate_seconds <= 20 and len(short.cells) >= 2
    assert all(not c.compiled for c in short.cells)  # a cold compile does not fit in 20 s
    assert any(x["reason"].startswith("left out") for x in short.left_out)
    with pytest.raises(ConfigError, match="too short to compare two settings"):
        plan_tune(config, TuneOptions(budget_seconds=0.5))
    # One setting selected (--cells): its first trial must fit too; it ran 19 s on a budget of 1 s, then said
    # "a comparison needs two settings at least".
    with pytest.raises(ConfigError, match="too short to measure the one setting selected here: that takes"):
        plan_tune(config, TuneOptions(budget_seconds=0.5), cells=[plan.cells[0]])
    assert len(plan_tune(config, TuneOptions(budget_seconds=600), cells=[plan.cells[0]]).cells) == 1
    for bad in ({"budget_seconds": -1}, {"budget_seconds": float("nan")}, {"steps": 0}, {"repeats": 0},
                {"precisions": ("fp8",)}):
        with pytest.raises(ConfigError):
            TuneOptions(**bad)


def test_splits_are_fitted_as_auto_fits_them_at_the_runs_vocabulary(micro, monkeypatch):
    """A split is tried where --micro-batch auto would pick it (on a CPU in half the RAM), estimated with the
    vocabulary the trials' tokenizer has (the data's, not the model config's); the current split is measured
    as set."""
    from core.memory_budget import estimate_training_memory as real

    config = micro(data={"vocab_size": 300}, train={"micro_batch": 4, "accum_steps": 2, "compile_mode": "off"})
    assert config.model.vocab_size != 300
    seen = []

    def estimate(model, micro_batch, seq_len, precision="fp32", shards=1):
        seen.append(model.vocab_size)
        return real(model, micro_batch, seq_len, precision, shards)

    monkeypatch.setattr("core.memory_budget.estimate_training_memory", estimate)
    # Available RAM such that micro-batch 8 needs more than half of it, and 4 (current) and below less.
    eight = real(config.expected_model(), 8, config.data.seq_len).total
    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (int(eight * 1.5), "available RAM"))
    plan = plan_tune(config, TuneOptions(budget_seconds=3600))
    assert 300 in seen
    assert {c.micro_batch for c in plan.cells} == {4, 2, 1}
    (eight_left,) = [x for x in plan.left_out if x["cell"] == "micro-batch 8 × 1"]
    assert "does not fit in memory" in eight_left["reason"] and "half of the" in eight_left["reason"]


def test_a_setting_train_refuses_is_refused_before_anything_is_estimated(micro, monkeypatch):
    import core.device

    def never(*args, **kwargs):
        raise AssertionError("the estimate was started")

    monkeypatch.setattr(core.device, "measure_matmul_peak", never)
    with pytest.raises(ConfigError, match="fits with the same effective batch") as caught:
        plan_tune(micro(train={"micro_batch": 10**9}), TuneOptions(budget_seconds=20))
    assert caught.value.field == "micro_batch"


def test_a_report_path_that_cannot_be_written_stops_the_tune_before_any_trial(micro, tmp_path, monkeypatch):
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER[:2])
    fake = FakeTrials(monkeypatch, seconds=1.0)
    (tmp_path / "blocker").write_text("")
    events = []
    with pytest.raises(ConfigError, match="blocker is a file, not a folder"):
        run_tune(plan, events.append, report_path=tmp_path / "blocker" / "report.json")
    assert fake.ran == [] and events == []


def test_a_report_that_cannot_be_saved_at_the_end_keeps_the_results(micro, tmp_path, monkeypatch):
    import errno

    import core.tune

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER[:2])
    FakeTrials(monkeypatch, seconds=1.0)

    real = Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.parent == tmp_path:  # only the report's folder is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full)
    seen = []
    with pytest.raises(core.tune.ReportNotSaved, match="no space left on the device") as caught:
        run_tune(plan, seen.append, report_path=tmp_path / "report.json")
    report = caught.value.report
    # The finished report comes as every tune's does, without a path, before the error: a window shows it.
    assert isinstance(seen[-1], core.tune.TuneFinished) and seen[-1].path is None and seen[-1].report is report
    assert [t["cell"] for t in report["trials"]] == ["off-a1-fp32", "off-a2-fp32"] and report["path"] is None
    assert "recommendation:" in format_report(report)
    assert list(tmp_path.iterdir()) == []


def test_a_huge_repeat_count_is_lowered_to_what_the_budget_holds_at_once(micro):
    """The most repeats that keep two settings is found by bisection: counting down from 10³⁰ never ended."""
    config = micro(train={"micro_batch": 4, "accum_steps": 2, "compile_mode": "off"})
    plan = plan_tune(config, TuneOptions(budget_seconds=20, repeats=10**30), cells=EAGER)
    assert len(plan.cells) >= 2 and plan.estimate_seconds <= 20
    assert plan_tune(config, TuneOptions(budget_seconds=20, repeats=plan.repeats + 1), cells=EAGER).repeats \
        == plan.repeats  # one more does not fit with two settings
    assert len(plan_tune(config, TuneOptions(budget_seconds=20, repeats=plan.repeats), cells=EAGER).cells) >= 2


def test_the_mfu_of_trials_counts_the_vocabulary_they_train_with(micro, private_tmp):
    """A corpus that gives fewer tokens than the vocabulary asked for: the trials' model has the tokenizer's
    size, and their MFU counts that model, as a run's own MFU does (it counted the size asked for: 1.68× high)."""
    from dataclasses import replace

    from core.data import prepare_data
    from core.device import training_flops_per_token

    config = micro(data={"vocab_size": 20_000})
    vocab = prepare_data(config.data).tokenizer.vocab_size
    assert vocab < 20_000
    events = []
    report = run_tune(plan_tune(config, TuneOptions(budget_seconds=600, steps=1, repeats=1), cells=EAGER[:1]),
                      events.append)
    trained = training_flops_per_token(replace(config.model, vocab_size=vocab), config.data.seq_len)
    assert report["plan"]["flops_per_token"] == events[0].plan["flops_per_token"] == trained
    row = report["summary"]["rows"][EAGER[0].name]
    assert row["mfu"] == pytest.approx(row["tokens_per_s"]["median"] * trained / report["plan"]["peaks"]["fp32"])


def test_tune_interleaves_trials_and_recommends_with_a_report_that_round_trips(micro, private_tmp, tmp_path):
    events = []
    config = micro()
    plan = plan_tune(config, TuneOptions(budget_seconds=600, steps=2, repeats=2), cells=EAGER)
    report = run_tune(plan, events.append, report_path=tmp_path / "report.json")
    assert isinstance(events[0], TuneStarted) and isinstance(events[-1], TuneFinished)
    started = [e for e in events if isinstance(e, TrialStarted)]
    # A B C A B C: every repeat runs every cell once.
    assert [(e.cell, e.repeat) for e in started] == [(c.name, r) for r in range(2) for c in EAGER]
    assert len([e for e in events if isinstance(e, TrialFinished)]) == 6
    rows = report["summary"]["rows"]
    assert list(rows) == [c.name for c in EAGER]
    for row in rows.values():
        assert row["measured"] == 2 and row["tokens_per_s"]["n"] == 4 and row["loss_agrees"], row
        assert row["peak_mem_gib"] > 0
    assert rows["off-a1-fp32"]["current"] and rows["off-a2-fp32"]["vs_current"]["ratio"] > 0
    assert rows["off-a1-bf16"]["loss_tolerance"] == pytest.approx(3e-2)
    rec = report["recommendation"]
    assert rec["cell"] in rows and rec["text"] and "significant" in rec
    assert report_settings(report) == rec["settings"]
    assert not report["cancelled"] and list(private_tmp.iterdir()) == []
    # The report file reads back as it was written, and prints the same table.
    loaded = load_report(tmp_path / "report.json")
    assert loaded["summary"] == report["summary"] and loaded["path"] == str(tmp_path / "report.json")
    assert table_rows(loaded) == table_rows(report)
    assert "recommendation:" in format_report(loaded)
    # A setting not run says why (the report's reasons); while trials run it is still to come.
    name = "off-a2-fp32"
    row = {**report["summary"]["rows"][name], "trials": 0, "tokens_per_s": None, "vs_current": None}
    unrun = {**report, "summary": {**report["summary"], "rows": {**report["summary"]["rows"], name: row}},
             "skipped": [{"cell": name, "repeat": 0, "reason": "it would not fit in the time budget left"}]}
    position = list(report["summary"]["rows"]).index(name) + 1
    assert table_rows(unrun)[position][-1] == "not run: it would not fit in the time budget left"
    assert table_rows(unrun["summary"], running=True)[position][-1] == "to run"


def test_a_cancel_while_planning_ends_the_planning_at_its_next_measurement(micro, monkeypatch):
    """The plan's measurements (matmul peaks, timed passes: a minute on a busy machine) went on to their end
    after Cancel, and the trials' warm-up after them."""
    import core.device
    from core.errors import Cancelled

    asked = {"peaks": 0}
    real = core.device.measure_matmul_peak

    def measured(device, precision):
        asked["peaks"] += 1
        return real(device, precision)

    monkeypatch.setattr(core.device, "measure_matmul_peak", measured)
    with pytest.raises(Cancelled, match="while they were planned: nothing was measured"):
        plan_tune(micro(), TuneOptions(budget_seconds=600), cancelled=lambda: asked["peaks"] >= 1)
    assert asked["peaks"] == 1  # fp32's peak; bf16's was not measured after the cancel


def test_a_cancelled_tune_reports_what_it_measured(micro, private_tmp):
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=2), cells=EAGER)
    cancel = {"now": False}

    def sink(event):
        if isinstance(event, TrialStarted) and event.index == 2:
            cancel["now"] = True  # during the second trial, between two of its steps

    report = run_tune(plan, sink, cancelled=lambda: cancel["now"])
    assert report["cancelled"] and len(report["trials"]) == 1
    assert report["summary"]["rows"]["off-a1-fp32"]["measured"] == 1
    assert report["recommendation"]["is_current"]
    assert list(private_tmp.iterdir()) == []
    text = format_report(report)  # "not run: not run: the trials were cancelled first" was said twice
    unrun = [r for r in report["summary"]["rows"].values() if r["trials"] == 0]
    assert len(unrun) >= 1 and "not run: not run" not in text
    # the trial the cancel cut short is said as such, not as never started
    assert text.count("cut short: the trials were cancelled during its first trial") == 1
    assert text.count("not run: the trials were cancelled first") == len(unrun) - 1
    assert f"not tried: {len(unrun)} setting{'s' * (len(unrun) > 1)} (the trials were cancelled during its " \
           f"first trial" in text


def test_the_not_tried_line_counts_settings_once_and_repeats_apart():
    """1 setting never run (its two trials skipped) and 1 repeat of a measured one were "not tried: 2"."""
    report = {"plan": {"left_out": []}, "summary": {"rows": {}}, "recommendation": None, "elapsed_seconds": 1.0,
              "skipped": [{"cell": "a", "repeat": 0, "reason": "over budget"},
                          {"cell": "b", "repeat": 1, "reason": "over budget"}]}
    text = format_report(report)
    assert "not tried: 1 setting (over budget), 1 repeat (over budget)" in text
    # Settings left out before the trials have no row: the line names them ("not tried: 4" beside 2 rows).
    report["plan"]["left_out"] = [{"cell": "off-a1-fp32", "reason": "left out to stay within the time budget"}]
    assert ("not tried: 2 settings (left out to stay within the time budget; over budget; the one left out "
            "before the trials, not in the table: off-a1-fp32), 1 repeat (over budget)") in format_report(report)


def test_a_failing_cell_is_a_row_and_never_recommended(micro, monkeypatch, private_tmp):
    from core import trainer

    real = trainer.Trainer._optimizer_step

    def step(self):
        if self.cfg.train.precision == "bf16":
            raise RuntimeError("out of memory")
        return real(self)

    monkeypatch.setattr(trainer.Trainer, "_optimizer_step", step)
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER)
    report = run_tune(plan)
    rows = report["summary"]["rows"]
    assert rows["off-a1-bf16"]["error"].startswith("out of memory") and rows["off-a1-bf16"]["tokens_per_s"] is None
    assert rows["off-a1-fp32"]["measured"] == 1
    assert report["recommendation"]["cell"] != "off-a1-bf16"
    assert any(r[-1].startswith("failed: out of memory") for r in table_rows(report))


def test_a_disagreeing_loss_is_flagged_and_not_recommended(micro, private_tmp):
    from core.tune import summarise

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER[:2])
    results = [_trial("off-a1-fp32", 0, [100, 100]), _trial("off-a2-fp32", 0, [200, 200])]
    results[1].losses = [1.5]  # far beyond fp32's tolerance: this cell changed the math
    summary = summarise(plan, results)
    assert summary["rows"]["off-a2-fp32"]["loss_agrees"] is False
    assert summary["recommendation"]["cell"] == "off-a1-fp32"


def test_a_pick_within_the_noise_of_the_next_best_says_it_is_a_tie(micro, private_tmp):
    from core.tune import summarise

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=3, repeats=2), cells=EAGER)
    results = [_trial(name, r, [base * f for f in (0.99, 1.0, 1.01)]) for r in (0, 1)
               for name, base in (("off-a1-fp32", 100), ("off-a2-fp32", 200), ("off-a1-bf16", 203))]
    rec = summarise(plan, results)["recommendation"]
    assert rec["cell"] == "off-a1-bf16" and rec["significant"]  # far above the current settings' noise
    assert rec["runner_up"] == "off-a2-fp32" and rec["runner_up_tied"]
    assert "either will do" in rec["text"] and "no significant difference from it" in rec["text"]
    # The runner-up's own figure, 200 against 203: behind, signed so (the pick's lead read as its "+1.5%").
    assert "The next best, " in rec["text"] and "from it (-1.5%" in rec["text"], rec["text"]
    clear = [t for t in results if t.cell != "off-a2-fp32"] + [_trial("off-a2-fp32", r, [150, 150, 150])
                                                             for r in (0, 1)]
    rec = summarise(plan, clear)["recommendation"]
    assert not rec["runner_up_tied"] and "either will do" not in rec["text"]
    # One timed step per setting: no noise to be within, so no tie ("-21.4% … too few timed steps to judge
    # …: either will do" read as a verdict the figures cannot give).
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=1, repeats=1), cells=EAGER)
    single = [_trial("off-a1-fp32", 0, [100]), _trial("off-a2-fp32", 0, [160]), _trial("off-a1-bf16", 0, [203])]
    rec = summarise(plan, single)["recommendation"]
    assert rec["cell"] == "off-a1-bf16" and not rec["runner_up_tied"] and "either will do" not in rec["text"]
    assert rec["text"].endswith("The next best, compile off, fp32, 2 × 2, shows -21.2% against it, with too few "
                                "timed steps to judge (a spread needs two or more per setting)."), rec["text"]


def test_the_next_best_may_be_the_current_settings(micro, private_tmp):
    """The current settings ranked second and a slower setting was named "the next best" after the pick."""
    from core.tune import summarise

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=3, repeats=2), cells=EAGER)
    results = [_trial(name, r, [base * f for f in (0.99, 1.0, 1.01)]) for r in (0, 1)
               for name, base in (("off-a1-fp32", 150), ("off-a2-fp32", 100), ("off-a1-bf16", 200))]
    rec = summarise(plan, results)["recommendation"]
    assert rec["cell"] == "off-a1-bf16" and rec["runner_up"] == "off-a1-fp32" and not rec["runner_up_tied"]
    assert "next best" not in rec["text"] and "2 × 2" not in rec["text"], rec["text"]
    tied = [t for t in results if t.cell != "off-a1-fp32"] + [_trial("off-a1-fp32", r, [196, 198, 200])
                                                              for r in (0, 1)]
    rec = summarise(plan, tied)["recommendation"]
    assert rec["runner_up"] == "off-a1-fp32" and rec["runner_up_tied"]
    assert "no significant difference from the current settings" in rec["text"], rec["text"]


def test_the_pick_is_ranked_against_the_current_settings_repeat_by_repeat(micro, private_tmp):
    """A cell measured only in a quiet repeat must not outrank the current settings, measured in that quiet
    repeat and in a loaded one (pooled medians would say 80 > 75): the ratio is taken repeat by repeat."""
    from core.tune import summarise

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=3, repeats=2), cells=EAGER[:2])
    results = [_trial("off-a1-fp32", 0, [100, 100, 100]), _trial("off-a2-fp32", 0, [80, 80, 80]),
               _trial("off-a1-fp32", 1, [50, 50, 50])]  # the machine got busy; the other cell never ran again
    rec = summarise(plan, results)["recommendation"]
    assert rec["cell"] == "off-a1-fp32" and rec["is_current"], rec["text"]


def test_a_report_file_of_another_kind_is_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"schema": "speedboard-bench/1"}')
    with pytest.raises(ConfigError, match="not a Speedboard tuning report"):
        load_report(path)
    path.write_text("{")
    with pytest.raises(ConfigError, match="cannot read"):
        load_report(path)
    with pytest.raises(ConfigError, match=r"below-a-file.json: .*x.json is a file, not a folder$"):
        save_report({"schema": "x"}, tmp_path / "x.json" / "below-a-file.json")  # it said "File exists"
    if hasattr(os, "mkfifo"):  # opening it blocked the window until something wrote to the pipe
        os.mkfifo(tmp_path / "pipe.json")
        with pytest.raises(ConfigError, match="pipe.json: it is not a regular file"):
            load_report(tmp_path / "pipe.json")


@pytest.mark.slow
def test_one_compiled_trial_reports_its_compile_cost(micro, private_tmp):
    result = run_trial(micro(), Cell("default", "block", 1, 4), total_steps=4)
    assert result.ok, result.error
    assert result.timed_steps == 1
    assert (result.compiler_seconds or result.compile_seconds) > 0


def test_no_trial_starts_past_the_budget(micro, private_tmp):
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=2), cells=EAGER)
    plan.budget_seconds = 0.01  # the machine turned out far slower than estimated
    report = run_tune(plan)
    # Two settings are the least a comparison needs: both run, the rest does not, and the overrun is said.
    assert [t["cell"] for t in report["trials"]] == ["off-a1-fp32", "off-a2-fp32"] and not report["cancelled"]
    assert {(x["cell"], x["repeat"]) for x in report["skipped"]} == {("off-a1-fp32", 1), ("off-a2-fp32", 1),
                                                                      ("off-a1-bf16", 0)}
    text = format_report(report)
    assert "it would not fit in the time budget left" in text
    assert "over the budget of 0 s: a comparison needs two settings at least" in text
    assert report["second_setting_past_budget"]
    assert report["plan"]["planning_seconds"] > 0  # the matmul peaks, the timed passes: before the trials


def test_the_trial_count_leaves_out_the_trials_the_budget_dropped(micro, monkeypatch):
    """"Trial 3 of 6" was said where the budget had left the third setting out: three more trials ran, not four."""
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=2), cells=EAGER)
    FakeTrials(monkeypatch, seconds=1.0)
    for name, e in plan.estimates.items():  # the third setting's first trial cannot fit 10 s; the repeats can
        plan.estimates[name] = {**e, "first": 100.0 if name == EAGER[2].name else 1.0, "repeat": 1.0, "step": 0.005}
    plan.budget_seconds = 10
    events = []
    report = run_tune(plan, events.append)
    assert len(report["trials"]) == 4
    assert [(e.index, e.total) for e in events if isinstance(e, TrialStarted)] == [(1, 6), (2, 6), (3, 4), (4, 4)]


def test_the_time_taken_says_what_planning_took_beside_the_trials():
    """Planning (matmul peaks, auto's probe, timed passes) took seconds that "done in N s" did not count."""
    from core.tune import time_taken

    report = {"elapsed_seconds": 412.2, "plan": {"budget_seconds": 600, "planning_seconds": 9.4}}
    assert time_taken(report) == "done in 412 s, after 9 s of planning"
    assert time_taken({**report, "plan": {"budget_seconds": 600}}) == "done in 412 s"  # a report of before


class FakeTrials:
    """Trials that take ``seconds`` each on a clock of their own (no torch.compile, no time window)."""

    def __init__(self, monkeypatch, seconds: float, compile_seconds: float = 0.0) -> None:
        import core.tune

        self.now, self.seconds, self.compile_seconds, self.ran = 0.0, seconds, compile_seconds, []
        self.warm_ups = 0
        monkeypatch.setattr(core.tune.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(core.tune, "run_trial", self)
        monkeypatch.setattr(core.tune, "_warm_up", self.warm_up)

    def warm_up(self, plan, stop) -> None:
        self.warm_ups += 1

    def __call__(self, config, cell, total_steps, repeat, cancelled=None) -> TrialResult:
        self.ran.append((cell.name, repeat))
        self.now += self.seconds
        compiled = self.compile_seconds if cell.compiled and repeat == 0 else None
        return TrialResult(cell.name, "speedboard", repeat, tokens_per_s=1000.0, tokens_per_step=100, timed_steps=2,
                           losses=[5.0, 4.9], step_seconds=[0.01, 0.01], compile_seconds=compiled,
                           wall_seconds=self.seconds, peak_mem_gib=1.0, mem_before_gib=0.5)


def test_time_the_estimate_left_over_goes_to_the_settings_it_left_out(micro, monkeypatch):
    cells = [*EAGER, Cell("default", "model", 1, 4, "fp32"), Cell("default", "model", 1, 4, "bf16")]
    plan = plan_tune(micro(), TuneOptions(budget_seconds=45, steps=2, repeats=2), cells=cells)
    # Estimated: a cold compile of ~30 s each, so the compiled settings do not fit 45 s.
    assert [c.name for c in plan.spare] == ["default-model-a1-fp32", "default-model-a1-bf16"]
    assert "2 more settings follow if the trials run faster than estimated" in plan.describe()
    fake = FakeTrials(monkeypatch, seconds=1.0, compile_seconds=0.5)  # the cache was warm: a 0.5 s compile
    # More time than planned with (the machine turned out free): a spare setting starts only with a margin over
    # its estimate, so that the planned settings' repeats keep their time.
    report = run_tune(dataclasses.replace(plan, budget_seconds=75))
    # Every setting measured twice, interleaved: the planned ones first in each repeat, then the spare ones.
    names = [c.name for c in cells]
    assert fake.ran == [(n, r) for r in range(2) for n in names]
    assert list(report["summary"]["rows"]) == names and report["skipped"] == []
    assert not [x for x in report["plan"]["left_out"] if x["reason"].startswith("left out")]
    # The report keeps the estimate the user saw before the trials, and says what came on top.
    assert report["plan"]["description"].endswith("; 2 of them tried as time allowed")
    assert report["plan"]["estimate_seconds"] == plan.estimate_seconds


def test_a_spare_setting_whose_estimate_barely_fits_leaves_the_time_to_the_planned_repeats(micro, monkeypatch):
    """A 60 s tune planned 4 settings × 2 repeats, started a fifth setting on an estimate that turned out short,
    and ran no repeat at all."""
    cells = [*EAGER, Cell("default", "model", 1, 4, "fp32"), Cell("default", "model", 1, 4, "bf16")]
    plan = plan_tune(micro(), TuneOptions(budget_seconds=45, steps=2, repeats=2), cells=cells)
    fake = FakeTrials(monkeypatch, seconds=1.0, compile_seconds=0.5)
    report = run_tune(plan)
    assert fake.ran == [(c.name, r) for r in range(2) for c in EAGER]  # every planned repeat, no spare one
    assert report["skipped"] == []


def test_one_trial_each_is_said_of_a_significant_comparison():
    """Drift between trials shows only with repeats: a margin above the in-trial noise from one trial each
    says so."""
    once = compare([_trial("b", 0, [150, 151, 149])], [_trial("a", 0, [100, 101, 99])])
    assert once.significant and once.pairs == 1
    assert once.describe().endswith("above the noise (±1.0%), from one trial each (no repeat)")
    twice = compare([_trial("b", r, [150, 151, 149]) for r in (0, 1)], [_trial("a", r, [100, 101, 99]) for r in (0, 1)])
    assert twice.significant and twice.pairs == 2 and "one trial" not in twice.describe()


def test_spare_settings_start_only_while_they_and_every_repeat_fit(micro, monkeypatch):
    cells = [*EAGER, Cell("default", "model", 1, 4, "fp32")]
    plan = plan_tune(micro(), TuneOptions(budget_seconds=45, steps=2, repeats=2), cells=cells)
    assert [c.name for c in plan.spare] == ["default-model-a1-fp32"]
    fake = FakeTrials(monkeypatch, seconds=6.0)  # slower than estimated: no room for the spare one
    report = run_tune(plan)
    assert fake.ran == [(c.name, r) for r in range(2) for c in EAGER]
    assert "default-model-a1-fp32" not in report["summary"]["rows"]
    assert [x["cell"] for x in report["plan"]["left_out"]] == ["default-model-a1-fp32"]
    assert report["skipped"] == []  # it was never planned: listed as left out, not as skipped
    assert report["plan"]["spare"] == []
    assert report["plan"]["description"].endswith("1 more setting follows if the trials run faster than "
                                                  "estimated; none of them could be tried within the budget")


DAMAGE = {
    "plan_without_description": lambda r: r["plan"].pop("description"),
    "rows_a_list": lambda r: r["summary"].update(rows=list(r["summary"]["rows"].values())),
    "summary_without_rows": lambda r: r["summary"].pop("rows"),
    "elapsed_missing": lambda r: r.pop("elapsed_seconds"),
    "budget_as_text": lambda r: r["plan"].update(budget_seconds="600"),
    "tokens_per_s_as_text": lambda r: next(iter(r["summary"]["rows"].values())).update(
        tokens_per_s={"median": "fast", "low": 1, "high": 2, "n": 1}),
    # Impossible rates were shown as if measured ("nan (nan–nan)", "-5,000,000,000").
    "tokens_per_s_nan": lambda r: next(iter(r["summary"]["rows"].values())).update(
        tokens_per_s={"median": float("nan"), "low": 1, "high": 2, "n": 2}),
    "tokens_per_s_infinite": lambda r: next(iter(r["summary"]["rows"].values())).update(
        tokens_per_s={"median": 5, "low": 1, "high": float("inf"), "n": 2}),
    "tokens_per_s_negative": lambda r: next(iter(r["summary"]["rows"].values())).update(
        tokens_per_s={"median": -5e9, "low": -1e10, "high": -1, "n": 2}),
    "recommendation_without_settings": lambda r: r["recommendation"].pop("settings"),
    "recommended_precision_unknown": lambda r: r["recommendation"]["settings"].update(precision="fp8"),
    # Opened with an empty table, its pick and "(2 trials)" shown beside it.
    "rows_removed": lambda r: r["summary"].update(rows={}),
    "recommended_row_unmeasured": lambda r: r["summary"]["rows"][r["recommendation"]["cell"]].update(
        tokens_per_s=None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_report_is_one_line_not_an_error_where_it_is_shown(damage, micro, tmp_path, monkeypatch):
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER[:2])
    FakeTrials(monkeypatch, seconds=1.0)  # its clock is the process's: after the plan has measured
    report = run_tune(plan)
    path = tmp_path / "report.json"
    save_report(report, path)
    assert load_report(path)["recommendation"] == report["recommendation"]  # whole, it reads
    broken = load_report(path)
    DAMAGE[damage](broken)
    path.write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match="is not a complete tuning report"):
        load_report(path)


def test_one_timed_step_per_setting_leaves_the_noise_unknown_and_nothing_significant():
    """One step shows no spread, which is not the same as none: "37% faster: above the noise (±0.0%)" was
    said of single steps."""
    base, faster = [_trial("a", 0, [100])], [_trial("b", 0, [137])]
    cmp = compare(faster, base)
    assert cmp.noise is None and not cmp.significant
    assert cmp.describe() == ("+37.0% against the current settings, with too few timed steps to judge (a spread "
                              "needs two or more per setting)")
    assert cmp.to_dict()["noise"] is None
    # Two repeats give each setting two timed steps: the noise is known again.
    two = compare([*faster, _trial("b", 1, [139])], [*base, _trial("a", 1, [101])])
    assert two.noise is not None and two.significant


def test_a_tune_of_single_steps_recommends_nothing_as_significant(micro, monkeypatch):
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=1, repeats=1), cells=EAGER[:2])
    fake = FakeTrials(monkeypatch, seconds=1.0)
    real = fake.__call__

    def one_step(config, cell, total_steps, repeat, cancelled=None):
        result = real(config, cell, total_steps, repeat, cancelled)
        result.step_seconds = [0.01] if cell.name == "off-a1-fp32" else [0.0073]  # 37% faster
        return result

    monkeypatch.setattr("core.tune.run_trial", one_step)
    report = run_tune(plan)
    rec = report["recommendation"]
    assert rec["cell"] == "off-a2-fp32" and rec["significant"] is False
    assert "too few timed steps to judge" in rec["text"] and "above the noise" not in rec["text"]
    assert rec["text"].startswith("Fastest measured: ") and "but" not in rec["text"]  # was "…, but +37%, but too few"
    row = table_rows(report)[2]
    assert row[2] == "1.37× (too few steps)"


def test_a_huge_repeat_count_with_one_setting_is_lowered_to_the_budget(micro):
    """With one setting the bisection that fits the repeats to the budget did not run: 2⁶³ - 1 repeats were
    planned ("about 10¹⁹ seconds") and listed trial by trial."""
    plan = plan_tune(micro(), TuneOptions(budget_seconds=5, repeats=2**63 - 1, precisions=("fp32",),
                                          patterns="off-a1-*"))
    assert [c.name for c in plan.cells] == ["off-a1-fp32"]
    assert 1 <= plan.repeats <= 5 / 1.5 and plan.estimate_seconds <= 5


def test_a_run_of_many_repeats_walks_them_without_listing_every_trial(micro, monkeypatch):
    """Trials are taken repeat by repeat, not from a list of them all; once a whole repeat fits no trial, the
    tune ends there instead of skipping the rest one by one."""
    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER)
    plan.repeats, plan.budget_seconds = 10**6, 10.0
    fake = FakeTrials(monkeypatch, seconds=1.0)
    asked = []
    report = run_tune(plan, cancelled=lambda: asked.append(1) and False)
    assert 2 <= len(fake.ran) <= 10 and not report["cancelled"]
    assert len(asked) < 100 and len(report["skipped"]) <= len(EAGER)


def test_the_estimate_times_a_small_models_passes(micro, monkeypatch):
    """A small model spends most of a step outside its matmuls: its passes are timed, not assumed at half the
    matmul peak (tiny's estimate came out 3-5× short), and a "too short" refusal names a budget that holds."""
    import core.tune

    seen = []
    # The first timing in a burst of another process' work (a bf16 pass timed 4-50× dearer than its trials' steps
    # turned out, and a command was refused as over its budget once and ran within it the next time): each
    # precision is timed again after the others, and the cheaper timing counts.
    burst = {"fp32": (5.0, 2.5), "bf16": (0.5, 0.25)}

    def passes(model, seq_len, device, precision, samples):
        seen.append((precision, samples))
        return burst.pop(precision, (0.5, 0.25))  # seconds per pass, per sample

    monkeypatch.setattr(core.tune, "time_passes", passes)
    plan = plan_tune(micro(), TuneOptions(budget_seconds=3600, steps=2, repeats=1), cells=EAGER[:2])
    assert seen == [("fp32", 4), ("fp32", 4)]  # up to the largest micro-batch of the cells
    seen.clear()
    plan_tune(micro(), TuneOptions(budget_seconds=3600, steps=2, repeats=1), cells=EAGER)
    assert seen == [("bf16", 4), ("fp32", 4)] * 2  # the precisions in turn
    for cell in plan.cells:
        step = cell.accum * (0.5 + cell.micro_batch * 0.25)
        assert plan.estimates[cell.name]["step"] == pytest.approx(step)
        assert plan.estimates[cell.name]["first"] == pytest.approx(core.tune.TRIAL_SETUP_S + plan.total_steps * step)
    with pytest.raises(ConfigError, match=r"give --budget-seconds (\d+) or more") as caught:
        plan_tune(micro(), TuneOptions(budget_seconds=1, steps=2, repeats=1), cells=EAGER[:2])
    enough = int(caught.value.args[0].split("--budget-seconds ")[1].split()[0])
    assert enough >= plan.estimate_seconds
    assert len(plan_tune(micro(), TuneOptions(budget_seconds=enough, steps=2, repeats=1), cells=EAGER[:2]).cells) == 2


def test_timing_a_models_passes_gives_two_positive_figures(micro):
    import math

    from core.tune import time_passes

    fixed, per_sample = time_passes(micro().model, 16, torch.device("cpu"), "fp32", 4)
    assert fixed >= 0 and per_sample > 0 and math.isfinite(fixed + per_sample)


def test_a_trial_near_the_peak_measures_it_again_and_mfu_stays_at_most_100_percent(micro, monkeypatch):
    """A peak cached while the machine was busy reads low: a trial near it (MFU 99.9-100% was shown) has it
    measured again, once per precision, and the figure kept is the higher one; MFU never shows above 100%."""
    import core.precision

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=2), cells=EAGER[:2])
    plan.peaks = {"fp32": 1e3}  # far below what the trials reach
    FakeTrials(monkeypatch, seconds=1.0)
    calls = []

    def remeasure(device, precision, refresh=False, measure=None):
        calls.append((str(device), precision, refresh))
        return 2e3

    monkeypatch.setattr(core.precision, "matmul_peak", remeasure)
    report = run_tune(plan)
    assert calls == [("cpu", "fp32", True)]  # once, in full
    assert report["plan"]["peaks"]["fp32"] == 2e3
    assert all(row["mfu"] == 1.0 for row in report["summary"]["rows"].values())
    assert all(cell[3] == "100%" for cell in table_rows(report)[1:])


def test_a_warm_up_trial_runs_before_the_first_measured_one_and_is_not_counted(micro, monkeypatch):
    """The process's first training paid one-time costs in its timed steps: the current settings, measured
    first, read several times slower than their repeats and every other setting as that much faster."""
    import core.tune

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=1), cells=EAGER[:2])
    calls = []
    real = core.tune.run_trial

    def recorded(config, cell, total_steps, repeat=0, cancelled=None):
        calls.append((cell, total_steps, repeat))
        return real(config, cell, total_steps, repeat, cancelled=cancelled)

    monkeypatch.setattr(core.tune, "run_trial", recorded)
    report = run_tune(plan)
    warm, *measured = calls
    assert warm == (Cell("off", "model", 1, EAGER[0].micro_batch, EAGER[0].precision), core.tune.WARM_UP_STEPS, 0)
    assert [c.name for c, _, _ in measured] == [c.name for c in EAGER[:2]]
    assert len(report["trials"]) == 2


def test_the_table_shows_each_settings_own_memory_not_the_process_peak():
    """On a CPU every row read 0.53 GiB, micro-batch 1 to 4, fp32 and bf16: the process' peak, Python and torch."""
    from core.tune import TABLE_HEADER

    row = {"label": "off", "tokens_per_s": None, "vs_current": None, "current": True, "mode": "off", "trials": 1,
           "error": None, "mfu": None, "peak_mem_gib": 0.53, "train_mem_gib": 0.04, "loss": 1.0}
    header, shown = table_rows({"summary": {"rows": {"off": row}}})
    assert shown[header.index("train mem (GiB)")] == "0.04"
    shown = table_rows({"summary": {"rows": {"off": {**row, "train_mem_gib": None}}}})[1]
    assert shown[TABLE_HEADER.index("train mem (GiB)")] == "0.53"  # where the own figure is not known


def test_an_overrun_budget_says_by_how_much_and_why():
    """It said "a comparison needs two settings at least" wherever two settings had run, also where a repeat
    that took longer than its estimate had overrun the budget, and never by how much."""
    from core.tune import time_taken

    def report(forced):
        return {"elapsed_seconds": 19.0, "cancelled": False, "plan": {"budget_seconds": 1.0},
                "trials": [{"cell": "a"}, {"cell": "b"}], "second_setting_past_budget": forced}

    assert time_taken(report(True)).endswith(
        "18 s over the budget of 1 s: a comparison needs two settings at least")
    assert time_taken(report(False)).endswith("18 s over the budget of 1 s: trials took longer than estimated")


def test_a_default_report_name_taken_in_the_same_second_is_kept_and_the_next_free_one_used(tmp_path):
    """Two tunes started in the same second both said "report: …/20261207-060947-tiny.json"; the later
    replaced the earlier's report without a word. A --json FILE given is replaced, as asked."""
    from core.tune import save_report

    target = tmp_path / "20261207-060947-tiny.json"
    target.write_text('{"earlier": true}\n')
    second = save_report({"trials": [2]}, target, keep_existing=True)
    third = save_report({"trials": [3]}, target, keep_existing=True)
    assert (second.name, third.name) == ("20261207-060947-tiny-2.json", "20261207-060947-tiny-3.json")
    assert json.loads(target.read_text()) == {"earlier": True}
    assert json.loads(second.read_text()) == {"trials": [2], "path": str(second)}
    assert json.loads(third.read_text())["path"] == str(third)
    assert save_report({"trials": [4]}, target) == target and json.loads(target.read_text()) == {"trials": [4]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, second.name, third.name])


@pytest.mark.skipif(os.name == "nt", reason="POSIX symbolic links")
def test_a_report_of_the_longest_name_the_file_system_takes_is_written(tmp_path):
    """Its temporary file took the name whole with ".tmp-PID" added: past 255 bytes, and the tune was refused
    before any trial with "no file can be created in" its folder (File name too long)."""
    path = tmp_path / f"{'x' * 250}.json"
    check_report_path(path)
    assert save_report({"format": "speedboard-tune"}, path) == path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_report_named_by_a_symbolic_link_is_written_where_the_link_points(tmp_path):
    """--json latest.json, a link to reports/real.json: the link was replaced by a file of its own and the file
    it named kept the old report, where `>` and every editor write through it. A dangling link makes its file."""
    from core.tune import check_report_path, save_report

    (tmp_path / "reports").mkdir()
    real = tmp_path / "reports" / "real.json"
    real.write_text('{"old": true}\n')
    link = tmp_path / "latest.json"
    link.symlink_to(Path("reports") / "real.json")
    assert check_report_path(link) == real
    assert save_report({"trials": [1]}, link) == real
    assert link.is_symlink() and json.loads(real.read_text()) == {"trials": [1]}
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["real.json"]  # no temporary file left

    dangling = tmp_path / "next.json"
    dangling.symlink_to(Path("reports") / "new.json")
    assert save_report({"trials": [2]}, check_report_path(dangling)) == tmp_path / "reports" / "new.json"
    assert dangling.is_symlink() and json.loads(dangling.read_text()) == {"trials": [2]}


def test_a_pick_made_on_a_busy_machine_says_so(micro, monkeypatch):
    """Trials beside other work (load average 4.9 on 2 cores) were recommended as "above the noise" with no word
    of the load the report recorded."""
    import core.device
    from core.tune import build_report

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=3, repeats=2), cells=EAGER)
    results = [_trial(name, r, [base * f for f in (0.99, 1.0, 1.01)]) for r in (0, 1)
               for name, base in (("off-a1-fp32", 100), ("off-a2-fp32", 200), ("off-a1-bf16", 203))]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(core.device, "load_average", lambda: (4.9, 4.0, 3.0))
    busy = build_report(plan, results, 60.0, False)
    assert busy["recommendation"]["text"].endswith(
        "The machine was busy during the trials (load average 4.9 on 2 cores): other work ran beside them, so "
        "these margins may not hold; tune again on a quiet machine to be sure.")
    assert busy["load_average"] == [4.9, 4.0, 3.0]
    monkeypatch.setattr(core.device, "load_average", lambda: (2.2, 2.0, 1.0))  # the trials' own two threads
    assert "busy" not in build_report(plan, results, 60.0, False)["recommendation"]["text"]


def test_the_time_left_counts_the_later_repeats_of_every_setting_from_the_first_trial(micro, monkeypatch):
    """During the first repeat the later repeats counted only the settings started so far: after the first of 9
    trials of 1 s the tune said about 0.3 min left where 8 s were, and the figure rose from trial to trial."""
    from core.tune import TrialFinished

    plan = plan_tune(micro(), TuneOptions(budget_seconds=600, steps=2, repeats=3), cells=EAGER)
    FakeTrials(monkeypatch, seconds=1.0)
    left = []
    run_tune(plan, sink=lambda e: left.append(e.eta_seconds) if isinstance(e, TrialFinished) else None)
    assert len(left) == 9
    assert left == sorted(left, reverse=True) and left[0] >= 7.0 and left[-1] == 0.0
    assert left[3:] == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]  # once every setting is measured: its own time each


@pytest.mark.parametrize("steps, advice", [
    (2, "give fewer --trial-steps (the budget is at most a week)"),
    (1, "a trial of one step takes longer than the longest budget, a week: give a smaller effective batch "
        "(--micro-batch × --accum) or a smaller model"),
])
def test_a_budget_no_week_holds_gives_advice_that_can_be_taken(micro, monkeypatch, steps, advice):
    """At one trial step already, "give fewer --trial-steps" was the advice, with the budget at its largest."""
    import core.tune

    monkeypatch.setattr(core.tune, "time_passes", lambda *args: (1e5, 1e5))  # a step of days
    with pytest.raises(ConfigError) as caught:
        plan_tune(micro(), TuneOptions(budget_seconds=604_800, steps=steps, repeats=1), cells=EAGER[:2])
    assert str(caught.value).endswith(advice)


def test_the_passes_an_estimate_times_stay_a_fraction_of_a_second(micro, monkeypatch):
    """The samples of the larger pass came from the matmul peak, which a small model misses by far: at a
    micro-batch of 4,096 each pass took 10 s, and the plan 3.5 minutes before its one-line refusal."""
    import core.precision
    from core.tune import PASS_SECONDS, time_passes

    sizes = []

    def fake_pass(net, x, device, autocast):  # 5 ms a pass and 10 ms a sample, on no clock
        sizes.append(x.shape[0])
        return lambda: 0.005 + 0.01 * x.shape[0]

    monkeypatch.setattr(core.precision, "timed_pass", fake_pass)
    fixed, per_sample = time_passes(micro().model, 32, torch.device("cpu"), "fp32", samples=4096)
    # Doubled until a pass takes PASS_SECONDS (and twice a pass of one): 32 samples, 0.325 s.
    assert sizes == [1, 2, 4, 8, 16, 32, 32] and 0.005 + 0.01 * 16 < PASS_SECONDS <= 0.005 + 0.01 * 32
    assert fixed == pytest.approx(0.005) and per_sample == pytest.approx(0.01)
    sizes.clear()
    time_passes(micro().model, 32, torch.device("cpu"), "fp32", samples=12)  # at most those asked for
    assert sizes == [1, 2, 4, 8, 12]


def test_a_settings_own_memory_is_never_below_zero():
    """A tiny model on a CPU showed "-0.00" GiB: what the process freed between the reading before a trial and
    the trial's own peak (an earlier trial's leftovers) made the difference negative."""
    from types import SimpleNamespace

    from core.tune import _cell_row

    plan = SimpleNamespace(current="off-model-a1-fp32", peaks={}, flops_per_token=1.0)
    cell = Cell("off", "model", 1, 4, "fp32")
    trials = [TrialResult(cell.name, "speedboard", r, tokens_per_s=1000.0, tokens_per_step=100, timed_steps=2,
                          losses=[5.0, 4.9], step_seconds=[0.1, 0.1], peak_mem_gib=0.50, mem_before_gib=before)
              for r, before in enumerate((0.501, 0.503, 0.49))]
    row = _cell_row(plan, cell, trials)
    assert row["train_mem_gib"] == 0.0  # the median of 0, 0 and 0.01
    header, shown = table_rows({"summary": {"rows": {"off": {**row, "label": "off", "vs_current": None,
                                                               "loss": 4.9}}}})
    assert shown[header.index("train mem (GiB)")] == "0.00"
