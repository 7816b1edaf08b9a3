"""Paths a user gives, resolved once and the same way, and checked before anything is written.

Every path that enters from outside (a flag, an environment variable, a
dialog, an API argument) goes through ``user_path``: ``~`` is expanded and a
relative path is made absolute against the current folder, so the run
folder, its metrics and its checkpoints always land in the same place.
``why_not_writable`` says, without creating anything, why a folder cannot be
created or written at a path; ``why_write_failed`` turns a failed write into
a reason a person can act on (a full disk, a file-size limit).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path


def numbered(path: Path, count: int = 999) -> Iterator[Path]:
    """``path``, then ``path`` with ``-2``, ``-3``, … before its suffix: the names a report of a default (time
    stamped) name takes where another of the same second has one."""
    yield path
    for n in range(2, count + 1):
        yield path.with_name(f"{path.stem}-{n}{path.suffix}")


def user_path(value: str | os.PathLike[str]) -> Path:
    """``value`` as the user meant it: ``~`` expanded, made absolute (symbolic links are kept)."""
    return Path(os.path.abspath(_expand_home(os.fspath(value))))


def written_through(path: Path) -> Path:
    """Where a file written at ``path`` lands: the file a symbolic link names (its links followed to the end),
    so a write by rename goes through the link as ``>`` does, instead of replacing the link with a file."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _expand_home(text: str) -> str:
    """``os.path.expanduser``, except that an empty ``HOME`` is no home: Python's took it for the root (``~/runs``
    was ``/runs``); the account's own home folder is used, as where ``HOME`` is unset."""
    if os.environ.get("HOME") == "" and (text == "~" or text.startswith("~/")):
        try:
            import pwd

            return pwd.getpwuid(os.getuid()).pw_dir + text[1:]
        except (ImportError, KeyError):  # no account database entry (or no pwd: Windows)
            return text
    return os.path.expanduser(text)


def locale_free(name: str) -> str:
    """A file name as its bytes read in UTF-8 (bytes that are no UTF-8 kept as surrogates): Python decodes names
    in the locale's encoding, so one file's name was another string under LC_ALL=C or a Latin-1 locale, and a
    corpus' store, keyed by it, was not found. Under a UTF-8 locale it is the name as Python gives it."""
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:  # a name recorded under another locale (a manifest's): text, read as UTF-8
        raw = name.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "surrogateescape")


def unnameable(path: str | os.PathLike[str], room: int = 0) -> str | None:
    """Why the operating system cannot name ``path`` (a part longer than its file system allows, or the whole
    longer than a path may be), or None. Asked before anything looks at it: ``stat`` of such a path raises
    "File name too long" where a missing file was expected. ``room``: bytes of the paths written below it (a
    run's checkpoints), which must fit too: found after training, a checkpoint was lost to them."""
    target = user_path(path)
    existing = next((p for p in (target, *target.parents) if os.path.lexists(p)), Path(target.anchor or "/"))
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    length = len(os.fsencode(target))
    if length >= path_max:
        return f"the path is {length:,} bytes long: more than the {path_max - 1:,} a path may have"
    if length + room >= path_max:
        return (f"the path is {length:,} bytes long: with the {room} bytes of what is written below it, more than "
                f"the {path_max - 1:,} a path may have")
    for part in target.parts:
        if len(os.fsencode(part)) > name_max:
            return (f"a name in the path is {len(os.fsencode(part)):,} bytes long: more than the {name_max} "
                    f"its file system allows ({part[:24]}…)")
    return None


def missing_folders(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: what creating it would create."""
    missing, target = [], user_path(path)
    for folder in (target, *target.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Remove those of ``folders`` (deepest first) that are empty: what a refused command created on its way."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _limit(path: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):  # no such limit here (or not a file system that says)
        return default


def process_alive(pid: int) -> bool:
    """Whether a process of this number runs on this machine (signal 0 only asks). One that belongs to
    someone else, or that the OS will not say about, counts as alive: what it may own is left alone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class WriterLock:
    """An advisory lock (``flock``) a writer holds on its temporary file or folder while it writes it.

    Sweeps of what dead writers left judge a writer by the process number in its temporary name, which means
    nothing in another PID namespace: two containers on one machine sharing a cache or a runs folder removed
    each other's folders mid-write. The lock is held by the open file, wherever its process' number lives,
    and the kernel drops it when the process dies. Where there is no ``flock`` (Windows) it holds nothing."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd: int | None = None
        try:
            import fcntl
        except ImportError:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without locks: the process number alone judges it
            os.close(fd)
            return
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether some process holds a ``WriterLock`` on ``path`` (this one included)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the lock just taken, if any
    return False


def writer_gone(path: str | os.PathLike[str], pid: int, same_host: bool) -> bool:
    """Whether what a writer left at ``path`` (its process number ``pid`` in its name) may be removed: written
    on this machine, by a process no longer running here, and not locked by a live writer (one of another PID
    namespace, whose number means nothing here). Another machine's leftovers are never judged."""
    return same_host and pid != os.getpid() and not process_alive(pid) and not is_locked(path)


_PROBE = re.compile(r"\.probe-(?:(?P<host>.+)-(?P<pid>\d+)-)?[a-z0-9_]+")
_PROBE_STALE_S = 60.0
"""Age past which a write probe is a leftover whoever made it: one lives for microseconds."""


def probe_prefix() -> str:
    """How a write probe's name begins (a file created and deleted at once to see that a folder can be written):
    with the machine and process that made it, so that a sweep knows one left by a killed process."""
    return f".probe-{socket.gethostname()}-{os.getpid()}-"


def sweep_probes(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the write probes in ``folder`` left by processes killed between creating and deleting them: made
    on this machine by a process now gone, or older than any probe lives (of another machine, another PID
    namespace or an earlier version's name). A live prober whose probe is removed loses nothing by it."""
    removed: list[Path] = []
    host, now = socket.gethostname(), time.time()
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            m = _PROBE.fullmatch(entry.name)
            if m is None:
                continue
            try:
                old = now - entry.lstat().st_mtime > _PROBE_STALE_S
            except OSError:  # deleted meanwhile by its prober
                continue
            if old or m["pid"] is not None and writer_gone(entry, int(m["pid"]), m["host"] == host):
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry)
    return removed


def fsync(path: str | os.PathLike[str]) -> None:
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


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): os.access alone decides
        return False


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists and is not a regular file ("a folder", "a named pipe", …): a file written
    there by a rename would replace it, or fail only after the work that made it. None when it is a regular file
    or absent (a broken link included)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), None)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character(path: str | os.PathLike[str]) -> str | None:
    """Why a name that writing ``path`` would create is refused: it holds a control character (a line break,
    a tab, an escape), with which every message, log line and listing that names it breaks; None otherwise.
    Names that exist already are the user's own and are taken as they are."""
    for folder in missing_folders(path):
        if (found := _CONTROL.search(folder.name)) is not None:
            return (f"the name {folder.name!r} holds a control character ({found.group()!r}), which would break "
                    f"every line that names it; choose another name")
    return None


def not_there(path: str | os.PathLike[str]) -> str:
    """How ``path``, found missing, is missing: "does not exist", or the symbolic link that leads nowhere (a link
    loop read as "does not exist", though the link was there to see)."""
    try:
        target = os.readlink(path)
    except OSError:  # no link: nothing there
        return "does not exist"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link that loops back on itself"
    return f"is a broken symbolic link (to {target}, which does not exist)"


def why_not_writable(path: str | os.PathLike[str], room: int = 0) -> str | None:
    """Why a folder cannot be created (or written into) at ``path``; None when nothing stands in the way.

    Looks at the nearest part of the path that exists: a file there, a
    read-only file system or a folder without write permission is the reason.
    Nothing is created.
    """
    target = user_path(path)
    if (why := unnameable(target, room) or control_character(target)) is not None:
        return why
    probe = target
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        probe = probe.parent
    if probe.is_symlink() and not probe.exists():
        return f"{probe} is a broken symbolic link"
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if _read_only(probe):
        return f"{probe} is on a read-only file system"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable (permission denied)"
    return None


_DISK_FULL_BYTES = 1 << 20
"""Below this much free space, a failed write is put down to a full disk."""


def _file_size_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _errno_of(exc: BaseException) -> int | None:
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno
    # safetensors (Rust) reports "I/O error: File too large (os error 27)"
    text = str(exc)
    marker = "(os error "
    at = text.rfind(marker)
    if at >= 0:
        digits = text[at + len(marker):].split(")")[0]
        if digits.isdigit():
            return int(digits)
    return None


def why_write_failed(exc: BaseException, where: str | os.PathLike[str]) -> str:
    """A reason a person can act on for a write under ``where`` that raised ``exc``.

    Libraries report a full disk in their own words (``torch.save``: "unexpected
    pos …"; safetensors: "File too large (os error 27)"), so the disk itself is
    asked as well: its free space and the process's file-size limit.
    """
    code = _errno_of(exc)
    limit = _file_size_limit()
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return "no space left on the device" if code == errno.ENOSPC else "the disk quota is used up"
    if code == errno.EFBIG:
        return (f"a file reached the file-size limit of {limit:,} bytes (ulimit -f)" if limit is not None
                else "a file grew beyond what the file system allows")
    if code is not None and isinstance(exc, OSError):
        return exc.strerror or os.strerror(code)
    # No error number: ask the disk.
    probe = user_path(where)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    if free is not None and free < _DISK_FULL_BYTES:
        return f"the disk is full ({free:,} bytes free)"
    if limit is not None:
        return f"a file may have reached the file-size limit of {limit:,} bytes (ulimit -f)"
    from core.errors import first_line

    return f"{type(exc).__name__}: {first_line(exc, 160)}"


# ----------------------------------------------------------------------------- private temporary folders
def temp_folder_name(prefix: str) -> Path:
    """A name for a private temporary folder, chosen before the folder exists: made with ``mkdir`` inside the block
    that removes it (``remove_tree``), no signal can leave it behind. ``tempfile.mkdtemp`` makes it in its own
    Python, where a SIGTERM landing after its mkdir raised with the folder made and its name not yet known."""
    import secrets
    import tempfile

    return Path(tempfile.gettempdir()) / f"{prefix}{secrets.token_hex(6)}"


def remove_tree(folder: str | os.PathLike[str]) -> None:
    """Remove ``folder`` and what it holds, also when a signal's exception (a SIGTERM raised again after Python
    discarded it) cuts the first removal short: it is removed again, then the exception goes on.

    The signal's exception, not what it set off: raised inside rmtree's own clean-up, it made rmtree close a
    folder's descriptor twice, and the OSError (EBADF) that took its place was a traceback with exit code 1
    where SIGTERM ends in one line, 143."""
    try:
        shutil.rmtree(folder, ignore_errors=True)
    except BaseException as exc:
        signalled = exc.__context__ if isinstance(exc, OSError) else None
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(signalled, KeyboardInterrupt):  # JobTerminated and HungUp are too
            raise signalled from None
        raise



LONG_NAME_BYTES = 150
"""A name longer than this is carried by the hidden files and folders written beside it shortened
(``hidden_form``): with a process number, a host or random parts added, a name of 235-255 bytes (which the file
system allows) made a hidden name past its 255, and the write was refused as "File name too long"."""


def hidden_form(name: str) -> str:
    """``name`` as a hidden file or folder beside it carries it: whole, or (long) its first 100 bytes, ``~`` and a
    hash of it all."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= LONG_NAME_BYTES:
        return name
    start = data[:100].decode("utf-8", "ignore")  # whole characters only
    return f"{start}~{hashlib.sha256(data).hexdigest()[:12]}"
