"""The token store: prepared once, found again, read exactly as the in-memory layouts were; atomic and cancellable."""

from __future__ import annotations

import errno
import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from core import token_store
from core.config import DataConfig
from core.control import Control
from core.data import SampleOrder, prepare_data
from core.errors import Cancelled, DataError
from core.event_text import data_progress_line
from core.events import DataPreparationProgress, DataPreparationStarted, DataPrepared, ListSink, RunFailed
from core.prepare import describe_source
from core.token_store import (
    MANIFEST,
    OFFSETS,
    TOKENS,
    TokenStore,
    list_stores,
    stores_dir,
    sweep_stale,
    token_dtype,
)
from core.tokenizer import BPETokenizer
from core.trainer import Trainer
from tests.core.store_helpers import store_folders

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def corpus(folder: Path, n: int = 60, name: str = "c.txt") -> Path:
    """Paragraphs of very different lengths."""
    docs = [f"doc {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + (i * 13) % 70)) + "."
            for i in range(n)]
    path = folder / name
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def test_prepared_once_then_read_from_the_store(tmp_path, cache):
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=32, vocab_size=300)
    first = ListSink()
    data = prepare_data(cfg, sink=first)
    kinds = [type(e) for e in first.events]
    assert kinds[0] is DataPreparationStarted and kinds[-1] is DataPrepared and DataPreparationProgress in kinds
    assert not first.of(DataPrepared)[0].from_store and first.of(DataPreparationStarted)[0].train_tokenizer
    (store,) = store_folders(cache)
    manifest = json.loads((store / MANIFEST).read_text())
    assert manifest["dtype"] == "uint16" and manifest["documents"] == 60
    assert manifest["tokenizer"]["eos"] == "<|eos|>" and manifest["source"]["files"][0]["path"] == "c.txt"
    again = ListSink()
    data2 = prepare_data(cfg, sink=again)
    assert [type(e) for e in again.events] == [DataPrepared] and again.of(DataPrepared)[0].from_store
    assert data2.tokenizer.to_str() == data.tokenizer.to_str() and data2.corpus.digest == data.corpus.digest
    assert isinstance(data2.store.tokens, np.memmap)


@pytest.mark.parametrize("read", ["pread", "seek and read"])
@pytest.mark.parametrize("layout", ["packed", "document"])
def test_samples_are_the_in_memory_layouts(tmp_path, cache, layout, read, monkeypatch):
    """Rows read from the store equal what the in-memory builder made: [BOS] doc [EOS], packed or padded; also
    where the system has no positional read (Windows) and the store seeks and reads."""
    if read != "pread":
        monkeypatch.setattr(token_store, "_pread", token_store._seek_read)
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300, layout=layout, val_fraction=0.1)
    data = prepare_data(cfg)
    tok = data.tokenizer
    docs = [[tok.bos_id, *ids, tok.eos_id] for ids in tok.encode_batch(
        [p for p in (tmp_path / "c.txt").read_text().split("\n\n")])]
    width = 17
    rows = torch.cat([data.train.samples, data.val.samples]).numpy()
    if layout == "packed":
        stream = np.concatenate(docs)
        sides = [view.token_starts(np.arange(len(view))) for view in (data.train, data.val)]
        assert np.array_equal(rows, np.stack([stream[i: i + width] for i in np.concatenate(sides)]))
        assert len(data.train) + len(data.val) >= (len(stream) - 1) // 16 - 2  # a window lost per side at most
        # Whole documents apart: no target of a validation window is a token of a document trained on (the
        # last training window may end on the BOS that opens the validation part).
        doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
        opens = np.zeros(len(stream), dtype=bool)
        opens[np.cumsum([0, *[len(d) for d in docs[:-1]]])] = True
        seen = [{int(doc_of[p]) for start in side for p in range(start + 1, start + width) if not opens[p]}
                for side in sides]
        assert seen[1] and not seen[0] & seen[1]
    else:
        expected = np.full((len(docs), width), tok.pad_id)
        for i, d in enumerate(docs):
            expected[i, : min(len(d), width)] = d[:width]
        is_val = (np.arange(len(expected)) % 10) == 9
        assert np.array_equal(rows, np.concatenate([expected[~is_val], expected[is_val]]))
    batch = data.train.batch([0, 3, 5])
    assert batch.num_targets == data.train.num_targets([0, 3, 5]) == int((batch.targets != -100).sum())
    assert batch.inputs.dtype == torch.int64


def test_the_packed_validation_spreads_over_the_corpus_at_document_boundaries(tmp_path, cache):
    from core.samples import SPLIT_SEGMENTS, packed_split

    cfg = DataConfig(source=str(corpus(tmp_path, n=3000)), seq_len=8, vocab_size=300)
    data = prepare_data(cfg)
    offsets = set(np.asarray(data.store.offsets).tolist())
    train, val = packed_split(data.store, 8, 0.05)
    assert len(val) == SPLIT_SEGMENTS and all(cut in offsets for cut, _ in val)  # stretches all over
    held = sum(end - cut for cut, end in val) / data.store.num_tokens
    assert 0.04 < held < 0.06 and len(data.val) > 0.04 * (len(data.train) + len(data.val))
    # One document (a book without blank lines): cut where it must be, a window on each side.
    (tmp_path / "book.txt").write_text(" ".join(WORDS * 40))
    one = prepare_data(DataConfig(source=str(tmp_path / "book.txt"), seq_len=8, vocab_size=300))
    assert one.store.num_documents == 1 and len(one.train) >= 1 and len(one.val) >= 1


def _split_of(lengths: list[int], seq_len: int):
    """``packed_split`` of a stream of documents of these token lengths (its offsets: where each begins)."""
    import types

    from core.samples import packed_split

    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    store = types.SimpleNamespace(num_tokens=int(sum(lengths)), offsets=offsets)
    return packed_split(store, seq_len, 0.05), store.num_tokens


@pytest.mark.parametrize("name, lengths, seq_len", [
    ("40 articles of ~4k tokens", [800 * 5 + 37 * i for i in range(40)], 128),
    ("a book among notes", [40, 110_000, 20, 60, 15, 50], 64),
    ("one document", [50_000], 32),
] + [(f"random {seed}", list(np.random.default_rng(seed).integers(2, 6_000, 60)), 64) for seed in range(8)])
def test_the_packed_split_holds_out_about_a_twentieth_in_ordered_ranges(name, lengths, seq_len):
    """Bounds snapped to document boundaries however far: a stretch held out its whole last document (31% of a
    corpus of 4k-token articles, 99.8% of one holding a book), and edges squeezed at the stream's end repeated a
    validation window 16 times (and gave inverted training ranges)."""
    (train, val), total = _split_of(lengths, seq_len)
    held = sum(end - cut for cut, end in val) / total
    assert 0.025 < held < 0.09, (name, held)
    bounds = [b for (t0, t1), (v0, v1) in zip(train, val, strict=True) for b in (t0, v0, v1)]
    assert bounds == sorted(bounds) and len(set(val)) == len(val)  # in order, none repeated
    assert all(t1 - t0 > seq_len and v1 - v0 > seq_len for (t0, t1), (v0, v1) in zip(train, val, strict=True))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process' mappings from /proc")
@pytest.mark.parametrize("layout", ["packed", "document"])
def test_training_reads_the_store_without_mapping_it(tmp_path, cache, layout):
    """Batches, target counts and validation read the store's files, not a memory map: a mapping's pages would
    count in the process' resident set, which grew with every batch read (an epoch: the whole token file) and
    made the CPU's training memory a measure of how much corpus was read."""
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300, layout=layout, val_fraction=0.1)
    data = prepare_data(cfg)
    for view in (data.train, data.val):
        everything = list(range(len(view)))
        assert view.batch(everything).num_targets == view.num_targets(everything) > 0
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(data.store.path) in line]
    assert mapped == []


def test_a_store_cut_short_while_a_run_reads_it_is_one_line(tmp_path, cache):
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300)
    data = prepare_data(cfg)
    last, first = len(data.train) - 1, data.train.batch([0]).inputs
    with open(data.store.path / TOKENS, "r+b") as f:
        f.truncate(100)
    assert torch.equal(data.train.batch([0]).inputs, first)  # the first 17 tokens (34 bytes) are still there
    with pytest.raises(DataError, match=r"is damaged \(tokens\.bin ends before byte [\d,]+\); remove it"):
        data.train.batch([last])


def test_offsets_are_checked_across_the_chunks_they_are_read_in(tmp_path, cache, monkeypatch):
    """A document that ends before it starts is named by its number wherever it falls: inside a chunk of the
    offsets read at opening, or across two."""
    monkeypatch.setattr(token_store, "_OFFSETS_CHUNK", 4)
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300, layout="document")
    prepare_data(cfg)
    (store,) = store_folders(cache)
    TokenStore.open(store)  # 61 offsets in chunks of 4: whole
    for zeroed, document in ((slice(8, 9), 8), (slice(6, 7), 6), (slice(9, 10), 9), (slice(12, 14), 12)):
        original = np.fromfile(store / OFFSETS, dtype=np.uint64)
        _damage_unseen(store, OFFSETS, lambda offsets, z=zeroed: offsets.__setitem__(z, 0))
        with pytest.raises(DataError, match=rf"\(document {document} ends before it starts\)"):
            TokenStore.open(store)
        _damage_unseen(store, OFFSETS, lambda offsets, o=original: offsets.__setitem__(slice(None), o))
        TokenStore.open(store)


def test_special_token_names_inside_a_document_are_text(tmp_path, cache):
    """A document that quotes "<|eos|>" or "<|pad|>" keeps them as text: BOS/EOS stand only at its ends."""
    path = corpus(tmp_path)
    path.write_text(path.read_text() + "\n\nthe marker <|eos|> ends GPT-style text, <|pad|> pads and <|bos|> opens.")
    data = prepare_data(DataConfig(source=str(path), seq_len=16, vocab_size=300, layout="document"))
    tok, store = data.tokenizer, data.store
    last = np.asarray(store.tokens[int(store.offsets[-2]):int(store.offsets[-1])])
    specials = {tok.bos_id, tok.eos_id, tok.pad_id}
    assert last[0] == tok.bos_id and last[-1] == tok.eos_id and not specials & set(last[1:-1].tolist())
    assert "the marker <|eos|> ends" in tok.decode(last[1:-1].tolist(), skip_special=False)


def test_an_end_of_text_token_added_as_a_plain_token_inside_a_document_is_text(tmp_path, cache):
    """A tokenizer.json whose "<|endoftext|>" is an added token with "special": false: HF matches plain added
    tokens in any text, so a page quoting it had EOS in its middle."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = corpus(tmp_path)
    path.write_text(path.read_text() + "\n\na page quoting <|endoftext|> in its text.")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator([path.read_text()], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())
    spec["added_tokens"][0]["special"] = False
    (tmp_path / "tok.json").write_text(json.dumps(spec))
    data = prepare_data(DataConfig(source=str(path), seq_len=16, vocab_size=300, tokenizer=str(tmp_path / "tok.json")))
    tok, store = data.tokenizer, data.store
    last = store.tokens[int(store.offsets[-2]):int(store.offsets[-1])].tolist()
    assert last[0] == last[-1] == tok.eos_id and tok.eos_id not in last[1:-1]
    assert tok.decode(last[1:-1], skip_special=False) == "a page quoting <|endoftext|> in its text."
    # A store written before, with EOS mid-document, is not the one found: such a tokenizer keys its own.
    assert token_store.tokenizer_key(tok) != token_store.tokenizer_sha256(tok)
    trained = prepare_data(DataConfig(source=str(path), seq_len=16, vocab_size=300)).tokenizer
    assert token_store.tokenizer_key(trained) == token_store.tokenizer_sha256(trained)  # others keep their stores


def test_order_needs_no_memory_per_sample():
    """An order over 300 million samples: a permutation computed by position, not a stored array."""
    order = SampleOrder(300_000_000, seed=5)
    a = order.take(10**12, 2000)
    assert a.min() >= 0 and a.max() < 300_000_000 and len(set(a.tolist())) == 2000
    assert np.array_equal(a[500:], order.take(10**12 + 500, 1500))
    for n in (1, 2, 3, 7, 64, 65, 1000):
        assert sorted(SampleOrder(n, 1).take(0, n)) == list(range(n))
        assert sorted(SampleOrder(n, 1).take(3 * n, n)) == list(range(n))


def test_a_failed_preparation_leaves_no_store(tmp_path, cache, monkeypatch):
    """A full disk mid-write: one line, and nothing under the store's name (the hidden folder is removed)."""
    import core.token_store as ts

    calls = []
    real = ts._pack

    def pack_then_fail(*args):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(ts, "_pack", pack_then_fail)
    cfg = DataConfig(source=str(corpus(tmp_path, n=3000)), seq_len=16, vocab_size=300)
    monkeypatch.setattr("core.sources.Source.iter_documents",
                        _small_batches(ts.Source.iter_documents))
    with pytest.raises(DataError, match=r"\(no space left on the device\); no token store was kept"):
        prepare_data(cfg)
    assert store_folders(cache) == [] and list_stores() == []
    monkeypatch.setattr(ts, "_pack", real)
    assert not prepare_data(cfg).corpus.from_store  # prepared from the start on the next try


def _small_batches(original):
    def iter_documents(self, batch_chars=1 << 22):
        return original(self, 2000)

    return iter_documents


def test_stop_cancels_preparation_and_keeps_nothing(tmp_path, cache, monkeypatch):
    """Control.stop during set-up: the trainer's preparation stops between chunks; no store, no run folder."""
    from tests.conftest import micro_config

    monkeypatch.setattr("core.sources.Source.iter_documents", _small_batches(
        __import__("core.sources", fromlist=["Source"]).Source.iter_documents))
    control = Control()
    seen = []

    def sink(event):
        seen.append(event)
        if isinstance(event, DataPreparationProgress) and event.stage == "tokens":
            control.stop()  # the dashboard's Stop, from the sink: the next chunk is not read

    monkeypatch.setattr("core.prepare._Reporter.progress", _every_progress)
    cfg = micro_config(tmp_path, data={"source": str(corpus(tmp_path, n=3000)), "vocab_size": 300})
    # The tokenizer trained before the stop stays cached, and the message says so (it said "nothing was kept").
    with pytest.raises(Cancelled, match="no token store was kept; the tokenizer trained for it stays cached"):
        Trainer(cfg, control, sink).run()
    assert isinstance(seen[-1], RunFailed) and "stopped" in seen[-1].message
    assert store_folders(cache) == [] and len(list((cache / "tokenizers").glob("source-*.json"))) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("signum, code, line", [
    ("SIGTERM", 143, "speedboard: terminated (SIGTERM)"),
    ("SIGHUP", 130, "speedboard: data preparation stopped; no token store was kept; the tokenizer trained for it "
                    "stays cached for the next preparation"),
])
def test_a_signal_during_prepare_keeps_nothing_and_says_so(signum, code, line, tmp_path, cache, monkeypatch, capsys):
    """`speedboard prepare` sent SIGTERM (end now) or SIGHUP (the terminal closed: stop, as a first Ctrl-C) while
    it tokenizes: one line, no store and no temporary folder left."""
    import os
    import signal

    from core.cli import ConsoleSink, main
    from core.interrupts import install_start_handlers

    monkeypatch.setattr("core.sources.Source.iter_documents", _small_batches(
        __import__("core.sources", fromlist=["Source"]).Source.iter_documents))
    monkeypatch.setattr("core.prepare._Reporter.progress", _every_progress)
    original, sent = ConsoleSink.__call__, []

    def signalled(self, event):
        if isinstance(event, DataPreparationProgress) and event.stage == "tokens" and not sent:
            sent.append(signum)
            os.kill(os.getpid(), getattr(signal, signum))
        return original(self, event)

    monkeypatch.setattr(ConsoleSink, "__call__", signalled)
    install_start_handlers()  # as main does first: the handler prepare's own is installed over, and gives back
    before = signal.getsignal(signal.SIGTERM)
    assert main(["prepare", str(corpus(tmp_path, n=3000)), "--vocab-size", "300", "--no-progress"]) == code
    assert sent and line in capsys.readouterr().err
    assert store_folders(cache) == [] and not list((cache / "stores").glob(".*tmp*"))
    assert signal.getsignal(signal.SIGTERM) is before
    # The abort watchdog (for an exception Python swallows) stands down once the exception came through.
    import threading

    for watchdog in [t for t in threading.enumerate() if t.name == "speedboard-term-watchdog"]:
        watchdog.join(timeout=60)
        assert not watchdog.is_alive()


def test_a_stop_after_the_last_batch_keeps_nothing_and_one_after_the_store_is_complete_exits_130(
        tmp_path, cache, monkeypatch, capsys):
    """Ctrl-C in prepare's last second finished the store and exited 0: `prepare && train` went on training."""
    import os
    import signal

    import core.prepare
    from core.cli import main
    from core.interrupts import install_start_handlers

    path = corpus(tmp_path, n=300)
    stop = []
    syncs = token_store.fsync

    def sync_then_stop(p):  # a stop asked while the finished files are synced, after the last batch's check
        syncs(p)
        stop.append(True)

    monkeypatch.setattr(token_store, "fsync", sync_then_stop)
    with pytest.raises(Cancelled):
        prepare_data(DataConfig(source=str(path), seq_len=16, vocab_size=300), should_stop=lambda: bool(stop))
    assert store_folders(cache) == [] and not list((cache / "stores").glob(".*tmp*"))
    monkeypatch.setattr(token_store, "fsync", syncs)

    prepare = core.prepare.prepare_corpus

    def prepared_then_interrupted(*args, **kwargs):
        result = prepare(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C asks for a stop; the store is already complete
        return result

    monkeypatch.setattr(core.prepare, "prepare_corpus", prepared_then_interrupted)
    install_start_handlers()
    assert main(["prepare", str(path), "--vocab-size", "300", "--no-progress"]) == 130
    assert "data preparation stopped once its store was complete; the store is kept" in capsys.readouterr().err
    assert len(store_folders(cache)) == 1


def _every_progress(self, stage, bytes_done, bytes_total, documents, documents_total, tokens, final=False,
                    source_bytes=None):
    """Progress events for every chunk (no throttling): the test reacts to the first one."""
    self.emit(DataPreparationProgress, stage=stage, bytes_done=bytes_done, bytes_total=bytes_total,
              documents_done=documents, documents_total=documents_total, tokens_done=tokens, eta_seconds=None)


def test_progress_eta_counts_from_the_start_of_its_stage(tmp_path, cache, monkeypatch):
    """The first progress of a stage comes after its first batch: its ETA is already an estimate, never 0:00
    while most of the corpus is still to be read."""
    import itertools
    from types import SimpleNamespace

    monkeypatch.setattr("core.prepare.time", SimpleNamespace(perf_counter=itertools.count().__next__))  # 1 s a call
    monkeypatch.setattr("core.sources._READ_CHUNK", 4096)  # the file is read in many chunks, not one
    monkeypatch.setattr("core.sources.Source.iter_documents", _small_batches(
        __import__("core.sources", fromlist=["Source"]).Source.iter_documents))
    sink = ListSink()
    prepare_data(DataConfig(source=str(corpus(tmp_path, n=3000)), seq_len=16, vocab_size=300), sink=sink)
    for stage in ("tokenizer", "tokens"):
        first = next(e for e in sink.of(DataPreparationProgress) if e.stage == stage)
        assert first.eta_seconds is not None and first.eta_seconds > 0, first


def test_training_the_tokenizer_is_a_stage_between_reading_its_sample_and_tokenizing(tmp_path, cache):
    """Training a tokenizer reports no progress of its own: one event says it starts, with its sample's size
    (the first ``tokenizer_train_docs`` documents), after the sample is read and before tokenizing begins."""
    sink = ListSink()
    prepare_data(DataConfig(source=str(corpus(tmp_path, n=300)), seq_len=16, vocab_size=300,
                            tokenizer_train_docs=120), sink=sink)
    stages = [e.stage for e in sink.of(DataPreparationProgress)]
    assert stages.count("tokenizer-training") == 1
    at = stages.index("tokenizer-training")
    assert set(stages[:at]) == {"tokenizer"} and set(stages[at + 1:]) == {"tokens"}
    (event,) = [e for e in sink.of(DataPreparationProgress) if e.stage == "tokenizer-training"]
    assert event.documents_done == 120 and event.eta_seconds is None
    assert data_progress_line(event) == "training the tokenizer on 120 documents …"


def test_one_process_prepares_and_the_others_wait_then_read_its_store(tmp_path, cache):
    """Under torchrun every rank calls the preparation: the corpus' lock lets one write while the others wait
    (saying so), then they map that same store. A stop while waiting ends the wait. flock belongs to an open
    file, so this thread holding the lock stands in for another process."""
    import threading

    from core.prepare import prepare_corpus
    from core.sources import resolve_source
    from core.token_store import preparation_lock, write_store
    from core.tokenizer import load_tokenizer_file, train_bpe

    path = corpus(tmp_path, n=300)
    tok_file = tmp_path / "tok.json"
    train_bpe(path.read_text().split("\n\n"), 300).tok.save(str(tok_file))
    cfg = DataConfig(source=str(path), seq_len=16, vocab_size=300, tokenizer=str(tok_file))
    source = resolve_source(str(path))
    waiting, result = threading.Event(), {}
    stores_dir().mkdir(parents=True)  # as the preparing process made it

    def sink(event):
        if isinstance(event, DataPreparationProgress) and event.stage == "waiting":
            waiting.set()

    def rank() -> None:
        result["prepared"] = prepare_corpus(cfg, sink=sink)

    with preparation_lock(source.fingerprint()):  # the preparing process
        waiter = threading.Thread(target=rank)
        waiter.start()
        assert waiting.wait(60), "the other process never said it waits"
        written = write_store(source, load_tokenizer_file(tok_file), source.fingerprint(), tokenizer_origin="f")
        assert waiter.is_alive()  # still waiting: the lock is held
    waiter.join(60)
    prepared = result["prepared"]
    assert prepared.from_store and prepared.store.path == written.path and store_folders(cache) == [written.path]
    other = corpus(tmp_path, n=20, name="other.txt")
    with preparation_lock(resolve_source(str(other)).fingerprint()), pytest.raises(Cancelled, match="waiting"):
        prepare_corpus(DataConfig(source=str(other), seq_len=16, tokenizer=str(tok_file)), should_stop=lambda: True)


def test_a_store_cut_short_or_missing_a_file_is_named_so(tmp_path, cache):
    prepare_data(DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300))
    (store,) = store_folders(cache)
    with open(store / TOKENS, "r+b") as f:
        f.truncate(10)
    with pytest.raises(DataError) as err:
        TokenStore.open(store)
    assert str(err.value).startswith(f"token store {store} is damaged (tokens.bin has 10 bytes, not ")
    assert str(err.value).endswith("); remove it (speedboard prepare --remove) to prepare the corpus again")
    (store / TOKENS).unlink()
    with pytest.raises(DataError, match=r"is damaged \(tokens.bin is missing\); remove it"):
        TokenStore.open(store)


def test_a_leftover_whose_writer_holds_its_lock_is_not_swept(tmp_path, cache):
    """A writer in another PID namespace (a container beside this one, sharing the cache): its process number
    means nothing here, and its store was removed mid-write. Its lock says it lives; the same goes for a
    checkpoint being saved and a tokenizer being cached."""
    from core.checkpoint.folders import _host_tag, sweep_leftovers
    from core.paths import WriterLock
    from core.tokenizer_cache import sweep_stale_tokenizers, tokenizers_dir

    stores_dir().mkdir(parents=True)
    tokenizers_dir().mkdir(parents=True)
    host = socket.gethostname()
    writing = [stores_dir() / f".tmp-{'0' * 32}-{host}-999999999-abcdef",
               tmp_path / f".step_1.tmp-999999999@{_host_tag()}-abcdef",
               tokenizers_dir() / f".source-x.json.{host}-999999999.tmp"]
    writing[0].mkdir()
    writing[1].mkdir()
    writing[2].write_text("{")
    locks = [WriterLock(path) for path in writing]
    assert sweep_stale() == [] and sweep_leftovers(tmp_path / "step_1") == [] and sweep_stale_tokenizers() == []
    assert all(path.exists() for path in writing)
    for lock in locks:  # the writer died: the kernel dropped its lock
        lock.release()
    assert sweep_stale() == [writing[0]] and sweep_leftovers(tmp_path / "step_1") == [writing[1]]
    assert sweep_stale_tokenizers() == [writing[2]] and not any(path.exists() for path in writing)


def test_damaged_or_stale_leftovers_are_not_used(tmp_path, cache):
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300)
    prepare_data(cfg)
    (store,) = store_folders(cache)
    with open(store / TOKENS, "r+b") as f:
        f.truncate(10)
    assert not prepare_data(cfg).corpus.from_store  # damaged: prepared again, replacing it
    assert prepare_data(cfg).corpus.from_store
    dead = stores_dir() / f".tmp-{'0' * 32}-{socket.gethostname()}-999999999-abcdef"
    dead.mkdir()
    (dead / TOKENS).write_bytes(b"half")
    aside = stores_dir() / f".removed-{'0' * 32}-abcdef"  # a removal killed between its rename and its delete
    aside.mkdir()
    (aside / TOKENS).write_bytes(b"gigabytes")
    assert sorted(sweep_stale()) == sorted([dead, aside]) and not dead.exists() and not aside.exists()
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    # A file lying where the store belongs is moved aside and deleted like a damaged store (it stayed, aside).
    shutil.rmtree(store)
    store.write_bytes(b"not a store")
    assert not prepare_data(cfg).corpus.from_store and store.is_dir()
    assert [p.name for p in stores_dir().iterdir() if p.name.startswith(".")] == []
    aside_file = stores_dir() / f".removed-{'1' * 32}-abcdef"
    aside_file.write_bytes(b"a file renamed aside")
    assert sweep_stale() == [aside_file] and not aside_file.exists()


def _damage_unseen(store: Path, name: str, change) -> None:
    """Change ``name`` of ``store`` and record its digest again: damage that the digest's samples (16 blocks of a
    large file) would not see."""
    from core.token_store import _digest

    array = np.memmap(store / name, dtype=np.uint64 if name == OFFSETS else np.uint16, mode="r+")
    change(array)
    array.flush()
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["digest"] = _digest(store, manifest["documents"], manifest["tokens"])
    (store / MANIFEST).write_text(json.dumps(manifest))


def test_document_offsets_out_of_order_are_damage_and_the_store_is_prepared_again(tmp_path, cache):
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300, layout="document")
    prepare_data(cfg)
    (store,) = store_folders(cache)
    _damage_unseen(store, OFFSETS, lambda offsets: offsets.__setitem__(slice(10, 20), 0))  # zeroed by bit rot
    with pytest.raises(DataError, match=r"is damaged \(document 10 ends before it starts\); remove it"):
        TokenStore.open(store)
    again = prepare_data(cfg)
    assert not again.corpus.from_store and (np.diff(again.store.offsets.astype(np.int64)) > 0).all()
    _damage_unseen(store, OFFSETS, lambda offsets: offsets.__setitem__(-1, 7))
    with pytest.raises(DataError, match="its offsets run from 0 to 7, not from 0 to "):
        TokenStore.open(store)


@pytest.mark.parametrize("layout", ["packed", "document"])
def test_a_token_id_beyond_the_vocabulary_is_one_line_when_its_batch_is_read(tmp_path, cache, layout):
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300, layout=layout)
    prepare_data(cfg)
    (store,) = store_folders(cache)
    _damage_unseen(store, TOKENS, lambda tokens: tokens.__setitem__(5, 65_535))
    data = prepare_data(cfg)
    assert data.corpus.from_store  # sizes, offsets and the digest agree: the damage shows only when read
    samples = getattr(data.train, "base", data.train)  # sample 0 holds token 5 in either layout
    assert samples.batch([1]).inputs.max() < data.tokenizer.vocab_size  # a batch without it is read
    with pytest.raises(DataError) as err:
        samples.batch([0, 1])
    assert str(err.value) == (f"token store {store} is damaged (token id 65,535 is beyond its vocabulary of "
                              f"{data.tokenizer.vocab_size:,}); remove it (speedboard prepare --remove) to "
                              f"prepare the corpus again")


@pytest.mark.parametrize("vocab", [65_536, None])
def test_a_manifest_whose_vocabulary_is_not_its_tokenizers_is_damage_and_ids_are_still_checked(tmp_path, cache,
                                                                                             vocab):
    """Ids read are checked against the manifest's vocabulary: edited (or gone), with ids beyond the model's in the
    tokens, training met an index error inside the embedding."""
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300)
    prepare_data(cfg)
    (store,) = store_folders(cache)
    _damage_unseen(store, TOKENS, lambda tokens: tokens.__setitem__(5, 65_535))
    manifest = json.loads((store / MANIFEST).read_text())
    if vocab is None:
        del manifest["tokenizer"]["vocab_size"]
    else:
        manifest["tokenizer"]["vocab_size"] = vocab
    (store / MANIFEST).write_text(json.dumps(manifest))
    tokenizer = BPETokenizer.load(store / "tokenizer.json")
    with pytest.raises(DataError, match=f"token store {store} is damaged \\(its manifest"):
        token_store.find_store(manifest["fingerprint"], tokenizer)
    again = prepare_data(cfg)  # damage counts as missing: prepared again, in its place
    assert not again.corpus.from_store and again.store.path == store
    assert int(again.store.tokens.max()) < again.tokenizer.vocab_size == again.store.vocab_size


def test_describe_source_says_what_a_picker_shows(tmp_path, cache):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = tmp_path / "shards"
    folder.mkdir()
    texts = [f"row {i} " + "text " * (i % 9 + 1) for i in range(50)]
    for k in range(2):
        pq.write_table(pa.table({"text": texts[k * 25:(k + 1) * 25]}), folder / f"{k}.parquet")
    cfg = DataConfig(source=str(folder), seq_len=16, vocab_size=300)
    info = describe_source(cfg)
    assert (info.kind, info.files, info.documents, info.prepared, info.tokens) == ("parquet", 2, 50, False, None)
    assert info.bytes == sum(p.stat().st_size for p in folder.iterdir())
    data = prepare_data(cfg)
    info = describe_source(cfg)
    assert info.prepared and info.tokens == data.store.num_tokens and info.store == str(data.store.path)
    text = describe_source(DataConfig(source=str(corpus(tmp_path)), vocab_size=300))
    assert (text.kind, text.documents, text.prepared) == ("text", None, False)


def test_tokenizer_files_and_their_special_tokens(tmp_path, cache):
    """The article series' [BOT]/[EOT]/[PAD]; a GPT-2-style <|endoftext|> alone; a file without an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def make(specials: list[str]) -> Path:
        tok = Tokenizer(models.BPE(unk_token=specials[0] if specials[0] == "[UNK]" else None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(["some words and more words"] * 20, trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False))
        path = tmp_path / f"tok{len(specials)}{specials[-1][:3]}.json"
        tok.save(str(path))
        return path

    article = make(["[UNK]", "[BOT]", "[EOT]", "[PAD]"])
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, tokenizer=str(article), layout="document")
    sink = ListSink()
    data = prepare_data(cfg, sink=sink)
    done = sink.of(DataPrepared)[0]
    assert (done.bos, done.eos, done.pad) == ("[BOT]", "[EOT]", "[PAD]") and done.tokenizer == str(article)
    assert data.tokenizer.to_str() == BPETokenizer.load(article).to_str()
    gpt2 = BPETokenizer.load(make(["<|endoftext|>"]))
    assert gpt2.bos_id == gpt2.eos_id is not None and gpt2.pad_id is None
    no_eos = make(["[UNK]", "[CLS]", "[SEP]"])
    with pytest.raises(DataError, match="has no end-of-text token") as err:
        prepare_data(DataConfig(source=str(corpus(tmp_path)), tokenizer=str(no_eos)))
    assert err.value.field == "tokenizer"
    looked_for = str(err.value).split("looked for ")[1].rstrip(")").split(", ")
    assert "[EOT]" in looked_for and "</s>" in looked_for and len(looked_for) == len(set(looked_for))
    (tmp_path / "not.json").write_text('{"this is": "not a tokenizer"}')
    with pytest.raises(DataError, match="cannot read tokenizer"):
        prepare_data(DataConfig(source=str(corpus(tmp_path)), tokenizer=str(tmp_path / "not.json")))
    (tmp_path / "no_tokenizer").mkdir()  # a folder is read for its tokenizer.json: say so when it has none
    with pytest.raises(DataError, match="tokenizer folder .*no_tokenizer holds no tokenizer.json$"):
        prepare_data(DataConfig(source=str(corpus(tmp_path)), tokenizer=str(tmp_path / "no_tokenizer")))


def test_one_tokenizer_file_with_other_roles_from_a_tokenizer_config_keeps_a_store_of_its_own(tmp_path, cache):
    """The same tokenizer.json with and without a tokenizer_config.json that swaps BOS and EOS had one store key:
    each preparation replaced the other's store (never used with the wrong roles, but tokenized again at every
    switch)."""
    from core.tokenizer import train_bpe

    plain = tmp_path / "tok.json"
    train_bpe(["some words and more words"] * 20, vocab_size=300).tok.save(str(plain))
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    shutil.copy(plain, swapped / "tokenizer.json")
    tok = BPETokenizer.load(plain)
    (swapped / "tokenizer_config.json").write_text(json.dumps({"bos_token": tok.eos_token,
                                                                "eos_token": tok.bos_token}))
    if tok.bos_id == tok.eos_id:
        pytest.skip("one token opens and closes documents: nothing to swap")
    source = str(corpus(tmp_path))
    first = prepare_data(DataConfig(source=source, seq_len=16, tokenizer=str(plain)))
    second = prepare_data(DataConfig(source=source, seq_len=16, tokenizer=str(swapped)))
    assert second.store.path != first.store.path and len(store_folders(cache)) == 2
    sink = ListSink()
    prepare_data(DataConfig(source=source, seq_len=16, tokenizer=str(plain)), sink=sink)
    assert sink.of(DataPrepared)[0].from_store  # the first is still there
    # A tokenizer_config.json naming the file's own roles changes nothing: its store is the same.
    (swapped / "tokenizer_config.json").write_text(json.dumps({"bos_token": tok.bos_token}))
    assert prepare_data(DataConfig(source=source, seq_len=16, tokenizer=str(swapped))).store.path == first.store.path


def test_tokenizer_is_trained_on_a_bounded_sample(tmp_path, cache):
    from core.tokenizer import train_bpe

    path = corpus(tmp_path, n=200)
    data = prepare_data(DataConfig(source=str(path), seq_len=16, vocab_size=300, tokenizer_train_docs=25))
    first = (tmp_path / "c.txt").read_text().split("\n\n")[:25]
    assert data.tokenizer.to_str() == train_bpe(first, 300).to_str()
    assert data.store.num_documents == 200  # all of the corpus is tokenized


def test_unwritable_cache_is_one_line_and_creates_nothing(tmp_path, monkeypatch):
    """A cache below a file (ENOTDIR), and a read-only one (EROFS): before any tokenizer is trained."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(blocker / "cache"))
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300)
    with pytest.raises(DataError, match="cannot write to the cache folder .*SPEEDBOARD_CACHE_DIR"):
        prepare_data(cfg)
    ro = tmp_path / "ro"
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(ro))

    def read_only(folder):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("core.token_store._mkstemp", read_only)
    with pytest.raises(DataError, match="Read-only file system"):
        prepare_data(cfg)
    assert not (ro / "tokenizers").exists() or not any((ro / "tokenizers").iterdir())
    assert not (ro / "stores").exists() or not any((ro / "stores").iterdir())


def test_too_little_text_is_known_before_preparing_and_exactly_after(tmp_path, cache):
    """What a data picker tells before Start: an empty or tiny text file surely gives no two samples."""
    from core.prepare import too_little_text

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a few words", encoding="utf-8")  # 11 bytes: at most 19 tokens
    with pytest.raises(DataError, match="empty.txt is empty"):  # its look reads it whole: nothing to describe
        describe_source(DataConfig(source=str(empty), seq_len=16, vocab_size=300))
    cfg = DataConfig(source=str(tiny), seq_len=16, vocab_size=300)
    problem = too_little_text(describe_source(cfg), cfg)
    assert problem is not None and "at most 19 tokens: too little text" in problem, problem
    cfg = DataConfig(source=str(tiny), seq_len=8, vocab_size=300)  # 19 tokens may be two windows of 9
    assert too_little_text(describe_source(cfg), cfg) is None
    one_doc = DataConfig(source=str(tiny), seq_len=8, vocab_size=300, layout="document")
    with pytest.raises(DataError):
        prepare_data(one_doc)  # its store is written, then its samples refused
    assert "has 1 document" in too_little_text(describe_source(one_doc), one_doc)

    big = DataConfig(source=str(corpus(tmp_path)), seq_len=32, vocab_size=300)
    assert too_little_text(describe_source(big), big) is None
    data = prepare_data(big)  # prepared: the count is exact
    tokens = data.store.num_tokens
    exact = DataConfig(source=big.source, seq_len=(tokens - 1) // 2 + 1, vocab_size=300)
    problem = too_little_text(describe_source(exact), exact)
    assert problem is not None and f"has {tokens:,} tokens" in problem
    fits = DataConfig(source=big.source, seq_len=(tokens - 1) // 2, vocab_size=300)
    assert too_little_text(describe_source(fits), fits) is None
    with pytest.raises(DataError):
        prepare_data(exact)
    prepare_data(fits)


def test_a_stop_during_tokenizer_training_is_answered_while_it_trains(tmp_path, cache, monkeypatch):
    """The training runs in a worker thread: a stop request (and so Ctrl-C's handler) is answered while it runs,
    not when it returns."""
    import threading

    release = threading.Event()

    def slow_training(docs, vocab_size):
        release.wait(120)  # a training that takes long (it releases the GIL, as the Rust one does)
        raise AssertionError("the stop was not answered while the tokenizer trained")

    monkeypatch.setattr("core.prepare.train_bpe", slow_training)
    stopped = []

    def should_stop():
        if any(t.name == "speedboard-tokenizer-training" for t in threading.enumerate()):
            stopped.append(True)
        return bool(stopped)

    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=32, vocab_size=300)
    try:
        with pytest.raises(Cancelled, match="nothing was kept"):
            prepare_data(cfg, should_stop=should_stop)
    finally:
        release.set()
    assert store_folders(cache) == []


def test_a_tokenizer_trains_on_runs_without_spaces_cut_short():
    from core.tokenizer import MAX_TRAINING_RUN, _short_runs

    text = "a b " + "x" * (2 * MAX_TRAINING_RUN + 5) + " c"
    assert [len(w) for w in _short_runs(text).split()] == [1, 1, MAX_TRAINING_RUN, MAX_TRAINING_RUN, 5, 1]
    assert _short_runs("plain text, short words") == "plain text, short words"


def test_a_stages_estimate_ends_at_the_first_total_it_reaches_and_a_done_stage_has_none(monkeypatch):
    """Reading a tokenizer's sample ends at its document limit or at the corpus' end: a small corpus half read
    is half done, whatever the limit; the stage's last line estimates nothing."""
    from core.prepare import _Reporter

    now = [0.0]
    monkeypatch.setattr("core.prepare.time.perf_counter", lambda: now[0])
    sink = ListSink()
    report = _Reporter(sink, "run", lambda: 0.0)
    report.begin("tokenizer")
    now[0] = 10.0
    report.progress("tokenizer", 500, None, 2, 100_000, 0, source_bytes=1000)
    now[0] = 20.0
    report.progress("tokenizer", 1000, None, 4, 100_000, 0, final=True, source_bytes=1000)
    etas = [e.eta_seconds for e in sink.of(DataPreparationProgress)]
    assert etas == [pytest.approx(10.0), None]


def test_a_file_written_to_while_it_is_prepared_keeps_no_store(tmp_path, cache, monkeypatch):
    """Its key and record would describe the text before the write, its tokens the text after."""
    monkeypatch.setattr("core.sources.Source.iter_documents", _small_batches(
        __import__("core.sources", fromlist=["Source"]).Source.iter_documents))
    monkeypatch.setattr("core.prepare._Reporter.progress", _every_progress)
    path = corpus(tmp_path, n=3000)
    appended = []

    def sink(event):
        if isinstance(event, DataPreparationProgress) and event.stage == "tokens" and not appended:
            appended.append(True)
            with open(path, "a") as f:
                f.write("\n\nwritten while it was read")

    with pytest.raises(DataError, match="changed while it was being prepared; no token store was kept") as caught:
        prepare_data(DataConfig(source=str(path), seq_len=32, vocab_size=300), sink=sink)
    assert appended and store_folders(cache) == []
    # The tokenizer trained a moment before is of the old text, under a fingerprint nothing matches again: it is
    # removed, and the message does not promise it for the next preparation.
    assert "stays cached" not in str(caught.value)
    assert list((cache / "tokenizers").glob("source-*.json")) == []
    prepare_data(DataConfig(source=str(path), seq_len=32, vocab_size=300))  # once written, it prepares
    assert len(store_folders(cache)) == 1


def test_a_file_rewritten_while_it_is_prepared_is_said_as_changed_not_as_bad_data(tmp_path, cache, monkeypatch):
    """A JSONL file rewritten mid-preparation with its text under another key failed to parse: "each line needs a
    string field 'text' … choose another text field", and the tokenizer trained for the old text stayed cached."""
    import json

    monkeypatch.setattr("core.sources.Source.iter_documents", _small_batches(
        __import__("core.sources", fromlist=["Source"]).Source.iter_documents))
    monkeypatch.setattr("core.prepare._Reporter.progress", _every_progress)
    docs = corpus(tmp_path, n=3000).read_text(encoding="utf-8").split("\n\n")
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    rewritten = []

    def sink(event):
        if isinstance(event, DataPreparationProgress) and event.stage == "tokens" and not rewritten:
            rewritten.append(True)
            path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs * 2), encoding="utf-8")

    with pytest.raises(DataError, match="changed while it was being prepared; no token store was kept") as caught:
        prepare_data(DataConfig(source=str(path), seq_len=32, vocab_size=300), sink=sink)
    assert rewritten and store_folders(cache) == [] and "stays cached" not in str(caught.value)
    assert list((cache / "tokenizers").glob("source-*.json")) == []


@pytest.mark.parametrize("layout, says", [
    ("packed", "use more text or a shorter sequence length"),
    ("document", "use more documents (a sample is a document in this layout)"),  # a shorter one cannot help
])
def test_a_corpus_of_one_sample_says_what_gives_its_layout_more(tmp_path, cache, layout, says):
    path = tmp_path / "one.txt"
    path.write_text(" ".join(WORDS * 2), encoding="utf-8")  # one document of ~30 tokens
    cfg = DataConfig(source=str(path), seq_len=16 if layout == "packed" else 8, vocab_size=300, layout=layout)
    with pytest.raises(DataError) as err:
        prepare_data(cfg)
    assert str(err.value) == f"corpus yields 1 sample; at least 2 are needed (one for validation); {says}"


def test_a_store_that_cannot_be_read_is_one_line(tmp_path, cache, monkeypatch):
    """A store removed or made unreadable between its checks and its opening (a prepare --remove elsewhere) is a
    DataError, which a preparation takes for a missing store, never an OSError."""
    cfg = DataConfig(source=str(corpus(tmp_path)), seq_len=16, vocab_size=300)
    prepare_data(cfg)
    (store,) = store_folders(cache)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(token_store.os, "open", refused)
    with pytest.raises(DataError, match=r"token store .* cannot be read \(Permission denied\)$"):
        TokenStore.open(store)
