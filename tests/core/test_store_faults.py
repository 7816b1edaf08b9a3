"""Faults around the token store: a cache that cannot be written to remove a store, a disk that fills up, a
damaged manifest. Each is one line, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest

import core.token_store as ts
from core.cli import main
from core.config import DataConfig
from core.errors import DataError
from core.prepare import prepare_corpus
from core.token_store import MANIFEST, TokenStore, list_stores
from tests.core.store_helpers import ENGLISH, jsonl, one_line, store_folders


def test_remove_on_a_cache_that_cannot_be_written_is_one_line(tmp_path, cache, capsys, monkeypatch):
    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    real = os.rename

    def read_only(src, dst, *args, **kwargs):  # as on a read-only mount (root may write anywhere else)
        if Path(src).parent == cache / "stores":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", read_only)
    err = one_line(capsys, main(["prepare", "--remove", data]))
    (store,) = store_folders(cache)
    assert f"cannot remove the token store {store} (Read-only file system)" in err, err
    assert "cannot be written" not in err  # its folder can: the rename was what failed
    monkeypatch.setattr(os, "rename", real)
    assert TokenStore.open(store).num_documents == len(ENGLISH)


def test_a_full_disk_is_named_before_the_half_written_store_is_removed(tmp_path, cache, monkeypatch):
    """numpy reports a short write without an error number; the disk, asked before the half-written store is
    removed (which gives its space back), says that it is full."""
    calls = []
    real_pack = ts._pack

    def short_write(*args):
        calls.append(1)
        if len(calls) > 1:
            raise OSError("1527711 requested and 1043161 written")
        return real_pack(*args)

    real_usage = shutil.disk_usage

    def usage(path):  # no room while a half-written store is there
        full = any(p.name.startswith(".tmp-") for p in (cache / "stores").iterdir())
        return real_usage(path)._replace(free=0) if full else real_usage(path)

    monkeypatch.setattr(ts, "_pack", short_write)
    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr("core.sources.Source.iter_documents",
                        lambda self, batch_chars=0, real=ts.Source.iter_documents: real(self, 200))
    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH * 4))
    with pytest.raises(DataError, match=r"\(the disk is full \(0 bytes free\)\); no token store was kept") as err:
        prepare_corpus(DataConfig(source=data, vocab_size=300))
    assert store_folders(cache) == []
    # The space it asks for is what the store takes, from the rate of the text encoded before the disk filled
    # (a fixed 0.3 tokens a byte asked for 60% of it on random words).
    monkeypatch.setattr(ts, "_pack", real_pack)
    needed = re.search(r"the store needs about ([\d.]+) kB, at the rate of its first", str(err.value))
    store = prepare_corpus(DataConfig(source=data, vocab_size=300)).store
    taken = sum((store.path / name).stat().st_size for name in (ts.TOKENS, ts.OFFSETS))
    assert needed and float(needed.group(1)) * 1e3 == pytest.approx(taken, rel=0.15), (needed, taken)


@pytest.mark.parametrize("edit", [{"documents": "x"}, {"dtype": "nonsense"}, {"tokens": -3}, {"created": 5},
                                  {"source": "x"}, [1]])
def test_a_manifest_with_values_of_other_types_is_a_damaged_store(edit, tmp_path, cache, capsys):
    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    cfg = DataConfig(source=data, vocab_size=300)
    prepare_corpus(cfg)
    (store,) = store_folders(cache)
    manifest = json.loads((store / MANIFEST).read_text())
    (store / MANIFEST).write_text(json.dumps({**manifest, **edit} if isinstance(edit, dict) else edit))
    with pytest.raises(DataError, match=f"token store {store} is damaged"):
        TokenStore.open(store)
    assert main(["prepare", "--list"]) == 0  # named in one line
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{store}: damaged (its manifest") and "--remove all removes it" in line, line
    assert list_stores()[0]["damaged"]
    prepared = prepare_corpus(cfg)  # counts as missing: prepared again, in its place
    assert not prepared.from_store and prepared.store.path == store and prepared.store.num_documents == len(ENGLISH)
    assert main(["prepare", "--remove", "all"]) == 0 and store_folders(cache) == []


@pytest.mark.parametrize("fault", ["cut", "gone"])
def test_a_store_whose_files_do_not_match_its_manifest_is_listed_as_damaged_and_removed_with_its_corpus(
        fault, tmp_path, cache, capsys):
    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    (store,) = store_folders(cache)
    if fault == "cut":
        os.truncate(store / ts.TOKENS, 1000)
    else:
        (store / ts.OFFSETS).unlink()
    capsys.readouterr()
    assert main(["prepare", "--list", data]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    why = f"{ts.TOKENS} has 1,000 bytes, not " if fault == "cut" else f"{ts.OFFSETS} is missing"
    assert f"{store}  damaged ({why}" in line and line.endswith("preparing its corpus again replaces it"), line
    assert main(["prepare", "--remove", data]) == 0 and store_folders(cache) == []


def test_a_store_removed_by_another_process_meanwhile_is_neither_listed_nor_an_error(tmp_path, cache, capsys,
                                                                                   monkeypatch):
    """prepare --list beside a prepare --remove: a store renamed aside between its manifest and its size was a
    FileNotFoundError traceback; two --remove at once: the second said "cannot remove … (No such file or
    directory)", exit code 2, for a store that was gone as asked, and stopped part-way."""
    from core.tokenizer_cache import remove_trained_tokenizers, tokenizers_dir

    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    (store,) = store_folders(cache)
    real = ts._files_damage

    def removed_meanwhile(entry, manifest):
        fault = real(entry, manifest)
        ts.remove_store(entry)  # the other process, between this one's manifest and its size
        return fault

    monkeypatch.setattr(ts, "_files_damage", removed_meanwhile)
    assert list_stores() == []
    monkeypatch.undo()
    ts.remove_store(store)  # already gone: nothing to do, no error
    tokenizers_dir().mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizers_dir() / f"source-{'a' * 32}-300.json"
    tokenizer.write_text("{}")
    real_unlink = Path.unlink

    def gone_first(self, *args, **kwargs):
        real_unlink(self, *args, **kwargs)  # the other process's removal
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", gone_first)
    assert remove_trained_tokenizers(None) == [] and not tokenizer.exists()


def test_a_cache_folder_deleted_while_waiting_for_the_lock_is_made_again(tmp_path, cache):
    """The process waiting for another's preparation reopened the lock in a stores folder deleted meanwhile: a
    FileNotFoundError traceback where the other failed in one line. It makes the folder and takes the lock."""
    shutil.rmtree(ts.stores_dir(), ignore_errors=True)
    with ts.preparation_lock("f" * 64):
        assert ts.stores_dir().is_dir()


def test_remove_of_a_corpus_also_sweeps_the_half_stores_of_killed_preparations(tmp_path, cache):
    """A kill -9 during a preparation left a half store (gigabytes on a large corpus) that neither --list showed
    nor --remove DATA removed: only --remove all, or a later preparation that wrote a store, swept it."""
    import socket

    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    dead = ts.stores_dir() / f".tmp-{'0' * 32}-{socket.gethostname()}-999999999-abcdef"
    dead.mkdir()
    (dead / ts.TOKENS).write_bytes(b"half")
    assert main(["prepare", "--remove", data]) == 0
    assert not dead.exists() and store_folders(cache) == []


def test_list_names_the_half_stores_of_killed_preparations_and_the_room_they_hold(tmp_path, cache, capsys):
    """--list showed nothing of a kill -9's half store, gigabytes on a large corpus; one being written by a live
    preparation (this process) is not a leftover."""
    import os
    import socket

    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    dead = ts.stores_dir() / f".tmp-{'0' * 32}-{socket.gethostname()}-999999999-abcdef"
    dead.mkdir()
    (dead / ts.TOKENS).write_bytes(b"h" * 3 * 2**20)
    live = ts.stores_dir() / f".tmp-{'1' * 32}-{socket.gethostname()}-{os.getpid()}-abcdef"
    live.mkdir()
    capsys.readouterr()
    assert main(["prepare", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and data in lines[0]
    assert lines[1] == (f"also 1 unfinished store of killed preparations or removals (3.0 MiB: {dead}); "
                        f"the next preparation or any prepare --remove deletes it")
    assert main(["prepare", "--list", data]) == 0  # a corpus' own stores only: the leftovers are no corpus'
    assert "unfinished" not in capsys.readouterr().out
    assert main(["prepare", "--remove", data]) == 0
    assert not dead.exists() and live.exists()
    capsys.readouterr()
    assert main(["prepare", "--list"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [f"no token stores in {ts.stores_dir()}"]
