"""Tokenizers trained on a corpus' sample, cached so that the next start finds the corpus' token store at once.

```
<cache>/tokenizers/source-<fingerprint>-<key>-<place>.json   fingerprint: the corpus' first 32 hex digits;
                                                              key: the vocabulary size and sample size asked;
                                                              place: hashes of where the corpus lies and of
                                                              the field its text was read from
```

One file per corpus and setting, named by the corpus' fingerprint so that ``prepare --remove`` removes it with
the corpus' stores, and by its place, so that it also removes a tokenizer trained on an earlier version of the
corpus that never got a store (a preparation stopped or refused after its tokenizer was trained). A file of the
same content elsewhere (a copy) finds it by its fingerprint alone. Written atomically through
``.<name>.<host>-<pid>.tmp``; what a killed writer left is removed by the next writer on that machine.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import socket
from pathlib import Path

from core.errors import CheckpointError, DataError
from core.paths import WriterLock, locale_free, sweep_probes, why_write_failed, writer_gone
from core.stopping import removed_on_forced_exit
from core.tokenizer import BPETokenizer, cache_dir

_KEY_FORMAT = "speedboard-source-tokenizer-1"
_TMP = re.compile(r"\.(?P<name>.+\.json)\.(?P<host>.+)-(?P<pid>\d+)\.tmp")


def tokenizers_dir() -> Path:
    return cache_dir() / "tokenizers"


def _key(fingerprint: str, vocab_size: int, sample_documents: int) -> str:
    return hashlib.sha256(f"{_KEY_FORMAT}:{fingerprint}:{vocab_size}:{sample_documents}".encode()).hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _place(location: str, text_field: str) -> str:
    """A short hash of a corpus' place (``core.sources.source_location``, whatever locale decoded its name), then
    of the field its text was read from: 8 + 4 hex digits."""
    return _digest(locale_free(location))[:8] + _digest(text_field)[:4]


def _stem(fingerprint: str, vocab_size: int, sample_documents: int) -> str:
    return f"source-{fingerprint[:32]}-{_key(fingerprint, vocab_size, sample_documents)[:16]}"


def trained_tokenizer_path(fingerprint: str, vocab_size: int, sample_documents: int, location: str,
                           text_field: str) -> Path:
    return tokenizers_dir() / f"{_stem(fingerprint, vocab_size, sample_documents)}-{_place(location, text_field)}.json"


def cached_trained_tokenizer(fingerprint: str, vocab_size: int, sample_documents: int, location: str,
                             text_field: str) -> BPETokenizer | None:
    """The tokenizer trained earlier on this corpus' sample with these settings, here or on a copy of the corpus
    elsewhere; a damaged file counts as none (it is trained again, never trusted). A file under the names of
    earlier versions (``source-<key>.json``, ``source-<fingerprint>-<key>.json``) is renamed to this one's as it
    is found, so that it too goes with the corpus' stores."""
    path = trained_tokenizer_path(fingerprint, vocab_size, sample_documents, location, text_field)
    stem = _stem(fingerprint, vocab_size, sample_documents)
    earlier = (tokenizers_dir() / f"{stem}.json",
               tokenizers_dir() / f"source-{_key(fingerprint, vocab_size, sample_documents)[:32]}.json")
    for name in earlier:
        if not path.is_file() and name.is_file():
            with contextlib.suppress(OSError):  # a read-only cache: read it where it is
                os.replace(name, path)
    # A copy of the corpus elsewhere, trained on first: the same text, the same tokenizer.
    elsewhere = sorted(tokenizers_dir().glob(f"{glob.escape(stem)}-*.json")) if tokenizers_dir().is_dir() else []
    for candidate in (path, *earlier, *elsewhere):
        if candidate.is_file():
            try:
                return BPETokenizer.load(candidate)
            except (CheckpointError, OSError):  # damaged, or removed meanwhile (prepare --remove): trained again
                return None
    return None


def store_trained_tokenizer(tokenizer: BPETokenizer, fingerprint: str, vocab_size: int,
                            sample_documents: int, location: str, text_field: str) -> None:
    """Write it into the cache, atomically (a concurrent reader never sees half a file)."""
    path = trained_tokenizer_path(fingerprint, vocab_size, sample_documents, location, text_field)
    sweep_stale_tokenizers()
    tmp = path.parent / f".{path.name}.{socket.gethostname()}-{os.getpid()}.tmp"
    try:
        with removed_on_forced_exit(tmp):
            tmp.touch()
            with WriterLock(tmp):  # never swept while it is written (by a process of another PID namespace too)
                tmp.write_text(tokenizer.to_str(), encoding="utf-8")
                os.replace(tmp, path)
    except OSError as exc:
        raise DataError(f"cannot write the tokenizer into the cache folder {path.parent} "
                        f"({why_write_failed(exc, path.parent)}); set SPEEDBOARD_CACHE_DIR to a writable folder "
                        f"with room") from None
    finally:  # a failed write, or SIGTERM mid-write: no half file (after os.replace there is none to remove)
        tmp.unlink(missing_ok=True)


def sweep_stale_tokenizers() -> list[Path]:
    """Remove the temporary files of writers on this machine whose process is gone (killed mid-write), and the
    write probes of killed processes (``core.token_store.ensure_writable``)."""
    folder, host, removed = tokenizers_dir(), socket.gethostname(), []
    if not folder.is_dir():
        return removed
    removed += sweep_probes(folder)
    for entry in folder.iterdir():
        m = _TMP.fullmatch(entry.name)
        if m and writer_gone(entry, int(m["pid"]), m["host"] == host):
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry)
    return removed


def remove_trained_tokenizers(fingerprints: set[str] | None, location: str | None = None,
                              text_field: str | None = None) -> list[tuple[Path, int]]:
    """Remove the cached tokenizers trained on these corpora, and on any version of the corpus at ``location``
    (its text read from ``text_field``; any field for None). ``fingerprints`` None: every cached tokenizer, those
    of earlier versions' names included. Each removed file with its size."""
    folder = tokenizers_dir()
    if not folder.is_dir():
        return []
    prefixes = None if fingerprints is None else tuple(f"source-{fp[:32]}-" for fp in fingerprints)
    # The place's hash (8 digits), and with it the text field's (4 more) where one is given.
    place = None if location is None else _place(location, text_field or "")[:12 if text_field is not None else 8]

    def of_location(name: str) -> bool:
        named = name.removesuffix(".json").rsplit("-", 1)[-1]
        return place is not None and len(named) == 12 and named.startswith(place)

    removed = []
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(".json") or entry.name.startswith(".") or not entry.is_file():
            continue
        if prefixes is not None and not (entry.name.startswith(prefixes) or of_location(entry.name)):
            continue
        try:
            size = entry.stat().st_size
            entry.unlink()
        except FileNotFoundError:  # removed meanwhile by another process: gone, as asked
            continue
        except OSError as exc:
            raise DataError(f"cannot remove the cached tokenizer {entry} ({exc.strerror or exc}); its folder "
                            f"{folder} cannot be written") from None
        removed.append((entry, size))
    return removed
