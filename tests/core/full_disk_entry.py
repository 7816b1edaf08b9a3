"""A process that writes as on a full disk: ``python -m tests.core.full_disk_entry SCENARIO LIMIT ARGS…``.

A file-size limit (``RLIMIT_FSIZE``) makes every write past ``LIMIT`` bytes of a
file fail, as a full disk does; SIGXFSZ is ignored, so the write fails with
EFBIG instead of killing the process. Scenarios:

- ``cli LIMIT ARGS…``: ``speedboard ARGS…`` under the limit from the start;
- ``save LIMIT FOLDER``: a checkpoint saved without a limit, then saves that fail
  in safetensors (weights), in ``torch.save`` (trainer state) and in an export;
  prints the messages as JSON;
- ``metrics LIMIT FOLDER CORPUS``: a run (in ``FOLDER/runs``) whose metrics.jsonl hits
  the limit mid-run (lowered at step 3, lifted again at step 6), then finishes; prints its events.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path


def _limit(nbytes: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY if nbytes is None else nbytes, hard))


def _save(limit: int, folder: Path) -> None:
    import torch

    from core import checkpoint as ck
    from core.errors import CheckpointError
    from tests.core.checkpoint_helpers import make_model, make_tokenizer

    model, tok = make_model(0), make_tokenizer()
    first = ck.save_checkpoint(folder / "first", model, tokenizer=tok, step=1)
    weights = (first / ck.WEIGHTS_FILE).stat().st_size
    messages = {}
    attempts = {
        # The weights do not fit: safetensors fails ("File too large").
        "weights": (weights // 2, lambda: ck.save_checkpoint(folder / "second", model, tokenizer=tok, step=2)),
        # The weights fit, the trainer state does not: torch.save fails ("unexpected pos …").
        "trainer_state": (limit, lambda: ck.save_checkpoint(folder / "second", model, tokenizer=tok, step=2,
                                                            trainer_state={"big": torch.zeros(limit)})),
        "replace": (weights // 2, lambda: ck.save_checkpoint(first, model, tokenizer=tok, step=3)),
        "export": (weights // 2, lambda: ck.export_hf(first, folder / "exported")),
    }
    for name, (nbytes, attempt) in attempts.items():
        _limit(nbytes)
        try:
            attempt()
            messages[name] = None
        except CheckpointError as exc:
            messages[name] = str(exc)
        finally:
            _limit(None)
    print(json.dumps(messages))


def _metrics(limit: int, folder: Path, corpus: str) -> None:
    from core.events import StepMetrics
    from core.runs import METRICS_FILE
    from core.trainer import Trainer
    from tests.conftest import micro_config

    seen = []

    def sink(event) -> None:
        seen.append(event.to_dict())
        if isinstance(event, StepMetrics) and event.step == 3:  # the disk fills up …
            size = next((folder / "runs").glob(f"*/{METRICS_FILE}")).stat().st_size
            _limit(size + limit)
        if isinstance(event, StepMetrics) and event.step == 6:  # … and space comes back
            _limit(None)

    cfg = micro_config(folder, data={"source": corpus, "vocab_size": 300},
                       train={"budget": 8, "save_every": 4, "sample_every": 2})
    Trainer(cfg, sink=sink).run()
    print(json.dumps(seen))


if __name__ == "__main__":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    scenario, limit = sys.argv[1], int(sys.argv[2])
    if scenario == "cli":
        from core.cli import main

        _limit(limit)
        sys.exit(main(sys.argv[3:]))
    elif scenario == "save":
        _save(limit, Path(sys.argv[3]))
    elif scenario == "metrics":
        _metrics(limit, Path(sys.argv[3]), sys.argv[4])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
