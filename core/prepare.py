"""Preparing a corpus: its tokenizer, then its token store, once; found again at every later start.

``prepare_corpus`` is what ``speedboard prepare``, the trainer's set-up and the
``--nproc`` launcher call. It reports plain-data events (``DataPreparationStarted``,
``DataPreparationProgress``, ``DataPrepared``) through a sink and stops between
chunks when ``should_stop()`` says so (``Control.stop_requested``), leaving
nothing a later run would use. ``describe_source`` says what a source is and
whether it is prepared, without tokenizing anything (for a data picker).

The tokenizer is, in order: the one given (a checkpoint's), ``DataConfig.tokenizer``
(a ``tokenizer.json`` file), or one trained on the corpus' first
``tokenizer_train_docs`` documents and cached under the source's fingerprint,
so a later start finds it (and through it the store) without reading the corpus.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import wait
from dataclasses import dataclass
from pathlib import Path

from core.config import DataConfig
from core.errors import DataError, SourceChanged, SpeedboardError
from core.events import DataPreparationProgress, DataPreparationStarted, DataPrepared, Event, WarningRaised
from core.sources import Source, resolve_source, source_location
from core.stopping import native_worker
from core.token_store import TokenStore, ensure_writable, find_store, preparation_lock, stores_dir, write_store
from core.tokenizer import BPETokenizer, check_special_tokens, drops_unknown_text, load_tokenizer_file, train_bpe
from core.tokenizer_cache import (
    cached_trained_tokenizer,
    store_trained_tokenizer,
    tokenizers_dir,
    trained_tokenizer_path,
)


@dataclass(frozen=True)
class PreparedCorpus:
    source: Source
    fingerprint: str
    tokenizer: BPETokenizer
    tokenizer_origin: str
    """A file path, ``checkpoint …``, or ``trained on the first N documents``."""
    store: TokenStore
    from_store: bool
    seconds: float


TOKENIZER_SAMPLE_CHARS = 64 * 2**20
"""Characters a new tokenizer is trained on at most, besides ``tokenizer_train_docs`` documents: 100,000
documents of a few KB each (FineWeb's) are hundreds of MB in RAM, and a corpus of fewer, long documents was
held whole (1 GB of text: 1.6 GB peak and 137 s of training, where 1,000 documents took 6 s)."""


def trained_origin(cfg: DataConfig) -> str:
    first = ("first document" if cfg.tokenizer_train_docs == 1 else
             f"first {cfg.tokenizer_train_docs:,} documents at most")
    return (f"trained on the corpus' {first}, "
            f"{TOKENIZER_SAMPLE_CHARS // 2**20} Mi characters at most ({cfg.vocab_size} tokens asked)")


def _find(fingerprint: str, tok: BPETokenizer) -> TokenStore | None:
    """The complete store of this corpus and tokenizer; a damaged one counts as missing (preparing replaces it)."""
    try:
        return find_store(fingerprint, tok)
    except DataError:
        return None


def _tokenizer_cache_key(fingerprint: str, cfg: DataConfig) -> tuple[str, int, int, str, str]:
    """What names the tokenizer trained for ``cfg``'s corpus in the cache (``core.tokenizer_cache``)."""
    return fingerprint, cfg.vocab_size, cfg.tokenizer_train_docs, source_location(cfg.source), cfg.text_field


def _cached_trained_tokenizer(fingerprint: str, cfg: DataConfig) -> BPETokenizer | None:
    return cached_trained_tokenizer(*_tokenizer_cache_key(fingerprint, cfg))


class _Reporter:
    """Builds the preparation events; progress at most four times a second (and at each stage's end)."""

    def __init__(self, sink: Callable[[Event], None] | None, run_id: str, clock: Callable[[], float]) -> None:
        self.sink, self.run_id, self.clock = sink, run_id, clock
        self._last = 0.0
        self._stage_start = time.perf_counter()
        self._stage = ""

    def emit(self, event_type, **fields) -> None:
        if self.sink is not None:
            self.sink(event_type(self.run_id, self.clock(), **fields))

    def begin(self, stage: str) -> None:
        """The stage's work starts now: its ETA counts from here (its first progress comes a batch later)."""
        self._stage, self._stage_start = stage, time.perf_counter()

    def progress(self, stage: str, bytes_done: int, bytes_total: int | None, documents: int,
                 documents_total: int | None, tokens: int, final: bool = False,
                 source_bytes: int | None = None) -> None:
        """``source_bytes``: the corpus' size, for the estimate only, where the stage may end before it (a
        tokenizer's sample ends at its document limit or at the corpus' end, whichever comes first)."""
        now = time.perf_counter()
        if stage != self._stage:
            self.begin(stage)
        if not final and now - self._last < 0.25:
            return
        self._last = now
        elapsed = now - self._stage_start
        # The stage ends at whichever total it reaches first (a tokenizer's sample: its document limit, or the
        # corpus' end); a stage that is done has nothing left to estimate.
        left = [elapsed * (total - done) / done for total, done in ((bytes_total or source_bytes, bytes_done),
                                                                   (documents_total, documents)) if total and done > 0]
        eta = None if final or not left else max(0.0, min(left))
        self.emit(DataPreparationProgress, stage=stage, bytes_done=bytes_done, bytes_total=bytes_total,
                  documents_done=documents, documents_total=documents_total, tokens_done=tokens, eta_seconds=eta)


def _trained_in_a_thread(docs: list[str], vocab_size: int, should_stop: Callable[[], bool] | None) -> BPETokenizer:
    """``train_bpe`` in a native worker (``core.stopping.native_worker``): its Rust training releases the GIL, so
    this thread keeps answering Ctrl-C, SIGTERM and a stop request (which leave the worker to finish on its own,
    its result unused) instead of waiting for the training to return."""
    from core.errors import Cancelled

    training = native_worker(lambda: train_bpe(docs, vocab_size), "speedboard-tokenizer-training")
    while not training.done():
        wait([training], timeout=0.2)
        if should_stop is not None and should_stop():
            raise Cancelled("data preparation stopped; nothing was kept")
    return training.result()


def _train_tokenizer(source: Source, cfg: DataConfig, fingerprint: str, report: _Reporter,
                     should_stop: Callable[[], bool] | None) -> BPETokenizer:
    from core.errors import Cancelled

    limit = cfg.tokenizer_train_docs
    docs: list[str] = []
    chars, done = 0, 0
    report.begin("tokenizer")
    for batch, done in source.iter_documents():
        if should_stop is not None and should_stop():
            raise Cancelled("data preparation stopped; nothing was kept")
        for doc in batch[: limit - len(docs)]:
            doc = doc[: TOKENIZER_SAMPLE_CHARS - chars]  # one document longer than all the rest: its start
            docs.append(doc)
            chars += len(doc)
            if chars >= TOKENIZER_SAMPLE_CHARS:
                break
        report.progress("tokenizer", done, None, len(docs), limit, 0, source_bytes=source.bytes)
        if len(docs) >= limit or chars >= TOKENIZER_SAMPLE_CHARS:
            break
    if not docs:
        raise DataError(f"data source {source.spec} is empty (no text)")
    report.progress("tokenizer", done, None, len(docs), limit, 0, final=True)
    # Training gives no progress of its own (tokenizers' bars draw to a terminal only): say that it runs.
    report.progress("tokenizer-training", done, None, len(docs), None, 0, final=True)
    tok = _trained_in_a_thread(docs, cfg.vocab_size, should_stop)
    store_trained_tokenizer(tok, *_tokenizer_cache_key(fingerprint, cfg))
    return tok


def prepare_corpus(cfg: DataConfig, tokenizer: BPETokenizer | None = None, *, tokenizer_origin: str = "given",
                   sink: Callable[[Event], None] | None = None, clock: Callable[[], float] | None = None,
                   run_id: str = "", should_stop: Callable[[], bool] | None = None) -> PreparedCorpus:
    """The corpus of ``cfg`` with its tokenizer and token store, prepared now if it has none yet.

    Every check that can fail on the user's input (the source, its files' headers, the tokenizer,
    a writable cache) runs before anything is written.
    """
    t0 = time.perf_counter()
    start = time.perf_counter()
    report = _Reporter(sink, run_id, clock or (lambda: time.perf_counter() - start))
    source = resolve_source(cfg.source, cfg.text_field)
    tok, origin = tokenizer, tokenizer_origin
    if tok is None and cfg.tokenizer:
        tok, origin = load_tokenizer_file(cfg.tokenizer), str(Path(cfg.tokenizer).expanduser())
    elif tok is not None:
        check_special_tokens(tok, origin)
    if tok is not None and cfg.layout == "document" and tok.pad_id is None:
        # Known now: not after hours of tokenizing (build_views says the same of a tokenizer trained here).
        raise DataError("the document layout needs a PAD token, and this tokenizer has none", "layout")
    fingerprint = source.fingerprint()
    if tok is None:
        tok = _cached_trained_tokenizer(fingerprint, cfg)
        origin = trained_origin(cfg)
    store = _find(fingerprint, tok) if tok is not None else None
    if store is not None:
        _report_prepared(report, source, store, tok, origin, True, 0.0)
        return PreparedCorpus(source, fingerprint, tok, origin, store, True, 0.0)

    source.check()
    ensure_writable(stores_dir())
    if tok is None:
        ensure_writable(tokenizers_dir())
    report.emit(DataPreparationStarted, source=source.spec, source_kind=source.kind, files=len(source.files),
                bytes_total=source.bytes, documents_total=source.documents, train_tokenizer=tok is None,
                skipped=source.ignored)

    def waiting() -> None:
        report.progress("waiting", 0, source.bytes, 0, source.documents, 0, final=True)

    with preparation_lock(fingerprint, on_wait=waiting, should_stop=should_stop,
                          location=source_location(source.spec)):
        trained_now = False
        if tok is None:  # another process may have trained it while this one waited
            tok = _cached_trained_tokenizer(fingerprint, cfg)
            if tok is None:
                tok, trained_now = _train_tokenizer(source, cfg, fingerprint, report, should_stop), True
        store = _find(fingerprint, tok)
        from_store = store is not None
        if store is None:
            total = source.bytes

            def progress(done: int, docs: int, tokens: int) -> None:
                report.progress("tokens", done, total, docs, source.documents, tokens)

            if drops_unknown_text(tok):
                report.emit(WarningRaised, message=f"tokenizer {origin} has no unknown token: a character it has no "
                                                   f"token for is left out of the tokens, without a trace")
            report.begin("tokens")
            try:
                store = write_store(source, tok, fingerprint, tokenizer_origin=origin, progress=progress,
                                    should_stop=should_stop)
            except SourceChanged:
                if trained_now:  # its sample is of the text before the write, and its name the old fingerprint's
                    trained_tokenizer_path(*_tokenizer_cache_key(fingerprint, cfg)).unlink(missing_ok=True)
                raise
            except SpeedboardError as exc:
                if not trained_now:
                    raise
                # The store is gone, but the tokenizer trained a moment ago stays cached (a later preparation
                # skips its training): "nothing was kept" would not be true.
                raise type(exc)(f"{exc}; the tokenizer trained for it stays cached for the next preparation",
                                exc.field) from None
            report.progress("tokens", total or 0, total, store.num_documents, store.num_documents,
                            store.num_tokens, final=True)
    seconds = time.perf_counter() - t0
    _report_prepared(report, source, store, tok, origin, from_store, 0.0 if from_store else seconds)
    return PreparedCorpus(source, fingerprint, tok, origin, store, from_store, seconds)


def _report_prepared(report: _Reporter, source: Source, store: TokenStore, tok: BPETokenizer, origin: str,
                     from_store: bool, seconds: float) -> None:
    report.emit(DataPrepared, source=source.spec, documents=store.num_documents, tokens=store.num_tokens,
                from_store=from_store, store=str(store.path), seconds=seconds, tokenizer=origin,
                vocab_size=tok.vocab_size, bos=tok.bos_token, eos=tok.eos_token, pad=tok.pad_token,
                skipped=source.ignored)


# ----------------------------------------------------------------------------- for a data picker
@dataclass(frozen=True)
class SourceInfo:
    """What a source is, found cheaply (file listing, headers, a sampled fingerprint; no tokenizing)."""

    spec: str
    kind: str
    name: str
    files: int
    bytes: int | None
    documents: int | None
    """Exact once prepared; Parquet/Arrow row counts before; None for text files and hub datasets."""
    ignored: tuple[str, ...]
    prepared: bool
    """A token store exists for this source and tokenizer: training starts at once."""
    tokens: int | None
    store: str | None


def describe_source(cfg: DataConfig, tokenizer: BPETokenizer | None = None) -> SourceInfo:
    """``cfg.source`` as a data picker shows it; DataError (one line) when it cannot be used."""
    source = resolve_source(cfg.source, cfg.text_field)
    tok = tokenizer or (load_tokenizer_file(cfg.tokenizer) if cfg.tokenizer else None)
    if source.kind != "hub":  # a hub dataset is looked up when a run prepares it (it needs the network)
        source.check()
    fingerprint = source.fingerprint()
    tok = tok or _cached_trained_tokenizer(fingerprint, cfg)
    store = _find(fingerprint, tok) if tok is not None else None
    documents = store.num_documents if store is not None else source.documents
    return SourceInfo(source.spec, source.kind, source.name, len(source.files), source.bytes, documents,
                      source.ignored, store is not None, store.num_tokens if store is not None else None,
                      str(store.path) if store is not None else None)


def too_little_text(info: SourceInfo, cfg: DataConfig) -> str | None:
    """Why ``info``'s source surely cannot give two samples of ``cfg`` (one is held out for validation), or
    None when it may.

    Exact once prepared (its tokens and documents are counted). Before, for plain text, a bound: a
    byte-level BPE token covers at least one byte and documents are parted by blank lines, so a file of
    B bytes yields at most B + 2·(B + 2)/3 tokens (with BOS/EOS) in at most (B + 2)/3 documents; other
    formats are judged when prepared.
    """
    if info.bytes == 0:
        return f"data source {info.spec} is empty (no text)"
    tokens, documents = info.tokens, info.documents
    if tokens is None and info.kind in ("text", "builtin") and info.bytes is not None:
        documents = (info.bytes + 2) // 3
        tokens = info.bytes + 2 * documents
    if cfg.layout == "packed" and tokens is not None and (tokens - 1) // cfg.seq_len < 2:
        most = "has" if info.tokens is not None else "has at most"
        return (f"{info.name} {most} {tokens:,} tokens: too little text for two samples of {cfg.seq_len + 1} "
                f"tokens (one is held out for validation); use more text or a shorter sequence length")
    if cfg.layout == "document" and documents is not None and documents < 2:
        return (f"{info.name} has {documents} document: the document layout needs at least 2 (one is held out "
                f"for validation); use more text or the packed layout")
    return None
