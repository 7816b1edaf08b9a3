"""The command line around data: prepare, list, remove; bad data, FIFOs, unwritable caches and batches that cannot
fit are one line and exit 2, with or without --nproc, and create nothing."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.cli import main
from tests.core.store_helpers import store_folders

SMALL = ["--preset", "tiny", "--micro-batch", "2", "--seq-len", "32", "--vocab-size", "300", "--eval-every", "0",
         "--no-progress", "--device", "cpu"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(folder))
    return folder


def text_corpus(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i}: " + "some words here " * (i % 9 + 2) for i in range(80)))
    return str(path)


def one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_prepare_then_train_from_the_store_then_remove(tmp_path, cache, capsys):
    data = text_corpus(tmp_path)
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "prepared in" in out and "BOS <|bos|>, EOS <|eos|>, PAD <|pad|>" in out
    assert "training the tokenizer on 80 documents …" in out  # a stage with no progress of its own is said
    assert main(["prepare", "--list"]) == 0
    assert data in capsys.readouterr().out
    assert main(["train", *SMALL, "--data", data, "--steps", "1", "--out", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "from its token store" in out and "prepared in" not in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    recorded = json.loads((run_dir / "config.json").read_text())
    assert recorded["tokenizer"]["bos"] == "<|bos|>" and recorded["tokenizer"]["eos"] == "<|eos|>"
    assert recorded["corpus"]["from_store"] and recorded["corpus"]["documents"] == 80
    assert main(["prepare", "--remove", data]) == 0  # its store, then the tokenizer trained on it
    removed = capsys.readouterr().out.splitlines()
    assert len(removed) == 2 and removed[1].startswith(f"removed 1 tokenizer trained on {data} (")
    assert main(["prepare", "--list"]) == 0
    assert "no token stores" in capsys.readouterr().out
    assert not list((cache / "tokenizers").iterdir()) and not list((cache / "stores").iterdir())
    assert main(["prepare", "--remove", data]) == 0 and capsys.readouterr().out == f"no token stores of {data}\n"
    for argv in (["--remove", "all"], ["--list", "all"]):  # 'all' is the cache folder, not a corpus of that name
        assert main(["prepare", *argv]) == 0 and capsys.readouterr().out == f"no token stores in {cache}/stores\n"
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    for folder in ("stores", "tokenizers"):  # write probes of a process killed between creating and deleting them
        (cache / folder / f".probe-{socket.gethostname()}-999999999-abc").touch()
    assert main(["prepare", "--remove", "all"]) == 0
    assert "removed 1 tokenizer trained on the corpora" in capsys.readouterr().out
    assert not list((cache / "tokenizers").iterdir()) and not list((cache / "stores").iterdir())


def test_prepare_names_relative_paths_as_the_absolute_files_they_are(tmp_path, cache, capsys, monkeypatch):
    """--list and --remove named DATA and --tokenizer as typed ("no token stores of data/corpus.txt"), and a store
    prepared with a relative tokenizer path recorded it so: typed elsewhere, the same words name other files."""
    from core.tokenizer import train_bpe

    data = Path(text_corpus(tmp_path))
    (tmp_path / "tok").mkdir()
    train_bpe([data.read_text()], 280).save(tmp_path / "tok")
    tokenizer = tmp_path / "tok" / "tokenizer.json"
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    monkeypatch.chdir(tmp_path)
    relative_data, relative_tokenizer = str(data.relative_to(tmp_path)), "tok/tokenizer.json"
    assert main(["prepare", relative_data, "--tokenizer", relative_tokenizer, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--list"]) == 0
    assert f"[{tokenizer}, 280 tokens]" in capsys.readouterr().out
    assert main(["prepare", "--remove", relative_data]) == 0
    removed = capsys.readouterr().out
    assert f"removed 1 tokenizer trained on {data} (" in removed
    assert main(["prepare", "--list", relative_data, "--tokenizer", relative_tokenizer]) == 0
    assert capsys.readouterr().out == f"no token stores of {data} made with {tokenizer}\n"
    gone = tmp_path / "gone.txt"
    assert main(["prepare", "--remove", "gone.txt"]) == 2
    assert f"data source {gone} does not exist" in capsys.readouterr().err


def test_prepare_names_the_files_of_a_folder_it_does_not_read(tmp_path, cache, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text(open(text_corpus(tmp_path)).read())
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    assert main(["prepare", str(folder), "--vocab-size", "300", "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"preparing {folder} (text, 1 file,") and "not read: logo.png" in first, first


def test_every_start_from_the_store_names_the_files_of_a_folder_it_does_not_read(tmp_path, cache, capsys):
    """Held-out splits left out of a folder were said in the preparation's first line only: a later start, from
    the store, said nothing of them."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.txt").write_text(open(text_corpus(tmp_path)).read())
    (folder / "test.txt").write_text("held out")
    assert main(["prepare", str(folder), "--vocab-size", "300", "--no-progress"]) == 0
    assert "not read: test.txt (test)" in capsys.readouterr().out.splitlines()[0]
    assert main(["prepare", str(folder), "--vocab-size", "300", "--no-progress"]) == 0
    data = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("data:"))
    assert "from its token store" in data and data.endswith("; not read: test.txt (test)"), data


def test_remove_finds_the_stores_of_every_text_field(tmp_path, cache, capsys):
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"body": f"document {i} " * 20, "text": "x"}) + "\n" for i in range(30)))
    for field in (["--text-field", "body"], []):
        assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress", *field]) == 0
    capsys.readouterr()
    assert main(["prepare", "--list", str(data)]) == 0  # its stores, each with the field it read
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and {line.split("--text-field ")[1].split()[0] for line in listed} == {"body", "text"}
    assert main(["prepare", "--list", "--remove", str(data)]) == 2
    assert "give --list or --remove, not both" in capsys.readouterr().err
    assert main(["prepare", "--remove", str(data), "--text-field", "text"]) == 0  # that field's store alone
    assert capsys.readouterr().out.count(f"removed {cache}") == 1
    assert len(list((cache / "tokenizers").iterdir())) == 1  # the tokenizer trained on the field 'body' stays
    assert main(["prepare", "--remove", str(data)]) == 0  # the rest: the one of --text-field body
    assert capsys.readouterr().out.count(f"removed {cache}") == 1
    assert not list((cache / "tokenizers").iterdir())
    assert main(["prepare", "--list"]) == 0 and "no token stores" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--remove", "all"], ["--list"], ["--list", "all"]])
def test_a_text_field_without_its_corpus_is_refused_not_ignored(args, tmp_path, cache, capsys):
    """--remove all --text-field body removed every store of every corpus, whatever field it was read from."""
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"body": f"document {i} " * 20, "text": "x"}) + "\n" for i in range(30)))
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", *args, "--text-field", "body"]) == 2
    err = capsys.readouterr().err
    assert "--text-field picks the stores of one corpus: give DATA with it" in err and len(err.splitlines()) == 1
    assert len(store_folders(cache)) == 1


@pytest.mark.parametrize("kind, field, message", [
    ("jsonl", "", "text field is empty"),  # --remove took it, and removed the corpus' tokenizers
    ("jsonl", " ", "text field is empty"),
    ("text", "body", "text field 'body' does not apply to"),  # --remove removed every store of the corpus
])
@pytest.mark.parametrize("command", ["--remove", "--list"])
def test_a_text_field_prepare_refuses_is_refused_by_list_and_remove_too(kind, field, message, command, tmp_path,
                                                                         cache, capsys):
    data = tmp_path / ("c.jsonl" if kind == "jsonl" else "c.txt")
    data.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(30))
                    if kind == "jsonl" else "\n\n".join(f"document {i} " * 20 for i in range(30)))
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    stores, tokenizers = store_folders(cache), sorted((cache / "tokenizers").iterdir())
    capsys.readouterr()
    assert main(["prepare", command, str(data), "--text-field", field]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err
    assert store_folders(cache) == stores and sorted((cache / "tokenizers").iterdir()) == tokenizers


def test_remove_and_list_take_a_tokenizer_and_say_what_they_leave(tmp_path, cache, capsys):
    """--tokenizer beside --remove removed the stores of every tokenizer without a word; a damaged store was
    left while the command said only what it removed."""
    from core.tokenizer import train_bpe

    data = text_corpus(tmp_path)
    train_bpe([open(data).read()], 300).save(tmp_path)
    tokenizer = str(tmp_path / "tokenizer.json")
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    assert main(["prepare", data, "--tokenizer", tokenizer, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--list", data, "--tokenizer", tokenizer]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["prepare", "--list", "all", "--tokenizer", tokenizer]) == 0  # "all" took every tokenizer's
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["prepare", "--remove", data, "--vocab-size", "300"]) == 2
    assert "--vocab-size does not apply to --remove" in one_line(capsys, 2)
    assert main(["prepare", "--remove", data, "--tokenizer", tokenizer]) == 0
    assert capsys.readouterr().out.count("removed ") == 1  # that tokenizer's store; the trained one's stays
    assert len(list((cache / "stores").iterdir())) == 1 and len(list((cache / "tokenizers").iterdir())) == 1
    (store,) = (cache / "stores").iterdir()
    (store / "manifest.json").write_text('{"broken')
    assert main(["prepare", "--remove", data]) == 0
    out = capsys.readouterr().out
    assert f"not removed: 1 damaged store whose corpus cannot be told ({store}); --remove all removes it" in out
    assert main(["prepare", "--remove", "all", "--tokenizer", tokenizer]) == 0  # none of that tokenizer left
    assert capsys.readouterr().out == f"no token stores in {cache}/stores made with {tokenizer}\n"
    assert len(list((cache / "stores").iterdir())) == 1
    assert main(["prepare", "--remove", "all"]) == 0 and not list((cache / "stores").iterdir())
    # Named by what its manifest cannot say, where it said "(0.00 GiB, ?)".
    assert re.search(rf"removed {re.escape(str(store))} \(\d+\.\d MiB, damaged: its manifest cannot be read: ",
                     capsys.readouterr().out)


def bad_data(tmp_path, kind: str) -> str:
    path = tmp_path / f"{kind}.txt"
    if kind == "empty":
        path.write_text("")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 20)
    elif kind == "one-word":
        path.write_text("word")
    elif kind == "fifo":
        os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]])
@pytest.mark.parametrize("kind, message", [("empty", "is empty"), ("binary", "not UTF-8"),
                                           ("one-word", "fewer than one sample"), ("fifo", "is a FIFO")])
def test_bad_data_is_one_line_before_any_process_starts(tmp_path, cache, capsys, monkeypatch, nproc, kind, message):
    if kind == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")

    def no_torchrun(*args, **kwargs):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr("core.launch.run_torchrun", no_torchrun)
    out = tmp_path / "runs"
    err = one_line(capsys, main(["train", *SMALL, "--steps", "1", "--data", bad_data(tmp_path, kind), "--out", str(out),
                                 *nproc]))
    assert message in err
    assert not out.exists()


def test_unwritable_cache_is_one_line(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(blocker / "cache"))
    out = tmp_path / "runs"
    err = one_line(capsys, main(["train", *SMALL, "--steps", "1", "--data", text_corpus(tmp_path), "--out", str(out)]))
    assert "cannot write to the cache folder" in err
    assert not out.exists() and blocker.read_text() == ""
    (tmp_path / "link").symlink_to(tmp_path / "gone")  # a cache behind a broken link: said as such ("File exists")
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "link"))
    err = one_line(capsys, main(["train", *SMALL, "--steps", "1", "--data", text_corpus(tmp_path), "--out", str(out)]))
    assert f"({tmp_path / 'link'} is a broken symbolic link)" in err and not out.exists()


@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]])
def test_a_batch_that_cannot_fit_is_one_line(tmp_path, cache, capsys, monkeypatch, nproc):
    monkeypatch.setattr("core.launch.run_torchrun", lambda *a, **k: pytest.fail("torchrun was started"))
    out = tmp_path / "runs"
    args = [a for a in SMALL if a not in ("--micro-batch", "2")]
    err = one_line(capsys, main(["train", *args, "--micro-batch", "100000000", "--steps", "1",
                                 "--data", text_corpus(tmp_path), "--out", str(out), *nproc]))
    assert "micro-batch 100,000,000 × 32 tokens needs at least" in err
    assert not out.exists()


def test_hub_dataset_without_network_is_one_line(tmp_path, cache, capsys, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = one_line(capsys, main(["prepare", "hf:HuggingFaceFW/fineweb:sample-10BT", "--no-progress"]))
    assert "HF_HUB_OFFLINE is set" in err
    assert not (cache / "stores").exists() or not [p for p in (cache / "stores").iterdir()
                                                     if not p.name.startswith(".")]


def _limited_cli(limit: int, *args: str) -> subprocess.CompletedProcess:
    """``speedboard ARGS…`` in a process whose files cannot grow past ``limit`` bytes, as on a full disk."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tests.core.full_disk_entry", "cli", str(limit), *args],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.slow
@pytest.mark.parametrize("limit, message", [(2_000, "cannot write the tokenizer into the cache folder"),
                                            (60_000, "cannot write the token store in")])
def test_a_full_disk_while_preparing_is_one_line_and_keeps_nothing(tmp_path, cache, capsys, limit, message):
    """The disk fills up while the tokenizer is cached, or while the tokens are written (numpy reports a short
    write without an error number): one line that says why, and nothing a later run would take up."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i}: " + " ".join(f"w{(i * j) % 97}" for j in range(40))
                                for i in range(1500)))
    proc = _limited_cli(limit, "prepare", str(path), "--vocab-size", "300", "--no-progress")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and message in err and "file-size limit" in err, err
    left = [p.relative_to(cache).as_posix() for p in cache.rglob("*")]
    assert not [p for p in left if ".tmp" in p or p.startswith("stores/")], left
    assert main(["prepare", str(path), "--vocab-size", "300", "--no-progress"]) == 0  # room again: prepared whole
    assert "prepared in" in capsys.readouterr().out


def test_remove_finds_the_stores_of_earlier_versions_and_of_a_deleted_file(tmp_path, cache, capsys):
    data = Path(text_corpus(tmp_path))
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    data.write_text(data.read_text() + "\n\nOne more paragraph, so the corpus is another version of itself.\n")
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--remove", str(data)]) == 0  # the store of the edited file and the one before
    out = capsys.readouterr().out
    assert out.count(f"removed {cache}") == 2 and "removed 2 tokenizers trained on" in out
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    data.unlink()
    capsys.readouterr()
    assert main(["prepare", "--remove", str(data)]) == 0  # its place still names its store and its tokenizer
    out = capsys.readouterr().out
    assert out.count(f"removed {cache}") == 1 and "removed 1 tokenizer trained on" in out
    assert main(["prepare", "--list"]) == 0
    assert "no token stores" in capsys.readouterr().out
    assert main(["prepare", "--remove", str(data)]) == 2  # nothing there and no store of it: the usual line
    assert "does not exist" in capsys.readouterr().err


def test_remove_of_a_copy_keeps_the_store_of_the_corpus_it_was_copied_from(tmp_path, cache, capsys):
    """A copy that kept its times (``cp -p``) has the original's fingerprint and so its store: ``--remove`` of the
    copy, never prepared, removed the original's store and its tokenizer (hours of preparation for a real corpus).
    Once the original is gone (the file moved), the store is the copy's alone and goes with it."""
    import shutil

    original = Path(text_corpus(tmp_path))
    assert main(["prepare", str(original), "--vocab-size", "300", "--no-progress"]) == 0
    copy = tmp_path / "backup" / "corpus.txt"
    copy.parent.mkdir()
    shutil.copy2(original, copy)
    capsys.readouterr()
    assert main(["prepare", "--list", str(copy)]) == 0  # listed: the copy would train from it
    assert str(original) in capsys.readouterr().out
    assert main(["prepare", "--remove", str(copy)]) == 0
    said, *rest = capsys.readouterr().out.splitlines()
    assert rest == [], rest
    assert said.startswith(f"kept {cache}/stores/") and said.endswith(
        f": prepared from {original}, whose content {copy} shares; `speedboard prepare --remove {original}` removes "
        f"it"), said
    assert len(list((cache / "stores").iterdir())) == 1 and len(list((cache / "tokenizers").glob("*.json"))) == 1
    original.unlink()  # moved away: the store is the copy's now
    assert main(["prepare", "--remove", str(copy)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"removed {cache}/stores/") and "removed 1 tokenizer" in out, out
    assert list((cache / "stores").iterdir()) == []


def test_relative_data_and_tokenizer_paths_are_recorded_absolute(tmp_path, cache, capsys, monkeypatch):
    """A resume from another folder reads the same corpus (the typed "c.txt" once named another file there)."""
    (tmp_path / "a").mkdir()
    Path(text_corpus(tmp_path)).rename(tmp_path / "a" / "c.txt")
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", *SMALL, "--data", "c.txt", "--steps", "1", "--out", str(tmp_path / "runs")]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    recorded = json.loads((run_dir / "config.json").read_text())["config"]["data"]
    assert recorded["source"] == str(tmp_path / "a" / "c.txt")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run_dir), "--steps", "2", "--no-progress",
                 "--out", str(tmp_path / "runs")]) == 0
    assert main(["train", *SMALL, "--data", "", "--steps", "1", "--out", str(tmp_path / "runs")]) == 2
    assert "data source is empty" in capsys.readouterr().err


def _tokenizer_without_pad(path: Path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 20, trainer=trainer)
    tok.save(str(path))
    return str(path)


def test_the_document_layout_with_a_tokenizer_without_pad_is_refused_before_tokenizing(tmp_path, cache, capsys):
    tokenizer = _tokenizer_without_pad(tmp_path / "tokenizer.json")
    err = one_line(capsys, main(["train", "--preset", "tiny", "--steps", "1", "--seq-len", "32", "--no-progress",
                                 "--data", text_corpus(tmp_path), "--tokenizer", tokenizer, "--layout", "document",
                                 "--out", str(tmp_path / "runs")]))
    assert "the document layout needs a PAD token" in err
    assert not (tmp_path / "runs").exists()
    assert not (cache / "stores").exists() or not list((cache / "stores").iterdir())


@pytest.mark.parametrize("flag", [["--vocab-size", "999"], ["--tokenizer-docs", "10"]])
def test_prepare_refuses_tokenizer_settings_beside_a_given_tokenizer(flag, tmp_path, cache, capsys):
    tokenizer = _tokenizer_without_pad(tmp_path / "tokenizer.json")
    err = one_line(capsys, main(["prepare", text_corpus(tmp_path), "--tokenizer", tokenizer, *flag, "--no-progress"]))
    assert f"{flag[0]} is for training a new tokenizer" in err
    assert not (cache / "stores").exists()


def test_a_file_named_with_a_line_break_is_still_one_line(tmp_path, cache, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n\nmore text")
    (folder / "bad\nname.csv").write_text("a,b\n1,2\n")  # a data-like file Speedboard does not read
    err = one_line(capsys, main(["prepare", str(folder), "--no-progress"]))
    assert "bad\\nname.csv" in err
    assert not cache.exists()


@pytest.mark.parametrize("argv", [["--list", ""], ["--remove", ""], [""]])
def test_prepare_refuses_an_empty_data_argument_as_train_does(cache, capsys, argv):
    """`prepare --list ''` listed every store: '' named the current folder (a FIFO there was read as data)."""
    assert one_line(capsys, main(["prepare", *argv])) == "speedboard: error: data source is empty"


@pytest.mark.parametrize("linked", [False, True])
def test_remove_waits_for_a_preparation_of_the_corpus_running_now(tmp_path, cache, capsys, monkeypatch, linked):
    """`prepare --remove DATA` said "removed" at once, and the preparation running meanwhile then put its store in
    place: DATA had a store again moments after its removal. ``linked``: the preparation named the corpus
    through a symbolic link to its folder, and the removal by its real path did not wait for it."""
    import dataclasses
    import threading

    from core import token_store
    from core.config import config_from_preset
    from core.prepare import prepare_corpus
    from core.sources import source_location
    from core.token_store import preparation_lock

    data = text_corpus(tmp_path)
    typed = data
    if linked:
        (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
        typed = str(tmp_path / "link" / Path(data).name)
    assert main(["prepare", data, "--vocab-size", "300", "--no-progress"]) == 0
    with open(data, "a") as f:  # a new version of the corpus: a store of its own
        f.write("\n\none more paragraph")
    holding, remover_waits, done = threading.Event(), threading.Event(), threading.Event()
    real_sleep = token_store.time.sleep

    def sleep(seconds):
        if threading.current_thread() is threading.main_thread():
            remover_waits.set()
        real_sleep(seconds)

    monkeypatch.setattr(token_store.time, "sleep", sleep)

    def another_preparer():  # holds a lock of this corpus, and prepares its new version under it
        with preparation_lock("f" * 32, location=source_location(typed)):
            holding.set()
            remover_waits.wait(timeout=20)
            prepare_corpus(dataclasses.replace(config_from_preset("tiny").data, source=typed, vocab_size=300))
        done.set()

    thread = threading.Thread(target=another_preparer)
    thread.start()
    assert holding.wait(timeout=20)
    capsys.readouterr()
    assert main(["prepare", "--remove", data]) == 0
    thread.join(timeout=60)
    out = capsys.readouterr().out
    assert done.is_set() and f"waiting for another process that is preparing {data} …" in out
    assert out.count("removed ") == 3, out  # both versions' stores, then the tokenizers trained on them
    assert main(["prepare", "--list", data]) == 0 and capsys.readouterr().out == f"no token stores of {data}\n"


def test_list_and_remove_name_a_corpus_by_its_absolute_path(tmp_path, cache, capsys, monkeypatch):
    """Stores of x/same.txt and y/same.txt prepared from inside x and y were both listed as "same.txt"."""
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.txt").write_text(Path(text_corpus(tmp_path)).read_text() + folder)
        monkeypatch.chdir(tmp_path / folder)
        assert main(["prepare", "same.txt", "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--list"]) == 0
    listed = capsys.readouterr().out
    assert f"{tmp_path / 'x' / 'same.txt'}  [" in listed and f"{tmp_path / 'y' / 'same.txt'}  [" in listed
    assert main(["prepare", "--remove", "same.txt"]) == 0  # from y: y's store alone
    assert f"MiB, {tmp_path / 'y' / 'same.txt'})" in capsys.readouterr().out


def test_a_corpus_named_in_another_locale_finds_its_store(tmp_path, cache, capsys):
    """Prepared under a UTF-8 locale, dätä.txt had "no token stores" under LC_ALL=C (Python decodes file names
    in the locale's encoding, and the store was keyed by that string), and train prepared it a second time."""
    data = tmp_path / "dätä.txt"
    data.write_text(Path(text_corpus(tmp_path)).read_text())
    assert main(["prepare", str(data), "--vocab-size", "300", "--no-progress"]) == 0
    capsys.readouterr()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "SPEEDBOARD_CACHE_DIR": str(cache)}
    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run([sys.executable, "-m", "core.cli", "prepare", "--list", os.fsencode(str(data))],
                            cwd=root, capture_output=True, env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert b"no token stores" not in listed.stdout and b"80 docs" in listed.stdout, listed.stdout
    assert len(list((cache / "stores").iterdir())) == 1


def test_the_first_line_counts_the_rows_of_parquet_and_the_last_its_documents(tmp_path, cache, capsys):
    """A null or blank text is a row but no document: the first line said "7 documents" of a file that held 5."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "n.parquet"
    texts = [f"document {i} " * 30 for i in range(5)]
    pq.write_table(pa.table({"text": [texts[0], None, *texts[1:3], "   ", *texts[3:]]}), path)
    assert main(["prepare", str(path), "--vocab-size", "300", "--no-progress"]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    assert ", 7 rows) into its token store" in lines[0], lines
    assert any(line.startswith("data: 5 documents,") for line in lines), lines
