"""Run folders: where each run writes its config, tokenizer, metrics and checkpoints.

```
<out>/<run_id>/
    config.json        full config, library versions, device (written at start)
    tokenizer.json     the run's tokenizer
    metrics.jsonl      one event per line, flushed as it happens
    heartbeat.json     while the run's process lives: its pid and host, touched every few seconds
    checkpoints/step_000100/ ...
```
A launcher of several processes creates the folder before it starts them
(``claim_run_dir``: a ``.claim`` file in it until rank 0 takes it over).
``EventTail`` follows a ``metrics.jsonl`` that another process is still writing;
``run_state`` tells a run that is still going from one whose process is gone
(killed, or its machine lost) although its last event is not an ending.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import platform
import re
import secrets
import socket
import stat
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.events import CheckpointFailed, CheckpointSaved, Event, RunFailed, RunFinished, RunStarted, event_from_dict
from core.json_text import finite_json, parse_json
from core.paths import WriterLock, is_locked, user_path, why_not_writable

METRICS_FILE = "metrics.jsonl"
HEARTBEAT_FILE = "heartbeat.json"
CONFIG_FILE = "config.json"
"""The settings file of a run folder, and of a checkpoint folder."""
CHECKPOINTS_DIR = "checkpoints"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def default_out_dir() -> Path:
    """Per-user data folder (``SPEEDBOARD_HOME`` overrides it)."""
    env = os.environ.get("SPEEDBOARD_HOME")
    if env:
        return user_path(env) / "runs"
    import platformdirs

    return user_path(platformdirs.user_data_dir("speedboard")) / "runs"


def run_root(out_dir: str | os.PathLike[str] | None) -> Path:
    """The folder that holds run folders: ``out_dir`` (``~`` expanded, absolute) or the per-user one."""
    return user_path(out_dir) if out_dir else default_out_dir()


RUN_FOLDER_ROOM = 300
"""Bytes a run writes below its run root at most, with a run id as long as the ones it makes: ``RUN_ID/
checkpoints/.step_NNNNNNN.tmp-…/tokenizer_config.json``. A root too long for them is refused before training."""


def check_run_root(out_dir: str | os.PathLike[str] | None) -> Path:
    """The run root, refused in one line (``ConfigError`` on ``out_dir``) when no run folder can be created there.

    Checked before anything is created: a file in the way, a read-only file
    system or a folder without write permission.
    """
    root = run_root(out_dir)
    reason = why_not_writable(root, room=RUN_FOLDER_ROOM)
    if reason:
        where = "SPEEDBOARD_HOME" if not out_dir and os.environ.get("SPEEDBOARD_HOME") else "the output folder"
        raise ConfigError(f"cannot create run folders in {root} ({where}): {reason}", "out_dir")
    # A run folder (or a folder inside one, a checkpoint) is no place for run folders: a new run nested in it
    # without a word, beside its config.json, where --resume was most likely meant.
    run = next((folder for folder in (root, *root.parents) if is_run_dir(folder)), None)
    if run is not None:
        what = "is a run folder" if run == root else f"is inside the run folder {run}"
        raise ConfigError(f"{root} {what}, not a folder for run folders; give the folder that holds it "
                          f"({run.parent}), or --resume {run} to continue that run", "out_dir")
    return root


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


MAX_RUN_ID = 128


def check_run_id(run_id: str) -> str:
    if run_id and len(run_id) > MAX_RUN_ID:
        raise ConfigError(f"run id {run_id[:40]!r}… has {len(run_id)} characters; at most {MAX_RUN_ID}")
    if not _RUN_ID.fullmatch(run_id or ""):
        raise ConfigError(f"run id {run_id!r} must be a plain folder name (ASCII letters, digits, '.', '_', '-', "
                          f"not starting with '.', '_' or '-')")
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
    # An empty id (an unset shell variable) is refused, not replaced by a new one.
    run_id = check_run_id(run_id if run_id is not None else new_run_id(run_tag(config, world_size)))
    return run_id, run_root(config.out_dir) / run_id


def _make_folder(path: Path) -> None:
    """Create ``path`` (and the run root above it); ``FileExistsError`` when it exists, else a ``ConfigError``."""
    try:
        path.mkdir(parents=True, exist_ok=False)  # one mkdir: of two processes asking at once, one gets it
    except FileExistsError:
        raise
    except OSError as exc:
        raise ConfigError(f"cannot create the run folder {path}: {exc.strerror or exc}", "out_dir") from None


def create_run_dir(out_dir: str | Path | None, run_id: str) -> Path:
    """A new, empty run folder; never reuses one, so earlier runs are never touched.

    The one exception is a folder that this process's own launcher claimed for
    it (``claim_run_dir``; its token in ``$SPEEDBOARD_RUN_CLAIM``): that claim
    is taken over, once. ``FileExistsError`` when the folder exists otherwise;
    any other failure to create it is a ``ConfigError`` naming the folder and the reason.
    """
    path = check_run_root(out_dir) / run_id
    try:
        _make_free_folder(path)
    except FileExistsError:
        if not _take_claim(path):
            raise
    return path


# ----------------------------------------------------------------------------- claims
CLAIM_FILE = ".claim"
"""In a run folder that a launcher created for the run its workers will write: the claim's token."""
CLAIM_ENV = "SPEEDBOARD_RUN_CLAIM"
"""The token of the claim, in the environment of the launcher's workers."""


def claim_run_dir(path: Path) -> str:
    """Create the run folder ``path`` now, for a run that processes started later will write; returns the token.

    A launcher (``speedboard train --nproc N``) claims its folder before it
    starts any process: of two jobs given the same run id at the same moment,
    exactly one gets the folder, and the other is refused in one line
    (``ConfigError``) without touching it. The workers' rank 0 takes the claim
    over through ``create_run_dir`` when it finds the token in ``CLAIM_ENV``;
    ``release_run_dir`` removes a claim that no worker took.
    """
    try:
        _make_free_folder(path)
    except FileExistsError:
        raise ConfigError(f"run folder {path} already exists; choose another run id", "run_id") from None
    token = secrets.token_hex(16)
    pending = path / f"{CLAIM_FILE}.{token}"
    try:
        # Written and locked under a name of its own, then renamed (the lock goes with the file): the lock is
        # held while this launcher lives (dropped by the kernel when it dies, kill -9 too), and a claim no
        # launcher holds any more is stale, its folder free again (_clear_stale_claim).
        with open(pending, "x", encoding="utf-8") as f:
            f.write(token)
        _CLAIM_LOCKS[str(path)] = WriterLock(pending)
        os.replace(pending, path / CLAIM_FILE)
    except OSError as exc:  # a full disk: nothing of the claim stays
        lock = _CLAIM_LOCKS.pop(str(path), None)
        if lock is not None:
            lock.release()
        for remove in (pending.unlink, (path / CLAIM_FILE).unlink, path.rmdir):
            try:
                remove()
            except OSError:
                pass
        raise ConfigError(f"cannot create the run folder {path}: {exc.strerror or exc}", "out_dir") from None
    return token


_CLAIM_LOCKS: dict[str, WriterLock] = {}
"""The locks of this process's claims, by folder, until ``release_run_dir``."""


def _make_free_folder(path: Path) -> None:
    """``_make_folder``, once more after removing a stale claim that stood in the way; ``FileExistsError``
    when the folder is taken (a live launcher's claim included: its worker takes it over)."""
    try:
        _make_folder(path)
    except FileExistsError:
        if not _clear_stale_claim(path):
            raise
        _make_folder(path)  # another job may have taken it meanwhile: FileExistsError


def _clear_stale_claim(path: Path) -> bool:
    """Remove a folder that holds nothing but the claim of a launcher that is gone (killed before any worker
    took the claim over: its run id was taken for good); True when it was removed."""
    try:
        if [p.name for p in path.iterdir()] != [CLAIM_FILE] or is_locked(path / CLAIM_FILE):
            return False
        (path / CLAIM_FILE).unlink()
        path.rmdir()
    except OSError:  # not a folder, another process took it meanwhile, or no longer empty
        return False
    return True


def _holds_claim(path: Path, token: str | None) -> bool:
    """Whether ``path`` holds the claim ``token`` (none: no claim is this process's)."""
    try:
        return bool(token) and (path / CLAIM_FILE).read_text(encoding="utf-8") == token
    except (OSError, ValueError):  # taken over already, gone, unreadable or not text
        return False


def _drop_claim(path: Path, token: str) -> bool:
    """Whether ``path`` holds the claim ``token``; its marker is removed then (a claim is dropped once)."""
    if not _holds_claim(path, token):
        return False
    try:
        (path / CLAIM_FILE).unlink()
    except OSError:  # taken over meanwhile
        return False
    return True


def run_id_taken(root: Path, run_id: str) -> bool:
    """Whether the run folder ``root / run_id`` exists other than as this process's launcher's claim: checked
    before a run prepares anything; creating the folder (``create_run_dir``) stays the check that counts."""
    path = root / run_id
    return os.path.lexists(path) and not _holds_claim(path, os.environ.get(CLAIM_ENV)) \
        and not _clear_stale_claim(path)


def _take_claim(path: Path) -> bool:
    """Whether ``path`` holds the claim named in ``CLAIM_ENV``; it is taken over (removed), once."""
    token = os.environ.get(CLAIM_ENV)
    return bool(token) and _drop_claim(path, token)


def release_run_dir(path: Path, token: str) -> None:
    """Remove a claim that no worker took over: its marker, and the folder when nothing else is in it."""
    lock = _CLAIM_LOCKS.pop(str(path), None)
    if lock is not None:
        lock.release()
    if not _drop_claim(path, token):
        return  # taken over (the run's folder now), or gone
    try:
        path.rmdir()  # only an empty folder: whatever a worker wrote stays
    except OSError:
        pass


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(finite_json(data, indent=2, default=str))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


RUN_CONFIG_KEYS = frozenset({
    "run_id", "parent", "config", "device", "precision", "precision_choice", "world_size", "tokens_per_step",
    "budget_tokens", "total_steps", "corpus", "tokenizer", "versions", "split_changes"})
"""What a run folder's ``config.json`` holds: the run's settings under ``config``, and what the run found out."""


class JsonlSink:
    """Appends each event to ``metrics.jsonl`` as one whole line, at once visible to readers.

    A line that cannot be written (a full disk, a file-size limit) is cut off
    again, so the file stays a sequence of whole lines; the call returns False
    and ``error`` keeps the first failure. Later events are tried again (space
    may come back). Safe to call from several threads.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # 0o666 under the umask, as every other file of a run (0o644 kept a group-writable umask from it)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()
        self.error: OSError | None = None
        """The first write that failed, if any."""

    def __call__(self, event: Event) -> bool:
        line = (finite_json(event.to_dict(), default=str) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                return False
            written = 0
            try:
                while written < len(line):
                    written += os.write(self._fd, line[written:])
            except OSError as exc:
                self.error = self.error or exc
                if written:
                    try:
                        os.ftruncate(self._fd, self._size)  # shrinking is allowed on a full disk
                    except OSError:
                        self.close()  # a cut line would stay: write nothing more after it
                return False
            self._size += written
            # Deleted (alone, or with its run folder) while the run writes it: every later line would go to a
            # file no one can read. One stat per event; the caller says it once.
            if os.fstat(self._fd).st_nlink == 0:
                self.error = self.error or FileNotFoundError(
                    errno.ENOENT, "it was deleted while the run wrote it", str(self.path))
                return False
            return True

    def moved_to(self) -> Path | None:
        """Where the file is now, when its folder was moved (renamed) while the run writes it: ``path`` names
        another file or none, and the open file has a name elsewhere (Linux: ``/proc/self/fd``). None when it is
        where it was, deleted, or its new name cannot be told."""
        with self._lock:
            if self._fd is None:
                return None
            mine = os.fstat(self._fd)
            try:
                there = os.stat(self.path)
                if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                    return None
            except OSError:
                pass
            if mine.st_nlink == 0:
                return None
            try:
                now = Path(os.readlink(f"/proc/self/fd/{self._fd}"))
            except OSError:  # not Linux
                return None
            return now if now.name == self.path.name and now.is_absolute() else None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


MAX_EVENT_LINE = 1 << 20
"""Bytes a line of metrics.jsonl may hold; every event Speedboard writes is far shorter (its longest, a run's
start with its whole configuration, a few KB). A longer line is damage, skipped without being held: a 100 MB
first line, joined a 128 KB piece at a time, froze the window that opened its folder for 40 s."""


class EventTail:
    """Reads new complete lines of a ``metrics.jsonl`` on each ``poll()``."""

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        path = user_path(path)
        # A run folder, also one that does not exist yet (a run being started elsewhere).
        self.path = path / METRICS_FILE if path.is_dir() or path.suffix != ".jsonl" else path
        self._offset = offset
        """Bytes already read (start later to skip what an earlier writer left)."""
        self._partial = b""
        """The unfinished last line read, held until its end comes."""
        self._skipped = 0
        """Bytes read of an unfinished line longer than ``MAX_EVENT_LINE``: read on to its end, not held."""
        self._written_at: str | None = None
        """The folder its run recorded (``RunStarted.run_dir``), where that is not the folder read."""
        self._read_at = str(self.path.parent)
        self.behind = False
        """The last poll read only part of what the file held (``max_bytes``)."""

    @property
    def _skipping(self) -> bool:
        """An unfinished line too long to be an event is being read past."""
        return self._skipped > 0

    def poll(self, max_bytes: int | None = None) -> list[Event]:
        """The events of the lines completed since the last poll; with ``max_bytes``, of at most that much of the
        file (``behind`` says whether more was there): a window reads a long file a piece per tick."""
        try:
            # Not blocking: a named pipe in its place would hold the reader (a window) until written to.
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            self.behind = False  # moved or deleted: nothing more to read here (its follower says so)
            return []
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{self.path} is not a regular file (a named pipe or a device); a run writes its "
                              f"{METRICS_FILE} as one")
            size = info.st_size
            if size < self._offset:
                # The writer cut off a line it could not finish (a full disk): go back
                # to the end of the last whole line, which is where the file now ends.
                self._offset -= len(self._partial) + self._skipped
                self._partial, self._skipped = b"", 0
            f.seek(self._offset)
            data = f.read() if max_bytes is None else f.read(max_bytes)
        self._offset += len(data)
        self.behind = self._offset < size
        if self._skipping:  # the rest of a line too long to be an event, up to its end
            rest, newline, data = data.partition(b"\n")
            self._skipped += len(rest)
            if not newline:
                return []
            self._skipped = 0
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        if len(self._partial) > MAX_EVENT_LINE:  # damaged: joined a piece per poll, it took quadratic time
            self._partial, self._skipped = b"", len(self._partial)
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                events.append(self._rebased(event_from_dict(parse_json(line))))
            except (ValueError, TypeError):
                continue  # a line from a newer or damaged writer: skip it, keep following
        return events

    def _rebased(self, event: Event) -> Event:
        """``event`` with its paths inside the folder its run recorded moved to the folder read: a run folder
        copied, moved or mounted elsewhere names its own checkpoints, not those at the path it was written."""
        read_at = self._read_at
        if isinstance(event, RunStarted) and event.run_dir and os.path.normpath(event.run_dir) != read_at:
            self._written_at = os.path.normpath(event.run_dir)
        if self._written_at is None:
            return event
        moved = {}
        for name in _PATH_FIELDS.get(type(event), ()):
            value = getattr(event, name)
            if value and (value == self._written_at or value.startswith(self._written_at + os.sep)):
                moved[name] = read_at + value[len(self._written_at):]
        return replace(event, **moved) if moved else event


_PATH_FIELDS: dict[type, tuple[str, ...]] = {
    RunStarted: ("run_dir",), CheckpointSaved: ("path",), CheckpointFailed: ("path",), RunFinished: ("checkpoint",)}
"""The fields of events that name a file or folder of their run folder."""


def read_events(run_dir: str | Path) -> list[Event]:
    return EventTail(run_dir).poll()


def is_run_dir(path: str | Path) -> bool:
    """A folder a run wrote: it has a metrics.jsonl or a checkpoints folder, or the heartbeat of a run still
    setting up (its first event not yet written), or the claim of a live launcher whose processes are starting
    (``speedboard train --nproc``: seconds before its rank 0 writes anything; a dead launcher's is no run)."""
    path = Path(path)
    try:
        return any((path / name).is_file() for name in (METRICS_FILE, HEARTBEAT_FILE)) or \
            (path / CHECKPOINTS_DIR).is_dir() or launcher_starting(path)
    except OSError:  # a name too long for the system (pathlib passes ENAMETOOLONG on): no run's folder
        return False


# ----------------------------------------------------------------------------- liveness
HEARTBEAT_EVERY_S = 5.0
"""How often a running trainer touches its heartbeat file."""
STALE_AFTER_S = 60.0
"""A heartbeat (or, for runs written before heartbeats, a metrics file) this old means the writer is gone."""


def _host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


class Heartbeat:
    """``heartbeat.json`` in a run folder while the process that writes the run lives.

    A daemon thread touches the file every ``HEARTBEAT_EVERY_S`` seconds (also
    during a long compile or a pause); ``stop`` removes it. After a kill -9 the
    file stays, but its process is gone and it stops being touched: readers
    (``run_state``) then report the run as not running.
    """

    def __init__(self, run_dir: Path, every_s: float = HEARTBEAT_EVERY_S) -> None:
        self.path = Path(run_dir) / HEARTBEAT_FILE
        self.every_s = every_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        """Write the file (its pid and host); raises OSError when it cannot be written."""
        write_json(self.path, {"pid": os.getpid(), "host": _host(), "started": time.time(),
                               "every_s": self.every_s})
        self._thread = threading.Thread(target=self._beat, name="speedboard-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stopped.wait(self.every_s):
            try:
                os.utime(self.path)  # needs no free space
            except OSError:
                pass  # removed from under us, or the disk is gone: readers see it go stale

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self.path.unlink()
        except OSError:
            pass


def writer_alive(run_dir: str | Path, now: float | None = None, stale_after: float = STALE_AFTER_S) -> bool:
    """Whether the process writing ``run_dir`` still lives, from its heartbeat (cheap: no metrics are read).

    On this machine its pid is asked directly; from another machine (shared
    storage) only the age of the heartbeat tells. A run folder written before
    heartbeats existed is judged by the age of its ``metrics.jsonl``.
    """
    run_dir = user_path(run_dir)
    now = time.time() if now is None else now
    beat = run_dir / HEARTBEAT_FILE
    try:
        age = now - beat.stat().st_mtime
        info = parse_json(beat.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        if launcher_starting(run_dir):
            return True
        try:
            return now - (run_dir / METRICS_FILE).stat().st_mtime < stale_after
        except OSError:
            return False
    if age > stale_after:
        return False
    if isinstance(info, dict) and info.get("host") == _host() and isinstance(info.get("pid"), int):
        return _pid_alive(info["pid"])
    return True


def launcher_starting(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds the claim of a launcher that lives and whose rank 0 has not taken it over yet:
    a job whose processes are starting (the claim's lock is held while its launcher lives)."""
    return is_locked(Path(run_dir) / CLAIM_FILE)


@dataclass(frozen=True)
class RunState:
    """Where a run folder's run stands, as a reader can tell."""

    state: str
    """``running``, ``finished``, ``stopped``, ``failed``, or ``not running`` (no ending, and no live writer)."""
    message: str = ""
    """Why: the failure's message, or how a run without an ending was judged."""

    @property
    def ended(self) -> bool:
        return self.state != "running"


def run_state(run_dir: str | Path, events: list[Event] | None = None, now: float | None = None,
              stale_after: float = STALE_AFTER_S) -> RunState:
    """The state of the run in ``run_dir``: its recorded ending, else whether its writer still lives.

    ``events`` are the folder's events when the caller already follows them
    (``EventTail``); otherwise they are read. A run whose process was killed
    (kill -9, a lost machine) records no ending: it is ``not running`` once its
    heartbeat is stale or its process is gone.
    """
    run_dir = user_path(run_dir)
    for event in reversed(read_events(run_dir) if events is None else events):
        if isinstance(event, RunFinished):
            return RunState("stopped" if event.stopped else "finished")
        if isinstance(event, RunFailed):
            return RunState("failed", event.message)
    if writer_alive(run_dir, now, stale_after):
        return RunState("running")
    return RunState("not running", "the run recorded no ending and its process is gone (killed, or its "
                                   "machine stopped)")
