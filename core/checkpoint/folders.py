"""Atomic checkpoint folders: written aside, flushed, renamed into place; removed by renaming aside first;
leftovers of dead processes cleared."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.errors import CheckpointError, SpeedboardError
from core.paths import (
    WriterLock,
    control_character,
    fsync,
    hidden_form,
    missing_folders,
    remove_empty,
    user_path,
    why_not_writable,
    why_write_failed,
    writer_gone,
)
from core.runs import CONFIG_FILE


def _host_tag() -> str:
    """This machine, as hidden folder names carry it (storage may be shared by several machines)."""
    return re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname())[:64] or "host"


_SHORTENED = re.compile(r"~[0-9a-f]{12}$")


def _hidden(target: Path, kind: str) -> Path:
    """``.NAME.KIND-PID@HOST-RANDOM`` beside ``target``: never taken for a checkpoint, and traceable to its process."""
    return target.parent / f".{hidden_form(target.name)}.{kind}-{os.getpid()}@{_host_tag()}-{secrets.token_hex(3)}"


_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<pid>\d+)(?:@(?P<host>[A-Za-z0-9.]+))?-[0-9a-f]+")


def check_writable(target: str | Path, what: str) -> None:
    """Refuse, in one line, a target that cannot be written: a file in the way, a read-only or locked folder."""
    reason = why_not_writable(Path(target).parent) or control_character(target)
    if reason:
        raise CheckpointError(f"cannot write the {what} to {target}: {reason}")


class AtomicFolder:
    """Write into a hidden temporary folder, fsync, then rename into place.

    An error or a crash before the rename leaves any earlier folder of the same
    name intact and no new folder under the target name; a crash leaves at most
    a hidden ``.name.tmp-*`` folder, which no loader accepts. Replacing an
    existing folder takes two renames (old away, new in); an error between them
    puts the old one back. The next save of the same name clears what a crashed
    one left (``sweep_leftovers``).

    Every file gets the mode a plain ``open()`` gives under the process' umask
    (safetensors writes 0600; the folder's other files are 0644 under umask 022),
    so a checkpoint can be shared or copied as one.

    Every failure to write (an ``OSError``, ``torch.save``'s "unexpected pos" on
    a full disk, safetensors' "File too large") becomes one ``CheckpointError``
    here, with a reason a person can act on; the temporary folder is removed.
    """

    def __init__(self, target: str | Path, what: str = "checkpoint", replace: bool = True) -> None:
        # A link to a folder keeps linking: the folder it names is written (a link renamed away was replaced by
        # a real folder, and the one it named left as it was).
        given = user_path(target)
        try:
            self.target = given.resolve(strict=False) if given.is_symlink() else given
        except (RuntimeError, OSError) as exc:  # a link that names itself, at some depth (Python < 3.13: Runtime)
            raise CheckpointError(f"cannot write the {what} to {given}: it is a symbolic link that loops back "
                                  f"to itself") from exc
        self.what = what
        self.replace = replace
        """False: a folder another writer filled meanwhile is refused at the rename (an export), never replaced."""
        self.tmp = _hidden(self.target, "tmp")
        self._lock: WriterLock | None = None
        self._made: list[Path] = []
        """The folders above the target that entering created: removed again when the write fails."""

    def __enter__(self) -> Path:
        made = missing_folders(self.target.parent)
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            sweep_leftovers(self.target)
            self.tmp.mkdir()
            self._lock = WriterLock(self.tmp)  # held while it is written: never swept from under this save
        except OSError as exc:
            remove_empty(made)  # the folders created on the way: a refused save leaves nothing
            raise self._failure(exc) from None
        self._made = made
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._finish(exc_type, exc)
        finally:
            if self._lock is not None:
                self._lock.release()

    def _finish(self, exc_type, exc) -> None:
        # The reason is asked for before the temporary folder is removed: removing it frees the disk it filled,
        # and the disk no longer says why the write failed (torch.save's own words are "unexpected pos …").
        if exc_type is not None:
            failure = self._failure(exc) if isinstance(exc, Exception) and not isinstance(exc, SpeedboardError) \
                else None
            shutil.rmtree(self.tmp, ignore_errors=True)
            remove_empty(self._made)
            if failure is not None:
                raise failure from None
            return  # a user error raised inside, or KeyboardInterrupt: as it is
        try:
            mode = _umask_file_mode(self.tmp)
            for f in self.tmp.iterdir():
                if f.is_file() and not f.is_symlink():
                    os.chmod(f, mode)
                fsync(f)
            fsync(self.tmp)
            self.commit()
        except Exception as exc:
            failure = exc if isinstance(exc, SpeedboardError) else self._failure(exc)
            shutil.rmtree(self.tmp, ignore_errors=True)
            remove_empty(self._made)
            raise failure from None
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            remove_empty(self._made)
            raise

    def _failure(self, exc: BaseException) -> CheckpointError:
        return CheckpointError(f"cannot write the {self.what} to {self.target}: "
                               f"{why_write_failed(exc, self.target.parent)}")

    def commit(self) -> None:
        if self.target.is_dir() and self._filled_in_place():
            return
        if not self.replace:
            try:  # one rename: of two writers that both found no folder, the second finds the first's here
                os.rename(self.tmp, self.target)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise self._taken() from None
                raise
            fsync(self.target.parent)
            return
        old = None
        if self.target.exists():
            os.chmod(self.tmp, stat.S_IMODE(os.stat(self.target).st_mode))  # the replaced folder's permissions
            old = _hidden(self.target, "old")
            os.rename(self.target, old)
        try:
            os.rename(self.tmp, self.target)
        except BaseException:
            if old is not None:
                os.rename(old, self.target)
            raise
        fsync(self.target.parent)
        if old is not None:
            remove_aside(old)

    def _taken(self) -> CheckpointError:
        return CheckpointError(f"{self.what} folder {self.target} exists and is not empty")

    def _filled_in_place(self) -> bool:
        """An empty folder made for the write (perhaps a shell's current folder, with its own mode and owner) is
        filled, not swapped for another: each file renamed in, config.json last, so a crash part-way leaves a
        folder that no loader takes for a checkpoint (it has no config.json) rather than a partial one. Under an
        exclusive lock on the folder, so two writers never mix their files; False when it is not empty (any
        more): a checkpoint then replaces it, an export is refused."""
        fd = os.open(self.target, os.O_RDONLY)
        try:
            with contextlib.suppress(ImportError, OSError):  # no flock (Windows, some network file systems)
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed
            if any(self.target.iterdir()):
                if not self.replace:
                    raise self._taken()
                return False
            names = sorted((f.name for f in self.tmp.iterdir()), key=lambda name: (name == CONFIG_FILE, name))
            moved: list[Path] = []
            try:
                for name in names:
                    self._move_in(name)
                    moved.append(self.target / name)
            except BaseException:  # a full volume part-way: the folder is left empty, as it was found
                for path in moved:  # the write fails whole: its staging folder goes too
                    with contextlib.suppress(OSError):
                        path.unlink()
                raise
            fsync(self.target)
            os.rmdir(self.tmp)
            return True
        finally:
            os.close(fd)

    def _move_in(self, name: str) -> None:
        """One staged file into the folder being filled: renamed, or where the folder is a file system of its own
        (an empty volume mounted there, the staging folder beside it on another) copied in under a hidden name
        and renamed there, so no file is ever seen part-written."""
        try:
            os.rename(self.tmp / name, self.target / name)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        part = self.target / f".{name}.part"
        try:
            shutil.copyfile(self.tmp / name, part)
            fsync(part)
            os.rename(part, self.target / name)
        except BaseException:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        os.unlink(self.tmp / name)


def _umask_file_mode(folder: Path) -> int:
    """The mode a new file gets under the current umask (0644 under 022), read from a probe file.

    ``os.umask`` can only be read by setting it, which races with other threads; creating a file
    with mode 0666 and reading back what the kernel kept does not.
    """
    probe = folder / ".mode-probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        probe.unlink()


def remove_folder(path: Path) -> bool:
    """Delete a checkpoint folder so that it is never seen half-deleted: renamed aside (hidden) first.

    A crash during the deletion leaves a hidden ``.NAME.del-*`` folder, which
    no loader lists and ``sweep_folder`` removes later. False when the folder
    could not be renamed (it stays whole).
    """
    aside = _hidden(path, "del")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    remove_aside(aside)
    return True


def remove_aside(folder: Path) -> None:
    """Remove one of the hidden folders of saves and deletions (moved aside here, or left by a killed process),
    whatever its mode: the folder of a read-only checkpoint (mode 0555, replaced by a save) kept its files, and a
    full hidden copy stayed beside the new one without a word."""
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o700)
        for root, dirs, _ in os.walk(folder):
            for name in dirs:
                inner = os.path.join(root, name)
                if not os.path.islink(inner):  # (chmod follows a link: never change a folder outside)
                    os.chmod(inner, 0o700)
    shutil.rmtree(folder, ignore_errors=True)


def _sweep(folder: Path, names: Iterable[str] | None) -> list[Path]:
    wanted = {hidden_form(n): n for n in names} if names is not None else None
    touched = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return touched
    for leftover in entries:
        match = _LEFTOVER.fullmatch(leftover.name)
        if (not match or (wanted is not None and match["name"] not in wanted) or not leftover.is_dir()
                # Another machine's leftovers (shared storage) are never touched: this one cannot tell.
                or not writer_gone(leftover, int(match["pid"]), match["host"] in (None, _host_tag()))):
            continue
        # A shortened long name (only found through the target's own sweep) maps back to the name it stands for.
        target = folder / (wanted[match["name"]] if wanted is not None else match["name"])
        try:
            # The last good checkpoint goes back under its own name, where the name is known (a shortened long
            # one is known only to its target's own sweep; elsewhere it is removed like the rest).
            if match["kind"] == "old" and not target.exists() and (wanted is not None
                                                                    or not _SHORTENED.search(match["name"])):
                os.rename(leftover, target)  # the last good checkpoint, back under its own name
            else:
                remove_aside(leftover)
        except OSError:
            continue
        touched.append(leftover)
    return touched


def sweep_leftovers(target: Path) -> list[Path]:
    """Clear what crashed saves of ``target`` left behind; returns the folders removed or restored.

    Only folders of processes that are gone are touched: their hidden
    ``.NAME.tmp-PID-*`` folders (never renamed into place) and ``.NAME.del-PID-*``
    folders (being deleted) are removed, and a ``.NAME.old-PID-*`` folder (the
    previous checkpoint, moved aside just before the crash) is put back under
    its name if nothing took that name since, else removed. Folders a process
    of another machine left (shared storage) are never touched.
    """
    return _sweep(Path(target).parent, [Path(target).name])


def sweep_folder(folder: Path) -> list[Path]:
    """``sweep_leftovers`` for every name in ``folder`` (a run's ``checkpoints/``)."""
    return _sweep(Path(folder), None)


def sweep_runs(root: Path, checkpoints_dir: str = "checkpoints") -> list[Path]:
    """``sweep_folder`` on the checkpoints of every run folder under ``root`` (where a new run starts)."""
    touched: list[Path] = []
    try:
        runs = [p for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return touched
    for run in runs:
        folder = run / checkpoints_dir
        if folder.is_dir():
            touched += sweep_folder(folder)
    return touched


def file_record(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a file, as config.json records them for every other file of a checkpoint."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}
