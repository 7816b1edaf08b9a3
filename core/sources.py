"""Corpus sources: what ``--data`` names, checked up front and read as a stream of documents.

A source is one of:

- ``builtin``: the documentation topics CPython ships in ``pydoc_data`` (about
  465 KB of English), split into paragraphs; nothing is downloaded;
- a ``.txt``/``.md`` file, split into paragraphs at blank lines;
- a ``.jsonl`` file (also ``.jsonl.gz``, ``.jsonl.zst``), one document per line in its text field;
- a ``.parquet`` file (FineWeb's format) or an ``.arrow`` file, one document per row of its text column;
- a folder of files of one of these formats (hidden files aside), read in sorted order;
- a folder written by Hugging Face ``Dataset.save_to_disk`` (its ``train`` split for a ``DatasetDict``);
- ``hf:NAME[:CONFIG[:SPLIT]]``: a Hugging Face hub dataset, streamed (needs the ``datasets`` package and network).

Every file is read in bounded chunks (never whole into memory) and every
problem is a ``DataError`` with one line. ``Source.fingerprint`` identifies the
content cheaply (see there); the token store is keyed by it.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.config import BUILTIN_CORPUS
from core.errors import DataError, first_line
from core.json_text import parse_json
from core.paths import locale_free, not_there, user_path
from core.tokenizer import piece_end

HUB_PREFIX = "hf:"
_HUB_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)?")
"""A hub repository id, by the hub's own rules: a path (``hf:../corpus``) is not one."""
DEFAULT_TEXT_FIELD = "text"
"""The column or key read when none is named: FineWeb's, and most datasets'."""
FORMAT_OF_SUFFIX = {".txt": "text", ".md": "text", ".jsonl": "jsonl", ".jsonl.gz": "jsonl", ".jsonl.zst": "jsonl",
                    ".parquet": "parquet", ".arrow": "arrow"}
SUPPORTED = ", ".join(FORMAT_OF_SUFFIX)
# Files that hold data in a format this reader does not take: a folder holding them is refused rather
# than trained on without them (other binary files, e.g. images or lock files, are skipped and listed).
_DATA_LIKE = (".csv", ".tsv", ".json", ".ndjson", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z", ".lz4",
              ".feather", ".orc", ".avro", ".pq", ".rst", ".html", ".htm", ".xml", ".tex")
# Documentation that ships beside data shards (a dataset repository's README) is not part of the corpus.
_DOC_FILE = re.compile(r"(readme|license|licence|changelog)(\..*)?", re.IGNORECASE)
# Markers a Spark or Hadoop job leaves beside its output shards: no data, skipped as a README is.
_JOB_MARKER = re.compile(r"_SUCCESS|_committed_.*|_started_.*")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_READ_CHUNK = 4 << 20
_BATCH_BYTES = 4 << 20
"""About the text of one Parquet or Arrow batch turned into strings: memory does not grow with row size."""
_MAX_BATCH_ROWS = 8192  # short rows (FineWeb's are ~3 KB) are read 8,192 at a time, as before
# A surrogate pair (what CESU-8 bytes of an emoji decode to) or a lone half of one.
_SURROGATE = re.compile(r"[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")
# UTF-8 never holds ED A0-BF: those bytes encode U+D800-DFFF (CESU-8, WTF-8), which json.loads lets through.
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
MAX_PARAGRAPH_CHARS = 8 << 20
"""A longer run of text without a blank line is handed on in parts (``Continued``): memory stays bounded on any
file, and the parts make one document."""
_SAMPLE_BLOCKS, _SAMPLE_BLOCK = 16, 16 << 10
"""The fingerprint hashes 16 blocks of 16 KiB of a large file: first, last and evenly spaced between."""
_SAMPLED_FILES = 64
"""Files of a source whose content the fingerprint samples (evenly spread): its cost stays bounded for a
folder of a million small files, which every start would otherwise read whole."""
# The split names of the Hugging Face hub's file layout (datasets' data-files patterns): a word of a file's
# or a folder's name, between ``-._``, spaces or digits, first in it or last (``_split_of``).
_SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
                "val": "validation", "dev": "validation", "test": "test", "testing": "test", "eval": "test",
                "evaluation": "test"}
_NAME_WORDS = re.compile(r"[-._ 0-9]+")
_SHARD_WORDS = {"of", "txt", "md", "jsonl", "json", "gz", "zst", "parquet", "arrow"}
"""What may follow a split word that ends a name: ``-00000-of-00002`` and the suffixes (digits separate words)."""


class Continued(str):
    """Text of a document that the next text read goes on with: a paragraph longer than ``MAX_PARAGRAPH_CHARS``,
    read in parts so that memory stays bounded. The store writes the parts as one document (one BOS, one EOS),
    with the ids of the whole where the cut allows (``core.tokenizer.piece_end``); the last part is a plain
    ``str``, possibly empty."""

    __slots__ = ()


def joined_documents(texts) -> Iterator[str]:
    """Whole documents from texts as read (``Continued`` parts joined): for what holds a corpus in memory."""
    begun: list[str] = []
    for text in texts:
        begun.append(text)
        if not isinstance(text, Continued):
            yield "".join(begun)
            begun = []
    assert not begun, "a Continued text without the rest of its document"


@dataclass(frozen=True)
class SourceFile:
    path: Path
    rel: str
    """Path relative to the source (its name for a single file): the fingerprint does not depend on where it lies."""
    size: int
    mtime_ns: int
    format: str


@dataclass(frozen=True)
class Source:
    spec: str
    """What the user gave (``--data``)."""
    kind: str
    """``builtin``, ``text``, ``jsonl``, ``parquet``, ``arrow`` or ``hub``."""
    name: str
    files: tuple[SourceFile, ...] = ()
    text_field: str = DEFAULT_TEXT_FIELD
    ignored: tuple[str, ...] = ()
    """Files of a folder that were skipped (binary files that hold no text, a README beside data shards, a
    Spark job's ``_SUCCESS`` marker)."""
    hub: tuple[str, str | None, str] | None = None
    """(dataset, config, split) of an ``hf:`` source."""
    _documents: list[int] = field(default_factory=list, compare=False, repr=False)

    @property
    def bytes(self) -> int | None:
        """Bytes of the source files; None for a hub dataset."""
        if self.kind == "hub":
            return None
        if self.kind == "builtin":
            return len(_builtin_text().encode("utf-8"))
        return sum(f.size for f in self.files)

    @property
    def documents(self) -> int | None:
        """Rows of Parquet/Arrow files, known after ``check()``; None where only a full read would tell."""
        return self._documents[0] if self._documents else None

    def fingerprint(self) -> str:
        """Identifies the content: cheap at every start, whatever the corpus size.

        For every file: its path relative to the source, size, modification
        time; and for up to 64 files (all of a smaller source, else 64 evenly
        spread) a SHA-256 of its content (all of it up to 256 KiB, else 16
        blocks of 16 KiB: the first, the last and 14 evenly spaced between).
        An edited file changes its size or modification time; a file replaced
        by one of the same size and time changes sampled content in all but
        contrived cases. Touching or copying a corpus without keeping times
        (``cp`` without ``-p``) makes it new: it is prepared again. The text
        field counts where it selects the text (not for .txt/.md).
        """
        h = hashlib.sha256()
        # 2 for text files: their CR LF and CR are read as LF, where version 1 kept them in the tokens.
        identity: dict = {"v": 2 if self.kind == "text" else 1, "kind": self.kind}
        if self.kind not in ("text", "builtin"):
            identity["text_field"] = self.text_field
        if self.kind == "builtin":
            identity["sha256"] = hashlib.sha256(_builtin_text().encode("utf-8")).hexdigest()
        elif self.kind == "hub":
            identity["hub"] = list(self.hub)
        else:
            sampled = _spread(len(self.files), _SAMPLED_FILES)
            # Names as their bytes read in UTF-8: the same corpus, whatever locale decoded its file names.
            identity["files"] = [[locale_free(f.rel), f.size, f.mtime_ns,
                                  sampled_sha256(f.path, f.size) if i in sampled else None]
                                 for i, f in enumerate(self.files)]
        h.update(json.dumps(identity, sort_keys=True).encode())
        return h.hexdigest()

    def check(self) -> None:
        """Open every file's start before anything is prepared: a missing text column or field, a damaged
        Parquet/Arrow file, a JSONL line that is no JSON or a text file that is not UTF-8 text is one line now,
        not after an hour of tokenizing (or after a data picker said it looked fine); counts Parquet/Arrow rows.
        Reads headers and at most ``_CHECKED_BYTES`` of a JSONL or text file."""
        if self.kind in ("text", "jsonl"):
            # Each check says whether its file may hold text (some seen, or more than was read): a source read
            # whole here without any is empty now, not after a failed start.
            may_hold_text = [_check_text_start(f.path) if self.kind == "text" else
                             _check_jsonl_start(f.path, self.text_field) for f in self.files]
            if not any(may_hold_text):
                raise DataError(f"data source {self.spec} is empty (no text)")
        elif self.kind in ("parquet", "arrow"):
            total = text_rows = valued = 0
            for f in self.files:
                if f.format == "parquet":
                    rows, typed, not_null = _parquet_rows(f.path, self.text_field)
                else:
                    rows, typed = _arrow_rows(f.path, self.text_field)
                    not_null = rows  # an Arrow file keeps no null counts: every row may hold text
                total += rows
                if typed:
                    text_rows += rows
                    valued += not_null
            if text_rows == 0:
                raise DataError(f"data source {self.spec} is empty ({'no text' if total else 'no rows'})")
            if valued == 0:  # it passed the data picker's check, then failed every start as "empty (no text)"
                raise DataError(f"data source {self.spec} is empty (no text: its column '{self.text_field}' holds "
                                f"only nulls)")
            self._documents[:] = [text_rows]
        elif self.kind == "hub":
            _hub_dataset(self)  # the package, the network, the name

    def iter_documents(self, batch_chars: int = 1 << 22) -> Iterator[tuple[list[str], int]]:
        """Batches of non-empty documents (about ``batch_chars`` characters each), with the bytes of the
        source read so far (for progress; compressed bytes for compressed files)."""
        done = 0
        batch: list[str] = []
        chars = 0
        for f in self.files or (None,):
            for doc, position in _read(self, f):
                batch.append(doc)
                chars += len(doc)
                if chars >= batch_chars:
                    yield batch, done + position
                    batch, chars = [], 0
            if f is not None:
                done += f.size
        if batch:  # the builtin corpus reports no position of its own: read whole by now
            yield batch, done if self.files else (self.bytes or 0)


def source_location(spec: str) -> str:
    """Where ``spec`` points, whatever its content now (and whether it still exists): the absolute path of
    a file or folder (``user_path``), or the builtin/hub name. The stores of every version of one corpus
    share it, and a run records its data by it, so a resume from another folder reads the same corpus."""
    if spec == BUILTIN_CORPUS or spec.startswith(HUB_PREFIX):
        return spec
    return str(user_path(spec))


def resolve_source(spec: str, text_field: str = DEFAULT_TEXT_FIELD) -> Source:
    """What ``spec`` names, with its files listed and checked cheaply (no file is opened here). A text field other
    than the default for plain text (which has no fields) is refused, not recorded and ignored."""
    source = _resolved(spec, text_field)
    if source.kind in ("text", "builtin") and text_field != DEFAULT_TEXT_FIELD:
        raise DataError(f"text field '{text_field}' does not apply to {source.name}: plain text has no fields "
                        f"(the text field names a column of Parquet, Arrow or hub data, or a key of JSONL); "
                        f"leave it out", "text_field")
    return source


def _resolved(spec: str, text_field: str) -> Source:
    if spec == BUILTIN_CORPUS:
        return Source(spec, "builtin", "builtin (Python documentation topics)", text_field=text_field)
    if spec.startswith(HUB_PREFIX):
        parts = spec[len(HUB_PREFIX):].split(":")
        if not parts[0] or len(parts) > 3 or any(c.isspace() for c in spec):
            raise DataError(f"hub dataset {spec!r}: expected hf:NAME[:CONFIG[:SPLIT]], "
                            f"e.g. hf:HuggingFaceFW/fineweb:sample-10BT")
        if not _HUB_NAME.fullmatch(parts[0]) or ".." in parts[0] or "--" in parts[0] or len(parts[0]) > 96:
            raise DataError(f"hub dataset {spec!r}: {parts[0]!r} is not a hub dataset name (OWNER/NAME or NAME: "
                            f"letters, digits, '-', '_' and '.', no '..' or '--', up to 96 characters); for a "
                            f"folder on this machine leave out hf:")
        name, config, split = parts[0], (parts[1] or None) if len(parts) > 1 else None, \
            (parts[2] if len(parts) > 2 and parts[2] else "train")
        return Source(spec, "hub", f"Hugging Face dataset {spec[len(HUB_PREFIX):]}", text_field=text_field,
                      hub=(name, config, split))
    path = Path(spec).expanduser()
    try:
        st = path.stat()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):  # gone, or a link to nothing
            raise DataError(f"data source {spec} {not_there(path)}") from None
        raise DataError(f"cannot read data source {spec}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return _resolve_folder(spec, path, text_field)
    _require_regular(path, st.st_mode, spec)
    fmt = _format_of(path)
    if fmt is None:
        raise DataError(f"unsupported data file {path.name}: use {SUPPORTED}, a folder of them, "
                        f"a Hugging Face dataset folder, or hf:NAME")
    return Source(spec, fmt, str(path), (SourceFile(path, path.name, st.st_size, st.st_mtime_ns, fmt),),
                  text_field)


def _require_regular(path: Path, mode: int, spec: str) -> None:
    """A FIFO, socket or device would block or never end: refuse it instead of reading it."""
    if not stat.S_ISREG(mode):
        what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise DataError(f"data source {spec}: {path.name} is {what}; Speedboard reads regular files "
                        f"(write the stream to a file first)")


def _format_of(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, fmt in sorted(FORMAT_OF_SUFFIX.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return fmt
    return None


def _not_text(head: bytes, whole: bool) -> str | None:
    """Why ``head``, a file's first bytes (``whole``: all of it), is no UTF-8 text, or None."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)  # a character cut at the end is fine
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (bad byte at offset {exc.start})"
    nul = head.find(b"\x00")
    if nul >= 0:  # valid UTF-8, but no text file holds NUL: a binary file named .txt
        return f"is not text (a NUL byte at offset {nul})"
    return None


def _looks_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return False
    return _not_text(head, whole=False) is not None


def _more(names: list[str], shown: int = 3) -> str:
    extra = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + extra


def _own_folders(path: Path, unreadable: Callable[[OSError], None]) -> set[tuple[int, int]]:
    """The folders under ``path`` reached without a symbolic link (as device and inode), hidden ones left out."""
    own = set()
    for root, dirs, _ in os.walk(path, onerror=unreadable):
        st = os.stat(root)
        own.add((st.st_dev, st.st_ino))
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return own


def _links_to(folder: Path, own: set[tuple[int, int]]) -> bool:
    """Whether ``folder`` is a symbolic link to one of the folders ``own`` holds."""
    if not folder.is_symlink():
        return False
    try:
        st = folder.stat()
    except OSError:  # gone meanwhile: os.walk says so, or passes it
        return False
    return (st.st_dev, st.st_ino) in own


def _resolve_folder(spec: str, path: Path, text_field: str) -> Source:
    if (path / "dataset_dict.json").is_file():  # DatasetDict.save_to_disk: one folder per split
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        if "train" not in splits:
            raise DataError(f"dataset folder {spec} has no 'train' split (splits: {', '.join(splits) or 'none'}); "
                            f"pass the folder of the split to train on")
        train = _resolve_folder(spec, path / "train", text_field)
        # The other splits are said with the folder, as a hub layout's held-out splits are: they went unsaid.
        others = [f"{split}/ ({_SPLIT_WORDS.get(split, split)})" for split in splits if split != "train"]
        return replace(train, ignored=tuple(sorted((*train.ignored, *others))))
    if (path / "state.json").is_file():  # Dataset.save_to_disk
        try:
            state = parse_json((path / "state.json").read_text(encoding="utf-8"))
            names = [d["filename"] for d in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"dataset folder {spec}: unreadable state.json ({first_line(exc)})") from None
        odd = [n for n in names if not isinstance(n, str)]
        if odd:
            raise DataError(f"dataset folder {spec}: unreadable state.json (a data file's name is "
                            f"{repr(odd[0])[:40]}, not a string)")
        files = []
        for n in names:
            p = path / n
            try:
                st = None if Path(n).is_absolute() or ".." in Path(n).parts else p.stat()
            except (OSError, ValueError):  # missing, or a name no file can have (too long, a NUL)
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise DataError(f"dataset folder {spec}: its data file {n!r} is missing")
            files.append(SourceFile(p, n, st.st_size, st.st_mtime_ns, "arrow"))
        if not files:
            raise DataError(f"dataset folder {spec} is empty (no data files)")
        return Source(spec, "arrow", str(path), tuple(files), text_field)

    found: dict[str, list[SourceFile]] = {}
    unsupported: list[str] = []
    binary: list[str] = []
    docs: list[str] = []
    def unreadable(exc: OSError):  # a sub-folder that cannot be listed is an error, not a smaller corpus
        raise DataError(f"cannot read {exc.filename}: {exc.strerror}")

    seen: set[tuple[int, int]] = set()
    listed: list[tuple[Path, str, os.stat_result]] = []
    own = _own_folders(path, unreadable)
    # Symbolic links to folders are followed (a corpus assembled from links), each folder read once; a link to a
    # folder of the corpus' own is not: its files keep their own names (a link `current -> train` sorted first
    # named the train split `current/…`, which no split word tells, and the validation split was read with it).
    for root, dirs, names in os.walk(path, onerror=unreadable, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:  # a link loop, or a second link to one folder
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = sorted((d for d in dirs if not d.startswith(".") and not _links_to(Path(root, d), own)),
                         key=locale_free)
        for name in sorted(names, key=locale_free):
            if name.startswith("."):
                continue
            p = Path(root, name)
            try:
                st = p.stat()
            except OSError as exc:
                raise DataError(f"cannot read {p}: {exc.strerror}") from None
            _require_regular(p, st.st_mode, spec)
            listed.append((p, p.relative_to(path).as_posix(), st))
    # A file with several names in the folder (symbolic or hard links) is read once, under its own name where
    # one is not a symbolic link: the corpus, and its fingerprint, do not change when a link comes or goes.
    read_as: dict[tuple[int, int], str] = {}
    for p, rel, st in listed:
        key = (st.st_dev, st.st_ino)
        if key not in read_as or (Path(path, read_as[key]).is_symlink() and not p.is_symlink()):
            read_as[key] = rel
    for p, rel, st in listed:
        name = p.name
        if read_as[(st.st_dev, st.st_ino)] != rel:  # another name of a file read under its own
            binary.append(rel)
            continue
        fmt = _format_of(p)
        if fmt is None and (_DOC_FILE.fullmatch(name) or _JOB_MARKER.fullmatch(name)):
            binary.append(rel)  # LICENSE, README without an extension, Spark's _SUCCESS: never data
            continue
        if fmt is not None:
            if _DOC_FILE.fullmatch(name) and fmt == "text":
                docs.append(rel)  # decided below: part of a text corpus, or a data folder's README
                continue
            found.setdefault(fmt, []).append(SourceFile(p, rel, st.st_size, st.st_mtime_ns, fmt))
        elif name.lower().endswith(_DATA_LIKE) or not _looks_binary(p):
            unsupported.append(rel)
        else:
            binary.append(rel)
    if docs:
        if found and "text" not in found:
            binary += docs  # a dataset's README beside its shards
        else:
            for rel in docs:
                st = (path / rel).stat()
                found.setdefault("text", []).append(SourceFile(path / rel, rel, st.st_size, st.st_mtime_ns, "text"))
            found["text"].sort(key=lambda f: locale_free(f.rel))
    if len(found) > 1:
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(found.items()))
        raise DataError(f"folder {spec} mixes data formats ({counts} files); point --data at a folder "
                        f"of one format or at a file")
    if unsupported:
        raise DataError(f"folder {spec} holds files Speedboard does not read: {_more(unsupported)} "
                        f"(it reads {SUPPORTED}); move them out or point --data at a file")
    if not found:
        raise DataError(f"folder {spec} holds no data files ({SUPPORTED})")
    ((fmt, files),) = found.items()
    files, other_splits = _train_split(files)
    return Source(spec, fmt, str(path), tuple(files), text_field, tuple(sorted(binary + other_splits)))


def _split_of(rel: str) -> str | None:
    """The split a file belongs to by the hub's naming (``data/train-00000-of-00002.parquet``,
    ``validation/part-0.jsonl``, ``test.txt``, ``TinyStories-valid.txt``, ``c4-train.00000-of-01024.json.gz``):
    its file name first, then its folders, innermost first. A split word counts where such names put it: first,
    or last but for the shard's numbering and the suffixes; inside a name ("the_test_of_time.txt") it is a word
    of a title."""
    for part in reversed(rel.split("/")):
        words = [w for w in _NAME_WORDS.split(part.lower()) if w]
        for i, word in enumerate(words):
            if word in _SPLIT_WORDS and (i == 0 or all(w in _SHARD_WORDS for w in words[i + 1:])):
                return _SPLIT_WORDS[word]
    return None


def _train_split(files: list[SourceFile]) -> tuple[list[SourceFile], list[str]]:
    """A folder laid out in splits as the hub ships them (a train split beside validation or test ones): its
    train files, and the others by name (not read, said with the folder). The held-out splits are never
    trained on; a folder without that layout is read whole."""
    splits = {f.rel: _split_of(f.rel) for f in files}
    if "train" not in splits.values() or not {"validation", "test"} & set(splits.values()):
        return files, []
    return ([f for f in files if splits[f.rel] == "train"],
            [f"{f.rel} ({splits[f.rel] or 'no split'})" for f in files if splits[f.rel] != "train"])


def _spread(n: int, k: int) -> set[int]:
    """``k`` indices spread evenly over ``range(n)`` (all of them when ``n <= k``), the first and last among them."""
    if n <= k:
        return set(range(n))
    return {round(i * (n - 1) / (k - 1)) for i in range(k)}


def sampled_sha256(path: Path, size: int) -> str:
    """SHA-256 of a whole small file, or of 16 blocks of 16 KiB spread over a large one (and its size)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            if size <= _SAMPLE_BLOCKS * _SAMPLE_BLOCK:
                h.update(f.read())
            else:
                step = (size - _SAMPLE_BLOCK) / (_SAMPLE_BLOCKS - 1)
                for i in range(_SAMPLE_BLOCKS):
                    f.seek(int(i * step))
                    h.update(f.read(_SAMPLE_BLOCK))
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    return h.hexdigest()


# ----------------------------------------------------------------------------- readers
def _builtin_text() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError("this Python has no pydoc_data module; pass --data with a text file") from None
    return "\n\n".join(topics[key] for key in sorted(topics))


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in _PARAGRAPH_BREAK.split(text) if p.strip()]


def _read(source: Source, f: SourceFile | None) -> Iterator[tuple[str, int]]:
    """(document, bytes of this file read so far) for one file of ``source`` (or the builtin/hub stream)."""
    if source.kind == "builtin":
        from pydoc_data.topics import topics

        for key in sorted(topics):
            for p in paragraphs(topics[key]):
                yield p, 0
    elif source.kind == "hub":
        yield from _read_hub(source)
    elif f.format == "text":
        yield from _read_text(f.path)
    elif f.format == "jsonl":
        yield from _read_jsonl(f.path, source.text_field)
    elif f.format == "parquet":
        yield from _read_parquet(f.path, source.text_field)
    else:
        yield from _read_arrow(f.path, source.text_field)


def _read_text(path: Path) -> Iterator[tuple[str, int]]:
    """Paragraphs of a UTF-8 file, read 4 MiB at a time (the text after the last break carries over).

    Line ends are read as Python's ``open`` reads text, and as nanoGPT's prepare.py and Hugging Face's text
    loader see them: Windows' CR LF and old Macs' lone CR become LF, so no document holds a CR and a blank line
    between CRs ends a paragraph too."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry = ""
    position = 0
    held_cr = False  # a chunk's last CR waits for the next chunk: it may start with the LF of the same line end
    begun = False  # ``carry`` goes on with a document whose start was handed on (``Continued``)
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.read(_READ_CHUNK)
                final = not raw
                pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
                origin = len(carry)  # characters of ``text`` read with earlier chunks
                try:
                    new = decoder.decode(raw, final=final)
                except UnicodeDecodeError as exc:
                    bad = position - pending + exc.start
                    raise DataError(f"{path} is not UTF-8 text (bad byte at offset {max(bad, 0)})") from None
                new = "\r" * held_cr + new
                held_cr = not final and new.endswith("\r")
                if held_cr:
                    new = new[:-1]
                if "\r" in new:  # a scan, where the replacing would copy every chunk of a file with none
                    new = new.replace("\r\n", "\n").replace("\r", "\n")
                text = carry + new
                nul = raw.find(b"\x00")  # as at the start (_not_text), wherever it lies: memchr, cheap
                if nul >= 0:
                    raise DataError(f"{path} is not text (a NUL byte at offset {position + nul})")
                if position == 0:
                    text = text.removeprefix("\ufeff")  # a byte-order mark is no text (JSONL lines lose it too)
                before, position = position, position + len(raw)
                parts, ends, start = [], [], 0
                for m in _PARAGRAPH_BREAK.finditer(text):
                    parts.append(text[start:m.start()])
                    ends.append(m.start())
                    start = m.end()
                carry = text[start:]
                if final:
                    parts.append(carry)
                    ends.append(len(text))
                    carry = ""
                head = None
                if len(carry) > MAX_PARAGRAPH_CHARS:  # handed on up to a cut that keeps the ids; the rest waits
                    last = len(carry)
                    while last > 1 and carry[last - 1].isspace():
                        last -= 1
                    cut = piece_end(carry, 0, last - 1) if last > 1 else len(carry)  # text stays after the cut
                    head, carry = carry[:cut], carry[cut:]
                    ends.append(start + cut)
                # Where each paragraph ends in the file, in proportion within this chunk: the chunk's end would run
                # a chunk ahead of the text handed on (a full disk's estimate of the store was half its size).
                per_char = len(raw) / max(len(text) - origin, 1)
                for k, end in enumerate(ends):
                    at = min(position, before + int(max(0, end - origin) * per_char))
                    if k == len(parts):  # the start or a middle of a long paragraph
                        head = head if begun else head.lstrip()
                        if head:
                            yield Continued(head), at
                            begun = True
                    elif begun and k == 0:  # the end of a paragraph begun in an earlier chunk: it closes even
                        begun = False       # when nothing but spaces is left of it
                        yield parts[0].rstrip(), at
                    else:
                        p = parts[k].strip()
                        if p:
                            yield p, at
                if final:
                    assert not begun, "the file's last paragraph was handed on as its final text"
                    return
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


class _CountingReader(io.RawIOBase):
    """A binary file that counts the bytes read from it (compressed bytes, under a decompressor)."""

    def __init__(self, f) -> None:
        self.f = f
        self.count = 0

    def readinto(self, b) -> int:
        n = self.f.readinto(b) or 0
        self.count += n
        return n

    def readable(self) -> bool:
        return True


class _ZstdReader(io.RawIOBase):
    """Zstandard frames decompressed one after another, as a stream.

    zstandard's own ``stream_reader`` ends quietly where a frame is cut short,
    so a partly downloaded ``.jsonl.zst`` would train on what came before the
    cut. Here each frame's decompressor must reach the frame's end: input
    that stops inside a frame raises EOFError. Input is fed 64 KiB at a time.
    """

    _INPUT = 1 << 16

    def __init__(self, raw) -> None:
        import zstandard

        self.raw = raw
        # zstd's largest window (2 GiB), which ``zstd --long=31`` writes: the library's default limit (128 MiB)
        # refused such files as "too much memory". A frame takes only the window its header declares.
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=1 << 31)
        self._frame = self._decompressor.decompressobj()
        self._inside = False  # bytes of the current frame were fed and its end is not reached yet
        self._out = memoryview(b"")
        self._error: Exception | None = None  # met after text that is handed on first

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not len(self._out):
            if self._error is not None:
                raise self._error
            data = self.raw.read(self._INPUT)
            if not data:
                if self._inside:
                    raise EOFError("the file ends inside a zstd frame: it is truncated")
                return 0
            self._out = memoryview(self._feed(data))
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self._inside = True
            try:
                out.append(self._frame.decompress(data))
            except Exception as exc:  # zstandard.ZstdError: damage, or junk after the last frame
                if not out:
                    raise
                # The frames before it are text to hand on first: the error then names the line after them.
                self._error = exc
                break
            if not self._frame.eof:
                break
            data = self._frame.unused_data  # the next frame's first bytes, if any
            self._frame, self._inside = self._decompressor.decompressobj(), False
        return b"".join(out)


class _OneReadAtATime(io.RawIOBase):
    """A buffered stream read one underlying read at a time (``read1``): GzipFile's ``read(n)`` gathers n bytes
    over several reads and loses them all when one fails (junk after the last member), so the error named a line
    up to a megabyte before it."""

    def __init__(self, f) -> None:
        self.f = f

    def readinto(self, b) -> int:
        data = self.f.read1(len(b))
        b[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True


def _open_lines(path: Path, counter: _CountingReader, buffer: int = 1 << 20):
    name = path.name.lower()
    if name.endswith(".gz"):
        import gzip

        return io.BufferedReader(_OneReadAtATime(gzip.GzipFile(fileobj=counter, mode="rb")), buffer)
    if name.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(counter), buffer)
    return io.BufferedReader(counter, buffer)


def _joined_or_replaced(match: re.Match) -> str:
    pair = match.group()
    if len(pair) == 1:
        return "\ufffd"
    return chr(0x10000 + ((ord(pair[0]) - 0xD800) << 10) + (ord(pair[1]) - 0xDC00))


def _without_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (JSON's ``\\ud800`` or the bytes ED A0 BD: half an emoji cut by a
    scraper) as U+FFFD, and two halves that make a pair (CESU-8's bytes of an emoji) as that character.

    json.loads accepts them, but they are no UTF-8 text: hashing or tokenizing the document would fail."""
    return _SURROGATE.sub(_joined_or_replaced, text)


def _json_problem(exc: ValueError, line: bytes) -> str:
    """What is wrong with a JSONL line, in words, with the column where it lies."""
    if not isinstance(exc, json.JSONDecodeError):
        return first_line(exc)
    bare = line.rstrip(b"\r\n")
    if len(bare) < len(line):  # read with its line end: judged without it, as the first lines' check does
        try:
            json.loads(bare)
        except json.JSONDecodeError as again:
            exc = again
        except ValueError:
            pass
    if exc.msg == "Unterminated string starting at":
        return f"the line ends inside a string that starts at column {exc.colno}: JSONL holds one record a line"
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"


def _jsonl_text(line: bytes, path: Path, n: int, text_field: str) -> str | None:
    """The text of JSONL line ``n`` (None for a missing value); a DataError naming the line when it has none."""
    if b"\0" in line:  # json.loads guesses UTF-16 and UTF-32 from bytes: a one-line UTF-16 file was read
        raise DataError(f"{path}:{n}: not UTF-8 text (it holds NUL bytes: UTF-16 or UTF-32?)")
    try:
        row = parse_json(line)
    except UnicodeDecodeError:
        raise DataError(f"{path}:{n}: not UTF-8 text") from None
    except ValueError as exc:  # also a number of more than 4,300 digits, or nesting too deep
        raise DataError(f"{path}:{n}: invalid JSON ({_json_problem(exc, line)})") from None
    if isinstance(row, dict) and text_field in row and row[text_field] is None:
        return None  # a missing value, as a null in a Parquet or Arrow text column: no document
    if isinstance(row, dict) and text_field in row and not isinstance(row[text_field], str):
        raise DataError(f"{path}:{n}: its '{text_field}' is {_json_kind(row[text_field])}, not text")
    if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
        keys = f" (its keys: {_more(sorted(row), 8)})" if isinstance(row, dict) else ""
        raise DataError(f"{path}:{n}: each line needs a string field '{text_field}'{keys}; choose another "
                        f"text field (--text-field)")
    text = row[text_field]
    # Only a line that escapes a code point in D000-DFFF, or holds bytes that encode one, can hold a surrogate:
    # others pay nothing (ED also leads Hangul syllables: the search settles those lines).
    if b"\\ud" in line or b"\\uD" in line or (b"\xed" in line and _SURROGATE_BYTES.search(line)):
        text = _without_surrogates(text)
    return text


def _json_kind(value) -> str:
    """A JSON value's kind in words, for a message: "a number", "a list"."""
    kinds = ((bool, "true or false"), ((int, float), "a number"), (list, "a list"), (dict, "an object"))
    return next((kind for types, kind in kinds if isinstance(value, types)), type(value).__name__)


_CHECKED_BYTES = 1 << 16
"""What ``Source.check`` reads of a JSONL or text file: its lines that end within the first 64 KiB."""


def _check_jsonl_start(path: Path, text_field: str) -> bool:
    """The lines of ``path`` that end within its first ``_CHECKED_BYTES`` (decompressed) hold a text field. False
    when they are all of the file and no line holds text."""
    head, error = b"", None
    try:
        with open(path, "rb") as raw:
            compressed = path.name.lower().endswith((".gz", ".zst"))
            if compressed and os.fstat(raw.fileno()).st_size == 0:
                # Python's readers take no bytes for an empty stream; gzip and zstd refuse them (even an empty
                # text compresses to a header): a download that failed, which would make the corpus smaller
                raise DataError(f"cannot read {path}: it is empty (0 bytes), not {path.suffix[1:]}-compressed data")
            reader = _open_lines(path, _CountingReader(raw), buffer=_CHECKED_BYTES)
            while len(head) < _CHECKED_BYTES:
                more = reader.read1(_CHECKED_BYTES - len(head))
                if not more:
                    break
                head += more
    except DataError:
        raise
    except Exception as exc:  # a damaged .gz/.zst (OSError, EOFError, ZstdError), or a read error
        error = exc  # the lines before it are judged first, and it names the last of them
    lines = head.split(b"\n")
    if len(head) == _CHECKED_BYTES or error is not None:
        lines.pop()  # cut at the limit or by the error: judged when it is read whole
    texts = False
    for n, line in enumerate(lines, start=1):
        if line.strip():
            text = _jsonl_text(line, path, n, text_field)
            texts = texts or bool(text and text.strip())
    if error is not None:
        where = f" after line {len(lines)}" if lines else ""
        raise DataError(f"cannot read {path}{where}: {first_line(error)}") from None
    return texts or len(head) == _CHECKED_BYTES


def _check_text_start(path: Path) -> bool:
    """The first ``_CHECKED_BYTES`` of ``path`` are UTF-8 text (a character cut at the limit is fine). False when
    they are the whole file and hold nothing but white space."""
    try:
        with open(path, "rb") as f:
            head = f.read(_CHECKED_BYTES)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    whole = len(head) < _CHECKED_BYTES
    problem = _not_text(head, whole=whole)
    if problem is not None:
        raise DataError(f"{path} {problem}")
    return not whole or bool(head.decode("utf-8").removeprefix("\ufeff").strip())


def _read_jsonl(path: Path, text_field: str) -> Iterator[tuple[str, int]]:
    n = 0
    try:
        with open(path, "rb") as raw:
            counter = _CountingReader(raw)
            lines = _open_lines(path, counter)
            # A plain file's lines say where they end; a compressed one's position is what was read (1 MiB ahead).
            plain, through = lines.raw is counter, 0
            for n, line in enumerate(lines, start=1):  # noqa: B007 - n names the line in errors
                through += len(line)
                if not line.strip():
                    continue
                text = _jsonl_text(line, path, n, text_field)
                if text is not None and text.strip():
                    yield text, through if plain else counter.count
    except DataError:
        raise
    except Exception as exc:  # a truncated or damaged .gz/.zst (OSError, EOFError, ZstdError), or a read error
        # Lines are read 1 MiB ahead: the damage lies past the last line read whole, not necessarily at the next.
        where = f" after line {n}" if n else ""
        raise DataError(f"cannot read {path}{where}: {first_line(exc)}") from None


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - loads the submodule
    except ImportError:
        raise DataError("reading Parquet/Arrow needs the pyarrow package (pip install pyarrow)") from None
    return pyarrow


def _text_column(path: Path, schema, text_field: str) -> bool:
    """Refuse a missing, ambiguous or non-text column; False where its type is null (None in every row)."""
    pa = _pyarrow()
    names = list(schema.names)
    if text_field not in names:
        raise DataError(f"{path} has no column '{text_field}' (its columns: {_more(names, 8)}); "
                        f"choose one with --text-field")
    if names.count(text_field) > 1:  # Arrow and Parquet allow it; which one is the text cannot be told
        raise DataError(f"{path} has {names.count(text_field)} columns named '{text_field}'; "
                        f"rename them, or choose another column with --text-field")
    kind = schema.field(text_field).type
    if pa.types.is_dictionary(kind):  # a categorical column (pandas' "category"): its values are the text
        kind = kind.value_type
    if pa.types.is_null(kind):  # None in every row, as pandas and ``datasets`` type it: no documents, as nulls
        return False
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise DataError(f"{path}: column '{text_field}' holds {kind}, not text; choose one with --text-field")
    return True


def _parquet_file(path: Path):
    pa = _pyarrow()
    try:
        # Read, not memory-mapped: a mapping's pages would stay in the process' resident set, which grew by
        # the whole file as it was prepared (304 MB uncompressed: a peak of 806 MB, 537 MB read).
        return pa.parquet.ParquetFile(str(path), memory_map=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: not a valid Parquet file ({first_line(exc)})") from None


def _parquet_text_column(path: Path, pf, text_field: str) -> bool:
    """``_text_column``, and Parquet's own ambiguity: it names columns by dotted paths, so a column named
    "meta.text" and the field "text" of a struct column "meta" are the same name there, and reading one
    by name gave the other."""
    typed = _text_column(path, pf.schema_arrow, text_field)
    if sum(pf.schema.column(i).path == text_field for i in range(len(pf.schema))) > 1:
        head = text_field.split(".")[0]
        raise DataError(f"{path.name}: '{text_field}' names both a column and a field inside column '{head}', "
                        f"which Parquet cannot tell apart; rename one")
    return typed


def _parquet_rows(path: Path, text_field: str) -> tuple[int, bool, int]:
    """The file's rows, whether its text column may hold text (not of the null type), and how many of its rows
    the file's statistics do not count as null there (every row where it keeps no null counts)."""
    pf = _parquet_file(path)
    typed = _parquet_text_column(path, pf, text_field)
    meta = pf.metadata
    index = next((i for i in range(len(pf.schema)) if pf.schema.column(i).path == text_field), None)
    if not typed or index is None:
        return meta.num_rows, typed, meta.num_rows
    not_null = 0
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        stats = row_group.column(index).statistics
        nulls = stats.null_count if stats is not None and stats.has_null_count else 0
        not_null += row_group.num_rows - nulls
    return meta.num_rows, typed, not_null


def _texts(column, path: Path, first_row: int) -> list[tuple[int, str]]:
    """(row within ``column``, text) of its non-blank texts; its first value is row ``first_row`` (from 0) of
    ``path``."""
    try:
        values = column.to_pylist()
    except UnicodeDecodeError:  # Arrow checks no UTF-8 on write or read: other writers' bytes arrive as they are
        values = _decoded(column, path, first_row)
    return [(i, t) for i, t in enumerate(values) if t is not None and not t.isspace() and t]


def _decoded(column, path: Path, first_row: int) -> list[str | None]:
    """The values of a text column holding bytes that are no UTF-8: read as JSONL lines are (a surrogate's
    bytes as U+FFFD or its pair's character), other bytes refused naming the row."""
    out: list[str | None] = []
    for i, raw in enumerate(column.cast(_pyarrow().large_binary()).to_pylist()):
        if raw is None:
            out.append(None)
            continue
        try:
            text = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: row {first_row + i + 1}: not UTF-8 text (bad byte at offset {exc.start} "
                            f"of its text)") from None
        out.append(_without_surrogates(text) if _SURROGATE_BYTES.search(raw) else text)
    return out


def _parquet_batch_rows(meta, group: int, text_field: str) -> int:
    """Rows per batch of row group ``group`` for about ``_BATCH_BYTES`` of text, from the sizes the footer records
    (the text column's, else the whole group's): a batch of 8,192 book-length rows would be gigabytes."""
    rg = meta.row_group(group)
    size = rg.total_byte_size
    for j in range(rg.num_columns):
        if rg.column(j).path_in_schema == text_field:
            size = rg.column(j).total_uncompressed_size
            break
    return max(1, min(_MAX_BATCH_ROWS, _BATCH_BYTES * rg.num_rows // max(size, 1)))


def _read_parquet(path: Path, text_field: str) -> Iterator[tuple[str, int]]:
    pa = _pyarrow()
    pf = _parquet_file(path)
    _parquet_text_column(path, pf, text_field)
    meta = pf.metadata
    size, rows, done = path.stat().st_size, max(meta.num_rows, 1), 0
    try:
        for group in range(meta.num_row_groups):
            batch_rows = _parquet_batch_rows(meta, group, text_field)
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=[text_field]):
                # Each row's position, not its batch's end: a full disk's estimate of the store scales by it.
                for i, t in _texts(batch.column(0), path, done):
                    yield t, size * (done + i + 1) // rows
                done += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {path}: damaged Parquet data ({first_line(exc)})") from None


def _arrow_reader(path: Path, *, mapped: bool):
    """An Arrow IPC reader: the stream format (what ``datasets`` writes) or the file format. ``mapped``: through a
    memory map, to count rows (only the batches' headers are touched); else read batch by batch into memory
    that is freed after it, as a preparation reads: a mapping's pages would stay in the process' resident set,
    which grew by the whole file (304 MB: a peak of 788 MB, 518 MB read)."""
    pa = _pyarrow()
    import pyarrow.ipc as ipc

    try:
        source = pa.memory_map(str(path)) if mapped else pa.OSFile(str(path))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {path}: {first_line(exc)}") from None
    for opener in (ipc.open_stream, ipc.open_file):
        try:
            source.seek(0)
            return opener(source)
        except (pa.ArrowException, OSError, ValueError):
            continue
    raise DataError(f"cannot read {path}: not an Arrow file")


def _arrow_batches(path: Path, reader):
    pa = _pyarrow()
    try:
        if hasattr(reader, "num_record_batches"):  # the file format
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
        else:
            yield from reader
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {path}: damaged Arrow data ({first_line(exc)})") from None


def _as_bytes(array):
    """``array`` (a text column) with its buffers viewed as bytes, so that a full validation checks its offsets
    and sizes but not its UTF-8, which ``_decoded`` repairs or refuses by row."""
    pa = _pyarrow()
    kind = array.type
    if pa.types.is_dictionary(kind):
        return pa.DictionaryArray.from_arrays(array.indices, _as_bytes(array.dictionary))
    binary = (pa.large_binary() if pa.types.is_large_string(kind)
              else pa.binary_view() if pa.types.is_string_view(kind) else pa.binary())
    return pa.Array.from_buffers(binary, len(array), array.buffers(), null_count=array.null_count,
                                 offset=array.offset)


def _checked_column(batch, text_field: str, path: Path, first_row: int):
    """The text column of a batch, its offsets and sizes checked first: Arrow trusts what it reads,
    and a damaged offset read as it stands crashes the process (a segfault) instead of raising."""
    pa = _pyarrow()
    column = batch.column(batch.schema.get_field_index(text_field))
    if pa.types.is_null(column.type):  # no buffers of text to check: every value is None
        return column
    try:
        _as_bytes(column).validate(full=True)  # O(rows): reads the offsets, not the text
    except (pa.ArrowException, ValueError) as exc:
        raise DataError(f"cannot read {path}: damaged Arrow data in rows {first_row + 1:,}–"
                        f"{first_row + len(column):,} ({first_line(exc)})") from None
    return column


def _arrow_rows(path: Path, text_field: str) -> tuple[int, bool]:
    """The file's rows, and whether its text column may hold text (``_parquet_rows`` without null counts)."""
    reader = _arrow_reader(path, mapped=True)
    typed = _text_column(path, reader.schema, text_field)
    return sum(b.num_rows for b in _arrow_batches(path, reader)), typed  # memory-mapped: headers only


def _read_arrow(path: Path, text_field: str) -> Iterator[tuple[str, int]]:
    reader = _arrow_reader(path, mapped=False)
    _text_column(path, reader.schema, text_field)
    size = path.stat().st_size
    done = row = 0
    for batch in _arrow_batches(path, reader):
        column = _checked_column(batch, text_field, path, row)
        # A batch is read whole, its texts as strings are not: converted about _BATCH_BYTES at a time.
        step = max(1, _BATCH_BYTES * len(column) // max(column.nbytes, 1))
        for start in range(0, len(column), step):
            for i, t in _texts(column.slice(start, step), path, row + start):
                yield t, min(done + batch.nbytes * (start + i + 1) // len(column), size)
        done += batch.nbytes
        row += len(column)


# ----------------------------------------------------------------------------- the Hugging Face hub
def _hub_online(spec: str) -> None:
    """Fail in one line, at once, where there is no network (instead of retrying for minutes)."""
    import socket
    from urllib.parse import urlparse

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            raise DataError(f"{spec} is streamed from the Hugging Face hub, but {var} is set (no network); "
                            f"download its Parquet files and pass their folder")
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DataError(f"cannot reach {host} ({reason}): {spec} needs the network; download its Parquet "
                        f"files where there is network and pass their folder") from None


def _hub_dataset(source: Source):
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source.spec}: hub datasets need the 'datasets' package (pip install -e '.[hub]' in the "
                        f"project folder), or download the Parquet files and pass their folder") from None
    _hub_online(source.spec)
    name, config, split = source.hub
    try:
        return datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as exc:  # datasets raises many types (FileNotFoundError, ValueError, its own)
        raise DataError(f"cannot open {source.spec}: {first_line(exc)}") from None


def _read_hub(source: Source) -> Iterator[tuple[str, int]]:
    dataset = _hub_dataset(source)
    field_ = source.text_field
    try:
        for n, row in enumerate(dataset, start=1):
            if not isinstance(row, dict) or field_ not in row:
                fields = f" (its fields: {_more(sorted(row), 8)})" if isinstance(row, dict) else ""
                raise DataError(f"{source.spec} has no text field '{field_}'{fields}; choose one with --text-field")
            text = row[field_]
            if text is None:
                continue  # a missing value, as a null in a Parquet column or JSONL: no document
            if not isinstance(text, str):
                value = f"{type(text).__name__} {repr(text)[:40]}"
                raise DataError(f"{source.spec}: row {n}: '{field_}' holds the {value}, not text; "
                                f"choose another field with --text-field")
            # isascii is a flag lookup; only other text can hold a surrogate, and only the rare row that does pays
            if not text.isascii() and _SURROGATE.search(text):
                text = _without_surrogates(text)
            if text.strip():
                yield text, 0
    except DataError:
        raise
    except Exception as exc:  # a connection lost mid-stream
        raise DataError(f"reading {source.spec} failed: {first_line(exc)}") from None
