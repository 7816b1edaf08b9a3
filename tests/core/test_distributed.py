"""Data-parallel training on the CPU with gloo, two processes: DDP, FSDP2, torchrun, faults.

The multi-process tests start real processes (``torch.multiprocessing`` with
torchrun's environment, or torchrun itself) and are marked slow; the rest
checks the launch commands and state conversions in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from core.checkpoint import list_checkpoints, load_weights, read_checkpoint
from core.config import RunConfig
from core.errors import ConfigError
from core.events import RunFailed, RunFinished, StepMetrics
from core.model import LlamaForCausalLM
from core.runs import EventTail, JsonlSink, read_events
from core.tokenizer import BPETokenizer
from tests.conftest import micro_config
from tests.core.dist_helpers import (
    ROOT,
    forwards,
    python_env,
    record,
    spawn_ranks,
    steps,
    uneven_corpus,
)

GLOBAL_BATCH = 8  # sequences per optimizer step in the equivalence runs
SEQ_LEN = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return uneven_corpus(tmp_path_factory.mktemp("corpus"))


def dist_config(root: Path, corpus: str, **train) -> RunConfig:
    """The micro model on uneven documents, padded layout; a checkpoint after every step."""
    return micro_config(root).replace(
        data={"source": corpus, "layout": "document", "seq_len": SEQ_LEN, "vocab_size": 300},
        train={"budget": 2, "save_every": 1, "keep": 5, "eval_every": 1, **train})


def weights_at(run_dir: str, step: int) -> dict[str, torch.Tensor]:
    return read_checkpoint(Path(run_dir) / "checkpoints" / f"step_{step:07d}").state_dict


def raw_keys(run_dir: str) -> list[str]:
    """Keys exactly as written in every checkpoint of a run (read_checkpoint would clean them)."""
    keys = []
    for ckpt in list_checkpoints(Path(run_dir) / "checkpoints"):
        with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
            keys += list(f.keys())
    return keys


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    """Equal after AdamW steps of lr 1e-2: float reordering moves a weight by a few 1e-6 at most."""
    assert a.keys() == b.keys()
    for key in a:
        diff = (a[key] - b[key]).abs().max().item()
        assert diff <= atol, (key, diff)


def events_of(rec: dict, kind: str) -> list[dict]:
    return [e for e in rec["events"] if e["event"] == kind]


def assert_same_steps(rec: dict, ref: dict, steps_: tuple[int, ...]) -> None:
    """Loss and the pre-clip gradient norm per step: global, and equal to the one-process run.

    The gradient norm matters: AdamW's first steps barely depend on the
    gradient's scale, so equal weights alone would not catch a wrong
    normalisation by a constant (a missing × world, say)."""
    got = {e["step"]: e for e in events_of(rec, "step")}
    want = {e["step"]: e for e in events_of(ref, "step")}
    for s in steps_:
        assert got[s]["loss"] == pytest.approx(want[s]["loss"], rel=1e-5)
        assert got[s]["grad_norm"] == pytest.approx(want[s]["grad_norm"], rel=1e-4)


def assert_reduces_on_last_micro_step_only(rec: dict, accum: int) -> None:
    for step, entries in steps(rec["timeline"]).items():
        per_micro: list[int] = []
        for entry in entries:
            if entry[0] == "forward":
                per_micro.append(0)
            elif entry[0] == "allreduce":
                per_micro[-1] += 1
        assert len(per_micro) == accum, (step, per_micro)
        assert per_micro[:-1] == [0] * (accum - 1), f"step {step}: all-reduces per micro-step {per_micro}"
        assert per_micro[-1] >= 1, f"step {step}: gradients never all-reduced"


# ----------------------------------------------------------------------------- DDP, 2 ranks × 2 × 2 vs 1 × 8 × 1
@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("ddp")
    ref = record(dist_config(root / "one", corpus, micro_batch=GLOBAL_BATCH, accum_steps=1))
    ranks = spawn_ranks(dist_config(root / "two", corpus, micro_batch=2, accum_steps=2), 2, root / "records")
    return SimpleNamespace(root=root, ref=ref, ranks=ranks)


@pytest.mark.slow
def test_two_ranks_reach_the_parameters_of_one(ddp_run):
    rank0 = ddp_run.ranks[0]
    for step in (1, 2):
        assert_same_weights(weights_at(rank0["run_dir"], step), weights_at(ddp_run.ref["run_dir"], step))
    assert_same_steps(rank0, ddp_run.ref, (1, 2))


@pytest.mark.slow
def test_non_final_micro_steps_do_not_all_reduce(ddp_run):
    for rec in ddp_run.ranks:
        assert_reduces_on_last_micro_step_only(rec, accum=2)
    assert not any(e[0] == "allreduce" for e in ddp_run.ref["timeline"])  # one process: no DDP at all


@pytest.mark.slow
def test_global_sample_order_does_not_depend_on_the_number_of_ranks(ddp_run):
    one = forwards(ddp_run.ref["timeline"])
    r0, r1 = (forwards(rec["timeline"]) for rec in ddp_run.ranks)
    assert one.keys() == r0.keys() == r1.keys() == {1, 2}
    for step in one:
        # Micro-step j of rank r is slice (j·world + r) of the global batch.
        rebuilt = [row for j in range(2) for part in (r0[step][j], r1[step][j]) for row in part]
        assert rebuilt == one[step][0]
        mine = {tuple(row) for micro in r0[step] for row in micro}
        theirs = {tuple(row) for micro in r1[step] for row in micro}
        assert len(mine) == len(theirs) == 4 and not mine & theirs  # disjoint shards
    pad = BPETokenizer.load(ddp_run.ref["run_dir"]).pad_id
    pads = [row.count(pad) for micro in one.values() for row in micro[0]]
    assert min(pads) == 0 and max(pads) > SEQ_LEN // 2, "the corpus must give full and mostly-padded samples"


@pytest.mark.slow
def test_rank0_alone_writes_and_logs_global_figures(ddp_run):
    rank0, rank1 = ddp_run.ranks
    assert rank1["events"] == [] and rank1["run_dir"] is None
    runs = list((ddp_run.root / "two" / "runs").iterdir())
    assert [p.name for p in runs] == [Path(rank0["run_dir"]).name]
    started = events_of(rank0, "run_started")[0]
    assert started["world_size"] == 2
    assert started["tokens_per_step"] == GLOBAL_BATCH * SEQ_LEN  # both ranks' tokens
    assert [e["tokens"] for e in events_of(rank0, "step")] == [GLOBAL_BATCH * SEQ_LEN, 2 * GLOBAL_BATCH * SEQ_LEN]
    for e in events_of(rank0, "step"):  # tokens/s: all ranks' tokens over the (shared) step time
        assert e["tokens_per_s"] * e["step_time"] == pytest.approx(GLOBAL_BATCH * SEQ_LEN)
    for mine, ref in zip(events_of(rank0, "validation"), events_of(ddp_run.ref, "validation"), strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-5)  # shared out over ranks, summed back
    keys = raw_keys(rank0["run_dir"])
    assert keys and not [k for k in keys if "module." in k or "_orig_mod" in k]
    assert len(list_checkpoints(Path(rank0["run_dir"]) / "checkpoints")) == 2


@pytest.mark.slow
def test_compiled_model_wrapped_in_ddp_matches_eager(ddp_run, corpus):
    """Compile, then wrap: DDP stays outside the graph, so no_sync works as in eager mode."""
    cfg = dist_config(ddp_run.root / "compiled", corpus, micro_batch=2, accum_steps=2,
                      compile_mode="default", compile_scope="model")
    rank0, rank1 = spawn_ranks(cfg, 2, ddp_run.root / "compiled-records")
    finished = events_of(rank0, "compile_finished")
    assert finished and not finished[0]["fallback"], events_of(rank0, "warning")
    for step in (1, 2):
        # Inductor's fused kernels sum in another order than eager ops; AdamW divides by the root of the
        # squared gradients, which turns that reordering into ~1e-5 on weights whose gradients are
        # near zero (1.1e-5 measured on an AMD EPYC): a looser bound than eager-vs-eager's, same math.
        assert_same_weights(weights_at(rank0["run_dir"], step), weights_at(ddp_run.ref["run_dir"], step),
                            atol=5e-5)
    assert_same_steps(rank0, ddp_run.ref, (1, 2))
    for rec in (rank0, rank1):
        assert_reduces_on_last_micro_step_only(rec, accum=2)
    assert not [k for k in raw_keys(rank0["run_dir"]) if "module." in k or "_orig_mod" in k]


# ----------------------------------------------------------------------------- FSDP2
@pytest.mark.slow
def test_fsdp_resumes_one_process_and_saves_full_plain_checkpoints(ddp_run, corpus):
    """Two FSDP ranks continue the one-process run from its step 1: the sharded load of its optimizer
    state, the sharded step 2, and the gathered save all agree with one process."""
    ref_dir = Path(ddp_run.ref["run_dir"])
    cfg = dist_config(ddp_run.root / "fsdp", corpus, micro_batch=2, accum_steps=2, fsdp=True)
    rank0, rank1 = spawn_ranks(cfg.replace(resume=str(ref_dir / "checkpoints" / "step_0000001")), 2,
                               ddp_run.root / "fsdp-records")
    assert rank1["events"] == [] and rank1["run_dir"] is None
    assert events_of(rank0, "run_started")[0]["world_size"] == 2
    assert [e["step"] for e in events_of(rank0, "step")] == [2]
    assert_same_weights(weights_at(rank0["run_dir"], 2), weights_at(ddp_run.ref["run_dir"], 2))
    assert_same_steps(rank0, ddp_run.ref, (2,))
    assert set(raw_keys(rank0["run_dir"])) == set(weights_at(ddp_run.ref["run_dir"], 2))  # full, plain names
    # The gathered optimizer state has the one-process layout and values.
    mine = read_checkpoint(Path(rank0["run_dir"]) / "checkpoints" / "step_0000002").read_trainer_state()
    ref = read_checkpoint(ref_dir / "checkpoints" / "step_0000002").read_trainer_state()
    def groups(state):  # torch.distributed.checkpoint stores the betas tuple as a list
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state["param_groups"]]

    assert groups(mine["optimizer"]) == groups(ref["optimizer"])
    assert mine["optimizer"]["state"].keys() == ref["optimizer"]["state"].keys()
    for index, state in ref["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine["optimizer"]["state"][index][name], state[name], rtol=1e-4, atol=1e-8)
        assert float(mine["optimizer"]["state"][index]["step"]) == float(state["step"]) == 2


# ----------------------------------------------------------------------------- torchrun: faults, CLI, stop
def _config_file(cfg: RunConfig, path: Path) -> str:
    path.write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_a_dead_rank_ends_the_job_and_its_checkpoint_resumes_on_fewer_ranks(tmp_path, corpus):
    cfg = micro_config(tmp_path).replace(
        data={"source": corpus, "layout": "document", "seq_len": SEQ_LEN, "vocab_size": 300},
        train={"micro_batch": 2, "accum_steps": 1, "budget": 4, "save_every": 2, "keep": 5})
    entry = str(ROOT / "tests" / "core" / "dist_fault_entry.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", entry,
            "train", "--config", _config_file(cfg, tmp_path / "run.json"), "--no-progress"]
    # A collective timeout far beyond the subprocess timeout: ending in time shows that
    # the job does not wait for it (torchrun and the closed sockets end it).
    env = python_env(SPEEDBOARD_TEST_DIE_AT="1:3", SPEEDBOARD_DIST_TIMEOUT="900")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "rank 1: simulated crash at step 3" in out
    assert "exitcode  : 17" in out  # torchrun names the rank that failed first
    (run_dir,) = (tmp_path / "runs").iterdir()
    last = read_events(run_dir)[-1]
    assert isinstance(last, RunFailed) and last.step == 2
    assert "another process of this job failed" in last.message or "terminated (SIGTERM)" in last.message
    assert last.message in out  # rank 0 printed the same one line

    # The last checkpoint loads, and one process continues the same data order.
    ckpt = run_dir / "checkpoints" / "step_0000002"
    model = LlamaForCausalLM(read_checkpoint(ckpt).model_config)
    load_weights(model, read_checkpoint(ckpt).state_dict)
    one = {"micro_batch": 4, "accum_steps": 1, "budget": 4, "save_every": 0}
    reference = record(cfg.replace(out_dir=str(tmp_path / "reference"), train=one))
    resumed = record(cfg.replace(out_dir=str(tmp_path / "resumed"), resume=str(ckpt), train=one))
    assert forwards(resumed["timeline"]) == {s: forwards(reference["timeline"])[s] for s in (3, 4)}
    assert_same_steps(resumed, reference, (3, 4))


@pytest.mark.slow
def test_cli_nproc_trains_end_to_end(tmp_path, corpus):
    argv = [sys.executable, "-m", "core.cli", "train", "--nproc", "2", "--preset", "tiny", "--data", corpus,
            "--layout", "document", "--seq-len", str(SEQ_LEN), "--vocab-size", "300", "--micro-batch", "2",
            "--accum", "2", "--steps", "3", "--eval-every", "0", "--sample-every", "0", "--device", "cpu",
            "--out", str(tmp_path / "runs"), "--no-progress", "--log-every", "1"]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run(argv, env=python_env(TMPDIR=str(scratch)), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # torchrun's log folder is the launcher's, and goes with the job (a torchelastic_* folder stayed each run)
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.split("-")[2:6] == ["tiny", "off", "a2", "x2"]
    assert json.loads((run_dir / "config.json").read_text())["world_size"] == 2
    events = read_events(run_dir)
    assert [e.step for e in events if isinstance(e, StepMetrics)] == [1, 2, 3]
    assert isinstance(events[-1], RunFinished) and not events[-1].stopped and events[-1].checkpoint
    assert "finished at step 3" in proc.stdout
    assert proc.stdout.count("step      1 |") == 1  # rank 0 alone prints
    assert proc.stdout.count("data: ") == proc.stdout.count("tokenizer: ") == 1  # not the launcher too
    assert not (run_dir / ".claim").exists()  # rank 0 took over the folder its launcher claimed


@pytest.mark.slow
def test_launch_spec_runs_and_sigint_stops_every_rank_cleanly(tmp_path, corpus):
    from core.launch import prepare_launch, stop_launch

    cfg = micro_config(tmp_path).replace(
        data={"source": corpus, "layout": "document", "seq_len": SEQ_LEN, "vocab_size": 300},
        train={"micro_batch": 2, "budget": 100_000, "eval_every": 0})
    spec = prepare_launch(cfg, 2)
    proc = subprocess.Popen(spec.argv, env=python_env(**spec.env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        tail, seen = EventTail(spec.metrics_file), []
        deadline = time.monotonic() + 120
        while not any(isinstance(e, StepMetrics) for e in seen):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            seen += tail.poll()
            time.sleep(0.1)
        stop_launch(proc.pid)  # the dashboard's Stop: SIGINT to the launcher
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    last = read_events(spec.run_dir)[-1]
    assert isinstance(last, RunFinished) and last.stopped and last.checkpoint
    assert last.step < 100_000 and Path(last.checkpoint).is_dir()
    assert "terminated" not in out and "SIGKILL" not in out
    spec.config_file.unlink()


# ----------------------------------------------------------------------------- launch commands, in this process
WORKER_END = """
import atexit, sys
from core import cli
atexit.register(lambda: print(" teardown ran", flush=True))
cli.COMMANDS["train"] = lambda args, argv: (print("trained", end=""), 3)[1]  # left in stdout's buffer
sys.exit(cli.main(["train"]))
"""


def test_a_torchrun_worker_of_train_ends_without_the_interpreters_teardown():
    """gloo's threads can abort a finished worker during the interpreter's teardown: a worker of ``train``
    leaves before it, with its exit code and its output flushed. Any other process ends as usual."""
    worker = subprocess.run([sys.executable, "-c", WORKER_END], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=python_env(WORLD_SIZE="2", RANK="1"))
    assert (worker.returncode, worker.stdout) == (3, "trained"), worker.stderr
    alone = subprocess.run([sys.executable, "-c", WORKER_END], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={k: v for k, v in python_env().items() if k not in ("RANK", "WORLD_SIZE")})
    assert (alone.returncode, alone.stdout) == (3, "trained teardown ran\n"), alone.stderr


def test_torchrun_argv_and_worker_env():
    from core.launch import torchrun_argv, worker_env

    argv = torchrun_argv(4, ["train", "--steps", "5"], python="py")
    assert argv == ["py", "-m", "core.launch_torchrun", "--standalone", "--nproc-per-node=4", "-m", "core.cli",
                    "train", "--steps", "5"]  # torchrun, its own messages sent to the launcher
    assert torchrun_argv(2, ["train"], python="py", log_dir="/l")[4:7] == ["--nproc-per-node=2", "--log-dir", "/l"]
    env = worker_env(2, "cpu", cpu_count=8)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONSAFEPATH"] == "1"  # the working folder is not first on the import path
    if "OMP_NUM_THREADS" not in os.environ:
        assert env["OMP_NUM_THREADS"] == "4"
        if not torch.cuda.is_available():  # "auto" is the CPU here: its processes share the cores too (were 1 each)
            assert worker_env(2, "auto", cpu_count=8)["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in worker_env(2, "cuda")


def test_a_folder_of_the_users_own_named_core_does_not_hide_ours_from_the_runs_processes(tmp_path):
    """Every process of a multi-process run starts as ``python -m core…`` in the user's working folder, which
    ``python -m`` puts first on the import path."""
    from core.launch import worker_env

    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("raise SystemExit('the user core was imported')")
    argv = [sys.executable, "-m", "core.cli", "train", "--help"]
    bare = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=python_env())
    assert bare.returncode != 0 and "the user core" in bare.stderr  # what a child met before
    child = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env=python_env(**worker_env(2, "cpu", cpu_count=2)))
    assert child.returncode == 0 and "--micro-batch" in child.stdout, child.stderr


def test_a_checkout_run_without_installing_gives_its_processes_the_way_to_it(monkeypatch, tmp_path):
    """PYTHONSAFEPATH takes the working folder off the children's import path: where only it found Speedboard
    (``python -m speedboard`` in an uninstalled checkout), the children get the checkout on PYTHONPATH."""
    from core.launch import worker_env

    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [str(ROOT), *[p for p in sys.path if os.path.abspath(p or ".") != str(ROOT)]])
    assert worker_env(2, "cpu")["PYTHONPATH"] == str(ROOT)  # found through the working folder
    monkeypatch.chdir(tmp_path)
    assert "PYTHONPATH" not in worker_env(2, "cpu")  # on the path as itself: an installed copy's site-packages
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != str(ROOT)])
    assert worker_env(2, "cpu")["PYTHONPATH"] == os.pathsep.join([str(ROOT), "/elsewhere"])  # an editable finder


def test_prepare_launch_writes_a_config_the_cli_reads_back(tmp_path):
    from core.cli import build_parser, config_from_args
    from core.launch import prepare_launch

    cfg = micro_config(tmp_path, train={"accum_steps": 3, "fsdp": True})
    spec = prepare_launch(cfg, 2, run_id="my-run", python="py")
    assert spec.argv[:4] == ["py", "-m", "core.cli", "train"]
    assert spec.run_dir == tmp_path / "runs" / "my-run" and not spec.run_dir.exists()
    args = build_parser().parse_args(spec.argv[3:])
    assert (args.nproc, args.run_id) == (2, "my-run")
    assert config_from_args(args) == cfg
    spec.config_file.unlink()


def test_run_ids_are_plain_folder_names(tmp_path):
    from core.launch import prepare_launch
    from core.runs import check_run_id

    for bad in ("", "../up", "a/b", ".hidden", "x" * 200):
        with pytest.raises(ConfigError):
            check_run_id(bad)
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    with pytest.raises(ConfigError, match="already exists"):
        prepare_launch(micro_config(tmp_path), 2, run_id="taken")


def test_nproc_must_fit_the_device():
    from core.launch import check_nproc

    check_nproc(4, "cpu")
    check_nproc(1, "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            check_nproc(2, "cuda")
    with pytest.raises(ConfigError):
        check_nproc(0, "cpu")


def test_cli_hands_over_without_its_own_options():
    from core.cli import _without_option

    argv = ["train", "--nproc", "2", "--steps", "3", "--run-id=abc", "--nproc=4"]
    assert _without_option(_without_option(argv, "--nproc"), "--run-id") == ["train", "--steps", "3"]


def test_run_outcome_follows_the_last_event(tmp_path):
    from core.events import RunFailed as Failed
    from core.launch import run_outcome
    from core.runs import JsonlSink

    sink = JsonlSink(tmp_path / "metrics.jsonl")
    assert run_outcome(tmp_path) is None
    sink(Failed("r", 1.0, "boom"))
    assert run_outcome(tmp_path) == "failed"
    sink(RunFinished("r", 2.0, 3, 10, True, 1.0, None, None, None, 0.1, None))
    sink.close()
    assert run_outcome(tmp_path) == "stopped"


def test_fsdp_refuses_fp16():
    from core.config import TrainConfig

    with pytest.raises(ConfigError, match="FSDP"):
        TrainConfig(fsdp=True, precision="fp16")
    assert not TrainConfig().fsdp


def test_optimizer_state_layouts_round_trip():
    """Parameter-name keyed state (what FSDP gathers) and index keyed state (what checkpoints hold) agree."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from core.distributed import optimizer_state_by_fqn, optimizer_state_by_index
    from core.trainer import make_optimizer

    cfg = micro_config()
    model = LlamaForCausalLM(cfg.model)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    model(torch.randint(0, 100, (2, 8))).sum().backward()
    optimizer.step()
    by_name = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    by_index = optimizer_state_by_index(by_name)
    expected = optimizer.state_dict()
    assert by_index["param_groups"] == expected["param_groups"]
    assert by_index["state"].keys() == expected["state"].keys()
    for i, state in expected["state"].items():
        for k, v in state.items():
            assert torch.equal(by_index["state"][i][k], v)
    names = {id(p): n for n, p in model.named_parameters()}
    fqns = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    back = optimizer_state_by_fqn(by_index, fqns)
    assert back["param_groups"] == by_name["param_groups"] and back["state"].keys() == by_name["state"].keys()
    with pytest.raises(ConfigError):
        optimizer_state_by_fqn(by_index, fqns[:1])


def test_collective_failures_become_one_clear_line():
    from core.distributed import DistContext, PeerLost, is_peer_failure, peer_failure_message

    two = DistContext(rank=0, world_size=2)
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:24210: "
                        "Connection reset by peer. This is typically caused by a remote worker hanging.")
    assert is_peer_failure(gloo, two)
    assert not is_peer_failure(gloo, DistContext())  # a single process has no peers
    assert not is_peer_failure(RuntimeError("shape mismatch"), two)
    assert not is_peer_failure(PeerLost("x"), two)
    message = peer_failure_message(gloo, two)
    assert "\n" not in message and "rank 0" in message and "Connection reset by peer" in message
    assert "pair.cc" not in message


def test_config_file_flag_reads_saved_configs(tmp_path, capsys):
    from core.cli import build_parser, config_from_args, main

    cfg = micro_config(tmp_path)
    run_config = tmp_path / "config.json"  # a run folder's config.json holds the RunConfig under "config"
    run_config.write_text(json.dumps({"run_id": "r", "config": cfg.to_dict()}), encoding="utf-8")
    args = build_parser().parse_args(["train", "--config", str(run_config), "--steps", "7", "--fsdp"])
    assert config_from_args(args) == cfg.replace(train={"budget_kind": "steps", "budget": 7, "budget_given": True,
                                                             "fsdp": True})
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    assert main(["train", "--config", str(tmp_path / "bad.json")]) == 2
    assert main(["train", "--config", str(run_config), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("speedboard: error:") for line in err)


def test_a_chosen_run_id_names_the_folder_and_is_never_reused(micro):
    from core.trainer import Trainer

    cfg = micro(train={"budget": 1, "sample_tokens": 1})
    result = Trainer(cfg, run_id="chosen").run()
    assert result.run_dir.name == "chosen"
    with pytest.raises(ConfigError, match="already exists"):
        Trainer(cfg, run_id="chosen").run()
    with pytest.raises(ConfigError):
        Trainer(cfg, run_id="../escape")


def test_nproc_with_bad_input_is_one_line_before_any_process_starts(tmp_path, capsys):
    from core.cli import main

    out = str(tmp_path / "runs")
    assert main(["train", "--nproc", "2", "--data", str(tmp_path / "missing.txt"), "--out", out]) == 2
    assert main(["train", "--nproc", "2", "--run-id", "../up", "--out", out]) == 2
    assert main(["train", "--nproc", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("speedboard: error:") for line in err), err
    assert not (tmp_path / "runs").exists()


def test_process_capacity_names_the_kind_of_process():
    from core.launch import process_capacity

    kind, count = process_capacity()
    if torch.cuda.device_count() > 1:
        assert (kind, count) == ("cuda", torch.cuda.device_count())
    else:
        assert kind == "cpu" and count == (os.cpu_count() or 1)


# --------------------------------------------------------------------------- the launcher's exit code
FAKE_RANK0 = """
import json, sys
from pathlib import Path
from core.runs import create_run_dir
run_dir, behaviour = Path(sys.argv[1]), sys.argv[2]
if behaviour == "refuse":  # rank 0 refuses (e.g. a bad setting): torchrun reports a ChildFailedError
    sys.exit(1)
create_run_dir(run_dir.parent, run_dir.name)  # as rank 0 does: it takes over the folder its launcher claimed
with open(run_dir / "metrics.jsonl", "a") as f:
    for step in (1, 2):
        f.write(json.dumps({"event": "step", "run_id": run_dir.name, "time": float(step), "step": step,
                            "tokens": 64 * step, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 1.0,
                            "step_time": 1.0, "peak_mem_gib": 0.1, "mem_gib": 0.1, "mfu": 0.1}) + "\\n")
    if behaviour == "finish":
        f.write(json.dumps({"event": "finished", "run_id": run_dir.name, "time": 3.0, "step": 2, "tokens": 128,
                            "stopped": False, "final_loss": 5.0, "val_loss": None, "median_tokens_per_s": None,
                            "compile_seconds": None, "peak_mem_gib": 0.1, "checkpoint": None}) + "\\n")
(run_dir / "heartbeat.json").write_text("{}")
sys.exit(0 if behaviour == "finish" else 137)  # "killed": rank 0 died without recording an ending
"""


@pytest.mark.parametrize("behaviour, code", [("refuse", 1), ("killed", 137), ("finish", 0)])
def test_the_launchers_exit_code_follows_this_job_alone(behaviour, code, tmp_path, monkeypatch):
    """A rank 0 that died gets its ending recorded; a claim that no rank 0 took is removed again."""
    from core.launch import run_outcome, run_torchrun
    from core.runs import HEARTBEAT_FILE

    run_dir = tmp_path / "runs" / "same-id"
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_RANK0)
    monkeypatch.setattr("core.launch.torchrun_argv",
                        lambda nproc, args, log_dir=None: [sys.executable, str(fake), str(run_dir), behaviour])
    assert run_torchrun(2, [], run_dir) == code
    if behaviour == "refuse":
        assert not run_dir.exists()  # nothing started the run: its id is free again
        return
    assert not (run_dir / ".claim").exists()
    events = read_events(run_dir)
    if behaviour == "killed":
        assert isinstance(events[-1], RunFailed) and "rank 0 ended without recording an ending" in events[-1].message
        assert events[-1].step == 2 and not (run_dir / HEARTBEAT_FILE).exists()
        assert run_outcome(run_dir) == "failed"
    else:
        assert isinstance(events[-1], RunFinished)


INTERRUPTED_RANK0 = """
import json, os, signal, sys
from pathlib import Path
from core.runs import create_run_dir
run_dir, started = Path(sys.argv[1]), sys.argv[2] == "started"
create_run_dir(run_dir.parent, run_dir.name)
with open(run_dir / "metrics.jsonl", "a") as f:
    if started:
        f.write(json.dumps({"event": "run_started", "run_id": run_dir.name, "time": 0.0, "run_dir": str(run_dir),
                            "config": {}, "device": "cpu", "precision": "fp32", "num_parameters": 1,
                            "tokens_per_step": 64, "budget_tokens": 640, "total_steps": 10}) + "\\n")
    f.write(json.dumps({"event": "warning", "run_id": run_dir.name, "time": 0.0, "message": "set-up"}) + "\\n")
signal.signal(signal.SIGINT, lambda *a: sys.exit(1))  # as torchrun ends with its workers, no ending recorded
os.kill(os.getppid(), signal.SIGINT)  # the user's Ctrl-C, which the launcher passes on
signal.pause()
"""


@pytest.mark.parametrize("started", [False, True])
def test_a_job_interrupted_before_rank_0_recorded_its_ending(started, tmp_path, monkeypatch):
    """Ctrl-C during rank 0's set-up left a run folder whose only event said "rank 0 ended without recording an
    ending (killed?)": nothing was trained, so nothing is kept; a run that had started says what ended it."""
    from core.launch import run_torchrun

    run_dir = tmp_path / "runs" / "same-id"
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(INTERRUPTED_RANK0)
    monkeypatch.setattr("core.launch.torchrun_argv", lambda nproc, args, log_dir=None: [
        sys.executable, str(fake), str(run_dir), "started" if started else "set-up"])
    assert run_torchrun(2, [], run_dir) == 130
    if not started:
        assert not run_dir.exists()
        return
    last = read_events(run_dir)[-1]
    assert isinstance(last, RunFailed) and "killed?" not in last.message
    assert last.message.startswith("the job was ended by signal 2, SIGINT before rank 0 recorded its ending")


def test_the_launcher_never_writes_into_an_existing_run_folder(tmp_path, monkeypatch):
    """Another job's folder (or an earlier run's) with this run id: refused before anything starts."""
    from core.launch import run_torchrun

    run_dir = tmp_path / "same-id"
    run_dir.mkdir()
    old = JsonlSink(run_dir / "metrics.jsonl")
    old(RunFinished("same-id", 9.0, 5, 50, False, 1.0, None, None, None, 0.1, None))
    old.close()
    before = (run_dir / "metrics.jsonl").read_bytes()
    monkeypatch.setattr("core.launch.torchrun_argv", lambda *a, **k: pytest.fail("torchrun was started"))
    with pytest.raises(ConfigError, match="already exists; choose another run id"):
        run_torchrun(2, [], run_dir)
    assert [p.name for p in run_dir.iterdir()] == ["metrics.jsonl"]
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_nproc_with_the_id_of_an_existing_run_is_refused_before_launching(tmp_path, capsys):
    from core.cli import main

    (tmp_path / "runs" / "taken").mkdir(parents=True)
    assert main(["train", "--nproc", "2", "--device", "cpu", "--run-id", "taken", "--out",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run folder" in err and "already exists" in err, err


def test_fsdp_in_one_process_is_refused_and_a_resumed_fsdp_run_can_leave_it(tmp_path, capsys):
    """--fsdp without --nproc ran as one process, recorded "fsdp": true, and a resumed FSDP run had no way out."""
    from core.cli import build_parser, main

    assert main(["train", "--fsdp", "--steps", "1", "--out", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.strip() == \
        "speedboard: error: --fsdp shards over several processes: give --nproc N (N ≥ 2) with it, or leave it out"
    assert not (tmp_path / "runs").exists()
    assert build_parser().parse_args(["train", "--no-fsdp"]).fsdp is False
    assert build_parser().parse_args(["train"]).fsdp is None  # a resume keeps its own
