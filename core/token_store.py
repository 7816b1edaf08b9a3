"""The prepared token store: a corpus tokenized once, opened in place at every later start.

```
<cache>/stores/<key>/                 key = sha256(format, source fingerprint, tokenizer JSON)
    tokens.bin        [BOS] doc [EOS] of every document, concatenated: uint16 when every
                      token id is below 65,536, else uint32 (nanoGPT's flat file)
    offsets.bin       uint64, documents + 1 entries: where each document starts, then the total
                      (Megatron's indexed dataset: the document boundaries beside the tokens)
    tokenizer.json    the tokenizer the tokens belong to
    manifest.json     format version, source (files, sizes), fingerprint, tokenizer hash and
                      special tokens, dtype, documents, tokens, a sampled digest; written last
```

Writing is atomic: everything goes into a hidden ``.tmp-…`` folder, is flushed,
and the folder is renamed into place only when complete. A crash, a full disk
or a cancelled preparation leaves at most that hidden folder (which no reader
accepts, and the next preparation on this machine removes once its process is
gone). One process prepares a given corpus at a time (a lock file per source, gone with its holder);
the others wait for it, then read the same files.

Training reads a store with positional reads (``os.pread``) of the rows each
batch needs, not through a memory map: the pages a mapping touches count in the
process' resident set, which would grow towards the whole token file over an
epoch (nanoGPT maps its file afresh for every batch for this reason) and make
the CPU's training-memory figure a measure of how much corpus was read. Read
this way, the kernel's page cache keeps what is read hot and the process holds
only the batch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import Cancelled, DataError, SourceChanged, first_line
from core.json_text import parse_json
from core.paths import (
    WriterLock,
    fsync,
    locale_free,
    probe_prefix,
    sweep_probes,
    why_not_writable,
    why_write_failed,
    writer_gone,
)
from core.sources import Continued, Source, sampled_sha256, source_location
from core.stopping import native_worker, removed_on_forced_exit
from core.tokenizer import TOKENIZER_FILE, BPETokenizer, cache_dir, iter_pieces

STORE_FORMAT = "speedboard-token-store"
STORE_VERSION = 2
"""2: the names of special tokens inside a document are text (1 turned them into the tokens)."""
MANIFEST, TOKENS, OFFSETS, TOKENIZER = "manifest.json", "tokens.bin", "offsets.bin", TOKENIZER_FILE
_REMOVED = ".removed-"
_LOCK = ".lock-"
_TMP = re.compile(r"\.tmp-(?P<key>[0-9a-f]+)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+")


def stores_dir() -> Path:
    return cache_dir() / "stores"


def tokenizer_sha256(tokenizer: BPETokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def store_key(fingerprint: str, tokenizer_hash: str) -> str:
    return hashlib.sha256(f"{STORE_FORMAT}-{STORE_VERSION}:{fingerprint}:{tokenizer_hash}".encode()).hexdigest()[:32]


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest dtype for ids below ``vocab_size`` (``BPETokenizer.vocab_size``: highest id + 1, which
    a vocabulary with holes has above its number of entries)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _seek_read(fd: int, size: int, offset: int, lock: threading.Lock) -> bytes:
    """A positional read where the system has none (Windows): a seek and a read, one reader at a time."""
    with lock:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)


def _positional_read(fd: int, size: int, offset: int, lock: threading.Lock) -> bytes:
    return os.pread(fd, size, offset)  # thread-safe: the file's position is not used


_pread = _positional_read if hasattr(os, "pread") else _seek_read


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class TokenStore:
    """An opened store, its two files held open (a store removed meanwhile stays readable, POSIX)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path, self.manifest = path, manifest
        self.dtype = np.dtype(manifest["dtype"])
        self._fds = {name: os.open(path / name, os.O_RDONLY | getattr(os, "O_BINARY", 0)) for name in (TOKENS, OFFSETS)}
        self._seek_lock = threading.Lock()
        weakref.finalize(self, _close_all, list(self._fds.values()))

    def _read(self, name: str, offset: int, size: int) -> bytes:
        data = _pread(self._fds[name], size, offset, self._seek_lock)
        if len(data) != size:  # the file was cut short after it was opened and checked
            raise damaged_store(self.path, f"{name} ends before byte {offset + size:,}")
        return data

    def read_rows(self, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
        """Row i: the ``lengths[i]`` (at most ``width``) tokens from token ``starts[i]``, then zeros; in the
        store's dtype. One read per row: 16 rows of 129 tokens take ~20 µs, a memory map's slice ~6 µs."""
        size = self.dtype.itemsize
        out = np.zeros((len(starts), width), dtype=self.dtype)
        flat, row = memoryview(out.reshape(-1).view(np.uint8)), width * size  # the rows' bytes, written in place
        for k, (start, n) in enumerate(zip(np.asarray(starts).tolist(), np.asarray(lengths).tolist(), strict=True)):
            assert 0 <= n <= width, "a row longer than the batch's width"
            flat[k * row: k * row + n * size] = self._read(TOKENS, start * size, n * size)
        return out

    def document_bounds(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first token, end) of each of these documents, as int64."""
        data = b"".join([self._read(OFFSETS, i * 8, 16) for i in np.asarray(indices).tolist()])
        bounds = np.frombuffer(data, dtype=np.uint64).reshape(-1, 2).astype(np.int64)
        return bounds[:, 0], bounds[:, 1]

    @property
    def tokens(self) -> np.ndarray:
        """The token file as a read-only memory map, mapped afresh at each access: for inspection (what is
        read through it leaves the resident set with the array)."""
        return np.memmap(self.path / TOKENS, dtype=self.dtype, mode="r", shape=(self.num_tokens,))

    @property
    def offsets(self) -> np.ndarray:
        """The document offsets as a read-only memory map, mapped afresh at each access: for inspection."""
        return np.memmap(self.path / OFFSETS, dtype=np.uint64, mode="r", shape=(self.num_documents + 1,))

    @property
    def num_documents(self) -> int:
        return int(self.manifest["documents"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["tokens"])

    @property
    def digest(self) -> str:
        """Identifies the tokens themselves (counts and sampled content): equal on every machine that
        prepared the same corpus with the same tokenizer, whatever the files' times."""
        return self.manifest["digest"]

    @classmethod
    def open(cls, path: Path) -> TokenStore:
        """Open a complete store; DataError if it is not one (damaged, older format, cut short)."""
        try:
            manifest = parse_json((path / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"token store {path} has no readable manifest ({exc})") from None
        damage = _damage(manifest)
        if damage is None and (manifest.get("format") != STORE_FORMAT or manifest.get("version") != STORE_VERSION):
            raise DataError(f"token store {path} has another format ({manifest.get('format')} "
                            f"{manifest.get('version')}); remove it (speedboard prepare --remove) to prepare the "
                            f"corpus again")
        if damage is None and any(manifest.get(k) is None for k in ("dtype", "documents", "tokens")):
            damage = "its manifest has no dtype, documents or tokens"
        if damage is None and _vocab_size(manifest) is None:  # what every id read is checked against
            damage = "its manifest has no vocabulary size"
        if damage is not None:
            raise damaged_store(path, damage)
        try:
            return cls._checked(path, manifest)
        except OSError as exc:  # removed or made unreadable while it was checked (a prepare --remove elsewhere)
            raise DataError(f"token store {path} cannot be read ({exc.strerror or exc})") from None

    @classmethod
    def _checked(cls, path: Path, manifest: dict[str, Any]) -> TokenStore:
        docs, toks = manifest["documents"], manifest["tokens"]
        damage = _files_damage(path, manifest)
        if damage is not None:
            raise damaged_store(path, damage)
        if _digest(path, docs, toks) != manifest.get("digest"):
            raise damaged_store(path, "its content does not match its manifest")
        damage = _offsets_damage(path / OFFSETS, toks)
        if damage is not None:
            raise damaged_store(path, damage)
        return cls(path, manifest)

    @property
    def vocab_size(self) -> int:
        """Highest token id + 1 of the store's tokenizer, as its manifest says (checked at opening, and against
        the tokenizer the store is found by)."""
        vocab = _vocab_size(self.manifest)
        assert vocab is not None, "a store's manifest is checked for its vocabulary size when it is opened"
        return vocab

    def check_ids(self, rows: np.ndarray) -> None:
        """DataError if ``rows`` (read from this store) hold an id the tokenizer never gives: the sampled digest
        at opening cannot see every byte of a large store, so what is read is checked as it is read."""
        vocab = self.vocab_size
        if rows.size == 0:
            return
        top = int(rows.max())
        if top >= vocab:
            raise damaged_store(self.path, f"token id {top:,} is beyond its vocabulary of {vocab:,}")

    def tokenizer(self) -> BPETokenizer:
        return BPETokenizer.load(self.path / TOKENIZER)


def damaged_store(path: Path, damage: str) -> DataError:
    """The one-line error of a store found damaged, saying what is wrong and how to prepare it again."""
    return DataError(f"token store {path} is damaged ({damage}); remove it (speedboard prepare --remove) to "
                     f"prepare the corpus again")


_MANIFEST_TYPES = {"created": str, "fingerprint": str, "digest": str, "dtype": str, "documents": int, "tokens": int,
                   "source": dict, "tokenizer": dict}


def _vocab_size(manifest: dict[str, Any]) -> int | None:
    value = (manifest.get("tokenizer") or {}).get("vocab_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _files_damage(path: Path, manifest: dict[str, Any]) -> str | None:
    """A token or offsets file missing or not of the size its (well-formed) manifest gives it, or None: a stat
    each, cheap enough for a listing."""
    dtype = np.dtype(manifest["dtype"])
    for name, expected in ((TOKENS, manifest["tokens"] * dtype.itemsize), (OFFSETS, (manifest["documents"] + 1) * 8)):
        if not (path / name).is_file():
            return f"{name} is missing"
        size = (path / name).stat().st_size
        if size != expected:
            return f"{name} has {size:,} bytes, not {expected:,}"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _damage(manifest: Any) -> str | None:
    """What keeps a parsed manifest from describing a store (a hand edit, a damaged disk), or None: a manifest is
    written whole, so another shape or a field of another type is never one this code wrote."""
    if not isinstance(manifest, dict):
        return "its manifest is no JSON object"
    for key, kind in _MANIFEST_TYPES.items():
        value = manifest.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)
                                  or key == "dtype" and value not in ("uint16", "uint32")
                                  or kind is int and value < 0):
            return f"its manifest's {key} is {_shown(value)}"
    return None


_OFFSETS_CHUNK = 1 << 20
"""Offsets compared at a time on opening: 8 MiB; FineWeb's sample-10BT (~15 M documents) takes ~10 ms warm."""


def _offsets_damage(path: Path, tokens: int) -> str | None:
    """What is wrong with a store's document offsets, or None: the first at 0, the last at the token count, each
    document at least one token (its BOS) long. Read whole (8 bytes a document) where the digest samples, by
    reads rather than a memory map, so that none of it stays resident."""
    with open(path, "rb") as f:
        first = int(np.fromfile(f, dtype=np.uint64, count=1)[0])
        f.seek(-8, os.SEEK_END)
        last = int(np.fromfile(f, dtype=np.uint64, count=1)[0])
        if first != 0 or last != tokens:
            return f"its offsets run from {first:,} to {last:,}, not from 0 to {tokens:,}"
        f.seek(0)
        previous, start = np.empty(0, dtype=np.uint64), 0  # the chunk before's last offset; the chunk's first index
        while (chunk := np.fromfile(f, dtype=np.uint64, count=_OFFSETS_CHUNK)).size:
            joined = np.concatenate((previous, chunk))
            growing = joined[1:] > joined[:-1]
            if not growing.all():  # offsets j and j + 1 bound document j + 1 (counted from 1)
                return f"document {start - len(previous) + int(np.argmin(growing)) + 1:,} ends before it starts"
            start, previous = start + len(chunk), chunk[-1:]
    return None


def _digest(path: Path, documents: int, tokens: int) -> str:
    h = hashlib.sha256(f"{documents}:{tokens}".encode())
    for name in (TOKENS, OFFSETS):
        h.update(sampled_sha256(path / name, (path / name).stat().st_size).encode())
    return h.hexdigest()


def _complete(path: Path, tokenizer: BPETokenizer) -> bool:
    try:
        _open_for(path, tokenizer)
    except (DataError, OSError):
        return False
    return True


def _open_for(path: Path, tokenizer: BPETokenizer) -> TokenStore:
    """The complete store at ``path``, made with ``tokenizer``: ids are checked against the manifest's vocabulary as
    they are read, so it must be the model's."""
    store = TokenStore.open(path)
    if store.vocab_size != tokenizer.vocab_size:
        raise damaged_store(path, f"its manifest's vocabulary is {store.vocab_size:,} tokens, its tokenizer's "
                                  f"{tokenizer.vocab_size:,}")
    # Its documents are framed by the BOS and EOS ids it was made with: a store of the same tokenizer file whose
    # roles were chosen otherwise (an earlier version took a text piece "<s>" over a special [BOT]) is not this one.
    made = store.manifest["tokenizer"]
    for role, now in (("bos", tokenizer.bos_id), ("eos", tokenizer.eos_id)):
        if f"{role}_id" in made and made[f"{role}_id"] != now:
            raise damaged_store(path, f"its documents are framed by {role.upper()} id {made[f'{role}_id']}, its "
                                      f"tokenizer's {role.upper()} is id {now}")
    return store


def find_store(fingerprint: str, tokenizer: BPETokenizer) -> TokenStore | None:
    """The complete store of this corpus and tokenizer, if one was prepared."""
    path = stores_dir() / store_key(fingerprint, tokenizer_key(tokenizer))
    if not (path / MANIFEST).is_file():
        return None
    return _open_for(path, tokenizer)


def ensure_writable(folder: Path) -> None:
    """Fail in one line, before anything is created, where the cache cannot be written."""
    def refused(why: str) -> DataError:
        return DataError(f"cannot write to the cache folder {folder} ({why}); set SPEEDBOARD_CACHE_DIR to a "
                         f"writable folder")

    if (why := why_not_writable(folder)) is not None:  # a broken link said as one, not as "File exists"
        raise refused(why)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = _mkstemp(folder)
        try:
            os.close(fd)
        finally:  # whatever stops it here (SIGTERM's JobTerminated too) deletes the probe
            with contextlib.suppress(FileNotFoundError):  # swept by another process meanwhile
                os.unlink(probe)
    except OSError as exc:
        raise refused(exc.strerror or str(exc)) from None


def _mkstemp(folder: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=probe_prefix(), dir=folder)


# ----------------------------------------------------------------------------- one preparer at a time
@contextlib.contextmanager
def preparation_lock(fingerprint: str, on_wait: Callable[[], None] | None = None,
                     should_stop: Callable[[], bool] | None = None, location: str = "") -> Iterator[None]:
    """Hold the lock of this corpus (an ``flock`` on ``stores/.lock-<fingerprint>``); wait while another
    process holds it (``on_wait`` once, ``should_stop`` polled: a stop request raises Cancelled). The holder
    writes ``location`` (``source_location``) into it, so that ``preparations_of`` finds it by its corpus.

    The holder deletes the lock file as it lets go, so none piles up. A process that opened the file before it
    was deleted holds a lock on a name nobody uses any more: it sees so (the name is gone or names another
    file) and tries again on the file now there."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the atomic rename still keeps every store whole
        yield
        return
    lock = stores_dir() / f"{_LOCK}{fingerprint[:32]}"
    waited = False
    while True:
        # (Made again each time: a cache folder deleted while this process waited was a FileNotFoundError
        # traceback here; it now prepares the corpus itself.)
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited and on_wait is not None:
                        on_wait()
                    waited = True
                    if should_stop is not None and should_stop():
                        raise Cancelled("stopped while waiting for another process preparing this corpus") from None
                    time.sleep(0.2)
            if _names_this_file(lock, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder before this one deleted it: lock the file under that name now
    with contextlib.suppress(OSError):  # only a label: a full disk must not stop the preparation
        os.ftruncate(fd, 0)
        os.pwrite(fd, location.encode("utf-8", "surrogateescape"), 0)
    with removed_on_forced_exit(lock):  # held: a forced exit deletes it as its holder would
        try:
            yield
        finally:
            # Deleted while held, then closed (which lets go): nobody can lock this name's file in between.
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)


def preparations_of(location: str | None) -> list[str]:
    """The fingerprints (as lock names hold them) of the preparations of the corpus at ``location`` (of every
    corpus for None) that hold their lock now, or held it when killed: ``prepare --remove`` waits for them (taking
    the lock), or their stores would appear after it. Read, never locked here: a preparer starting meanwhile must
    not be made to wait."""
    folder = stores_dir()
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        if not entry.name.startswith(_LOCK):
            continue
        try:
            label = entry.read_bytes().decode("utf-8", "surrogateescape")
        except OSError:  # let go of and deleted meanwhile
            continue
        if label and (location is None or _same_place(label, location)):
            found.append(entry.name[len(_LOCK):])
    return sorted(found)


def _same_place(label: str, location: str) -> bool:
    """Two locations of one corpus: the same text, or paths that lead to the same file through symbolic links (a
    preparation started through a link to the corpus' folder was not waited for by a removal of its real path)."""
    if locale_free(label) == locale_free(location):
        return True
    if not (os.path.isabs(label) and os.path.isabs(location)):  # builtin, hf:NAME
        return False
    with contextlib.suppress(OSError, ValueError):
        return os.path.realpath(label) == os.path.realpath(location)
    return False


def _names_this_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def sweep_stale(folder: Path | None = None) -> list[Path]:
    """Remove hidden folders of preparations whose process on this machine is gone (killed, crashed), of
    removals cut short (``remove_store`` renames a store aside, then deletes it: what is aside is never used),
    the write probes of killed processes (``ensure_writable``) and the lock files they held
    (``preparation_lock``)."""
    folder = folder or stores_dir()
    removed = []
    if not folder.is_dir():
        return removed
    removed += sweep_probes(folder)
    host = socket.gethostname()
    for entry in folder.iterdir():
        if _left_behind(entry, host):
            _delete(entry)
            removed.append(entry)
        elif entry.name.startswith(_LOCK) and _remove_unheld_lock(entry):
            removed.append(entry)
    return removed


def _left_behind(entry: Path, host: str) -> bool:
    """A half store whose preparation is gone, or a store renamed aside by a removal cut short."""
    m = _TMP.fullmatch(entry.name)
    return bool(m and entry.is_dir() and writer_gone(entry, int(m["pid"]), m["host"] == host)
                or entry.name.startswith(_REMOVED))


def leftovers() -> list[tuple[Path, int]]:
    """What ``sweep_stale`` would delete of the stores folder (half stores of killed preparations, removals cut
    short) with its size on disk, left in place: ``prepare --list`` names the room they hold."""
    folder, host, found = stores_dir(), socket.gethostname(), []
    if not folder.is_dir():
        return found
    for entry in sorted(folder.iterdir()):
        try:
            if _left_behind(entry, host):
                found.append((entry, sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())))
        except FileNotFoundError:  # swept meanwhile by another process: gone, as it would be
            continue
    return found


def _remove_unheld_lock(lock: Path) -> bool:
    """Delete a lock file nobody holds (its holder was killed before it could), as a holder lets go of it: locked,
    deleted, closed. One held now, or locked by another in between, stays (``preparation_lock`` tells a waiter
    whose file was deleted so)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(lock, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _names_this_file(lock, fd):
            return False
        os.unlink(lock)
        return True
    except OSError:  # BlockingIOError: held
        return False
    finally:
        os.close(fd)


def _delete(path: Path) -> None:
    """A folder with what it holds, or a file (something else lying where a store belongs, renamed aside)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# ----------------------------------------------------------------------------- writing
def _plain_roles(tok, tokenizer: BPETokenizer) -> list:
    """The added tokens of ``tok`` that are ``tokenizer``'s BOS, EOS or PAD but not marked special."""
    roles = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token} - {None}
    return [t for t in tok.get_added_tokens_decoder().values() if t.content in roles and not t.special]


def tokenizer_key(tokenizer: BPETokenizer) -> str:
    """What a store's key takes of its tokenizer: its hash, whether a plain-token BOS/EOS/PAD is read as text in
    documents (stores written before that was so hold it mid-document: they are not reused), and its roles where a
    ``tokenizer_config.json`` chose others than the file's own names give (the same file with and without one
    shared a key, and each preparation replaced the other's store)."""
    plain = _plain_roles(tokenizer.tok, tokenizer)
    key = tokenizer_sha256(tokenizer) + (":plain roles read as text" if plain else "")
    roles = (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
    named = BPETokenizer(tokenizer.tok)
    if roles != (named.bos_id, named.eos_id, named.pad_id):
        key += ":roles " + "/".join(str(i) for i in roles)
    return key


def plain_text_tokenizer(tokenizer: BPETokenizer):
    """A copy of ``tokenizer.tok`` that reads the names of special tokens inside a document as text.

    HF tokenizers turn "<|endoftext|>" or "[EOT]" written in a document into the special token itself (even
    without ``add_special_tokens``): a web page quoting it would end its document mid-text. The store holds
    BOS/EOS where Speedboard puts them only (nanoGPT's ``encode_ordinary``). A BOS, EOS or PAD that the file
    adds as a plain token (``"special": false``), which that setting would still match, is made special in the
    copy. The tokenizer saved and hashed stays the original.
    """
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(tokenizer.to_str())
    plain = _plain_roles(tok, tokenizer)
    if plain:  # added again as special: the same ids, now read as text inside a document
        tok.add_special_tokens([AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                                           normalized=t.normalized, special=True) for t in plain])
    tok.encode_special_tokens = True
    return tok


@dataclass
class _Unit:
    """One encoding job: texts that are whole documents or pieces of a long one, each with its document's number in
    the corpus (from 0), whether it opens the document (BOS before it) and closes it (EOS after it)."""

    texts: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    opens: list[bool] = field(default_factory=list)
    closes: list[bool] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)
    """A long document's start, to name it in a message ("" for a whole document: the text is its start)."""
    done_bytes: int = 0
    """Bytes of the source read once it is written (in proportion to the characters within a batch)."""
    chars: int = 0


def _parts(doc: str, opens: bool = True, closes: bool = True) -> Iterator[tuple[str, bool, bool, str]]:
    """(text, opens, closes, head) of a text as read: whole, or its pieces cut one at a time. ``opens``: it starts
    its document (not the rest of a ``Continued`` one); ``closes``: it ends it (it is no ``Continued`` text)."""
    pieces = iter_pieces(doc)
    text = next(pieces)
    for following in pieces:
        yield text, opens, False, doc[:60]
        text, opens = following, False
    yield text, opens, closes, "" if opens and closes else doc[:60]


def _texts_of(docs: list[str], begun: bool) -> Iterator[tuple[str, bool, bool, str]]:
    """``_parts`` of each text of a batch; ``begun``: the first goes on with a document begun before the batch."""
    for doc in docs:
        closes = not isinstance(doc, Continued)
        yield from _parts(doc, opens=not begun, closes=closes)
        begun = not closes


def _units(batches: Iterator[tuple[list[str], int]], chars: int) -> Iterator[_Unit]:
    """Each batch of the source as one encoding job, a long document's pieces (``core.tokenizer.iter_pieces``)
    in jobs of about ``chars`` characters as well, so memory does not grow with how a text is broken into
    documents, and the pieces of one document are encoded side by side (one Rust thread each). A document
    read in ``Continued`` parts may span batches."""
    number = before = 0
    begun = False
    for docs, done in batches:
        total, through = max(sum(map(len, docs)), 1), 0
        unit = _Unit()
        for text, opens, closes, head in _texts_of(docs, begun):
            unit.texts.append(text)
            unit.numbers.append(number)
            unit.opens.append(opens)
            unit.closes.append(closes)
            unit.heads.append(head)
            unit.chars += len(text)
            through += len(text)
            number += closes
            if unit.chars >= chars and through < total:
                unit.done_bytes = before + (done - before) * through // total
                yield unit
                unit = _Unit()
        if unit.texts:
            unit.done_bytes = done
            yield unit
        begun = bool(docs) and isinstance(docs[-1], Continued)
        before = done


def _encoder(tokenizer: BPETokenizer, origin: str, spec: str) -> Callable[[_Unit], list[list[int]]]:
    """The ids of each text of a unit, through HF tokenizers' batch encoding (Rust threads, the GIL released; the
    variant without offsets when the installed version has it: same ids, less work). Text the tokenizer cannot
    encode (a Unigram vocabulary without an unknown token) is a DataError naming the document."""
    tok = plain_text_tokenizer(tokenizer)
    fast = getattr(tok, "encode_batch_fast", None)

    def batch(texts: list[str]) -> list:
        return fast(texts, add_special_tokens=False) if fast is not None else \
            tok.encode_batch(texts, add_special_tokens=False)

    def fails(text: str) -> bool:
        try:
            batch([text])
        except Exception:  # tokenizers raises a bare Exception
            return True
        return False

    def encode(unit: _Unit) -> list[list[int]]:
        try:
            return [e.ids for e in batch(unit.texts)]
        except Exception as exc:  # found again one text at a time: only on this way out
            i = next((i for i, t in enumerate(unit.texts) if fails(t)), 0)
            text = unit.texts[i]
            char = next((c for c in dict.fromkeys(text) if fails(c)), None)
            what = f", which holds {char!r} (U+{ord(char):04X})" if char is not None else ""
            raise DataError(f"tokenizer {origin} cannot encode document {unit.numbers[i] + 1:,} of {spec} (it begins "
                            f"{unit.heads[i] or text[:60]!r}){what}: {first_line(exc)}; no token store was kept",
                            "tokenizer") from None

    return encode


def _pack(ids: list[list[int]], opens: list[bool], closes: list[bool], dtype: np.dtype, bos: int,
          eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Each text's ids, with BOS before the texts that open a document and EOS after those that close one,
    concatenated; and where each opened document starts in it."""
    first, last = np.array(opens, dtype=bool), np.array(closes, dtype=bool)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)) + first + last
    ends = np.cumsum(lengths)
    begins = ends - lengths
    out = np.empty(int(ends[-1]), dtype=dtype)
    body = np.ones(len(out), dtype=bool)
    body[begins[first]] = False
    body[ends[last] - 1] = False
    out[body] = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(body.sum()))
    out[begins[first]] = bos
    out[ends[last] - 1] = eos
    return out, begins[first]


def _check_unchanged(source: Source) -> None:
    """Every file still has the size and time it had when the source was fingerprinted: a file written to while
    it was read would give a store whose key and record describe other text than its tokens."""
    for f in source.files:
        try:
            st = os.stat(f.path)
        except OSError as exc:
            raise SourceChanged(f"{f.path} changed while it was being prepared ({exc.strerror}); no token store was "
                                f"kept: prepare it again") from None
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            raise SourceChanged(f"{f.path} changed while it was being prepared; no token store was kept: prepare it "
                                f"again once it is written")


def write_store(source: Source, tokenizer: BPETokenizer, fingerprint: str, *, tokenizer_origin: str,
                progress: Callable[[int, int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None, batch_chars: int = 1 << 22) -> TokenStore:
    """Tokenize ``source`` into its store and open it; call under ``preparation_lock``.

    ``progress(bytes_done, documents_done, tokens_done)`` follows each batch (and each part of a long document);
    ``should_stop()`` is polled between them (a stop raises Cancelled). Memory stays bounded: two batches of
    about ``batch_chars`` characters (whole documents or pieces of a long one) and their tokens at a time.
    """
    if tokenizer.eos_id is None or tokenizer.bos_id is None:
        raise DataError("the tokenizer has no end-of-text token")
    t0 = time.perf_counter()
    folder = stores_dir()
    key = store_key(fingerprint, tokenizer_key(tokenizer))
    final = folder / key
    dtype = token_dtype(tokenizer.vocab_size)
    sweep_stale(folder)
    tmp = folder / f".tmp-{key}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    documents = tokens = text_bytes = 0
    seen = (0, 0, 0)  # (bytes of the source, documents, tokens) encoded so far, written or not: a full disk's rate
    encode = _encoder(tokenizer, tokenizer_origin, source.spec)
    lock: WriterLock | None = None
    with removed_on_forced_exit(tmp):  # a forced exit removes it, as the clean-up below does
        try:
            tmp.mkdir(parents=True)
            lock = WriterLock(tmp)  # held while it is written: no other process' sweep removes it meanwhile
            with open(tmp / TOKENS, "wb") as tf, open(tmp / OFFSETS, "wb") as of:
                pending = None

                def flush(job) -> None:
                    nonlocal documents, tokens, seen
                    future, unit = job
                    packed, starts = _pack(future.result(), unit.opens, unit.closes, dtype, tokenizer.bos_id,
                                           tokenizer.eos_id)
                    seen = (unit.done_bytes, documents + sum(unit.closes), tokens + len(packed))
                    (starts + tokens).astype(np.uint64).tofile(of)
                    packed.tofile(tf)
                    documents += sum(unit.closes)
                    tokens += len(packed)
                    if progress is not None:
                        progress(unit.done_bytes, documents, tokens)

                # Encoding unit k+1 (Rust threads, no GIL) overlaps reading and writing unit k. A long document spans
                # several units: its start is written with its first piece, its EOS with its last. A preparation cut
                # short leaves the unit being encoded to its worker: waiting for it took seconds, past the watchdog.
                for unit in _units(source.iter_documents(batch_chars), batch_chars):
                    if should_stop is not None and should_stop():
                        raise Cancelled("data preparation stopped; no token store was kept")
                    text_bytes += unit.chars
                    job = (native_worker(functools.partial(encode, unit), "speedboard-encode"), unit)
                    if pending is not None:
                        flush(pending)
                    pending = job
                if pending is not None:
                    flush(pending)
                if documents == 0:
                    raise DataError(f"data source {source.spec} is empty (no text)")
                _check_unchanged(source)
                np.array([tokens], dtype=np.uint64).tofile(of)
            (tmp / TOKENIZER).write_text(tokenizer.to_str(), encoding="utf-8")  # any path, not only a UTF-8 one
            manifest = {
                "format": STORE_FORMAT, "version": STORE_VERSION,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "source": {"spec": source.spec, "location": source_location(source.spec), "kind": source.kind,
                           "name": source.name,
                           "text_field": source.text_field, "bytes": source.bytes,
                           "files": [{"path": f.rel, "bytes": f.size} for f in source.files]},
                "fingerprint": fingerprint,
                "tokenizer": {"sha256": tokenizer_sha256(tokenizer), "origin": tokenizer_origin,
                              "vocab_size": tokenizer.vocab_size, "bos": tokenizer.bos_token,
                              "eos": tokenizer.eos_token, "pad": tokenizer.pad_token, "bos_id": tokenizer.bos_id,
                              "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id},
                "dtype": dtype.name, "documents": documents, "tokens": tokens, "text_chars": text_bytes,
                "digest": _digest(tmp, documents, tokens), "seconds": round(time.perf_counter() - t0, 3),
            }
            for name in (TOKENS, OFFSETS, TOKENIZER):
                fsync(tmp / name)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            fsync(tmp / MANIFEST)
            if should_stop is not None and should_stop():  # asked during the last batches or the syncs: not kept
                raise Cancelled("data preparation stopped; no token store was kept")
            if _complete(final, tokenizer):  # another process finished first (no lock on this platform)
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                if final.exists():  # a damaged store of the same key: moved aside, then replaced
                    remove_store(final)
                os.rename(tmp, final)
                fsync(folder)
        except DataError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(exc, SourceChanged):
                # A file rewritten while it was read fails to parse ("needs a string field 'text'", "damaged
                # Parquet data"): the write is what to say, not the data's fault that named another remedy.
                _check_unchanged(source)
            raise
        except OSError as exc:
            # numpy's tofile reports a short write without an error number ("N requested and M written"):
            # why_write_failed asks the disk (free space, the file-size limit) for a reason a person can act on,
            # before the half-written store is removed and the disk has room again.
            reason = why_write_failed(exc, folder)
            shutil.rmtree(tmp, ignore_errors=True)
            need = _space_needed(source.bytes, *seen, dtype)
            raise DataError(f"cannot write the token store in {folder} ({reason}); no token store was kept{need}"
                            ) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if lock is not None:
                lock.release()
    return _open_for(final, tokenizer)


def _space_needed(source_bytes: int | None, done_bytes: int, documents: int, tokens: int, dtype: np.dtype) -> str:
    """What a store whose writing failed would take, as a clause: from the tokens per byte of the source encoded
    so far (compressed bytes for Parquet or .gz: tokens per byte vary five-fold between sources), or nothing."""
    if not source_bytes or not done_bytes or not tokens:
        return ""
    scale = source_bytes / done_bytes
    size = tokens * scale * dtype.itemsize + (documents * scale + 1) * 8
    if done_bytes >= source_bytes:
        return f" (the store needs {_size(size)})"
    return f" (the store needs about {_size(size)}, at the rate of its first {_size(done_bytes)} of data)"


# ----------------------------------------------------------------------------- listing and removing
def list_stores() -> list[dict[str, Any]]:
    """Manifests of the stores (with ``path`` and ``bytes`` on disk), newest first: ``damaged`` (what is wrong) in
    place of a manifest that cannot be read, ``fault`` beside one whose files do not have the sizes it gives."""
    out = []
    folder = stores_dir()
    if not folder.is_dir():
        return out
    for entry in folder.iterdir():
        if entry.name.startswith(".") or not (entry / MANIFEST).is_file():
            continue
        try:
            manifest = parse_json((entry / MANIFEST).read_text(encoding="utf-8"))
            damage = _damage(manifest)
        except (OSError, ValueError) as exc:
            damage = f"its manifest cannot be read: {first_line(exc, 80)}"
        if damage is not None:  # listed (and removable) by its path alone
            manifest = {"damaged": damage}
        elif all(isinstance(manifest.get(k), int) for k in ("documents", "tokens")) and manifest.get("dtype"):
            try:
                fault = _files_damage(entry, manifest)
            except OSError as exc:
                fault = f"its files cannot be read: {exc.strerror or exc}"
            if fault is not None:  # its corpus is known: listed and removed with it, prepared again by a start
                manifest["fault"] = fault
        manifest["path"] = str(entry)
        try:
            manifest["bytes"] = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        except FileNotFoundError:  # removed meanwhile by another process (its --remove): no store to list
            continue
        out.append(manifest)
    return sorted(out, key=lambda m: m.get("created", ""), reverse=True)


def remove_store(path: str | Path) -> None:
    """Rename the store aside (it stops looking complete at once), then delete it. A process that has
    it open keeps reading its files until it ends (POSIX)."""
    path = Path(path)
    aside = path.parent / f"{_REMOVED}{path.name}-{secrets.token_hex(3)}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # removed meanwhile by another process (two --remove at once): it is gone, as asked
        return
    except OSError as exc:  # a read-only cache, or another user's; or the store's own folder made immutable
        where = f"; its folder {path.parent} cannot be written" if not os.access(path.parent, os.W_OK) else ""
        raise DataError(f"cannot remove the token store {path} ({exc.strerror or exc}){where}") from None
    _delete(aside)
