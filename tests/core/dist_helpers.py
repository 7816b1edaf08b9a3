"""Helpers for the multi-process tests: a corpus of uneven documents, a recording trainer, spawned ranks.

Ranks are started with ``torch.multiprocessing`` and the environment torchrun
would set (gloo on the CPU), or with torchrun itself where the launcher's own
behaviour is under test.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch

from core.events import ListSink
from core.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def uneven_corpus(folder: Path) -> str:
    """64 documents of very different lengths: in the document layout some are mostly PAD, some truncated."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda omicron sigma omega".split()
    lengths = (2, 5, 40, 9, 70, 3, 15, 120)
    docs = [f"doc {i}: " + " ".join(words[(i * 5 + j * 3) % len(words)] for j in range(lengths[i % 8])) + "."
            for i in range(64)]
    path = folder / "uneven.txt"
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingTrainer(Trainer):
    """Records a timeline per rank: each optimizer step, each training forward's input rows,
    and each DDP bucket all-reduce (through a communication hook), in the order they happen."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timeline: list[list] = []

    def _wrap(self, compiled):
        compiled = super()._wrap(compiled)
        module = compiled.module

        def on_forward(mod, args):
            if torch.is_grad_enabled():  # training only: validation and sampling run without grad
                self.timeline.append(["forward", args[0].tolist()])

        module.register_forward_pre_hook(on_forward)
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting_hook(state, bucket):
                self.timeline.append(["allreduce"])
                return allreduce_hook(state, bucket)  # what DDP does by default: sum, divide by world

            module.register_comm_hook(None, counting_hook)
        return compiled

    def _optimizer_step(self):
        self.timeline.append(["step", self.step + 1])
        return super()._optimizer_step()

    def _average_gradients(self):
        # The first step of a split all-reduces by hand after the last micro-step (core.split).
        self.timeline.append(["allreduce"])
        super()._average_gradients()


def record(config, **kwargs) -> dict:
    """Run ``config`` in this process with a RecordingTrainer; what a rank file holds."""
    sink = ListSink()
    trainer = RecordingTrainer(config, sink=sink, **kwargs)
    result = trainer.run()
    return {"rank": trainer.dist.rank, "timeline": trainer.timeline, "events": [e.to_dict() for e in sink.events],
            "run_dir": str(result.run_dir) if result.run_dir else None}


def _rank_main(rank: int, world: int, port: int, config: dict, out: str) -> None:
    from core.config import RunConfig
    from core.distributed import exit_without_teardown, shutdown

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        data = record(RunConfig.from_dict(config))
    finally:
        shutdown()
    Path(out, f"rank{rank}.json").write_text(json.dumps(data), encoding="utf-8")
    # Leave as a torchrun worker of train does (gloo's threads could abort a finished rank at teardown: about
    # 1 run in 30 of the FSDP test on a loaded 2-core machine, reported as a failure of the training itself).
    exit_without_teardown(0)


def spawn_ranks(config, world: int, out: Path, entry=_rank_main, extra: tuple = ()) -> list[dict]:
    """Train ``config`` in ``world`` processes (gloo); each rank's record, rank order. ``entry`` (a module-level
    function of ``rank, world, port, config, out, *extra`` that ends in ``_rank_main``) can change a rank first."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(entry, args=(world, free_port(), config.to_dict(), str(out), *extra), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(world)]


def steps(timeline: list[list]) -> dict[int, list[list]]:
    """Timeline entries grouped by optimizer step."""
    out: dict[int, list[list]] = {}
    current = None
    for entry in timeline:
        if entry[0] == "step":
            current = out.setdefault(entry[1], [])
        elif current is not None:
            current.append(entry)
    return out


def forwards(timeline: list[list]) -> dict[int, list[list[list[int]]]]:
    """Per optimizer step, each micro-step's input rows."""
    return {s: [e[1] for e in entries if e[0] == "forward"] for s, entries in steps(timeline).items()}


def python_env(**extra: str) -> dict[str, str]:
    """The test environment for a subprocess, with the checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


PYTHON = sys.executable
