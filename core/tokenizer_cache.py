"""Tokenizers trained on a corpus' sample, cached so that the next start finds the corpus' token store at once.

```
<cache>/tokenizers/source-<fingerprint>-<key>.json     fingerprint: the corpus' first 32 hex digits;
                                                        key: the vocabulary size and sample size asked
```

One file per corpus and setting, named by the corpus' fingerprint so that ``prepare --remove`` removes it with
the corpus' stores. Written atomically through ``.<name>.<host>-<pid>.tmp``; what a killed writer left is
removed by the next writer on that machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from pathlib import Path

from core.errors import CheckpointError, DataError
from core.paths import WriterLock, sweep_probes, why_write_failed, writer_gone
from core.stopping import removed_on_forced_exit
from core.tokenizer import BPETokenizer, cache_dir

_KEY_FORMAT = "speedboard-source-tokenizer-1"
_TMP = re.compile(r"\.(?P<name>.+\.json)\.(?P<host>.+)-(?P<pid>\d+)\.tmp")


def tokenizers_dir() -> Path:
    return cache_dir() / "tokenizers"


def _key(fingerprint: str, vocab_size: int, sample_documents: int) -> str:
    return hashlib.sha256(f"{_KEY_FORMAT}:{fingerprint}:{vocab_size}:{sample_documents}".encode()).hexdigest()


def trained_tokenizer_path(fingerprint: str, vocab_size: int, sample_documents: int) -> Path:
    return tokenizers_dir() / f"source-{fingerprint[:32]}-{_key(fingerprint, vocab_size, sample_documents)[:16]}.json"


def cached_trained_tokenizer(fingerprint: str, vocab_size: int, sample_documents: int) -> BPETokenizer | None:
    """The tokenizer trained earlier on this corpus' sample with these settings; a damaged file counts as none
    (it is trained again, never trusted). A file under the name of earlier versions (``source-<key>.json``) is
    renamed to this one's as it is found, so that it too goes with the corpus' stores."""
    path = trained_tokenizer_path(fingerprint, vocab_size, sample_documents)
    earlier = tokenizers_dir() / f"source-{_key(fingerprint, vocab_size, sample_documents)[:32]}.json"
    if not path.is_file() and earlier.is_file():
        with contextlib.suppress(OSError):  # a read-only cache: read it where it is
            os.replace(earlier, path)
    for candidate in (path, earlier):
        if candidate.is_file():
            try:
                return BPETokenizer.load(candidate)
            except (CheckpointError, OSError):  # damaged, or removed meanwhile (prepare --remove): trained again
                return None
    return None


def store_trained_tokenizer(tokenizer: BPETokenizer, fingerprint: str, vocab_size: int,
                            sample_documents: int) -> None:
    """Write it into the cache, atomically (a concurrent reader never sees half a file)."""
    path = trained_tokenizer_path(fingerprint, vocab_size, sample_documents)
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


def remove_trained_tokenizers(fingerprints: set[str] | None) -> list[tuple[Path, int]]:
    """Remove the cached tokenizers trained on these corpora (``None``: every cached tokenizer, those of
    earlier versions' names included); each removed file with its size."""
    folder = tokenizers_dir()
    if not folder.is_dir():
        return []
    prefixes = None if fingerprints is None else tuple(f"source-{fp[:32]}-" for fp in fingerprints)
    removed = []
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(".json") or entry.name.startswith(".") or not entry.is_file():
            continue
        if prefixes is not None and not entry.name.startswith(prefixes):
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
