"""Corpora, sample layouts and a deterministic sample order.

A corpus is a list of documents (strings):
- ``builtin``: the documentation topics CPython ships in ``pydoc_data`` (about
  465 KB of English), split into paragraphs; nothing is downloaded;
- a ``.txt``/``.md`` file or a folder of them, split into paragraphs at blank lines;
- a ``.jsonl`` file, one document per line in its ``text`` field.

Two layouts turn documents into samples of ``seq_len + 1`` tokens:
- ``packed``: ``[BOS] doc [EOS]`` for every document, concatenated and cut into
  windows; every position is a real token;
- ``document``: one ``[BOS] doc [EOS]`` per sample, truncated or padded with PAD;
  PAD targets are ignored by the loss and PAD keys masked in attention.

The order of samples is a function of the seed and the sample position alone,
so an optimizer step sees the same global batch whatever its split into
micro-batches (or ranks).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.config import BUILTIN_CORPUS, DataConfig
from core.errors import DataError
from core.tokenizer import BPETokenizer, get_tokenizer

IGNORE_INDEX = -100  # targets the loss skips (cross_entropy's default ignore_index)
TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: list[str]
    fingerprint: str
    """sha256 of the documents: the tokenizer cache key and a record in config.json."""

    @property
    def num_chars(self) -> int:
        return sum(len(d) for d in self.documents)


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text (bad byte at offset {exc.start})") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


def _read_jsonl(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise DataError(f"{path}:{n}: each line needs a string field 'text'")
        if row["text"].strip():
            docs.append(row["text"])
    return docs


def load_corpus(source: str) -> Corpus:
    """Read the documents of ``source``; raise DataError with a one-line reason."""
    if source == BUILTIN_CORPUS:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            raise DataError("this Python has no pydoc_data module; pass --data with a text file") from None
        docs = [p for key in sorted(topics) for p in _paragraphs(topics[key])]
        name = "builtin (Python documentation topics)"
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise DataError(f"data source {source} does not exist")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            if not files:
                raise DataError(f"folder {source} holds no .txt or .md files")
            docs = [p for f in files for p in _paragraphs(_read_text(f))]
        elif path.suffix.lower() == ".jsonl":
            docs = _read_jsonl(path)
        elif path.suffix.lower() in TEXT_SUFFIXES:
            docs = _paragraphs(_read_text(path))
        else:
            raise DataError(f"unsupported data file {path.name}: use .txt, .md, .jsonl or a folder")
        name = str(path)
    if not docs:
        raise DataError(f"data source {source} is empty")
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8") + b"\x00")
    return Corpus(name=name, documents=docs, fingerprint=h.hexdigest())


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) int64
    targets: torch.Tensor  # (B, T) int64, IGNORE_INDEX where no loss
    attention_mask: torch.Tensor | None  # (B, T) 1 real / 0 pad; None in the packed layout
    num_targets: int  # real target tokens, counted on the CPU (no device sync)

    def slice(self, start: int, stop: int) -> Batch:
        mask = None if self.attention_mask is None else self.attention_mask[start:stop]
        targets = self.targets[start:stop]
        return Batch(self.inputs[start:stop], targets, mask, int((targets != IGNORE_INDEX).sum()))

    def to(self, device: torch.device) -> Batch:
        # non_blocking: host-to-device copies overlap with compute on CUDA.
        nb = device.type == "cuda"
        mask = None if self.attention_mask is None else self.attention_mask.to(device, non_blocking=nb)
        return Batch(self.inputs.to(device, non_blocking=nb), self.targets.to(device, non_blocking=nb),
                     mask, self.num_targets)


class TokenDataset:
    """Fixed-length samples of ``seq_len + 1`` token ids, stored as int32."""

    def __init__(self, samples: torch.Tensor, pad_id: int | None) -> None:
        assert samples.ndim == 2 and samples.shape[0] > 0
        self.samples = samples
        self.pad_id = pad_id

    def __len__(self) -> int:
        return self.samples.shape[0]

    @property
    def seq_len(self) -> int:
        return self.samples.shape[1] - 1

    def batch(self, indices: np.ndarray | list[int]) -> Batch:
        rows = self.samples[torch.as_tensor(np.asarray(indices), dtype=torch.long)].long()
        inputs, targets = rows[:, :-1], rows[:, 1:].clone()
        mask = None
        if self.pad_id is not None:
            # The document layout always carries a mask, padded or not, so a
            # compiled model sees one graph signature and never recompiles mid-run.
            targets[targets == self.pad_id] = IGNORE_INDEX
            mask = (inputs != self.pad_id).long()
        return Batch(inputs.contiguous(), targets, mask, int((targets != IGNORE_INDEX).sum()))


def build_samples(token_docs: list[list[int]], cfg: DataConfig, tok: BPETokenizer) -> TokenDataset:
    width = cfg.seq_len + 1
    if tok.bos_id is None or tok.eos_id is None:
        raise DataError("the tokenizer has no BOS/EOS tokens")
    if cfg.layout == "packed":
        stream = np.fromiter((t for d in token_docs for t in (tok.bos_id, *d, tok.eos_id)), dtype=np.int32)
        n = (len(stream) - 1) // cfg.seq_len
        if n < 1:
            raise DataError(f"corpus has {len(stream)} tokens, fewer than one sample of {width} tokens; "
                            f"use more text or a shorter sequence length")
        # Windows overlap by one token so each position is a target exactly once.
        idx = np.arange(n)[:, None] * cfg.seq_len + np.arange(width)[None, :]
        return TokenDataset(torch.from_numpy(stream[idx]), pad_id=None)
    if tok.pad_id is None:
        raise DataError("the document layout needs a PAD token, and this tokenizer has none")
    out = np.full((len(token_docs), width), tok.pad_id, dtype=np.int32)
    for i, d in enumerate(token_docs):
        row = [tok.bos_id, *d, tok.eos_id][:width]
        out[i, : len(row)] = row
    return TokenDataset(torch.from_numpy(out), pad_id=tok.pad_id)


def split_train_val(ds: TokenDataset, val_fraction: float) -> tuple[TokenDataset, TokenDataset]:
    """Every k-th sample (k = 1/val_fraction) is held out, spread over the whole corpus."""
    n = len(ds)
    if n < 2:
        raise DataError(f"corpus yields {n} sample; at least 2 are needed (one for validation); "
                        f"use more text or a shorter sequence length")
    period = max(2, round(1 / val_fraction))
    is_val = (np.arange(n) % period) == period - 1
    if not is_val.any():
        is_val[-1] = True
    val = torch.from_numpy(np.flatnonzero(is_val))
    train = torch.from_numpy(np.flatnonzero(~is_val))
    return TokenDataset(ds.samples[train], ds.pad_id), TokenDataset(ds.samples[val], ds.pad_id)


class SampleOrder:
    """An endless shuffled stream of sample indices: epoch e is a permutation seeded by (seed, e).

    ``take(position, count)`` depends only on the stream position, so any split
    of a global batch into micro-batches or ranks reads the same samples.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.n = num_samples
        self.seed = seed
        self._cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            self._cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._cache[epoch]

    def take(self, position: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, offset = divmod(position + filled, self.n)
            chunk = self._perm(epoch)[offset: offset + count - filled]
            out[filled: filled + len(chunk)] = chunk
            filled += len(chunk)
        return out


@dataclass
class Data:
    corpus: Corpus
    tokenizer: BPETokenizer
    train: TokenDataset
    val: TokenDataset


def prepare_data(cfg: DataConfig, tokenizer: BPETokenizer | None = None) -> Data:
    """Read the corpus, get its tokenizer (cached, or the one given), build train/val samples."""
    corpus = load_corpus(cfg.source)
    tok = tokenizer or get_tokenizer(corpus.documents, cfg.vocab_size, corpus.fingerprint)
    token_docs = tok.encode_batch(corpus.documents)
    train, val = split_train_val(build_samples(token_docs, cfg, tok), cfg.val_fraction)
    return Data(corpus, tok, train, val)
