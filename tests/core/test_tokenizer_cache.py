"""The tokenizers trained on a corpus' sample: cached once per corpus and setting, named by the corpus so that they
go with its stores; what a killed writer left is swept; a preparation's lock file goes with its holder."""

from __future__ import annotations

import json
import os
import socket
import threading

from core.config import DataConfig
from core.events import DataPreparationStarted, ListSink
from core.prepare import prepare_corpus
from core.sources import resolve_source
from core.token_store import preparation_lock, stores_dir
from core.tokenizer_cache import (
    remove_trained_tokenizers,
    sweep_stale_tokenizers,
    tokenizers_dir,
    trained_tokenizer_path,
)
from tests.core.store_helpers import store_folders

DOCS = [f"paragraph {i}: " + " ".join(f"w{(i * j) % 53}" for j in range(30)) for i in range(60)]


def text_corpus(folder, name="c.txt", docs=DOCS):
    path = folder / name
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def test_one_cached_tokenizer_per_corpus_named_by_its_fingerprint(tmp_path, cache):
    cfg = DataConfig(source=str(text_corpus(tmp_path)), seq_len=16, vocab_size=300, tokenizer_train_docs=40)
    first = prepare_corpus(cfg)
    (cached,) = tokenizers_dir().iterdir()  # the trained tokenizer alone: no second copy, no temporary file
    assert cached == trained_tokenizer_path(first.fingerprint, 300, 40, cfg.source, "text")
    assert cached.name.startswith(f"source-{first.fingerprint[:32]}-")
    assert cached.read_text(encoding="utf-8") == first.tokenizer.to_str()
    sink = ListSink()
    again = prepare_corpus(cfg, sink=sink)  # the next start: the tokenizer from the cache, then its store
    assert again.from_store and not sink.of(DataPreparationStarted)
    assert again.tokenizer.to_str() == first.tokenizer.to_str()
    other = prepare_corpus(DataConfig(source=cfg.source, seq_len=16, vocab_size=320, tokenizer_train_docs=40))
    assert not other.from_store and len(list(tokenizers_dir().iterdir())) == 2  # another setting, another file
    assert len(store_folders(cache)) == 2  # and no lock file left beside the stores


def test_a_tokenizer_cached_under_an_earlier_name_is_found_and_renamed(tmp_path, cache):
    import hashlib

    cfg = DataConfig(source=str(text_corpus(tmp_path)), seq_len=16, vocab_size=300, tokenizer_train_docs=40)
    first = prepare_corpus(cfg)
    new = trained_tokenizer_path(first.fingerprint, 300, 40, cfg.source, "text")
    key = hashlib.sha256(f"speedboard-source-tokenizer-1:{first.fingerprint}:300:40".encode()).hexdigest()
    # The names versions before this one gave it: by the key alone, then by the corpus' fingerprint and the key.
    for earlier in (new.parent / f"source-{key[:32]}.json",
                    new.parent / f"source-{first.fingerprint[:32]}-{key[:16]}.json"):
        new.rename(earlier)
        sink = ListSink()
        assert prepare_corpus(cfg, sink=sink).from_store and not sink.of(DataPreparationStarted)  # not trained again
        assert new.is_file() and not earlier.exists()


def test_what_a_killed_writer_left_is_swept_and_only_that(tmp_path, cache):
    tokenizers_dir().mkdir(parents=True)
    host = socket.gethostname()
    dead = tokenizers_dir() / f".source-ab-cd.json.{host}-999999999.tmp"
    mine = tokenizers_dir() / f".source-ab-ef.json.{host}-{os.getpid()}.tmp"  # a writer at work
    elsewhere = tokenizers_dir() / ".source-ab-gh.json.other-host-999999999.tmp"  # shared cache: not ours to judge
    for path in (dead, mine, elsewhere):
        path.write_text("{half")
    assert sweep_stale_tokenizers() == [dead]
    assert not dead.exists() and mine.exists() and elsewhere.exists()
    mine.unlink()
    prepare_corpus(DataConfig(source=str(text_corpus(tmp_path)), seq_len=16, vocab_size=300))
    assert elsewhere.exists() and len([p for p in tokenizers_dir().iterdir() if p.suffix == ".tmp"]) == 1


def test_removing_a_corpus_tokenizers_leaves_the_others(tmp_path, cache):
    a = prepare_corpus(DataConfig(source=str(text_corpus(tmp_path)), seq_len=16, vocab_size=300))
    b_path = text_corpus(tmp_path, "b.txt", [d.replace("w", "v") for d in DOCS])
    b = prepare_corpus(DataConfig(source=str(b_path), seq_len=16, vocab_size=300))
    assert resolve_source(str(b_path)).fingerprint() == b.fingerprint
    a_cached, b_cached = (trained_tokenizer_path(c.fingerprint, 300, DataConfig().tokenizer_train_docs, c.source.spec,
                                                 "text") for c in (a, b))
    (removed, size), = remove_trained_tokenizers({a.fingerprint})
    assert removed == a_cached and size > 0 and b_cached.is_file()
    legacy = tokenizers_dir() / f"{'0' * 32}.json"  # an earlier version's copy, named by its sample's hash
    legacy.write_text("{}")
    assert {path for path, _ in remove_trained_tokenizers(None)} == {legacy, b_cached}
    assert not list(tokenizers_dir().iterdir())


def test_a_tokenizer_trained_on_an_earlier_version_that_got_no_store_goes_with_the_corpus(tmp_path, cache, capsys,
                                                                                         monkeypatch):
    """A preparation refused after its tokenizer was trained (a bad line at the end) kept that tokenizer, named by the
    fingerprint of a version that never got a store: --remove DATA, once the file was fixed, left it behind."""
    from core.cli import main
    from core.sources import Source

    monkeypatch.setattr(Source, "iter_documents",  # small batches: the bad line is read after the sample
                        lambda self, batch_chars=0, real=Source.iter_documents: real(self, 200))
    data = text_corpus(tmp_path, "c.jsonl", [json.dumps({"text": d}) for d in DOCS * 3])
    monkeypatch.setattr("core.sources._CHECKED_BYTES", 1024)  # the start a check reads: the bad line is past it
    data.write_text(data.read_text().replace("\n\n", "\n") + "\n{bad\n")
    flags = ["--vocab-size", "300", "--tokenizer-docs", "10", "--no-progress"]
    assert main(["prepare", str(data), *flags]) == 2  # trained on its first 10 documents, then the bad line
    assert "the tokenizer trained for it stays cached" in capsys.readouterr().err
    data.write_text(data.read_text().replace("{bad\n", ""))
    assert main(["prepare", str(data), *flags]) == 0
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "c.jsonl"  # the same file elsewhere: its tokenizer found, not trained again
    copy.write_bytes(data.read_bytes())
    os.utime(copy, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns))
    sink = ListSink()
    copied = prepare_corpus(DataConfig(source=str(copy), seq_len=16, vocab_size=300, tokenizer_train_docs=10),
                            sink=sink)
    assert copied.from_store and not sink.of(DataPreparationStarted)
    assert len(list(tokenizers_dir().iterdir())) == 2
    capsys.readouterr()
    assert main(["prepare", "--remove", str(data)]) == 0
    assert "removed 2 tokenizers trained on" in capsys.readouterr().out
    assert list(tokenizers_dir().iterdir()) == []


def test_the_preparation_lock_excludes_and_leaves_no_file(cache):
    """Each holder deletes the lock file as it lets go. One that had opened that file while waiting then holds a
    lock on a name nobody uses: it sees so and waits on the file now under the name, never beside its holder."""
    stores_dir().mkdir(parents=True)
    waiting, entered = threading.Event(), threading.Event()

    def second():
        with preparation_lock("f" * 64, on_wait=waiting.set):
            entered.set()

    with preparation_lock("f" * 64):
        worker = threading.Thread(target=second)
        worker.start()
        assert waiting.wait(30)  # it opened the lock file, and waits on it
    with preparation_lock("f" * 64):  # a third comes as the first goes: a new lock file under the name
        assert not entered.wait(1.0), "two processes held the preparation lock at once"
    worker.join(30)
    assert entered.is_set() and not list(stores_dir().iterdir())
