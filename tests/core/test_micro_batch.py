"""Self-fitting micro-batches: an out-of-memory micro-step is redone with a smaller split, and ``auto`` fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.cli import main
from core.errors import ConfigError
from core.events import CheckpointSaved, ListSink, MicroBatchChanged, RunFailed, StepMetrics
from core.memory_budget import GIB, MemoryEstimate
from core.model import LlamaForCausalLM
from core.runs import read_events
from core.split import OutOfMemory, smaller_split
from core.trainer import Trainer
from tests.conftest import micro_config
from tests.core.checkpoint_helpers import corpus_file
from tests.core.test_accumulation import assert_same_params

pytestmark = pytest.mark.usefixtures("single_thread")


def config(folder: Path, **train):
    folder.mkdir(parents=True, exist_ok=True)
    return micro_config(folder, data={"source": str(corpus_file(folder))}, train={"budget": 4, **train})


class InjectedOom:
    """Make the model's training forward passes number ``at`` (1-based, counted over the whole run) raise
    ``torch.OutOfMemoryError`` as CUDA's allocator does, or every one from ``from_call`` on."""

    def __init__(self, monkeypatch, at: tuple[int, ...] = (), from_call: int | None = None,
                 error: Exception | None = None) -> None:
        self.at, self.from_call, self.calls, self.raised = set(at), from_call, 0, 0
        self.error = error or torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        original = LlamaForCausalLM.forward
        injector = self

        def forward(model, *args, **kwargs):
            if torch.is_grad_enabled():  # training only: validation and sampling run without grad
                injector.calls += 1
                if injector.calls in injector.at or (injector.from_call and injector.calls >= injector.from_call):
                    injector.raised += 1
                    raise injector.error
            return original(model, *args, **kwargs)

        monkeypatch.setattr(LlamaForCausalLM, "forward", forward)


def run(cfg) -> tuple[Trainer, ListSink]:
    sink = ListSink()
    trainer = Trainer(cfg, sink=sink)
    trainer.run()
    return trainer, sink


TOLERANCE = 1e-5
"""fp32 after 4 steps at lr 1e-2: uninterrupted 4 × 1 and 2 × 2 runs of this config differ by up to 5.1e-6 (the
accumulation tests allow 2e-6 after one step)."""


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


# --------------------------------------------------------------------------- the split
@pytest.mark.parametrize("split, smaller", [((8, 1), (4, 2)), ((4, 2), (2, 4)), ((6, 2), (3, 4)), ((3, 1), (1, 3)),
                                            ((5, 2), (2, 5)), ((1, 8), None)])
def test_a_smaller_split_keeps_the_batch_exact(split, smaller):
    assert smaller_split(*split) == smaller
    if smaller:
        assert smaller[0] * smaller[1] == split[0] * split[1]


# --------------------------------------------------------------------------- during a run
def test_an_out_of_memory_micro_step_is_redone_with_the_same_update(tmp_path, monkeypatch):
    """Micro-step 2 of step 2 runs out of memory: step 2 is redone from its start as 2 × 4, the run finishes,
    and its parameters are those of the uninterrupted 4 × 2 run with the same seed."""
    reference, ref_sink = run(config(tmp_path / "ref", micro_batch=4, accum_steps=2))
    oom = InjectedOom(monkeypatch, at=(4,))  # step 1: calls 1-2; step 2: calls 3-4
    trainer, sink = run(config(tmp_path / "oom", micro_batch=4, accum_steps=2))
    assert oom.raised == 1
    assert_same_params(params(reference), params(trainer), atol=TOLERANCE)
    assert [s.loss for s in sink.of(StepMetrics)] == pytest.approx([s.loss for s in ref_sink.of(StepMetrics)],
                                                                   rel=1e-5)
    (change,) = sink.of(MicroBatchChanged)
    assert (change.step, change.old_micro, change.old_accum, change.new_micro, change.new_accum) == (2, 4, 2, 2, 4)
    assert "out of memory in micro-step 2 of 2 of step 2 at micro-batch 4" in change.reason
    # The run folder records it: metrics.jsonl, config.json (the split trained last, and every change).
    run_dir = trainer.run_dir
    recorded = [e for e in read_events(run_dir) if isinstance(e, MicroBatchChanged)]
    assert recorded == [change]
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["config"]["train"]["micro_batch"], saved["config"]["train"]["accum_steps"]) == (2, 4)
    assert [(c["step"], c["new_micro"], c["new_accum"]) for c in saved["split_changes"]] == [(2, 2, 4)]
    # A resume from its checkpoint trains with the last split.
    checkpoint = sink.of(CheckpointSaved)[-1].path
    out = tmp_path / "resumed"
    monkeypatch.undo()
    assert main(["train", "--resume", checkpoint, "--steps", "6", "--out", str(out), "--no-progress"]) == 0
    (resumed,) = out.iterdir()
    train = json.loads((resumed / "config.json").read_text())["config"]["train"]
    assert (train["micro_batch"], train["accum_steps"]) == (2, 4)


def test_a_failed_cpu_allocation_is_out_of_memory_too(tmp_path, monkeypatch):
    """The CPU allocator raises where an allocation can fail (ulimit -v, strict overcommit): a plain RuntimeError,
    halved like CUDA's; any other RuntimeError is not taken for one."""
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: you "
                       "tried to allocate 42762240 bytes. Error code 12 (Cannot allocate memory)")
    oom = InjectedOom(monkeypatch, at=(1,), error=cpu)
    _, sink = run(config(tmp_path / "cpu", micro_batch=4, accum_steps=1))
    assert oom.raised == 1 and "DefaultCPUAllocator" in sink.of(MicroBatchChanged)[0].reason
    InjectedOom(monkeypatch, at=(1,), error=RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run(config(tmp_path / "other", micro_batch=4, accum_steps=1))


def test_an_out_of_memory_error_with_one_accumulation_step(tmp_path, monkeypatch):
    """The very first forward pass fails: the whole run trains as 2 × 2, bit for bit an uninterrupted 2 × 2 run."""
    reference, _ = run(config(tmp_path / "ref", micro_batch=4, accum_steps=1))
    halved, _ = run(config(tmp_path / "halved", micro_batch=2, accum_steps=2))
    InjectedOom(monkeypatch, at=(1,))
    trainer, sink = run(config(tmp_path / "oom", micro_batch=4, accum_steps=1))
    for key, value in params(halved).items():
        assert torch.equal(value, params(trainer)[key]), key
    assert_same_params(params(reference), params(trainer), atol=TOLERANCE)
    assert [(c.step, c.new_micro, c.new_accum) for c in sink.of(MicroBatchChanged)] == [(1, 2, 2)]


def test_micro_batch_one_that_runs_out_of_memory_ends_the_run_clearly(tmp_path, monkeypatch):
    """From step 2 on every forward pass fails: 2 × 1 becomes 1 × 2, then the run ends, saving step 1's state."""
    InjectedOom(monkeypatch, from_call=2)
    sink = ListSink()
    trainer = Trainer(config(tmp_path, micro_batch=2, accum_steps=1), sink=sink)
    with pytest.raises(OutOfMemory, match="micro-batch 1 does not fit") as err:
        trainer.run()
    assert "\n" not in str(err.value)
    assert [(c.step, c.new_micro, c.new_accum) for c in sink.of(MicroBatchChanged)] == [(2, 1, 2)]
    (failed,) = sink.of(RunFailed)
    assert failed.step == 1 and "out of memory in micro-step 1 of 2 of step 2 at micro-batch 1" in failed.message
    (saved,) = sink.of(CheckpointSaved)
    assert saved.step == 1 and Path(saved.path).name == "step_0000001" and saved.path in failed.message


def test_memory_that_runs_out_outside_a_micro_step_is_one_line(tmp_path, monkeypatch):
    """AdamW allocates its state at the first optimizer step: under ulimit -v the CPU allocator's failure there
    was a 49-line traceback and exit code 1."""
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: you "
                       "tried to allocate 42762240 bytes. Error code 12 (Cannot allocate memory)")

    def failing_step(self, *args, **kwargs):
        raise cpu

    monkeypatch.setattr(torch.optim.AdamW, "step", failing_step)
    sink = ListSink()
    with pytest.raises(OutOfMemory) as err:
        Trainer(config(tmp_path, micro_batch=2, accum_steps=1), sink=sink).run()
    assert str(err.value) == (
        "out of memory in step 1, outside its micro-steps (the optimizer step, whose state AdamW allocates at the "
        "first, validation or sampling) (DefaultCPUAllocator: can't allocate memory: you tried to allocate 42762240 "
        "bytes. Error code 12 (Cannot allocate memory)); choose a smaller model, fewer --eval-batches or a shorter "
        "sample")
    (failed,) = sink.of(RunFailed)
    assert failed.message == str(err.value) and not sink.of(MicroBatchChanged)


def test_a_split_the_settings_refuse_ends_the_run_with_the_last_step_saved(tmp_path, monkeypatch):
    """Under a CUDA-graph compile mode the next split (accumulation 2) is refused: the run ended without saving
    step 1, and its message said that split "would fit", which nothing had checked."""
    InjectedOom(monkeypatch, from_call=2)
    monkeypatch.setattr(Trainer, "_refused_split", lambda self, micro, accum: f"no {micro} × {accum} here")
    sink = ListSink()
    trainer = Trainer(config(tmp_path, micro_batch=2, accum_steps=1), sink=sink)
    with pytest.raises(OutOfMemory, match="at micro-batch 2 .*: no 1 × 2 here; the state after step 1 is saved"):
        trainer.run()
    assert not sink.of(MicroBatchChanged)
    (saved,) = sink.of(CheckpointSaved)
    assert saved.step == 1 and Path(saved.path).name == "step_0000001"


def test_a_cuda_graph_compile_mode_refuses_the_next_split_in_its_own_words(tmp_path):
    trainer = Trainer(config(tmp_path, micro_batch=2, accum_steps=1, compile_mode="reduce-overhead"))
    assert trainer._refused_split(1, 2).startswith(
        "the next split, micro-batch 1 × accumulation 2, cannot be used: compile mode 'reduce-overhead' uses CUDA "
        "graphs")
    assert trainer._refused_split(1, 1) == ""


# --------------------------------------------------------------------------- before a run: --micro-batch auto
CLI = ["--preset", "tiny", "--seq-len", "32", "--vocab-size", "512", "--steps", "1", "--no-progress"]


@pytest.fixture
def budget(monkeypatch):
    """A device of ``gib`` GiB where a micro-batch of n sequences needs n GiB (the model itself nothing)."""

    def set_budget(gib: float) -> None:
        monkeypatch.setattr("core.memory_budget.estimate_training_memory",
                            lambda model, micro_batch, seq_len, precision="fp32", shards=1:
                            MemoryEstimate(0, 0, 0, micro_batch * GIB))
        monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (int(gib * GIB), "test memory"))

    return set_budget


def test_micro_batch_auto_picks_the_largest_split_that_fits(budget, tmp_path, capsys):
    # tiny's micro-batch 16 × accumulation 2 = 32 per step; on a CPU a split is fitted to half the RAM, 6.5 GiB:
    # 6 fits, but only 4 divides 32.
    budget(13)
    assert main(["train", *CLI, "--micro-batch", "auto", "--accum", "2", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "warning:" not in out  # warnings go where errors go; step lines stay on standard output
    assert ("warning: micro-batch auto: micro-batch 16 × 32 tokens needs at least 16.0 GiB (16.0 GiB of "
            "activations), more than half of the 13.0 GiB of test memory, what a CPU run is fitted to (the "
            "estimate is a lower bound): from step 1 micro-batch 4 × accumulation 8 (was 16 × 2)") in err
    (run_dir,) = tmp_path.iterdir()
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["config"]["train"]["micro_batch"], saved["config"]["train"]["accum_steps"]) == (4, 8)
    assert saved["tokens_per_step"] == 32 * 32
    assert [(c["step"], c["old_micro"], c["new_micro"]) for c in saved["split_changes"]] == [(1, 16, 4)]
    assert any(isinstance(e, MicroBatchChanged) for e in read_events(run_dir))


def test_micro_batch_auto_keeps_a_split_that_fits(budget, tmp_path, capsys):
    budget(64)
    assert main(["train", *CLI, "--micro-batch", "auto", "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["config"]["train"]["micro_batch"] == 16 and saved["split_changes"] == []


@pytest.mark.parametrize("args, gib, message", [
    (["--micro-batch", "many"], 64, "argument --micro-batch: expected an integer, got 'many'"),
    (["--micro-batch", "-2"], 64, "micro-batch must be an integer ≥ 1, got -2"),
    (["--micro-batch", "auto"], 0.5, "micro-batch 1 × 32 tokens needs at least 1.0 GiB"),
    # An explicit micro-batch is trained as given or refused (only when it surely cannot fit: 16 GiB of 13),
    # naming the split that fits in half of it.
    (["--micro-batch", "16", "--accum", "2"], 13,
     "more than the 13.0 GiB of test memory; micro-batch 4 × accumulation 8 fits with the same effective batch "
     "(--micro-batch 4 --accum 8); on a CPU a split is fitted to half the available RAM"),
    (["--micro-batch", "12", "--accum", "2"], 13, None),  # 12 GiB of 13: might fit, so trained as given
    # A CUDA-graph compile mode refuses accumulation: the split that fits is not named as if it would run.
    (["--micro-batch", "16", "--compile", "reduce-overhead"], 13,
     "micro-batch 4 × accumulation 4 would keep the effective batch, but compile mode 'reduce-overhead' uses CUDA "
     "graphs, refused with accumulation: use --micro-batch 4 --accum 4 with --compile max-autotune-no-cudagraphs "
     "or default, or --micro-batch 4 alone (a smaller effective batch)"),
])
def test_bad_micro_batch_values_are_one_line_and_exit_2(budget, tmp_path, capsys, args, gib, message):
    budget(gib)
    try:
        code = main(["train", *CLI, *args, "--out", str(tmp_path)])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err.strip()
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_auto_in_a_config_file(tmp_path):
    from core.config import RunConfig

    cfg = RunConfig.from_dict({"preset": "small", "train": {"micro_batch": "auto", "accum_steps": 2}})
    assert cfg.train.auto_micro_batch and cfg.train.micro_batch == 8 and cfg.train.accum_steps == 2
    assert RunConfig.from_dict({"preset": "small", "train": {"micro_batch": " AUTO"}}).train.auto_micro_batch
    # A run's own config.json records "auto_micro_batch": false; its "micro_batch" set to "auto" asks for it.
    assert RunConfig.from_dict({"preset": "small", "train": {"micro_batch": "auto",
                                                             "auto_micro_batch": False}}).train.auto_micro_batch
    with pytest.raises(ConfigError, match="micro batch must be an integer"):
        RunConfig.from_dict({"preset": "small", "train": {"micro_batch": "all"}})


# --------------------------------------------------------------------------- under torchrun (two gloo ranks)
def _oom_rank_main(rank: int, world: int, port: int, config: dict, out: str, oom_calls: dict) -> None:
    """A rank of ``spawn_ranks``, whose training forward passes numbered ``oom_calls[rank]`` run out of memory."""
    from tests.core.dist_helpers import _rank_main

    original, calls = LlamaForCausalLM.forward, [0]

    def forward(model, *args, **kwargs):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] in oom_calls.get(str(rank), ()):
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return original(model, *args, **kwargs)

    LlamaForCausalLM.forward = forward
    _rank_main(rank, world, port, config, out)


def _spawn_with_oom(cfg, out: Path, oom_calls: dict) -> list[dict]:
    from tests.core.dist_helpers import spawn_ranks

    return spawn_ranks(cfg, 2, out, _oom_rank_main, (oom_calls,))


@pytest.mark.slow
def test_ranks_agree_on_a_smaller_split_when_one_runs_out_of_memory(tmp_path):
    """Two ranks × 4 × 2. In step 2 rank 1 runs out of memory in its first micro-step (rank 0 learns it before
    the micro-step DDP synchronises), then in the redo as 2 × 4 (a split's first step, synchronised by hand
    after its micro-steps): both ranks shrink alike, nothing hangs, and the weights are those of one process
    training micro-batch 16."""
    from tests.core.dist_helpers import record, steps, uneven_corpus
    from tests.core.test_distributed import assert_same_steps, assert_same_weights, dist_config, weights_at

    corpus = uneven_corpus(tmp_path)
    ref = record(dist_config(tmp_path / "one", corpus, micro_batch=16, accum_steps=1, budget=3))
    # Rank 1's training forward passes: step 1 = 1-2; step 2 = 3 (fails), as 2 × 4: 4, 5 (fails), as 1 × 8: 6-13.
    rank0, rank1 = _spawn_with_oom(dist_config(tmp_path / "two", corpus, micro_batch=4, accum_steps=2, budget=3),
                                   tmp_path / "records", {"1": (3, 5)})
    plain, _ = _spawn_with_oom(dist_config(tmp_path / "plain", corpus, micro_batch=4, accum_steps=2, budget=3),
                               tmp_path / "plain-records", {})
    changes = [e for e in rank0["events"] if e["event"] == "micro_batch_changed"]
    assert [(e["step"], e["old_micro"], e["new_micro"], e["new_accum"]) for e in changes] == [(2, 4, 2, 4),
                                                                                              (2, 2, 1, 8)]
    assert all("out of memory on another process in step 2" in e["reason"] for e in changes)
    for step in (1, 2, 3):
        # The uninterrupted two-rank run, to float noise; the one-process run as closely as that one is (AdamW's
        # first step divides by |gradient|: entries near 1e-8 turn fp32 reordering into a few 1e-5 here).
        assert_same_weights(weights_at(rank0["run_dir"], step), weights_at(plain["run_dir"], step), atol=1e-6)
        assert_same_weights(weights_at(rank0["run_dir"], step), weights_at(ref["run_dir"], step), atol=5e-5)
    assert_same_steps(rank0, ref, (1, 2, 3))
    for rec, tried in ((rank0, 1 + 4), (rank1, 1 + 2)):  # forward passes until each learnt of the failure
        forwards = {s: sum(e[0] == "forward" for e in entries) for s, entries in steps(rec["timeline"]).items()}
        assert forwards == {1: 2, 2: tried + 8, 3: 8}


@pytest.mark.slow
def test_out_of_memory_where_ddp_synchronises_ends_the_job_without_hanging(tmp_path):
    """Once a split has trained a step, its last micro-step synchronises inside DDP: an out-of-memory error
    there cannot be redone on one rank. That rank fails with one clear line, and the job ends (torchrun, here
    the spawner, ends the others) instead of waiting."""
    import torch.multiprocessing as mp

    from tests.core.dist_helpers import uneven_corpus
    from tests.core.test_distributed import dist_config

    cfg = dist_config(tmp_path / "two", uneven_corpus(tmp_path), micro_batch=2, accum_steps=1, budget=3)
    with pytest.raises(mp.ProcessRaisedException, match="under DDP, in the micro-step that all-reduces gradients, "
                                                        "a step cannot be redone on one process alone"):
        _spawn_with_oom(cfg, tmp_path / "records", {"1": (2,)})


@pytest.mark.slow
def test_a_compiled_run_redoes_its_first_step_without_falling_back_to_eager(tmp_path, monkeypatch):
    """The first micro-step of step 1 (the step that compiles) runs out of memory: that is no compile failure.
    The step is redone as 2 × 2, compiled, and matches the eager 4 × 1 run."""
    from core.compile import CompiledModel
    from core.events import CompileFinished

    reference, _ = run(config(tmp_path / "ref", micro_batch=4, accum_steps=1, budget=2))
    call, calls = CompiledModel.__call__, [0]

    def failing_once(self, *args, **kwargs):  # before the compiled module: one graph to compile, not two
        calls[0] += 1
        if calls[0] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return call(self, *args, **kwargs)

    monkeypatch.setattr(CompiledModel, "__call__", failing_once)
    trainer, sink = run(config(tmp_path / "compiled", micro_batch=4, accum_steps=1, budget=2,
                               compile_mode="default"))
    assert [(c.step, c.new_micro, c.new_accum) for c in sink.of(MicroBatchChanged)] == [(1, 2, 2)]
    assert not any(e.fallback for e in sink.of(CompileFinished))
    assert trainer.compiled.compiled
    assert_same_params(params(reference), params(trainer), atol=TOLERANCE)


def test_the_largest_divisor_under_a_limit_is_exact_and_quick_for_huge_batches():
    from core.memory_budget import largest_divisor_at_most

    for n in range(1, 400):
        for limit in (0, 1, 2, 7, 19, 20, 21, n - 1, n, n + 5):
            assert largest_divisor_at_most(n, limit) == max([d for d in range(1, n + 1)
                                                             if n % d == 0 and d <= limit], default=1)
    # √(10²³ × 8) candidates would never end; the limit (from memory) bounds the search.
    assert largest_divisor_at_most(8 * 10**23, 4059) == 4000
    assert largest_divisor_at_most(2**61 - 1, 5000) == 1  # a prime: no divisor but 1 under the limit


def test_a_refusal_for_several_processes_gives_the_need_per_process(budget):
    import torch

    from core.config import config_from_preset
    from core.memory_budget import check_fits

    budget(20)  # 8 GiB per process × 3 processes = 24 GiB: more than the 20
    with pytest.raises(ConfigError) as refused:
        check_fits(config_from_preset("tiny").model, 8, 32, "fp32", torch.device("cpu"), processes=3)
    assert "needs at least 8.0 GiB per process × 3 (8.0 GiB of activations), more than the 20.0 GiB" in str(
        refused.value)


def _cgroup(root: Path, rel: str, files: dict[str, str]) -> None:
    folder = root / rel
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


@pytest.mark.parametrize("version", [1, 2])
def test_the_room_a_memory_cgroup_leaves_is_the_least_of_its_own_and_its_ancestors(tmp_path, version):
    """Only the machine's free RAM was read: under a container's 800 MiB limit `--micro-batch auto` fitted to
    23 GiB and the run was killed (exit 137) instead of fitted or refused."""
    from core.memory_budget import cgroup_room

    mib = 1 << 20
    if version == 2:
        root, proc = tmp_path / "cg", "0::/job/step\n"
        _cgroup(root, "", {"cgroup.controllers": "memory\n"})
        _cgroup(root, "job", {"memory.max": f"{800 * mib}\n", "memory.current": f"{300 * mib}\n",
                              "memory.stat": f"anon 1\ninactive_file {100 * mib}\n"})
        _cgroup(root, "job/step", {"memory.max": "max\n", "memory.current": f"{10 * mib}\n"})
    else:
        root, proc = tmp_path / "cg", "9:pids:/\n4:memory:/job/step\n1:name=systemd:/\n"
        _cgroup(root, "memory/job", {"memory.limit_in_bytes": f"{800 * mib}\n",
                                     "memory.usage_in_bytes": f"{300 * mib}\n",
                                     "memory.stat": f"cache 5\ntotal_inactive_file {100 * mib}\n"})
        _cgroup(root, "memory/job/step", {"memory.limit_in_bytes": "9223372036854771712\n",
                                          "memory.usage_in_bytes": f"{10 * mib}\n"})
    (tmp_path / "cgroup").write_text(proc)
    # 800 MiB less what is used, the page cache it can reclaim not counted: 600 MiB.
    assert cgroup_room(str(tmp_path / "cgroup"), str(root)) == 600 * mib
    (tmp_path / "none").write_text("0::/\n" if version == 2 else "4:memory:/\n")
    assert cgroup_room(str(tmp_path / "none"), str(root)) is None  # the root: no limit there
    assert cgroup_room(str(tmp_path / "absent"), str(root)) is None


def test_a_cgroup_limit_below_the_free_ram_is_the_memory_a_cpu_run_fits_to(monkeypatch):
    import core.memory_budget as budget

    monkeypatch.setattr(budget, "cgroup_room", lambda: 512 << 20)
    assert budget.device_memory(torch.device("cpu")) == (512 << 20, "RAM the process' memory limit (cgroup) leaves")
    monkeypatch.setattr(budget, "cgroup_room", lambda: 1 << 62)
    assert budget.device_memory(torch.device("cpu"))[1] == "available RAM"


@pytest.mark.parametrize("rank, here, said", [(0, False, True), (1, False, False), (1, True, True)])
def test_under_torchrun_a_rank_that_only_heard_of_the_out_of_memory_stays_quiet(rank, here, said, tmp_path,
                                                                                monkeypatch, capsys):
    """Every rank ended with its error line (two, run together on one line at times, beside the launcher's)."""

    def out_of_memory(self):
        raise OutOfMemory("out of memory on another process in step 2: micro-batch 1 does not fit", here=here)

    monkeypatch.setattr(Trainer, "run", out_of_memory)
    monkeypatch.setattr("core.distributed.launched_by_torchrun", lambda: True)  # its environment would start a
    monkeypatch.setenv("RANK", str(rank))  # watch over a launcher this test does not have
    monkeypatch.setattr("core.distributed.exit_without_teardown", lambda code: None)  # a worker's os._exit
    assert main(["train", *CLI, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ("speedboard: error: out of memory on another process in step 2: micro-batch 1 does not fit\n"
                   if said else "")
