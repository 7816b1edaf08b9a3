"""Resume exactly, start from weights, continue with other speedups; periodic, requested and final saves."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core import checkpoint as ck
from core.cli import main
from core.control import Control
from core.data import IGNORE_INDEX, SampleOrder
from core.errors import CheckpointError, ConfigError
from core.events import (
    CheckpointFailed,
    CheckpointSaved,
    CompileFinished,
    ListSink,
    RunFailed,
    RunFinished,
    RunStarted,
    StepMetrics,
    WarningRaised,
)
from core.runs import read_events
from core.schedule import LRSchedule
from core.trainer import Trainer, train
from tests.conftest import micro_config
from tests.core.checkpoint_helpers import corpus_file, input_ids, logits, one_thread

pytestmark = pytest.mark.usefixtures("single_thread")

TOKENS_PER_STEP = 4 * 32  # micro config: micro-batch 4 × seq_len 32


def config(folder: Path, **train):
    """The micro config on a small corpus (sets up in milliseconds)."""
    return micro_config(folder, data={"source": str(corpus_file(folder))}, train=train)


class StopAt:
    """A sink that records events and stops the run when step ``step``'s metrics arrive."""

    def __init__(self, control: Control, step: int) -> None:
        self.control, self.step, self.sink = control, step, ListSink()

    def __call__(self, event) -> None:
        self.sink(event)
        if isinstance(event, StepMetrics) and event.step == self.step:
            self.control.stop()


def run_stopped_at(cfg, step: int) -> tuple[ListSink, Path]:
    control = Control()
    stopper = StopAt(control, step)
    result = train(cfg, control, stopper)
    assert result.stopped and result.step == step
    return stopper.sink, result.checkpoint


def steps(sink: ListSink) -> list[StepMetrics]:
    return sink.of(StepMetrics)


@pytest.fixture(scope="module")
def stopped_parent(tmp_path_factory):
    """A run planned for 8 steps, stopped after step 4 (its checkpoint is saved on stop)."""
    folder = tmp_path_factory.mktemp("parent")
    with one_thread():
        sink, checkpoint = run_stopped_at(config(folder, budget=8), 4)
    return sink, checkpoint


# --------------------------------------------------------------------------- exact resume
def test_resume_gives_the_same_loss_curve_as_an_uninterrupted_run(tmp_path):
    """50 steps + resume + 50 steps == 100 uninterrupted steps (eager, one seed)."""
    cfg = config(tmp_path, budget=100, lr=3e-3, min_lr=3e-4, warmup_ratio=0.1)
    first, checkpoint = run_stopped_at(cfg, 50)  # the 100-step schedule, stopped half-way
    second = ListSink()
    resumed = Trainer(cfg.replace(resume=str(checkpoint)), sink=second)
    resumed.run()
    whole = ListSink()
    uninterrupted = Trainer(cfg, sink=whole)
    uninterrupted.run()

    joined = steps(first) + steps(second)
    assert [s.step for s in joined] == list(range(1, 101)) == [s.step for s in steps(whole)]
    for name in ("loss", "lr", "grad_norm", "tokens"):
        torch.testing.assert_close(torch.tensor([getattr(s, name) for s in joined], dtype=torch.float64),
                                   torch.tensor([getattr(s, name) for s in steps(whole)], dtype=torch.float64),
                                   rtol=1e-6, atol=1e-7, msg=name)
    started = second.of(RunStarted)[0]
    assert (started.start_step, started.start_tokens, started.total_steps) == (50, 50 * TOKENS_PER_STEP, 100)
    assert started.parent == first.of(RunStarted)[0].run_id
    for a, b in zip(resumed.model.parameters(), uninterrupted.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_auto_precision_is_decided_once_per_lineage(tmp_path, monkeypatch):
    """A resume decided `auto` again: a parent that trained in bf16 went on in fp32 (the probe read on a busier
    machine), and the resume was not exact."""
    import core.trainer
    from core.precision import PrecisionChoice

    def probe_says(precision):
        monkeypatch.setattr(core.trainer, "decide_precision", lambda requested, device, model=None: PrecisionChoice(
            "auto", precision, f"{precision}: the probe"))

    cfg = config(tmp_path, budget=6, precision="auto")
    probe_says("bf16")
    first, checkpoint = run_stopped_at(cfg, 3)
    assert first.of(RunStarted)[0].precision == "bf16"
    probe_says("fp32")  # now: another reading
    resumed = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint)), sink=resumed).run()
    started = resumed.of(RunStarted)[0]
    assert started.precision == "bf16" and started.config["train"]["precision"] == "auto"
    assert started.precision_reason == "bf16: as its parent trained (auto is decided once per lineage)"
    fresh = ListSink()
    Trainer(cfg.replace(init_from=str(checkpoint)), sink=fresh).run()  # a new run decides anew
    assert fresh.of(RunStarted)[0].precision == "fp32"


def test_resume_from_the_cli_takes_the_checkpoints_settings(stopped_parent, tmp_path, capsys):
    _, checkpoint = stopped_parent
    assert main(["train", "--resume", str(checkpoint.parent.parent), "--out", str(tmp_path), "--no-progress"]) == 0
    (run_dir,) = tmp_path.iterdir()
    events = read_events(run_dir)
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.config["train"]["micro_batch"] == 4 and started.config["model"]["hidden_size"] == 32
    assert started.config["resume"] == str(checkpoint)
    assert [e.step for e in events if isinstance(e, StepMetrics)] == [5, 6, 7, 8]


@pytest.mark.parametrize("flag, value", [("--seed", "7"), ("--warmup", "0")])
def test_a_seed_or_warmup_on_resume_is_refused_not_recorded_and_ignored(stopped_parent, tmp_path, capsys, flag,
                                                                       value):
    """--warmup 0 on resume was written into config.json while the run warmed up along its parent's schedule."""
    _, checkpoint = stopped_parent
    assert main(["train", "--resume", str(checkpoint), flag, value, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"{flag} does not apply to --resume" in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def _resuming_config(checkpoint: Path, folder: Path, **train) -> Path:
    """A --config file that resumes ``checkpoint`` (as a resumed run's own config.json does, and as the dashboard
    hands a continued torchrun run over)."""
    own = json.loads((checkpoint.parent.parent / "config.json").read_text())["config"]
    path = folder / "resume.json"
    path.write_text(json.dumps({**own, "resume": str(checkpoint), "init_from": None,
                                "train": {**own["train"], **train}}))
    return path


@pytest.mark.parametrize("extra, message", [
    (["--seed", "7"], "--seed does not apply to the resume in {file}"),
    (["--warmup", "0"], "--warmup does not apply to the resume in {file}"),
    (["--vocab-size", "500"], "--vocab-size is for training a new tokenizer, but this run uses the tokenizer of"),
])
def test_flags_void_beside_a_config_files_resume_are_refused_as_beside_resume(stopped_parent, tmp_path, capsys,
                                                                               extra, message):
    """A --config file that resumes a checkpoint went past every check made for --resume: --seed 9 was recorded
    in config.json while the losses were the parent's, to the bit."""
    _, checkpoint = stopped_parent
    file = _resuming_config(checkpoint, tmp_path)
    assert main(["train", "--config", str(file), *extra, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert message.format(file=file) in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_config_files_resume_of_another_architecture_is_refused(stopped_parent, tmp_path, capsys):
    _, checkpoint = stopped_parent
    file = _resuming_config(checkpoint, tmp_path)
    data = json.loads(file.read_text())
    file.write_text(json.dumps({**data, "model": {**data["model"], "hidden_size": 64}}))
    assert main(["train", "--config", str(file), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"brings its own architecture, not the model of {file}" in err and err.count("\n") == 1, err


def test_a_resumed_run_records_the_seed_and_warmup_it_trains_with(stopped_parent, tmp_path, capsys):
    """The file's seed 5 and warmup 0.9 were recorded in config.json though the run continued its checkpoint's
    random streams and its lineage's warmup; another seed given is said."""
    _, checkpoint = stopped_parent
    own = json.loads((checkpoint.parent.parent / "config.json").read_text())["config"]["train"]
    file = _resuming_config(checkpoint, tmp_path, seed=own["seed"] + 5, warmup_ratio=0.9)
    assert main(["train", "--config", str(file), "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    recorded = json.loads((run_dir / "config.json").read_text())["config"]
    assert (recorded["train"]["seed"], recorded["train"]["warmup_ratio"]) == (own["seed"], own["warmup_ratio"])
    assert recorded["resume"] == str(checkpoint)
    err = capsys.readouterr().err
    assert f"seed {own['seed'] + 5} does not apply: a resumed run continues the random streams its checkpoint " \
           f"saved (seed {own['seed']})" in err
    # the warmup given is said too (the dashboard's warmup field was ignored without a word)
    ratio = own["warmup_ratio"]
    assert f"warmup 90% does not apply: a resumed run keeps its schedule (warmup {ratio * 100:g}% of its " \
           f"budget); config.json records warmup_ratio {own['warmup_ratio']}" in err


def test_a_warmup_given_as_the_one_the_run_trains_with_is_not_said(tmp_path):
    """A resumed run's own config.json reused (a new segment after a finished budget: "warmup_ratio": 0.0, as it
    trained) was told "warmup 0% does not apply … config.json records warmup_ratio 0.0"."""
    from types import SimpleNamespace

    from core.trainer import Trainer

    said = []
    trainer = SimpleNamespace(cfg=micro_config(tmp_path).replace(train={"warmup_ratio": 0.0}), seed=None,
                              schedule=SimpleNamespace(warmup_tokens=0, end_tokens=10, start_tokens=0),
                              warn=said.append)
    trainer.seed = trainer.cfg.train.seed
    state = {"train_config": {"warmup_ratio": 0.05}, "schedule": {"end_tokens": 10}}
    Trainer._record_what_the_checkpoint_decides(trainer, state)
    assert said == [] and trainer.cfg.train.warmup_ratio == 0.0
    trainer.cfg = trainer.cfg.replace(train={"warmup_ratio": 0.2})  # another warmup given: said
    Trainer._record_what_the_checkpoint_decides(trainer, state)
    assert said == ["warmup 20% does not apply: a resumed run keeps its schedule (a new cosine without warmup after "
                    "its finished budget); config.json records warmup_ratio 0.0"]


# --------------------------------------------------------------------------- changing speedups on resume
def test_resume_with_other_accumulation_continues_the_schedule_by_tokens(stopped_parent, tmp_path):
    parent_sink, checkpoint = stopped_parent
    saved = ck.read_checkpoint(checkpoint).read_trainer_state()["schedule"]
    schedule = LRSchedule(**saved)
    assert main(["train", "--resume", str(checkpoint), "--accum", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    (run_dir,) = tmp_path.iterdir()
    events = read_events(run_dir)
    metrics = [e for e in events if isinstance(e, StepMetrics)]
    # Twice the tokens per step: the remaining 4 × 128 tokens take 2 steps, and each step's
    # learning rate is the one the parent's schedule gives at that many tokens.
    assert [(m.step, m.tokens) for m in metrics] == [(5, 6 * TOKENS_PER_STEP), (6, 8 * TOKENS_PER_STEP)]
    assert [m.lr for m in metrics] == [schedule(6 * TOKENS_PER_STEP), schedule(8 * TOKENS_PER_STEP)]
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.budget_tokens == 8 * TOKENS_PER_STEP and started.tokens_per_step == 2 * TOKENS_PER_STEP
    # Said at the start, and recorded: the config's budget (8 steps) is the lineage's; this run's horizon is
    # in config.json in tokens and steps.
    notes = [e.message for e in events if isinstance(e, WarningRaised)]
    assert any(f"from {TOKENS_PER_STEP:,} to {2 * TOKENS_PER_STEP:,} tokens per step" in n
               and "2 steps remain" in n for n in notes), notes
    recorded = json.loads((run_dir / "config.json").read_text())
    assert (recorded["budget_tokens"], recorded["total_steps"]) == (8 * TOKENS_PER_STEP, 6)
    # The parent's own steps followed the same function of tokens.
    assert [m.lr for m in steps(parent_sink)] == [schedule(s * TOKENS_PER_STEP) for s in range(1, 5)]


def test_a_new_budget_on_resume_sets_the_lineage_total(stopped_parent, tmp_path, capsys):
    _, checkpoint = stopped_parent
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(checkpoint.parents[3]))})
    sink = ListSink()
    train(cfg.replace(resume=str(checkpoint), train={"budget": 10}), sink=sink)
    assert [s.step for s in steps(sink)] == [5, 6, 7, 8, 9, 10]
    assert sink.of(RunStarted)[0].budget_tokens == 10 * TOKENS_PER_STEP
    # config.json records the warmup it trains with: the lineage's, in tokens, as a share of the new total
    saved = ck.read_checkpoint(checkpoint).read_trainer_state()["schedule"]
    recorded = sink.of(RunStarted)[0].config["train"]["warmup_ratio"]
    assert recorded * 10 * TOKENS_PER_STEP == pytest.approx(saved["warmup_tokens"])
    assert steps(sink)[-1].lr == pytest.approx(cfg.train.min_lr)  # the cosine ends at the new total
    with pytest.raises(ConfigError, match="already used up: the checkpoint is at step 4"):
        train(cfg.replace(resume=str(checkpoint), train={"budget": 3}))
    assert main(["train", "--resume", str(checkpoint), "--steps", "3", "--out", str(tmp_path / "cli")]) == 2
    assert "already used up" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_a_budget_given_on_resume_is_the_total_even_where_it_equals_the_parents(stopped_parent, tmp_path):
    """--steps 8 beside twice the batch kept the parent's horizon in tokens (2 more steps, to step 6), because 8
    was the parent's budget too: a budget given on the command line is the lineage's total; one left out keeps
    the parent's horizon (test_resume_with_other_accumulation_continues_the_schedule_by_tokens)."""
    _, checkpoint = stopped_parent
    assert main(["train", "--resume", str(checkpoint), "--accum", "2", "--steps", "8", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    (run_dir,) = tmp_path.iterdir()
    events = read_events(run_dir)
    metrics = [e for e in events if isinstance(e, StepMetrics)]
    assert [m.step for m in metrics] == [5, 6, 7, 8]
    min_lr = json.loads((run_dir / "config.json").read_text())["config"]["train"]["min_lr"]
    assert metrics[-1].lr == pytest.approx(min_lr)  # the cosine ends at the total given
    assert next(e for e in events if isinstance(e, RunStarted)).budget_tokens == (4 + 4 * 2) * TOKENS_PER_STEP


def test_resuming_a_finished_run_continues_with_a_new_cosine_segment(tmp_path):
    cfg = config(tmp_path, budget=4)
    first = train(cfg)
    sink = ListSink()
    train(cfg.replace(resume=str(first.checkpoint)), sink=sink)
    lrs = [s.lr for s in steps(sink)]
    assert [s.step for s in steps(sink)] == [5, 6, 7, 8]
    assert lrs[0] == pytest.approx(cfg.train.lr, rel=0.2) and lrs[-1] == pytest.approx(cfg.train.min_lr)
    assert lrs == sorted(lrs, reverse=True)  # no warmup: straight into the decay


# --------------------------------------------------------------------------- init-from
def test_init_from_starts_a_new_run_from_the_weights_with_a_fresh_optimizer(stopped_parent, tmp_path):
    _, checkpoint = stopped_parent
    parent_state = ck.read_checkpoint(checkpoint).read_trainer_state()
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(checkpoint.parents[3]))},
                       train={"budget": 4, "warmup_ratio": 1 / 2})
    sink = ListSink()
    child = Trainer(cfg.replace(init_from=str(checkpoint)), sink=sink)
    child.run()
    started = sink.of(RunStarted)[0]
    assert (started.start_step, started.start_tokens, started.parent) == (0, 0, None)
    assert [s.step for s in steps(sink)] == [1, 2, 3, 4]
    assert steps(sink)[0].lr == pytest.approx(cfg.train.lr / 2)  # a fresh warmup, not the parent's position
    adam_steps = {float(s["step"]) for s in child.optimizer.state_dict()["state"].values()}
    assert adam_steps == {4.0}  # the parent's moments (4 steps) were not carried over
    assert {float(s["step"]) for s in parent_state["optimizer"]["state"].values()} == {4.0}

    # Its first step started from the parent's weights: its loss is theirs on the first batch.
    model, loaded = ck.model_from_checkpoint(checkpoint)
    batch = child.data.train.batch(SampleOrder(len(child.data.train), cfg.train.seed).take(0, 4))
    with torch.no_grad():
        out = model(batch.inputs, batch.attention_mask)
        loss = F.cross_entropy(out.view(-1, out.size(-1)), batch.targets.view(-1), ignore_index=IGNORE_INDEX)
    assert steps(sink)[0].loss == pytest.approx(loss.item(), rel=1e-5)
    assert child.data.tokenizer.to_str() == loaded.tokenizer.to_str()  # the checkpoint's tokenizer, not a new one


def test_init_from_a_bare_state_dict_with_its_tokenizer_given_or_with_weights_not_finite(stopped_parent, tmp_path):
    """A bare state dict with --tokenizer trains without a warning that its tokenizer is new; weights that are
    not finite are refused before the run folder exists (not "loss became nan" at step 1)."""
    _, checkpoint = stopped_parent
    weights = ck.read_checkpoint(checkpoint).state_dict
    bare = tmp_path / "weights.pt"
    torch.save(weights, bare)
    tokenizer = str(checkpoint / "tokenizer.json")
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(checkpoint.parents[3])), "tokenizer": tokenizer},
                       train={"budget": 1})
    sink = ListSink()
    train(cfg.replace(init_from=str(bare)), sink=sink)
    assert not [w.message for w in sink.of(WarningRaised) if "tokenizer" in w.message]
    weights["model.norm.weight"][0] = float("nan")
    torch.save(weights, bare)
    runs = Path(cfg.out_dir)
    before = sorted(runs.iterdir())
    with pytest.raises(CheckpointError,
                       match=r"the weights of .*weights\.pt are not finite \(NaN or inf in model\.norm\.weight\)"):
        train(cfg.replace(init_from=str(bare)))
    assert sorted(runs.iterdir()) == before  # no run folder


@pytest.mark.parametrize("command", ["export", "generate"])
def test_export_and_generate_refuse_weights_that_are_not_finite(stopped_parent, tmp_path, capsys, command):
    """A NaN in an attention projection that CPU attention hides from the first token's outputs: export wrote
    it into a Hugging Face folder and generate printed text from it, both with exit code 0."""
    from safetensors.torch import load_file, save_file

    _, checkpoint = stopped_parent
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    weights = load_file(damaged / ck.WEIGHTS_FILE)
    weights["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
    save_file(weights, damaged / ck.WEIGHTS_FILE)
    meta = json.loads((damaged / "config.json").read_text())
    meta["files"][ck.WEIGHTS_FILE] = ck.file_record(damaged / ck.WEIGHTS_FILE)
    meta[ck.CONFIG_CHECKSUM] = ck.config_checksum(meta)  # a checkpoint sealed as it was saved
    (damaged / "config.json").write_text(json.dumps(meta))
    argv = ["export", str(damaged), str(tmp_path / "hf")] if command == "export" else \
        ["generate", str(damaged), "--max-new-tokens", "2", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"speedboard: error: the weights of {damaged} are not finite (NaN or inf in "
                   f"model.layers.0.self_attn.q_proj.weight): it was saved from a diverged or damaged model; "
                   f"{command} {'an' if command == 'export' else 'from an'} earlier checkpoint\n")
    assert not (tmp_path / "hf").exists()


def test_a_bare_state_dict_of_another_architecture_is_named_as_such(stopped_parent, tmp_path):
    """Not "the tokenizer has N tokens but the embedding only M rows": the shapes are checked first."""
    _, checkpoint = stopped_parent
    state = dict(ck.read_checkpoint(checkpoint).state_dict)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):  # an embedding smaller than the tokenizer
        if key in state:
            state[key] = state[key][:100].clone()
    bare = tmp_path / "weights.pt"
    torch.save(state, bare)
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(checkpoint.parents[3])),
                                       "tokenizer": str(checkpoint / "tokenizer.json")}, train={"budget": 1})
    wider = cfg.replace(model={"hidden_size": 64, "intermediate_size": 128}, init_from=str(bare))
    seen = ListSink()
    with pytest.raises(CheckpointError, match=r"architecture mismatch with .*weights\.pt: "
                                              r"model\.embed_tokens\.weight: expected \(100, 64\), found \(100, 32\)"):
        train(wider, sink=seen)
    # Said before the corpus was looked at (its preparation can take hours): no data event came first.
    assert [type(e) for e in seen.events] == [RunFailed]


def test_resume_needs_a_trainer_state_and_an_intact_one(stopped_parent, tmp_path):
    _, checkpoint = stopped_parent
    cfg = micro_config(tmp_path, data={"source": str(corpus_file(checkpoint.parents[3]))})
    weights_only = tmp_path / "weights.pt"
    torch.save(ck.read_checkpoint(checkpoint).state_dict, weights_only)
    with pytest.raises(CheckpointError, match="holds no trainer state .*use init-from"):
        train(cfg.replace(resume=str(weights_only)))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in checkpoint.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    state = (damaged / "trainer_state.pt").read_bytes()
    (damaged / "trainer_state.pt").write_bytes(state[:-100] + bytes(100))
    with pytest.raises(CheckpointError, match="trainer_state.pt in .* is corrupted"):
        train(cfg.replace(resume=str(damaged)))
    (damaged / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="incomplete: trainer_state.pt is missing"):
        train(cfg.replace(resume=str(damaged)))
    assert not (tmp_path / "runs").exists()  # a failed start writes no run folder


# --------------------------------------------------------------------------- periodic, requested, final saves
def test_save_every_keeps_the_newest_checkpoints(tmp_path):
    sink = ListSink()
    result = train(config(tmp_path, budget=7, save_every=2, keep=2), sink=sink)
    assert [e.step for e in sink.of(CheckpointSaved)] == [2, 4, 6, 7]  # periodic, then the final one
    assert [p.name for p in ck.list_checkpoints(result.run_dir / "checkpoints")] == ["step_0000006", "step_0000007"]
    assert not [p for p in (result.run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    sink = ListSink()
    result = train(config(tmp_path, budget=6, save_every=3, keep=5), sink=sink)
    assert [e.step for e in sink.of(CheckpointSaved)] == [3, 6]  # the last step is saved once
    assert result.checkpoint == result.run_dir / "checkpoints" / "step_0000006"


def test_save_on_stop_and_resume_from_it(tmp_path):
    cfg = config(tmp_path, budget=1000)
    sink, checkpoint = run_stopped_at(cfg, 3)
    finished = sink.of(RunFinished)[0]
    assert finished.stopped and finished.step == 3 and finished.checkpoint == str(checkpoint)
    assert ck.read_checkpoint(checkpoint).meta["step"] == 3
    resumed, _ = run_stopped_at(cfg.replace(resume=str(checkpoint)), 5)
    assert [s.step for s in steps(resumed)] == [4, 5]


def _run_in_thread(cfg, control: Control, sink) -> threading.Thread:
    errors: list[BaseException] = []

    def target():
        try:
            train(cfg, control, sink)
        except BaseException as exc:  # surfaced by the test through .errors
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.errors = errors
    thread.start()
    return thread


class Waiter:
    """A sink that lets the test thread wait for a given event (no sleeping)."""

    def __init__(self) -> None:
        self.sink = ListSink()
        self._cond = threading.Condition()

    def __call__(self, event) -> None:
        with self._cond:
            self.sink(event)
            self._cond.notify_all()

    def wait_for(self, predicate, timeout: float = 120):
        with self._cond:
            assert self._cond.wait_for(lambda: any(predicate(e) for e in self.sink.events), timeout)
            return next(e for e in self.sink.events if predicate(e))


def test_save_requested_from_another_thread_happens_at_the_next_step(tmp_path):
    control, waiter = Control(), Waiter()
    thread = _run_in_thread(config(tmp_path, budget=100_000), control, waiter)
    seen = waiter.wait_for(lambda e: isinstance(e, StepMetrics) and e.step >= 2)
    target = tmp_path / "requested"
    control.request_save(str(target))
    saved = waiter.wait_for(lambda e: isinstance(e, CheckpointSaved) and e.path == str(target))
    control.request_save()  # no path: into the run's own checkpoints folder
    own = waiter.wait_for(lambda e: isinstance(e, CheckpointSaved) and e.path != str(target))
    control.stop()
    thread.join(120)
    assert not thread.is_alive() and not thread.errors
    assert saved.step >= seen.step
    before = waiter.sink.events[: waiter.sink.events.index(saved)]
    assert [e for e in before if isinstance(e, StepMetrics)][-1].step == saved.step  # between two steps
    meta = ck.read_checkpoint(target).meta
    assert meta["step"] == saved.step and ck.read_checkpoint(target).read_trainer_state()["step"] == saved.step
    assert Path(own.path).parent.name == "checkpoints" and Path(own.path).name == f"step_{own.step:07d}"


def test_save_works_while_paused(tmp_path):
    control, waiter = Control(), Waiter()
    thread = _run_in_thread(config(tmp_path, budget=100_000), control, waiter)
    waiter.wait_for(lambda e: isinstance(e, StepMetrics) and e.step >= 1)
    control.pause()
    control.request_save(str(tmp_path / "while_paused"))
    saved = waiter.wait_for(lambda e: isinstance(e, CheckpointSaved))
    steps_when_saved = len(waiter.sink.of(StepMetrics))
    assert saved.step == waiter.sink.of(StepMetrics)[-1].step  # no step ran after the pause took hold
    control.stop()
    thread.join(120)
    assert not thread.errors and len(waiter.sink.of(StepMetrics)) == steps_when_saved
    assert ck.read_checkpoint(tmp_path / "while_paused").meta["step"] == saved.step


def test_a_save_that_cannot_be_written_is_a_warning_not_the_end_of_the_run(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    control = Control()
    control.request_save(str(blocker))
    control.request_save(str(blocker / "inside_a_file"))
    sink = ListSink()
    result = train(config(tmp_path, budget=3), control, sink)
    failures = sink.of(CheckpointFailed)
    assert [f.path for f in failures] == [str(blocker), str(blocker / "inside_a_file")]
    assert all(f.message.startswith("cannot write the checkpoint") for f in failures)
    assert not sink.of(WarningRaised)
    assert result.step == 3 and not result.stopped and result.checkpoint.is_dir()
    assert blocker.read_text() == "not a folder"


# --------------------------------------------------------------------------- compile and accumulation on resume
@pytest.mark.slow
def test_resume_compiled_per_block_with_other_accumulation(stopped_parent, tmp_path):
    """Flip torch.compile (per block) and accumulation on resume: same schedule by tokens, the same
    losses as an eager resume, and the checkpoint it writes is plain and loads into an eager model."""
    _, checkpoint = stopped_parent
    schedule = LRSchedule(**ck.read_checkpoint(checkpoint).read_trainer_state()["schedule"])
    cfg = ck.peek_checkpoint(checkpoint).run_config.replace(out_dir=str(tmp_path))  # what the CLI does
    runs = {}
    for mode in ("off", "default"):
        sink = ListSink()
        trainer = Trainer(cfg.replace(resume=str(checkpoint), train={"compile_mode": mode, "compile_scope": "block",
                                                                     "accum_steps": 2}), sink=sink)
        trainer.run()
        runs[mode] = (trainer, sink)
    compiled, sink = runs["default"]
    # No compile fallback or other warning; only the note that accumulation 2 doubles the effective batch.
    assert [w.message.split(",")[0] for w in sink.of(WarningRaised)] == ["the effective batch changes on resume"]
    assert not any(e.fallback for e in sink.of(CompileFinished))
    assert sink.of(CompileFinished)  # it really compiled
    assert [(s.step, s.tokens) for s in steps(sink)] == [(5, 6 * TOKENS_PER_STEP), (6, 8 * TOKENS_PER_STEP)]
    assert [s.lr for s in steps(sink)] == [schedule(6 * TOKENS_PER_STEP), schedule(8 * TOKENS_PER_STEP)]
    torch.testing.assert_close([s.loss for s in steps(sink)], [s.loss for s in steps(runs["off"][1])],
                               rtol=1e-4, atol=1e-4)
    written = compiled.run_dir / "checkpoints" / "step_0000006"
    meta = json.loads((written / "config.json").read_text())
    assert meta["run"]["train"]["compile_mode"] == "default"
    loaded = ck.read_checkpoint(written)
    assert loaded.state_dict.keys() == compiled.model.state_dict().keys()
    model, _ = ck.model_from_checkpoint(written)
    ids = input_ids(vocab=model.config.vocab_size)
    torch.testing.assert_close(logits(model, ids), logits(compiled.model, ids), rtol=0, atol=0)


# --------------------------------------------------------------------------- crafted trainer states
def _craft(state: dict, kind: str) -> None:
    if kind == "rng_too_short":
        state["rng"]["torch"] = torch.zeros(7, dtype=torch.uint8)
    elif kind == "rng_not_bytes":
        state["rng"]["torch"] = torch.zeros(5056, dtype=torch.float32)
    elif kind == "empty_schedule":
        state["schedule"] = {}
    elif kind == "schedule_ends_before_it_starts":
        state["schedule"]["end_tokens"] = 0
    elif kind == "step_is_text":
        state["step"] = "abc"
    elif kind == "step_negative":
        state["step"] = -5
    elif kind == "optimizer_state_of_another_shape":
        entry = next(iter(state["optimizer"]["state"].values()))
        entry["exp_avg"] = torch.zeros(3, 3)
    elif kind == "optimizer_without_groups":
        state["optimizer"] = {"state": {}}
    elif kind == "optimizer_moment_nan":
        entry = next(iter(state["optimizer"]["state"].values()))
        entry["exp_avg_sq"].view(-1)[0] = float("nan")
    elif kind == "not_a_dict":
        state.clear()
        state["x"] = 1
    elif kind == "optimizer_moment_a_number":
        next(iter(state["optimizer"]["state"].values()))["exp_avg"] = 0.5
    elif kind == "optimizer_moment_sparse":
        entry = next(iter(state["optimizer"]["state"].values()))
        entry["exp_avg"] = entry["exp_avg"].to_sparse()
    elif kind == "optimizer_state_keyed_by_text":
        moments = state["optimizer"]["state"]
        moments["0"] = moments.pop(0)
    elif kind == "optimizer_state_of_no_parameter":
        moments = state["optimizer"]["state"]
        moments[-1] = moments.pop(0)
    elif kind == "optimizer_step_negative":
        next(iter(state["optimizer"]["state"].values()))["step"] = torch.tensor(-2.0)
    elif kind == "train_samples_text":
        state["train_samples"] = "x"
    elif kind == "train_samples_negative":
        state["train_samples"] = -5
    elif kind == "tokens_per_step_zero":
        state["tokens_per_step"] = 0
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind, message", [
    ("rng_too_short", "rng torch must be a CPU random-generator state"),
    ("rng_not_bytes", "rng torch must be a CPU random-generator state"),
    ("empty_schedule", "schedule must hold max_lr, min_lr"),
    ("schedule_ends_before_it_starts", "schedule ends"),
    ("step_is_text", "step must be an integer ≥ 0, got 'abc'"),
    ("step_negative", "step must be an integer ≥ 0, got -5"),
    ("optimizer_state_of_another_shape", "exp_avg of parameter 0 has shape (3, 3)"),
    ("optimizer_without_groups", "optimizer must be an optimizer state_dict"),
    ("not_a_dict", "not a valid Speedboard trainer state: optimizer, samples, schedule, step, tokens missing"),
    # Resumed, it trained a step and failed with "loss became nan …; lower the learning rate".
    ("optimizer_moment_nan", "is not finite (NaN or inf in exp_avg_sq): it was saved from a diverged or damaged "
                             "run; start a new run from its weights with --init-from"),
    # These failed in the first step's fused AdamW (a traceback of every tensor, a run folder left) or at set-up
    # (a ValueError traceback), or were taken in silence (the moments of parameter "0" dropped, the resume inexact).
    ("optimizer_moment_a_number", "exp_avg of parameter 0 must be a dense floating-point tensor, got 0.5"),
    ("optimizer_moment_sparse", "exp_avg of parameter 0 must be a dense floating-point tensor, got a sparse_coo "
                                "tensor"),
    ("optimizer_state_keyed_by_text", "the optimizer state names parameter '0', which no param group lists"),
    ("optimizer_state_of_no_parameter", "the optimizer state names parameter -1, which no param group lists"),
    # (It said "got a torch.float32 tensor of shape ()", as a sound checkpoint's step is: the value is the news.)
    ("optimizer_step_negative", "the optimizer step of parameter 0 must be a count ≥ 0, got -2.0 (a torch.float32 "
                                "tensor)"),
    ("train_samples_text", "train_samples must be an integer ≥ 0, got 'x'"),
    ("train_samples_negative", "train_samples must be an integer ≥ 0, got -5"),
    ("tokens_per_step_zero", "tokens_per_step must be an integer ≥ 1, got 0"),
])
def test_a_crafted_trainer_state_with_a_valid_checksum_is_one_line_before_any_folder(kind, message, stopped_parent,
                                                                                     tmp_path, capsys):
    """The checksum proves a file is the one saved; its structure is checked too, so a file crafted or written
    by another program is one line and exit code 2, before a run folder exists."""
    _, checkpoint = stopped_parent
    crafted = tmp_path / "crafted"
    shutil.copytree(checkpoint, crafted)
    state = torch.load(crafted / ck.STATE_FILE, weights_only=True)
    _craft(state, kind)
    torch.save(state, crafted / ck.STATE_FILE)
    meta = json.loads((crafted / "config.json").read_text())
    meta["files"][ck.STATE_FILE] = ck.file_record(crafted / ck.STATE_FILE)
    meta[ck.CONFIG_CHECKSUM] = ck.config_checksum(meta)  # every checksum valid
    (crafted / "config.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    assert main(["train", "--resume", str(crafted), "--data", str(corpus_file(checkpoint.parents[3])),
                 "--steps", "6", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedboard: error: ") and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_resume_trains_with_its_own_hyperparameters_not_the_saved_param_groups(stopped_parent, tmp_path):
    """The checkpoint gives AdamW's moments and step counts; weight decay, betas and eps are this run's. A new
    --weight-decay on resume applies (load_state_dict used to put the saved value back), and param groups a file
    was crafted with (betas "x", an infinite weight decay, no lr) are never used."""
    _, checkpoint = stopped_parent
    crafted = tmp_path / "crafted"
    shutil.copytree(checkpoint, crafted)
    state = torch.load(crafted / ck.STATE_FILE, weights_only=True)
    for group in state["optimizer"]["param_groups"]:
        group.update(betas="x", weight_decay=float("inf"), eps=-1.0)
        group.pop("lr")
    torch.save(state, crafted / ck.STATE_FILE)
    meta = json.loads((crafted / "config.json").read_text())
    meta["files"][ck.STATE_FILE] = ck.file_record(crafted / ck.STATE_FILE)
    meta[ck.CONFIG_CHECKSUM] = ck.config_checksum(meta)
    (crafted / "config.json").write_text(json.dumps(meta))
    cfg = ck.peek_checkpoint(crafted).run_config.replace(resume=str(crafted), out_dir=str(tmp_path / "out"))
    cfg = cfg.replace(train={"weight_decay": 0.25})
    sink = ListSink()
    trainer = Trainer(cfg, Control(), sink)
    result = trainer.run()
    assert result.step == 8 and all(torch.isfinite(torch.tensor([m.loss for m in steps(sink)])))
    decay, no_decay = trainer.optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.25, 0.0)
    assert decay["betas"] == (cfg.train.beta1, cfg.train.beta2) and decay["eps"] == 1e-8
    assert trainer.optimizer.state[decay["params"][0]]["exp_avg"].abs().sum() > 0  # the moments did come back


# --------------------------------------------------------------------------- the sample stream
def _warnings(sink: ListSink) -> list[str]:
    return [e.message for e in sink.of(WarningRaised)]


def test_a_resume_says_when_it_cannot_continue_the_parents_sample_stream(stopped_parent, tmp_path, monkeypatch):
    _, checkpoint = stopped_parent
    source = corpus_file(checkpoint.parents[3])
    cfg = micro_config(tmp_path, data={"source": str(source)}, train={"budget": 8})
    same = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint)), sink=same).run()
    assert not [w for w in _warnings(same) if "sample" in w]  # the same data and order: the same stream

    monkeypatch.setattr("core.resume.SAMPLE_ORDER", "another-order")  # this release reads another order
    other_order = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint)), sink=other_order).run()
    assert any("saved with sample order 'feistel6-splitmix64'" in w and "resume exactly" in w
               for w in _warnings(other_order))
    monkeypatch.undo()

    more = tmp_path / "more.txt"
    more.write_text(source.read_text(encoding="utf-8") * 2, encoding="utf-8")
    other_data = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint), data={"source": str(more)}), sink=other_data).run()
    assert any("the data differs from the parent run's" in w for w in _warnings(other_data))

    # The same tokens cut into other samples: said as such, not as other data.
    shorter = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint), data={"seq_len": 16}), sink=shorter).run()
    notes = [w for w in _warnings(shorter) if "sample" in w]
    assert any(w.startswith("the samples differ from the parent run's: the same tokens, cut into ")
               and "(another sequence length or layout)" in w for w in notes), notes
    assert not any("the data differs" in w for w in notes)

    # The same documents in another order (as many tokens, so as many samples): told by the tokens' digest.
    documents = source.read_text(encoding="utf-8").split("\n\n")
    reordered = tmp_path / "reordered.txt"
    reordered.write_text("\n\n".join(reversed(documents)), encoding="utf-8")
    other_text = ListSink()
    Trainer(cfg.replace(resume=str(checkpoint), data={"source": str(reordered)}), sink=other_text).run()
    assert any("the data differs from the parent run's (other tokens, as many training samples)" in w
               for w in _warnings(other_text)), _warnings(other_text)


def test_a_resumed_runs_memory_baseline_leaves_its_checkpoints_tensors_to_the_training(stopped_parent, tmp_path,
                                                                                        monkeypatch):
    """The start checkpoint was read before the baseline was taken: a continued run's Train GiB was its
    checkpoint's size (weights and optimizer state) lower than a fresh run's of the same model."""
    import core.trainer
    from core.device import GIB

    _, checkpoint = stopped_parent
    monkeypatch.setattr(core.trainer, "memory_gib", lambda device: 1.0)
    read = []
    real_read = core.trainer.Trainer.read_start_checkpoint

    def reading(self):
        read.append(real_read(self))
        return read[-1]

    monkeypatch.setattr(core.trainer.Trainer, "read_start_checkpoint", reading)
    cfg = config(tmp_path, budget=8).replace(resume=str(checkpoint))
    trainer = Trainer(cfg, sink=ListSink())
    try:
        trainer.set_up()
    finally:
        trainer.record_abort("measured its set-up alone")  # its heartbeat stops, its metrics.jsonl is closed
    (held,) = read
    weights = sum(t.numel() * t.element_size() for t in held[0].state_dict.values())
    state = core.trainer._tensor_bytes(held, torch.device("cpu"))
    assert state > weights  # the optimizer's moments too
    assert trainer.mem_baseline == pytest.approx(1.0 - state / GIB)
    assert core.trainer._tensor_bytes(held, torch.device("cuda")) == 0  # a GPU run's baseline: its own memory


def test_a_resume_takes_its_checkpoints_tokenizer_whatever_now_lies_at_the_parents_tokenizer_path(tmp_path,
                                                                                                  capsys):
    """A run trained with --tokenizer FILE could not be resumed once FILE was overwritten: its own config (which
    --resume inherits) named FILE, and the resume said "leave --tokenizer out" to a user who gave none. A
    --tokenizer given that does not exist was taken silently (and recorded) beside a checkpoint's own."""
    from tests.core.checkpoint_helpers import make_tokenizer

    (tmp_path / "tok").mkdir()
    file = make_tokenizer(300).save(tmp_path / "tok")
    cfg = config(tmp_path, budget=4).replace(data={"tokenizer": str(file)})
    _, checkpoint = run_stopped_at(cfg, 2)
    make_tokenizer(400).save(tmp_path / "tok")  # another tokenizer at the same path
    assert main(["train", "--resume", str(checkpoint), "--out", str(tmp_path / "resumed"), "--no-progress"]) == 0
    capsys.readouterr()
    for start in (["--resume"], ["--seq-len", "32", "--init-from"]):
        assert main(["train", *start, str(checkpoint), "--tokenizer", str(tmp_path / "missing.json"),
                     "--out", str(tmp_path / "refused"), "--no-progress"]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == \
            f"speedboard: error: tokenizer file {tmp_path / 'missing.json'} does not exist"
    assert not (tmp_path / "refused").exists()
