"""Run folders: where each run writes its config, tokenizer, metrics and checkpoints.

```
<out>/<run_id>/
    config.json        full config, library versions, device (written at start)
    tokenizer.json     the run's tokenizer
    metrics.jsonl      one event per line, flushed as it happens
    checkpoints/step_000100/ ...
```
``EventTail`` follows a ``metrics.jsonl`` that another process is still writing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import secrets
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.events import Event, event_from_dict

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
"""The settings file of a run folder, and of a checkpoint folder."""
CHECKPOINTS_DIR = "checkpoints"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def default_out_dir() -> Path:
    """Per-user data folder (``SPEEDBOARD_HOME`` overrides it)."""
    env = os.environ.get("SPEEDBOARD_HOME")
    if env:
        return Path(env) / "runs"
    import platformdirs

    return Path(platformdirs.user_data_dir("speedboard")) / "runs"


def library_versions() -> dict[str, str]:
    import numpy
    import tokenizers
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "numpy": numpy.__version__, "tokenizers": tokenizers.__version__}
    try:
        import safetensors

        versions["safetensors"] = safetensors.__version__
    except ImportError:  # pragma: no cover - a hard dependency, but never fail a run over a version string
        pass
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id or ""):
        raise ConfigError(f"run id {run_id!r} must be a plain folder name (letters, digits, '.', '_', '-')")
    return run_id


def new_run_id(tag: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{tag}-{secrets.token_hex(2)}"


def run_tag(config, world_size: int = 1) -> str:
    """The readable middle of a run id: preset, compile mode and scope, accumulation, processes."""
    tc = config.train
    scope = "-block" if tc.compile_scope == "block" else ""
    procs = f"-x{world_size}{'-fsdp' if tc.fsdp else ''}" if world_size > 1 else ""
    return f"{config.preset}-{tc.compile_mode}{scope}-a{tc.accum_steps}{procs}"


def plan_run_dir(config, world_size: int = 1, run_id: str | None = None) -> tuple[str, Path]:
    """The id and folder a run of ``config`` in ``world_size`` processes will have (nothing is created)."""
    run_id = check_run_id(run_id or new_run_id(run_tag(config, world_size)))
    root = Path(config.out_dir) if config.out_dir else default_out_dir()
    return run_id, root / run_id


def create_run_dir(out_dir: str | Path | None, run_id: str) -> Path:
    """A new, empty run folder; never reuses one, so earlier runs are never touched."""
    root = Path(out_dir) if out_dir else default_out_dir()
    path = root / run_id
    path.mkdir(parents=True, exist_ok=False)
    return path


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JsonlSink:
    """Appends each event to ``metrics.jsonl`` and flushes it, so readers see it at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(event.to_dict(), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventTail:
    """Reads new complete lines of a ``metrics.jsonl`` on each ``poll()``."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        # A run folder, also one that does not exist yet (a run being started elsewhere).
        self.path = path / METRICS_FILE if path.is_dir() or path.suffix != ".jsonl" else path
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Event]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                events.append(event_from_dict(json.loads(line)))
            except (ValueError, TypeError):
                continue  # a line from a newer or damaged writer: skip it, keep following
        return events


def read_events(run_dir: str | Path) -> list[Event]:
    return EventTail(run_dir).poll()


def is_run_dir(path: str | Path) -> bool:
    """A folder a run wrote: it has a metrics.jsonl or a checkpoints folder."""
    path = Path(path)
    return (path / METRICS_FILE).is_file() or (path / CHECKPOINTS_DIR).is_dir()
