"""The trainer: events, run folder, control from another thread, budgets, fallbacks."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from core import compile as compile_mod
from core.config import TrainConfig
from core.control import Control
from core.errors import ConfigError, NotFinite
from core.events import (
    CheckpointSaved,
    CompileFinished,
    DataPreparationProgress,
    DataPreparationStarted,
    DataPrepared,
    ListSink,
    RunFailed,
    RunFinished,
    RunStarted,
    SampleGenerated,
    StepMetrics,
    ValidationDone,
    WarningRaised,
)
from core.runs import read_events
from core.trainer import Trainer, train


def test_run_emits_events_in_order_and_writes_its_folder(micro):
    sink = ListSink()
    result = train(micro(train={"budget": 6, "eval_every": 3, "sample_every": 3}), sink=sink)
    # The corpus comes first (from its token store, or prepared into it): set-up, before the run exists.
    data_events = (DataPreparationStarted, DataPreparationProgress, DataPrepared)
    assert isinstance(sink.events[0], data_events) and sink.of(DataPrepared)
    run_events = [e for e in sink.events if not isinstance(e, data_events)]
    assert sink.events.index(sink.of(DataPrepared)[-1]) < sink.events.index(run_events[0])
    kinds = [type(e) for e in run_events]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    steps = sink.of(StepMetrics)
    assert [s.step for s in steps] == list(range(1, 7))  # one metrics event per optimizer step
    assert steps[0].warmup and not any(s.warmup for s in steps[1:])
    assert [v.step for v in sink.of(ValidationDone)] == [3, 6]
    assert [s.step for s in sink.of(SampleGenerated)] == [3, 6]  # the last step's sample once, not twice
    assert sink.of(CheckpointSaved)
    assert all(s.tokens == s.step * 4 * 32 for s in steps)
    run_dir = result.run_dir
    assert {p.name for p in run_dir.iterdir()} >= {"config.json", "metrics.jsonl", "tokenizer.json", "checkpoints"}
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["config"]["train"]["micro_batch"] == 4 and cfg["versions"]["torch"] == torch.__version__
    assert cfg["device"] == "cpu"
    # The folder replays to exactly the events the sink saw.
    assert [e.to_dict() for e in read_events(run_dir)] == [e.to_dict() for e in run_events]
    finished = sink.of(RunFinished)[0]
    assert finished.median_tokens_per_s > 0 and finished.compile_seconds is None and not finished.stopped


def test_loss_falls(micro):
    sink = ListSink()
    train(micro(train={"budget": 40, "lr": 1e-2}), sink=sink)
    losses = [s.loss for s in sink.of(StepMetrics)]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


@pytest.mark.parametrize("kind, budget, expected_steps", [("steps", 3, 3), ("tokens", 128 * 5, 5), ("epochs", 1, None)])
def test_budget_kinds(micro, tmp_path, kind, budget, expected_steps):
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n\n".join(f"paragraph {i} " + "words and more words " * (i % 5 + 1) for i in range(60)))
    sink = ListSink()
    trainer = Trainer(micro(data={"source": str(corpus), "vocab_size": 300},
                            train={"budget_kind": kind, "budget": budget}), sink=sink)
    trainer.run()
    steps = sink.of(StepMetrics)
    if expected_steps is None:  # one pass over the training samples
        expected_steps = -(-len(trainer.data.train) // 4)
    assert len(steps) == expected_steps


class WatchedControl(Control):
    """A Control that says when the trainer really waits in a pause (an event, not a guess about timing)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait_while_paused(self, timeout=None):
        self.waiting.set()
        return super().wait_while_paused(timeout)


def test_stop_pause_and_resume_from_another_thread(micro):
    control = WatchedControl()
    sink = ListSink()
    outcome = {}

    def sink_with_hook(event):
        sink(event)
        if isinstance(event, StepMetrics) and event.step == 2:
            control.pause()  # from the trainer's own thread: no step can start before it takes hold

    def driver():
        assert control.waiting.wait(60), "the trainer never paused"
        outcome["steps_while_paused"] = len(sink.of(StepMetrics))
        control.resume()
        control.stop()

    t = threading.Thread(target=driver)
    t.start()
    result = train(micro(train={"budget": 10_000}), control=control, sink=sink_with_hook)
    t.join()
    assert outcome["steps_while_paused"] == 2  # paused between steps 2 and 3
    assert result.stopped and result.step == 2  # the stop that came with the resume ended it before step 3
    finished = sink.of(RunFinished)[0]
    assert finished.stopped and finished.checkpoint  # save-on-stop


def test_failure_becomes_a_failed_event(micro, monkeypatch):
    sink = ListSink()

    def explode(self):
        raise RuntimeError("boom in the step")

    monkeypatch.setattr(Trainer, "_optimizer_step", explode)
    ending_when = {}

    def record(event):  # whether a signal arriving now would find the outcome decided (core.stopping)
        ending_when.setdefault(type(event), trainer.ending)
        sink(event)

    trainer = Trainer(micro(), sink=record)
    with pytest.raises(RuntimeError):
        trainer.run()
    failed = sink.of(RunFailed)
    assert failed and "boom in the step" in failed[0].message
    assert ending_when[RunStarted] is False and ending_when[RunFailed] is True and trainer.ending


def test_compile_unavailable_falls_back_with_a_warning(micro, monkeypatch):
    monkeypatch.setattr("core.trainer.compile_unavailable_reason", lambda device: "no C++ compiler found")
    sink = ListSink()
    result = train(micro(train={"compile_mode": "default"}), sink=sink)
    warnings = [w.message for w in sink.of(WarningRaised)]
    assert any("no C++ compiler found" in w and "eager" in w for w in warnings)
    assert result.step == 4


def test_compile_error_at_first_step_falls_back(micro, monkeypatch):
    real = compile_mod.compile_model

    def broken(model, mode, scope):
        compiled = real(model, "off", scope)
        if mode == "off":
            return compiled

        def fail(*args, **kwargs):
            raise RuntimeError("Inductor: C++ compile error")

        compiled.mode = mode
        compiled.module = fail
        return compiled

    monkeypatch.setattr("core.trainer.compile_model", broken)
    sink = ListSink()
    result = train(micro(train={"compile_mode": "default"}), sink=sink)
    assert result.step == 4
    assert any("C++ compile error" in w.message for w in sink.of(WarningRaised))
    assert sink.of(CompileFinished)[0].fallback


def test_cuda_graph_modes_refuse_accumulation():
    with pytest.raises(ConfigError, match="max-autotune-no-cudagraphs"):
        TrainConfig(compile_mode="reduce-overhead", accum_steps=4)
    TrainConfig(compile_mode="reduce-overhead", accum_steps=1)
    TrainConfig(compile_mode="max-autotune-no-cudagraphs", accum_steps=4)


def test_a_budget_in_steps_or_tokens_is_whole_and_one_in_epochs_need_not_be():
    for kind in ("steps", "tokens"):
        with pytest.raises(ConfigError, match=f"a budget in {kind} must be a whole number, got 1000.5"):
            TrainConfig(budget_kind=kind, budget=1000.5)
        TrainConfig(budget_kind=kind, budget=1000.0)
    TrainConfig(budget_kind="epochs", budget=0.5)


@pytest.mark.parametrize("tokens", [0, 10_001, 10**9])
def test_a_sample_is_bounded_as_it_runs_deaf_to_stop(tokens):
    """A sample runs between two optimizer steps: 10**9 tokens held a run past every Stop."""
    with pytest.raises(ConfigError, match=f"sample tokens must be between 1 and 10,000 .*got {tokens}"):
        TrainConfig(sample_tokens=tokens)
    TrainConfig(sample_tokens=10_000)


def test_nan_loss_fails_clearly(micro):
    sink = ListSink()
    with pytest.raises(NotFinite, match="became (nan|inf).*lower the learning rate"):
        train(micro(train={"lr": 1e6, "min_lr": 1e5, "grad_clip": 0.0, "budget": 50}), sink=sink)
    assert sink.of(RunFailed)


@pytest.mark.parametrize("precision, advice", [("fp32", "lower the learning rate"),
                                               ("fp16", "lower the learning rate or use fp32/bf16")])
def test_a_loss_that_is_not_finite_is_given_advice_that_fits_the_precision(micro, monkeypatch, precision, advice):
    """"or use fp32/bf16" was said to fp32 runs too: only fp16's range is a cause a precision can remove."""
    from core.trainer import Trainer

    real = Trainer._optimizer_step_with_fallback

    def nan_loss(self, first):
        loss, grad_norm, lr = real(self, first=first)
        return float("nan"), grad_norm, lr

    monkeypatch.setattr(Trainer, "_optimizer_step_with_fallback", nan_loss)
    with pytest.raises(NotFinite) as err:
        train(micro(train={"precision": precision, "budget": 3}))
    assert str(err.value) == f"loss became nan at step 1; {advice}"


@pytest.mark.parametrize("train_settings", [{"lr": 1e30, "min_lr": 0.0}, {"weight_decay": 1e30}])
def test_a_diverging_run_fails_at_the_step_that_broke_its_weights(micro, train_settings):
    """A finite loss with a NaN gradient norm: the update just made the weights NaN. The run ends there, one
    line, instead of evaluating and sampling from NaN weights (the sampler's RuntimeError, a traceback)."""
    sink = ListSink()
    with pytest.raises(NotFinite, match="gradient norm became nan at step 2"):
        train(micro(train={**train_settings, "budget": 6, "sample_every": 1, "eval_every": 1}), sink=sink)
    assert "gradient norm became nan" in sink.of(RunFailed)[0].message
    assert not sink.of(SampleGenerated)[1:]  # nothing sampled from the broken weights


def test_an_update_that_breaks_the_weights_on_the_last_step_is_not_recorded_as_a_validation_of_nan(micro):
    """Weight decay 1e23 scales the weights past what fp32 holds while step 2's own loss and gradient are finite:
    the final validation read nan, was printed and written, and only then did the run fail."""
    from core.events import ValidationDone

    sink = ListSink()
    with pytest.raises(NotFinite, match="validation loss became nan at step 2: the last update made the weights "
                                        "diverge; lower the learning rate or the weight decay"):
        train(micro(train={"weight_decay": 1e23, "budget": 2, "eval_every": 0}), sink=sink)
    assert not sink.of(ValidationDone) and sink.of(RunFailed)


@pytest.mark.slow
def test_mode_switches_do_not_grow_memory(micro):
    """Ten runs alternating eager and compiled in one process: RSS settles."""
    import psutil

    rss = []
    for i in range(10):
        mode = "default" if i % 2 else "off"
        result = train(micro(train={"compile_mode": mode, "budget": 2, "eval_batches": 1}))
        assert result.step == 2
        rss.append(psutil.Process().memory_info().rss / 2**20)
    growth = rss[-1] - rss[3]
    assert growth < 60, rss  # MiB, over six switches after the first warm-up


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(micro, precision):
    sink = ListSink()
    result = train(micro(train={"precision": precision, "budget": 3}), sink=sink)
    assert result.step == 3 and all(torch.isfinite(torch.tensor(s.loss)) for s in sink.of(StepMetrics))
    assert sink.of(RunStarted)[0].precision == precision


def test_same_seed_same_run_and_schedule_follows_tokens(micro):
    """Two runs with one seed are identical; with 4× the batch, the LR at equal tokens is equal."""
    tokens = 4 * 32 * 8  # eight steps of micro-batch 4, two steps of micro-batch 4 × accumulation 4
    runs = []
    for accum in (1, 1, 4):
        sink = ListSink()
        train(micro(train={"budget_kind": "tokens", "budget": tokens, "accum_steps": accum, "warmup_ratio": 0.25}),
              sink=sink)
        runs.append({s.tokens: (s.loss, s.lr) for s in sink.of(StepMetrics)})
    assert runs[0] == runs[1]
    assert len(runs[0]) == 8 and len(runs[2]) == 2
    for t, (_, lr) in runs[2].items():
        assert lr == pytest.approx(runs[0][t][1])


def test_a_sink_that_raises_never_ends_the_run(micro):
    """A consumer's failure (a closed pipe, a bug) is recorded once in the run folder; training goes on."""
    calls = []

    def broken(event):
        calls.append(event)
        if isinstance(event, StepMetrics):
            raise BrokenPipeError(32, "Broken pipe")

    result = train(micro(train={"budget": 3}), sink=broken)
    assert result.step == 3 and result.checkpoint.is_dir()
    assert len([e for e in calls if isinstance(e, StepMetrics)]) == 3  # still called
    events = read_events(result.run_dir)
    warnings = [e.message for e in events if isinstance(e, WarningRaised)]
    assert len(warnings) == 1 and "the event consumer failed (BrokenPipeError" in warnings[0], warnings
    assert isinstance(events[-1], RunFinished)


def test_weights_that_are_not_finite_are_never_saved(micro, tmp_path):
    """A diverged model (NaN weights) is refused at save, by the user's Save and the periodic one alike,
    so it never replaces a good checkpoint; the run's earlier checkpoints stay."""
    from core.errors import CheckpointError

    trainer = Trainer(micro(train={"budget": 2}), sink=ListSink())
    trainer.run()
    saved_before = sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir())
    with torch.no_grad():
        next(trainer.model.parameters())[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="not finite"):
        trainer.save(tmp_path / "diverged")
    assert not (tmp_path / "diverged").exists()
    trainer.step += 1  # the periodic save warns instead of ending the run
    sink = trainer.user_sink = ListSink()
    assert trainer._save_or_warn(None) is None
    assert "not finite" in sink.events[-1].message
    assert sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir()) == saved_before


def test_the_memory_baseline_follows_the_probes_and_torchs_lazy_imports_with_the_freed_heap_given_back(micro,
                                                                                                       monkeypatch):
    """auto precision's probe and the matmul peak allocate and free GEMM buffers before the model exists, and the
    first optimizer of a process imports torch._dynamo (70 MB of modules). Taken before them, the baseline left
    the freed buffers, which stay in the C heap, and the modules to the run: tiny's Train GiB read 0.22-0.28 in
    runs that probed, 0.19 in a process' first run and 0.12 in its second."""
    import core.trainer

    calls: list[str] = []
    real_decide, real_model, real_memory = (core.trainer.decide_precision, core.trainer.LlamaForCausalLM,
                                            core.trainer.memory_gib)

    def deciding(requested, device, **kw):
        calls.append("precision")
        return real_decide("fp32", device, **kw)  # the probe's result, without its seconds

    def measuring(device):
        calls.append("memory")
        return real_memory(device)

    monkeypatch.setattr(core.trainer, "decide_precision", deciding)
    monkeypatch.setattr(core.trainer, "measure_matmul_peak", lambda *a: calls.append("peak") or 1e12)
    monkeypatch.setattr(core.trainer, "import_training_libraries", lambda: calls.append("libraries"))
    monkeypatch.setattr(core.trainer, "release_freed_memory", lambda: calls.append("release"))
    monkeypatch.setattr(core.trainer, "memory_gib", measuring)
    monkeypatch.setattr(core.trainer, "LlamaForCausalLM", lambda cfg: calls.append("model") or real_model(cfg))
    result = train(micro(train={"precision": "auto", "budget": 2}), sink=ListSink())
    assert result.step == 2 and not result.stopped
    assert calls[:6] == ["precision", "peak", "libraries", "release", "memory", "model"], calls
