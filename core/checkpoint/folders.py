"""Atomic checkpoint folders: written aside, flushed, renamed into place; leftovers of crashed saves cleared."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any


def _fsync(path: Path) -> None:
    """Flush a file or folder to disk; a no-op where the platform cannot (folders on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFolder:
    """Write into a hidden temporary folder, fsync, then rename into place.

    An error or a crash before the rename leaves any earlier folder of the same
    name intact and no new folder under the target name; a crash leaves at most
    a hidden ``.name.tmp-*`` folder, which no loader accepts. Replacing an
    existing folder takes two renames (old away, new in); an error between them
    puts the old one back. The next save of the same name clears what a crashed
    one left (``sweep_leftovers``).
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.tmp = self.target.parent / f".{self.target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(self.target)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            for f in self.tmp.iterdir():
                _fsync(f)
            _fsync(self.tmp)
            self.commit()
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def commit(self) -> None:
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
            os.rename(self.target, old)
        try:
            os.rename(self.tmp, self.target)
        except BaseException:
            if old is not None:
                os.rename(old, self.target)
            raise
        _fsync(self.target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # this process: its own saves are never swept from under it
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # exists, but belongs to someone else (or the OS will not say): leave it
        return True
    return True


def sweep_leftovers(target: Path) -> list[Path]:
    """Clear what crashed saves of ``target`` left behind; returns the folders removed or restored.

    Only folders of processes that are gone are touched: their hidden
    ``.NAME.tmp-PID-*`` folders (never renamed into place) are removed, and a
    ``.NAME.old-PID-*`` folder (the previous checkpoint, moved aside just before
    the crash) is put back under its name if nothing took that name since, else removed.
    """
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-(\d+)-[0-9a-f]+")
    touched = []
    for leftover in sorted(target.parent.iterdir()):
        match = pattern.fullmatch(leftover.name)
        if not match or not leftover.is_dir() or _process_alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not target.exists():
            os.rename(leftover, target)  # the last good checkpoint, back under its own name
        else:
            shutil.rmtree(leftover, ignore_errors=True)
        touched.append(leftover)
    return touched




def file_record(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a file, as config.json records them for every other file of a checkpoint."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}
