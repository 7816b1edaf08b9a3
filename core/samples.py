"""Samples read from a token store: no sample is ever held in memory before its batch is built.

- ``PackedWindows``: sample i is ``tokens[i·T : i·T + T + 1]`` of a range of the flat stream
  (windows overlap by one token, so every position is a target exactly once); ``packed_split``
  gives the training and the validation ranges, whole documents apart;
- ``DocumentRows``: sample i is document i (``[BOS] doc [EOS]``), truncated to
  T + 1 tokens or padded with PAD; padding is positional (past the document's
  end), so its count of real targets comes from the offsets alone;
- ``SplitView``: the training or validation samples of either, by arithmetic on
  the index (every k-th sample is held out), without an index array.

A batch is read from the store's files (one positional read per row, see
``core.token_store``) in the store's compact dtype and only then widened to
int64, one micro-batch at a time.
"""

from __future__ import annotations

import abc

import numpy as np
import torch

from core.data import IGNORE_INDEX, Batch
from core.errors import DataError
from core.token_store import TokenStore

_CHUNK = 1 << 20
"""Indices per chunk when counting targets over a whole global batch: memory stays bounded."""


class StoreSamples(abc.ABC):
    """The samples of one layout over a store; subclasses say how sample i is cut."""

    more_samples = "use more text or a shorter sequence length"
    """What gives this layout more samples, for a message."""

    def __init__(self, store: TokenStore, seq_len: int, pad_id: int | None) -> None:
        self.store = store
        self.width = seq_len + 1
        self.pad_id = pad_id

    @property
    def seq_len(self) -> int:
        return self.width - 1

    @abc.abstractmethod
    def __len__(self) -> int:
        """Samples of this layout."""

    @abc.abstractmethod
    def rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows of ``width`` tokens in the store's dtype, real tokens per row)."""

    @abc.abstractmethod
    def row_lengths(self, indices: np.ndarray) -> np.ndarray:
        """Real tokens of each sample (before truncation to ``width``)."""

    def checked_rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows``, their ids checked against the vocabulary: a damaged store is one line here, not an index
        error inside the model or training on wrong tokens."""
        rows, lengths = self.rows(indices)
        self.store.check_ids(rows)
        return rows, lengths

    def batch(self, indices) -> Batch:
        idx = np.asarray(indices, dtype=np.int64)
        rows, lengths = self.checked_rows(idx)
        tokens = torch.from_numpy(np.array(rows, dtype=np.int64))  # a plain array, widened here
        inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
        mask = None
        if self.pad_id is not None:
            positions = torch.arange(self.width - 1)
            real = torch.from_numpy(lengths)[:, None]
            targets[positions[None, :] + 1 >= real] = IGNORE_INDEX
            # For inspection and left-padding callers: training needs none (core.trainer, _TRAINING_MASK).
            mask = (positions[None, :] < real).long()
        count = int((np.minimum(lengths, self.width) - 1).sum())
        return Batch(inputs.contiguous(), targets, mask, count)

    def num_targets(self, indices) -> int:
        """Real target tokens of these samples, without building their batch."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.pad_id is None:
            return len(idx) * self.seq_len
        return int(sum((np.minimum(self.row_lengths(idx[i:i + _CHUNK]), self.width) - 1).sum()
                       for i in range(0, len(idx), _CHUNK)))

    @property
    def samples(self) -> torch.Tensor:
        """Every sample as one int32 tensor (rows of ``seq_len + 1``): for small corpora and inspection only."""
        rows, _ = self.checked_rows(np.arange(len(self), dtype=np.int64))
        return torch.from_numpy(np.array(rows, dtype=np.int32))


class PackedWindows(StoreSamples):
    """Windows of ``seq_len + 1`` tokens cut from token ranges of the store (``regions``; the whole stream by
    default), numbered region after region: a window never crosses from one region into the next."""

    def __init__(self, store: TokenStore, seq_len: int, regions: list[tuple[int, int]] | None = None) -> None:
        super().__init__(store, seq_len, None)
        regions = regions if regions is not None else [(0, store.num_tokens)]
        counts = [max(0, (end - start - 1) // seq_len) for start, end in regions]
        self._starts = np.array([start for start, _ in regions], dtype=np.int64)
        self._first = np.cumsum([0, *counts], dtype=np.int64)
        """The number of each region's first window."""
        self.n = int(self._first[-1])

    def __len__(self) -> int:
        return self.n

    def token_starts(self, indices: np.ndarray) -> np.ndarray:
        """Where in the stream each of these windows begins."""
        region = np.searchsorted(self._first, indices, side="right") - 1
        return self._starts[region] + (indices - self._first[region]) * self.seq_len

    def rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert len(indices) == 0 or (indices.min() >= 0 and indices.max() < self.n), "sample index out of range"
        lengths = np.full(len(indices), self.width, dtype=np.int64)
        return self.store.read_rows(self.token_starts(np.asarray(indices, dtype=np.int64)), lengths,
                                    self.width), lengths

    def row_lengths(self, indices: np.ndarray) -> np.ndarray:
        return np.full(len(indices), self.width, dtype=np.int64)


class DocumentRows(StoreSamples):
    more_samples = "use more documents (a sample is a document in this layout)"

    def __init__(self, store: TokenStore, seq_len: int, pad_id: int) -> None:
        super().__init__(store, seq_len, pad_id)

    def __len__(self) -> int:
        return self.store.num_documents

    def row_lengths(self, indices: np.ndarray) -> np.ndarray:
        starts, ends = self.store.document_bounds(indices)
        return ends - starts

    def rows(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert len(indices) == 0 or (indices.min() >= 0 and indices.max() < len(self)), "sample index out of range"
        starts, ends = self.store.document_bounds(indices)
        lengths = np.minimum(ends - starts, self.width)
        rows = self.store.read_rows(starts, lengths, self.width)
        rows[np.arange(self.width)[None, :] >= lengths[:, None]] = self.pad_id
        return rows, lengths


SPLIT_SEGMENTS = 20
"""The packed layout holds out a validation range in each of this many stretches of the corpus (fewer in a
small one), so that validation spreads over the corpus as the document layout's every k-th document does."""


def packed_split(store: TokenStore, seq_len: int, val_fraction: float) -> tuple[list[tuple[int, int]],
                                                                                 list[tuple[int, int]]]:
    """Training and validation token ranges of the packed layout: in each of ``SPLIT_SEGMENTS`` stretches of
    the stream, its last ``val_fraction`` validates, every bound at a document boundary where one lies near.

    Every k-th window held out cut documents between the two sides: two thirds of the validation tokens came
    from documents trained on (the builtin corpus, tiny preset), and the validation loss read low. A corpus
    of one document (or of documents longer than a stretch's validation part) is still cut where it must be."""
    total, width = store.num_tokens, seq_len + 1
    windows = (total - 1) // seq_len
    if windows < 2:
        raise DataError(f"corpus yields {windows} sample; at least 2 are needed (one for validation); "
                        f"use more text or a shorter sequence length")
    offsets = store.offsets

    def boundary(x: int, lo: int, hi: int) -> int:
        """The document boundary nearest ``x`` within [lo, hi] (lo ≤ hi), else ``x`` brought into it."""
        i = int(np.searchsorted(offsets, x))
        near = [int(offsets[j]) for j in (i - 1, i) if 0 <= j < len(offsets) and lo <= int(offsets[j]) <= hi]
        return min(near, key=lambda b: abs(b - x)) if near else min(max(x, lo), hi)

    # A bound moves to a document boundary only within a quarter of a stretch (an edge) or half the held-out part
    # (a cut) of where it belongs: snapped any farther, a stretch held out its whole last document (31% of a corpus
    # of 4k-token articles, 99.8% of one holding a book), and edges squeezed together at the end of the stream
    # repeated one validation window 16 times. A document longer than that is cut where the bound belongs.
    segments = max(1, min(SPLIT_SEGMENTS, windows // 100))
    reach = round(total / segments / 4)
    edges = [0]
    for k in range(1, segments):
        target = round(total * k / segments)
        lo, hi = max(edges[-1] + 4 * width, target - reach), min(total - 4 * width, target + reach)
        if lo <= hi:  # else no room for another stretch here: this one runs on to the next edge
            edges.append(boundary(target, lo, hi))
    edges.append(total)
    train, val = [], []
    for start, end in zip(edges, edges[1:], strict=False):
        # The validation part: a share of the stretch, at least one window. The training part ends on the cut's
        # token (a document's BOS there), its last target, as windows overlap: each side keeps a window.
        held = max(width, round((end - start) * val_fraction))
        ideal = end - held
        lo, hi = max(start + seq_len, ideal - held // 2), min(end - width, ideal + held // 2)
        cut = boundary(ideal, lo, hi) if lo <= hi else max(start + seq_len, min(ideal, end - width))
        assert start + seq_len <= cut <= end - width, (start, cut, end)
        train.append((start, cut + 1))
        val.append((cut, end))
    return train, val


class SplitView:
    """Training or validation samples of ``base``: sample k·p + p − 1 is held out for validation
    (p = round(1/val_fraction), at least 2; the last sample when there are fewer than p)."""

    def __init__(self, base: StoreSamples, val_fraction: float, validation: bool) -> None:
        n = len(base)
        if n < 2:
            raise DataError(f"corpus yields {n} sample; at least 2 are needed (one for validation); "
                            f"{base.more_samples}")
        self.base = base
        self.period = max(2, round(1 / val_fraction))
        self.validation = validation
        held_out = n // self.period
        self._few = held_out == 0  # fewer samples than one period: the last one validates
        held_out = held_out or 1
        self.n = held_out if validation else n - held_out
        self.pad_id = base.pad_id

    def __len__(self) -> int:
        return self.n

    @property
    def seq_len(self) -> int:
        return self.base.seq_len

    def base_indices(self, indices) -> np.ndarray:
        """Indices into ``base`` of these samples of the view."""
        idx = np.asarray(indices, dtype=np.int64)
        if self._few:
            return np.full_like(idx, len(self.base) - 1) if self.validation else idx
        if self.validation:
            return idx * self.period + self.period - 1
        return idx + idx // (self.period - 1)

    def batch(self, indices) -> Batch:
        return self.base.batch(self.base_indices(indices))

    def num_targets(self, indices) -> int:
        return self.base.num_targets(self.base_indices(indices))

    @property
    def samples(self) -> torch.Tensor:
        """Every sample as one int32 tensor: for small corpora and inspection only."""
        rows, _ = self.base.checked_rows(self.base_indices(np.arange(self.n)))
        return torch.from_numpy(np.array(rows, dtype=np.int32))
