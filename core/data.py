"""Corpora, sample layouts and a deterministic sample order.

A corpus (see ``core.sources`` for what ``--data`` may name) is tokenized once
into a token store (``core.token_store``) and read from its files
(``core.samples``). Two layouts turn documents into samples of ``seq_len + 1`` tokens:
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from core.config import DataConfig
from core.errors import DataError
from core.prepare import prepare_corpus
from core.sources import joined_documents, resolve_source
from core.tokenizer import BPETokenizer

if TYPE_CHECKING:
    from core.events import Event
    from core.token_store import TokenStore

IGNORE_INDEX = -100  # targets the loss skips (cross_entropy's default ignore_index)
@dataclass(frozen=True)
class Corpus:
    """A corpus read whole into memory: for small corpora and tests (training reads the token store)."""

    name: str
    documents: list[str]
    fingerprint: str
    """sha256 of the documents."""

    @property
    def num_chars(self) -> int:
        return sum(len(d) for d in self.documents)


def load_corpus(source: str, text_field: str = "text") -> Corpus:
    """Read every document of ``source`` into memory; raise DataError with a one-line reason."""
    src = resolve_source(source, text_field)
    src.check()
    docs = list(joined_documents(d for batch, _ in src.iter_documents() for d in batch))
    if not docs:
        raise DataError(f"data source {source} is empty")
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8") + b"\x00")
    return Corpus(name=src.name, documents=docs, fingerprint=h.hexdigest())


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

    def to(self, device: torch.device, with_mask: bool = True) -> Batch:
        """On ``device``; ``with_mask=False`` leaves the mask behind (training needs none: core.trainer)."""
        # non_blocking: host-to-device copies overlap with compute on CUDA.
        nb = device.type == "cuda"
        moved = with_mask and self.attention_mask is not None
        mask = self.attention_mask.to(device, non_blocking=nb) if moved else None
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

    def num_targets(self, indices: np.ndarray | list[int]) -> int:
        """Real target tokens of these samples."""
        rows = self.samples[torch.as_tensor(np.asarray(indices), dtype=torch.long)]
        if self.pad_id is None:
            return rows.shape[0] * self.seq_len
        return int((rows[:, 1:] != self.pad_id).sum())


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


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
ORDER_ROUNDS = 6


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic): a strong bit mixer."""
    z = (z + _GOLDEN) * _MIX1
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


SAMPLE_ORDER = "feistel6-splitmix64"
"""Names ``SampleOrder``'s algorithm in every checkpoint: a resume from one saved with another order (or
on other data) cannot continue the parent's sample stream, and says so."""


class SampleOrder:
    """An endless shuffled stream of sample indices: epoch e is a permutation seeded by (seed, e).

    ``take(position, count)`` depends only on the stream position, so any split
    of a global batch into micro-batches or ranks reads the same samples.

    The permutation is computed, never stored: a 6-round Feistel network over
    the next even power of two ≥ n, keyed by (seed, epoch), maps a position in
    the epoch to a sample, and positions that land past n are mapped again
    until they fall inside (cycle walking keeps it a permutation of 0..n-1).
    Memory is O(count) per call whatever the number of samples, and a resumed
    run continues the same stream from its position alone.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        assert num_samples >= 1, num_samples
        self.n = num_samples
        self.seed = seed
        bits = max(2, (num_samples - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys: dict[int, np.ndarray] = {}

    def _round_keys(self, epoch: int) -> np.ndarray:
        keys = self._keys.get(epoch)
        if keys is None:
            if len(self._keys) > 16:
                self._keys.clear()
            keys = np.random.SeedSequence([self.seed, epoch]).generate_state(ORDER_ROUNDS, np.uint64)
            self._keys[epoch] = keys
        return keys

    def _feistel(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & self._mask)
        return (left << self._half) | right

    def _permute(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        keys = self._round_keys(epoch)
        y = self._feistel(positions, keys)
        outside = np.flatnonzero(y >= self.n)
        while len(outside):
            y[outside] = self._feistel(y[outside], keys)
            outside = outside[y[outside] >= self.n]
        return y.astype(np.int64)

    def take(self, position: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, offset = divmod(position + filled, self.n)
            m = min(count - filled, self.n - offset)
            out[filled: filled + m] = self._permute(np.arange(offset, offset + m, dtype=np.uint64), epoch)
            filled += m
        return out


def global_batch_targets(dataset, order: SampleOrder, position: int, count: int, chunk: int = 1 << 20) -> int:
    """Real target tokens of the ``count`` samples from stream ``position``, counted chunk by chunk on the
    CPU (no batch is built): the divisor of an optimizer step's loss, the same for any split."""
    if getattr(dataset, "pad_id", None) is None:  # packed: every target is a real token
        return count * dataset.seq_len
    return sum(dataset.num_targets(order.take(position + i, min(chunk, count - i))) for i in range(0, count, chunk))


@dataclass(frozen=True)
class CorpusInfo:
    """What a run records about its corpus (config.json) and compares across ranks."""

    name: str
    fingerprint: str
    """Identifies the source's content (``Source.fingerprint``)."""
    documents: int
    tokens: int
    store: str
    """The token store's folder."""
    digest: str
    """Identifies the tokens (``TokenStore.digest``): equal wherever the same corpus was prepared."""
    from_store: bool
    tokenizer_origin: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Data:
    corpus: CorpusInfo
    tokenizer: BPETokenizer
    train: Any
    """Training samples: ``len``, ``seq_len``, ``batch(indices)``, ``num_targets(indices)``."""
    val: Any
    store: TokenStore | None = None


def build_views(store: TokenStore, cfg: DataConfig, tokenizer: BPETokenizer) -> tuple[Any, Any]:
    """Training and validation samples of ``store`` in ``cfg``'s layout; DataError if there are too few."""
    from core.samples import DocumentRows, PackedWindows, SplitView, packed_split

    width = cfg.seq_len + 1
    if cfg.layout == "packed":
        if PackedWindows(store, cfg.seq_len).n < 1:
            raise DataError(f"corpus has {store.num_tokens} tokens, fewer than one sample of {width} tokens; "
                            f"use more text or a shorter sequence length")
        train, val = packed_split(store, cfg.seq_len, cfg.val_fraction)
        return PackedWindows(store, cfg.seq_len, train), PackedWindows(store, cfg.seq_len, val)
    else:
        if tokenizer.pad_id is None:
            raise DataError("the document layout needs a PAD token, and this tokenizer has none", "layout")
        base = DocumentRows(store, cfg.seq_len, tokenizer.pad_id)
    return SplitView(base, cfg.val_fraction, False), SplitView(base, cfg.val_fraction, True)


def prepare_data(cfg: DataConfig, tokenizer: BPETokenizer | None = None, *, tokenizer_origin: str = "given",
                 sink: Callable[[Event], None] | None = None, clock: Callable[[], float] | None = None,
                 run_id: str = "", should_stop: Callable[[], bool] | None = None) -> Data:
    """The corpus' token store (prepared once, opened in place after), its tokenizer (the one given, the
    ``cfg.tokenizer`` file, or one trained and cached), and train/val samples read from the store."""
    prepared = prepare_corpus(cfg, tokenizer, tokenizer_origin=tokenizer_origin, sink=sink, clock=clock,
                              run_id=run_id, should_stop=should_stop)
    train, val = build_views(prepared.store, cfg, prepared.tokenizer)
    store = prepared.store
    info = CorpusInfo(prepared.source.name, prepared.fingerprint, store.num_documents, store.num_tokens,
                      str(store.path), store.digest, prepared.from_store, prepared.tokenizer_origin)
    return Data(info, prepared.tokenizer, train, val, store)
