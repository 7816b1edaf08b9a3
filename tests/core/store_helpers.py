"""Helpers of the token-store tests: a small corpus, its JSONL file, the stores a cache holds, a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

ENGLISH = ["plain english text", "some more words of it", "the quick brown fox jumps over the lazy dog"] * 5


def jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def store_folders(cache: Path) -> list[Path]:
    """What the stores folder of ``cache`` holds (a preparation's lock file goes with it)."""
    folder = cache / "stores"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def one_line(capsys, code: int) -> str:
    """The command's stderr, checked to be one line with exit code 2 and no traceback."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err
