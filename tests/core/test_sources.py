"""Corpus sources: every format read as a stream, the same documents whatever the format; bad sources in one line."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from core.config import DataConfig
from core.data import load_corpus, prepare_data
from core.errors import DataError
from core.sources import resolve_source

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

DOCS = [f"document {i}: " + "words flow on " * (1 + i % 7) + "and end." for i in range(40)]


def write_parquet(path: Path, docs=DOCS, column: str = "text", row_group_size: int = 16) -> Path:
    table = pa.table({column: pa.array(docs, pa.string()), "id": pa.array(range(len(docs)), pa.int64())})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, docs=DOCS, key: str = "text") -> Path:
    data = "\n".join(json.dumps({key: d, "url": "x"}) for d in docs).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def one_line_error(call) -> str:
    with pytest.raises(DataError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"])
def test_every_format_reads_the_same_documents(tmp_path, name):
    path = tmp_path / name
    write_parquet(path) if name.endswith(".parquet") else write_jsonl(path)
    assert load_corpus(str(path)).documents == DOCS


@pytest.mark.parametrize("name", ["c.jsonl", "c.parquet"])
def test_null_and_blank_texts_are_no_documents_in_any_format(tmp_path, name):
    """A null text (a missing value) and a blank one are skipped alike in JSONL and Parquet."""
    docs = [DOCS[0], None, DOCS[1], "  ", DOCS[2], ""]
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"text": pa.array(docs, pa.string())}), path)
    else:
        path.write_text("\n".join(json.dumps({"text": d}) for d in docs), encoding="utf-8")
    assert load_corpus(str(path)).documents == DOCS[:3]


def test_a_text_column_of_nulls_only_is_no_documents_not_another_type(tmp_path):
    """pandas and ``datasets`` write a column of None only as Arrow's null type: one such shard refused a whole
    folder ("holds null, not text; choose one with --text-field"), where a string column of nulls was skipped."""
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "000.parquet", DOCS[:20])
    pq.write_table(pa.table({"text": pa.nulls(30), "n": list(range(30))}), shards / "001.parquet")
    write_parquet(shards / "002.parquet", DOCS[20:])
    assert load_corpus(str(shards)).documents == DOCS
    alone = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": pa.nulls(30)}), alone)
    assert "nulls.parquet is empty (no text)" in one_line_error(lambda: resolve_source(str(alone)).check())
    # A string column of nulls only: the data picker's check passed it ("500 rows; tokenized once …"), then every
    # Start failed as "empty (no text)". The file's statistics count its nulls; shards with text beside it are read.
    strings = tmp_path / "strings"
    strings.mkdir()
    pq.write_table(pa.table({"text": pa.array([None] * 500, pa.string())}), strings / "000.parquet",
                   row_group_size=128)
    assert one_line_error(lambda: resolve_source(str(strings)).check()).endswith(
        "strings is empty (no text: its column 'text' holds only nulls)")
    write_parquet(strings / "001.parquet", DOCS)
    resolve_source(str(strings)).check()
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": [None] * 10})})
    dd.save_to_disk(str(tmp_path / "hf_nulls"))
    assert "is empty (no text)" in one_line_error(lambda: resolve_source(str(tmp_path / "hf_nulls")).check())


def test_a_dictionary_encoded_text_column_is_text(tmp_path):
    """pandas' categorical columns are written as dictionary<string>: the same documents."""
    pq.write_table(pa.table({"text": pa.array(DOCS).dictionary_encode()}), tmp_path / "c.parquet")
    assert load_corpus(str(tmp_path / "c.parquet")).documents == DOCS


def test_parquet_folder_of_shards_in_order_and_text_field(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "001.parquet", DOCS[20:], column="content")
    write_parquet(shards / "000.parquet", DOCS[:20], column="content")
    (shards / "README.md").write_text("# a dataset card, not data")
    (shards / ".cache").mkdir()
    (shards / ".cache" / "x.lock").write_text("")
    source = resolve_source(str(shards), "content")
    assert source.kind == "parquet" and [f.rel for f in source.files] == ["000.parquet", "001.parquet"]
    assert source.ignored == ("README.md",)
    assert load_corpus(str(shards), text_field="content").documents == DOCS
    message = one_line_error(lambda: load_corpus(str(shards)))
    assert "no column 'text'" in message and "content" in message and "id" in message


@pytest.mark.parametrize("kind", ["file", "folder", "builtin"])
def test_a_text_field_for_plain_text_is_refused_not_ignored(tmp_path, kind):
    """``--text-field body`` on a .txt file trained its paragraphs and recorded "text_field": "body"."""
    if kind == "builtin":
        spec, name = "builtin", "builtin (Python documentation topics)"
    else:
        (tmp_path / "a.txt").write_text("one paragraph.\n\nanother one.\n")
        spec = name = str(tmp_path if kind == "folder" else tmp_path / "a.txt")
    assert resolve_source(spec).kind in ("text", "builtin")  # the default field is no naming
    with pytest.raises(DataError) as caught:
        resolve_source(spec, "body")
    assert str(caught.value).startswith(f"text field 'body' does not apply to {name}: plain text has no fields")
    assert caught.value.field == "text_field"


@pytest.mark.parametrize("name", ["dup.parquet", "dup.arrow"])
def test_two_columns_of_the_text_fields_name_are_one_line(tmp_path, name):
    import pyarrow.ipc as ipc

    texts = pa.array(DOCS, pa.string())
    table = pa.Table.from_arrays([texts, texts], names=["text", "text"])
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(table, path)
    else:
        with ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
    message = one_line_error(lambda: resolve_source(str(path)).check())
    assert "2 columns named 'text'" in message


def test_a_dotted_text_field_that_parquet_cannot_tell_from_a_struct_field_is_one_line(tmp_path):
    """Parquet names a column "meta.text" and the field "text" of a struct column "meta" alike: reading the one
    gave the other (a traceback after "preparing …")."""
    path = tmp_path / "dotted.parquet"
    pq.write_table(pa.table({"meta": [{"text": "inner"}] * len(DOCS), "meta.text": DOCS}), path)
    message = one_line_error(lambda: resolve_source(str(path), "meta.text").check())
    assert "'meta.text' names both a column and a field inside column 'meta'" in message
    plain = tmp_path / "plain.parquet"  # a dotted name alone is a column like any other
    pq.write_table(pa.table({"meta.text": DOCS}), plain)
    assert load_corpus(str(plain), text_field="meta.text").documents == DOCS


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_an_empty_compressed_shard_is_refused_not_read_as_no_documents(tmp_path, suffix):
    """0 bytes is no gzip or zstd data (an empty text compresses to a header): a download that failed, which was
    read as an empty shard, so the corpus silently shrank."""
    if suffix.endswith(".zst"):
        pytest.importorskip("zstandard")
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / f"s0{suffix}", DOCS[:20])
    write_jsonl(shards / f"s1{suffix}", DOCS[20:])
    (shards / f"s2{suffix}").write_bytes(b"")
    for spec in (shards, shards / f"s2{suffix}"):
        message = one_line_error(lambda spec=spec: resolve_source(str(spec)).check())
        assert f"s2{suffix}: it is empty (0 bytes), not {suffix.rsplit('.', 1)[1]}-compressed data" in message


def test_a_source_read_whole_at_its_check_without_any_text_is_empty_then(tmp_path):
    """8 KB of blank lines passed the data picker's look (Start enabled) and failed the run it started."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\t\n" * 2000)
    assert "blank.txt is empty (no text)" in one_line_error(lambda: resolve_source(str(blank)).check())
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text('{"text": null}\n{"text": "  "}\n\n')
    assert "nulls.jsonl is empty (no text)" in one_line_error(lambda: resolve_source(str(nulls)).check())
    folder = tmp_path / "folder"  # a blank file beside one with text: the source holds text
    folder.mkdir()
    (folder / "a.txt").write_text("\n\n")
    (folder / "b.txt").write_text("words")
    resolve_source(str(folder)).check()
    big = tmp_path / "big.txt"  # blank as far as the look reads: the rest is not known yet
    big.write_text(" " * (1 << 17) + "words")
    resolve_source(str(big)).check()


def test_hugging_face_dataset_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert resolve_source(str(tmp_path / "ds")).kind == "arrow"
    assert load_corpus(str(tmp_path / "ds")).documents == DOCS
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "dd"))
    assert load_corpus(str(tmp_path / "dd")).documents == DOCS  # its train split
    # The split left out is said with the folder, as a hub layout's are (it went unsaid).
    assert resolve_source(str(tmp_path / "dd")).ignored == ("test/ (test)",)
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "noval"))
    assert "no 'train' split" in one_line_error(lambda: resolve_source(str(tmp_path / "noval")))


def test_text_is_streamed_in_chunks_with_the_same_paragraphs(tmp_path, monkeypatch):
    text = "\n\n".join(f"paragraph {i} with ünïcode ✓ " * (i % 5 + 1) for i in range(200)) + "\n \n\n tail"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    whole = load_corpus(str(path)).documents
    monkeypatch.setattr("core.sources._READ_CHUNK", 7)  # chunk ends inside paragraphs, breaks and characters
    assert load_corpus(str(path)).documents == whole
    assert len(whole) == 201 and whole[-1] == "tail"
    path.write_bytes(text.encode()[:100] + b"\xff" + text.encode()[100:])
    assert "bad byte at offset 100" in one_line_error(lambda: load_corpus(str(path)))


@pytest.mark.parametrize("chunk", [1 << 20, 7, 1, 2])
def test_windows_and_old_mac_line_ends_are_read_as_python_reads_text(tmp_path, monkeypatch, chunk):
    """CR LF and lone CR are LF (as ``open`` reads text, nanoGPT's prepare.py and HF's text loader included):
    no CR in the tokens, and a blank line of CRs ends a paragraph; also where a chunk ends between CR and LF."""
    lines = ["first line", "second line of the first paragraph", "", "a second paragraph", " ", "third"]
    unix = tmp_path / "unix.txt"
    unix.write_bytes("\n".join(lines).encode())
    expected = load_corpus(str(unix)).documents
    assert expected == ["first line\nsecond line of the first paragraph", "a second paragraph", "third"]
    monkeypatch.setattr("core.sources._READ_CHUNK", chunk)
    for name, end in (("windows.txt", "\r\n"), ("mac.txt", "\r")):
        path = tmp_path / name
        path.write_bytes(end.join(lines).encode())
        assert load_corpus(str(path)).documents == expected, name
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(b"a\r\n\r\nb\r\rc\n\nd\r\n")
    assert load_corpus(str(mixed)).documents == ["a", "b", "c", "d"]


def test_a_nul_byte_anywhere_in_a_text_file_is_refused_as_at_its_start(tmp_path, monkeypatch):
    """Past the 64 KiB looked at first, a NUL was tokenized into the corpus, where a bad UTF-8 byte was refused."""
    from core import sources

    monkeypatch.setattr(sources, "_CHECKED_BYTES", 64)
    monkeypatch.setattr(sources, "_READ_CHUNK", 50)  # the NUL in the third chunk
    path = tmp_path / "c.txt"
    path.write_bytes(b"words and words\n\n" * 6 + b"ab\x00cd\n\nmore")
    source = resolve_source(str(path))
    source.check()  # the start is text
    assert one_line_error(lambda: load_corpus(str(path))) == f"{path} is not text (a NUL byte at offset 104)"


@pytest.mark.parametrize("make, expected", [
    (lambda p: write_parquet(p / "c.parquet", [], column="text"), "is empty"),
    (lambda p: (p / "c.parquet").write_bytes(b"PAR1 this is not parquet PAR1"), "not a valid Parquet file"),
    (lambda p: (p / "c.arrow").write_bytes(b"garbage" * 10), "not an Arrow file"),
    (lambda p: (p / "c.csv").write_text("a,b\n"), "unsupported data file c.csv"),
    (lambda p: write_jsonl(p / "c.jsonl", key="body"), "needs a string field 'text' (its keys: body, url)"),
    (lambda p: (p / "c.jsonl").write_text('{"text": "a"}\n{"text": 5}\n'),
     "c.jsonl:2: its 'text' is a number, not text"),
    (lambda p: (p / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 50)[:-12]), "cannot read"),
])
def test_bad_files_are_one_line(tmp_path, make, expected):
    make(tmp_path)
    (path,) = tmp_path.iterdir()
    assert expected in one_line_error(lambda: load_corpus(str(path)))


def test_zstd_frames_are_read_one_after_another_and_a_cut_one_is_refused(tmp_path):
    """Concatenated frames (``cat a.zst b.zst``, pzstd) are one stream; a file that stops inside a frame (a
    partial download) is refused, even where the cut leaves every line whole (only the frame's checksum is lost)."""
    zstandard = pytest.importorskip("zstandard")
    lines = [json.dumps({"text": d}) + "\n" for d in DOCS]
    frame = zstandard.ZstdCompressor(write_checksum=True).compress
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(b"".join(frame("".join(lines[i:i + 7]).encode()) for i in range(0, len(lines), 7)))
    assert load_corpus(str(path)).documents == DOCS
    whole = frame("".join(lines).encode())
    for cut in (4, len(whole) // 2):  # the checksum alone; half the file
        path.write_bytes(whole[:-cut])
        assert "truncated" in one_line_error(lambda: load_corpus(str(path)))


def test_zstd_with_a_long_window_is_read(tmp_path):
    """``zstd --long`` declares a window past the library's default limit (128 MiB): refused as "too much memory".
    (Here 256 MiB, which decompressing a small frame does not allocate; compressing with 2 GiB would.)"""
    import io

    zstandard = pytest.importorskip("zstandard")
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=28)
    buffer = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(buffer, closefd=False) as writer:
        writer.write("".join(json.dumps({"text": d}) + "\n" for d in DOCS).encode())
    assert zstandard.get_frame_parameters(buffer.getvalue()).window_size == 1 << 28
    path = tmp_path / "long.jsonl.zst"
    path.write_bytes(buffer.getvalue())
    assert load_corpus(str(path)).documents == DOCS


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.jsonl.zst"])
@pytest.mark.parametrize("lines", [40, 4000])  # within the 64 KiB looked at first; past the 1 MiB read ahead
def test_junk_after_the_last_compressed_frame_is_named_after_the_last_line(tmp_path, monkeypatch, name, lines):
    """The text before the junk is read first: lost with the error, it was named a megabyte of lines early."""
    docs = [f"line {i} " + "words " * 50 for i in range(lines)]
    path = write_jsonl(tmp_path / name, docs + [""])  # a last line, without its newline: cut by the junk
    path.write_bytes(path.read_bytes() + b"junk after the last frame")
    assert f"cannot read {path} after line {lines}: " in one_line_error(lambda: load_corpus(str(path)))


def test_folders_mixing_formats_or_holding_unread_files_are_refused(tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_parquet(mixed / "a.parquet")
    write_jsonl(mixed / "b.jsonl")
    assert "mixes data formats (1 jsonl, 1 parquet files)" in one_line_error(lambda: resolve_source(str(mixed)))
    unread = tmp_path / "unread"
    unread.mkdir()
    (unread / "a.txt").write_text("some text")
    (unread / "b.csv").write_text("x,y")
    (unread / "notes").write_text("plain text without a suffix")
    message = one_line_error(lambda: resolve_source(str(unread)))
    assert "does not read: b.csv, notes" in message
    (tmp_path / "empty").mkdir()
    assert "holds no data files" in one_line_error(lambda: resolve_source(str(tmp_path / "empty")))


def test_linked_sub_folders_are_read_once_and_an_unlistable_one_is_an_error(tmp_path, monkeypatch):
    real = tmp_path / "real" / "a"
    real.mkdir(parents=True)
    (real / "x.txt").write_text("linked text")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "top.txt").write_text("top text")
    (corpus / "sub").symlink_to(real, target_is_directory=True)
    (corpus / "again").symlink_to(real, target_is_directory=True)  # a second link to it: read once
    (real / "loop").symlink_to(corpus, target_is_directory=True)  # and a loop back: ends
    source = resolve_source(str(corpus))
    assert [f.rel for f in source.files] == ["top.txt", "again/x.txt"]
    # A sub-folder that cannot be listed is an error, not a smaller corpus.
    real_scandir = os.scandir

    def denied(path="."):
        if str(path).endswith("again"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    assert "again: Permission denied" in one_line_error(lambda: resolve_source(str(corpus)))


def test_a_link_to_a_folder_of_the_corpus_leaves_its_files_their_own_names_and_splits(tmp_path):
    """A link `current -> train`, sorted before `train`, had the train split read as `current/…`, which no split
    word names: the validation split was read with it, and the corpus' fingerprint changed with the link."""
    corpus = tmp_path / "corpus"
    for split, text in (("train", "train text"), ("validation", "held-out text")):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "part-0.jsonl").write_text(json.dumps({"text": text}) + "\n")
    before = resolve_source(str(corpus))
    assert [f.rel for f in before.files] == ["train/part-0.jsonl"]
    (corpus / "current").symlink_to("train", target_is_directory=True)
    (corpus / "train" / "latest").symlink_to(corpus / "train", target_is_directory=True)  # a link to its own folder
    after = resolve_source(str(corpus))
    assert [f.rel for f in after.files] == ["train/part-0.jsonl"] and after.fingerprint() == before.fingerprint()
    assert load_corpus(str(corpus)).documents == ["train text"]
    flat = tmp_path / "flat"  # and without splits: the files keep the name of the folder they are in
    (flat / "z_real").mkdir(parents=True)
    (flat / "z_real" / "x.txt").write_text("some text")
    plain = resolve_source(str(flat)).fingerprint()
    (flat / "a_link").symlink_to("z_real", target_is_directory=True)
    assert [f.rel for f in resolve_source(str(flat)).files] == ["z_real/x.txt"]
    assert resolve_source(str(flat)).fingerprint() == plain


def test_a_second_link_to_a_file_is_read_once_and_named_as_not_read(tmp_path):
    """A symbolic or hard link to a file already in the corpus doubled its text silently (folders were read once)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text")
    (corpus / "b.txt").symlink_to(corpus / "a.txt")
    os.link(corpus / "a.txt", corpus / "c.txt")
    (corpus / "d.txt").write_text("other text")
    source = resolve_source(str(corpus))
    assert [f.rel for f in source.files] == ["a.txt", "d.txt"] and source.ignored == ("b.txt", "c.txt")
    assert load_corpus(str(corpus)).documents == ["some text", "other text"]


def test_a_file_and_a_link_to_it_read_the_file_under_its_own_name(tmp_path):
    """The link sorted first ("a-link.txt" before "b.txt") was read and the file itself named as not read: the
    corpus' files, and its fingerprint, changed when the link was removed."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "b.txt").write_text("some text")
    (corpus / "a-link.txt").symlink_to(corpus / "b.txt")
    (corpus / "c.txt").write_text("other text")
    source = resolve_source(str(corpus))
    assert [f.rel for f in source.files] == ["b.txt", "c.txt"] and source.ignored == ("a-link.txt",)
    (corpus / "a-link.txt").unlink()
    assert [f.rel for f in resolve_source(str(corpus)).files] == ["b.txt", "c.txt"]


def test_a_licence_without_a_suffix_beside_data_shards_is_skipped_and_named(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_parquet(shards / "a.parquet")
    (shards / "LICENSE").write_text("Creative Commons …")
    (shards / "README.md").write_text("# the dataset")
    source = resolve_source(str(shards))
    assert [f.rel for f in source.files] == ["a.parquet"] and source.ignored == ("LICENSE", "README.md")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_fifo_is_refused_not_read(tmp_path):
    """Reading a named pipe would block forever: refused before it is opened, as --data and inside a folder."""
    os.mkfifo(tmp_path / "pipe.txt")
    assert "is a FIFO" in one_line_error(lambda: resolve_source(str(tmp_path / "pipe.txt")))
    (tmp_path / "a.txt").write_text("text")
    assert "is a FIFO" in one_line_error(lambda: resolve_source(str(tmp_path)))


def test_fingerprint_is_cheap_and_follows_the_content(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"lorem ipsum dolor\n\n" * 100_000)  # 1.9 MB: sampled, not hashed whole
    first = resolve_source(str(path)).fingerprint()
    assert resolve_source(str(path)).fingerprint() == first
    data = bytearray(path.read_bytes())
    data[-5] = ord("X")  # the last block is always sampled
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same time: the content tells
    assert resolve_source(str(path)).fingerprint() != first
    changed = resolve_source(str(path)).fingerprint()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched (or copied without -p): new
    assert resolve_source(str(path)).fingerprint() not in (first, changed)


def test_the_fingerprint_of_a_folder_of_many_files_reads_a_bounded_sample_of_them(tmp_path, monkeypatch):
    """Every start fingerprints the source: a folder of a million small files was read whole each time."""
    import core.sources as sources

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(200):
        (folder / f"{i:03d}.txt").write_text(f"document {i}\n")
    opened = []
    real = sources.sampled_sha256
    monkeypatch.setattr(sources, "sampled_sha256", lambda path, size: opened.append(path.name) or real(path, size))
    first = resolve_source(str(folder)).fingerprint()
    assert len(opened) == sources._SAMPLED_FILES and {"000.txt", "199.txt"} <= set(opened)
    (folder / "100.txt").write_text("document 100 edited\n")  # a file not sampled: its size tells
    assert resolve_source(str(folder)).fingerprint() != first


def test_a_folder_in_the_hubs_split_layout_reads_its_train_split_only(tmp_path):
    """Parquet shards as the hub ships them (data/train-*, data/validation-*, data/test-*), the folder the
    offline hf: message asks for: the held-out splits were trained on, without a word."""
    data = tmp_path / "tinystories" / "data"
    data.mkdir(parents=True)
    write_parquet(data / "train-00000-of-00002.parquet", DOCS[:20])
    write_parquet(data / "train-00001-of-00002.parquet", DOCS[20:])
    write_parquet(data / "validation-00000-of-00001.parquet", ["held out"])
    write_parquet(data / "test-00000-of-00001.parquet", ["held out too"])
    source = resolve_source(str(tmp_path / "tinystories"))
    assert [f.rel for f in source.files] == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    assert source.ignored == ("data/test-00000-of-00001.parquet (test)",
                              "data/validation-00000-of-00001.parquet (validation)")
    assert load_corpus(str(data)).documents == DOCS
    # Split folders, and text files named by their split, the same way.
    for split, text in (("train", "one\n\ntwo"), ("dev", "three"), ("testing", "four")):
        (tmp_path / "text" / split).mkdir(parents=True)
        (tmp_path / "text" / split / "part-0.txt").write_text(text)
    assert [f.rel for f in resolve_source(str(tmp_path / "text")).files] == ["train/part-0.txt"]
    # Without a held-out split beside a train one, nothing is left out (a folder of notes named "test_ideas").
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "test_ideas.txt").write_text("ideas")
    (notes / "validation_of_x.txt").write_text("x")
    assert len(resolve_source(str(notes)).files) == 2 and resolve_source(str(notes)).ignored == ()


def test_every_held_out_split_is_named_among_the_files_not_read(tmp_path):
    """The hub's usual layout, a README beside two shards of each split: the list of files not read, cut to three
    in path order, said "README.md, data/test-00000… (test), data/test-00001… (test) and 2 more": the validation
    split went unsaid."""
    from core.event_text import skipped_files

    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    (data.parent / "README.md").write_text("# a dataset card")
    for split in ("train", "validation", "test"):
        for i in range(2):
            write_parquet(data / f"{split}-0000{i}-of-00002.parquet", DOCS if split == "train" else ["held out"])
    said = skipped_files(resolve_source(str(data.parent)).ignored)
    assert said == "the test split (2 files), the validation split (2 files), README.md", said
    # A split of one file is named by its file; beyond three other files, the rest is counted.
    assert skipped_files(["a", "b", "c", "d", "v.txt (validation)"]) == "v.txt (validation), a, b, c and 1 more"


def test_a_folder_of_books_whose_titles_hold_split_words_is_read_whole(tmp_path):
    """"training_day.txt" beside "the_test_of_time.txt" made a folder of books a hub split layout: three of its four
    books were left out, said once in the first line of a preparation and never again."""
    books = tmp_path / "books"
    books.mkdir()
    names = ["moby_dick.txt", "pride_and_prejudice.txt", "the_test_of_time.txt", "training_day.txt",
             "attest.txt", "training-notes.txt", "a_dev_diary.txt"]
    for name in names:
        (books / name).write_text(f"a paragraph of {name}\n")
    source = resolve_source(str(books))
    assert sorted(f.rel for f in source.files) == sorted(names) and source.ignored == ()


@pytest.mark.parametrize("layout, read", [
    ({"TinyStories-train.txt": "t", "TinyStories-valid.txt": "v", "README.md": "r"}, ["TinyStories-train.txt"]),
    ({"en/c4-train.00000-of-00002.jsonl.gz": "t", "en/c4-train.00001-of-00002.jsonl.gz": "t",
      "en/c4-validation.00000-of-00001.jsonl.gz": "v"},
     ["en/c4-train.00000-of-00002.jsonl.gz", "en/c4-train.00001-of-00002.jsonl.gz"]),
    ({"train_data.jsonl": "t", "test_data.jsonl": "v"}, ["train_data.jsonl"]),
    ({"wiki.train.txt": "t", "wiki.test.txt": "v", "wiki.valid.txt": "v"}, ["wiki.train.txt"]),
])
def test_split_words_first_or_last_in_a_name_mark_the_hubs_layouts(tmp_path, layout, read):
    folder = tmp_path / "corpus"
    for rel, text in layout.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"text": text}) + "\n").encode() if ".jsonl" in rel else text.encode()
        path.write_bytes(gzip.compress(line) if rel.endswith(".gz") else line)
    source = resolve_source(str(folder))
    assert [f.rel for f in source.files] == read
    assert len(source.ignored) == len(layout) - len(read)


def test_hub_names_without_network_are_one_line(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = resolve_source("hf:HuggingFaceFW/fineweb:sample-10BT")
    assert source.kind == "hub" and source.hub == ("HuggingFaceFW/fineweb", "sample-10BT", "train")
    assert "HF_HUB_OFFLINE is set" in one_line_error(source.check)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert "cannot reach 127.0.0.1" in one_line_error(source.check)
    assert "expected hf:NAME" in one_line_error(lambda: resolve_source("hf:"))


@pytest.mark.parametrize("name", ["../corpus", "/data/corpus", "a/b/c", "owner/-name", "owner//name", "a..b",
                                  "a--b", "name.", "x" * 97, "owner/na me!"])
def test_a_hub_name_that_is_no_repository_id_is_refused_before_any_network(name):
    """``hf:../corpus`` passed as a name and was sent to the hub (or said "offline") instead of naming the typo."""
    message = one_line_error(lambda: resolve_source(f"hf:{name}"))
    assert "is not a hub dataset name" in message or "expected hf:NAME" in message, message


def test_hub_names_of_the_hubs_own_forms_are_taken():
    for spec, name in (("hf:HuggingFaceFW/fineweb-edu:sample-10BT", "HuggingFaceFW/fineweb-edu"),
                       ("hf:wikitext:wikitext-103-raw-v1:validation", "wikitext"),
                       ("hf:roneneldan/TinyStories", "roneneldan/TinyStories"), ("hf:a.b_c/d-1.2", "a.b_c/d-1.2")):
        assert resolve_source(spec).hub[0] == name


def test_hub_rows_skip_nulls_and_refuse_other_values_like_jsonl(monkeypatch):
    """The hub stream is read as a JSONL file is: a null text is no document, a number is refused by row."""
    import core.sources

    rows = [{"text": DOCS[0]}, {"text": None}, {"text": DOCS[1]}]
    monkeypatch.setattr(core.sources, "_hub_dataset", lambda source: iter(rows))
    source = resolve_source("hf:someone/corpus")
    assert [d for batch, _ in source.iter_documents() for d in batch] == DOCS[:2]
    rows.append({"text": 7})
    message = one_line_error(lambda: list(source.iter_documents()))
    assert "hf:someone/corpus: row 4: 'text' holds the int 7, not text" in message
    rows[:] = [{"text": None}, {"body": DOCS[0]}]  # a null first row does not hide the missing field after it
    assert "has no text field 'text' (its fields: body)" in one_line_error(lambda: list(source.iter_documents()))


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz"])
def test_lone_surrogates_in_jsonl_become_replacement_characters(tmp_path, name, monkeypatch, tok):
    """json.loads accepts "\\ud800" alone (half of an emoji cut by a scraper): hashing and tokenizing it failed.
    A whole pair, and escapes of other characters near the range (U+D55C), stay as they are."""
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    lines = [r'{"text": "words \ud800 end"}', r'{"text": "cut \uDFFF\ud83d"}',
             r'{"text": "pair \ud83d\ude00 and \ud55c"}', json.dumps({"text": DOCS[0]})]
    data = "\n".join(lines).encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    expected = ["words \ufffd end", "cut \ufffd\ufffd", "pair \U0001f600 and \ud55c", DOCS[0]]
    assert load_corpus(str(tmp_path / name)).documents == expected
    tok_file = tok.save(tmp_path)  # a given tokenizer (its encoder refused such a string with a TypeError)
    store = prepare_data(DataConfig(source=str(tmp_path / name), seq_len=16, tokenizer=str(tok_file))).store
    first = store.tokens[1: int(store.offsets[1]) - 1]
    assert tok.decode(first.tolist()) == expected[0]


def test_lone_surrogates_in_hub_rows_become_replacement_characters(monkeypatch):
    import core.sources

    rows = [{"text": "a \udc00 b"}, {"text": "ok"}, {"text": "pair \ud83d\ude00"}]
    monkeypatch.setattr(core.sources, "_hub_dataset", lambda source: iter(rows))
    source = resolve_source("hf:someone/corpus")
    assert [d for batch, _ in source.iter_documents() for d in batch] == ["a \ufffd b", "ok", "pair \U0001f600"]


def test_a_byte_order_mark_opening_a_text_file_is_no_text(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\n\n".join(DOCS[:3]).encode("utf-8"))
    assert load_corpus(str(path)).documents == DOCS[:3]


@pytest.mark.parametrize("make, expected", [
    (lambda p: write_jsonl(p / "c.jsonl", key="content"), "c.jsonl:1: each line needs a string field 'text' "
                                                          "(its keys: content, url); choose another text field"),
    (lambda p: write_jsonl(p / "c.jsonl.gz", key="content"), "needs a string field 'text'"),
    (lambda p: write_jsonl(p / "c.jsonl.zst", key="content"), "needs a string field 'text'"),
    (lambda p: (p / "c.jsonl").write_text('{"text": "a"}\n{"text": oops}\n'),
     "c.jsonl:2: invalid JSON (Expecting value at column 10)"),
    (lambda p: (p / "c.jsonl").write_text('{"text": "a"}\n{"text": "two\nlines"}\n'),
     "c.jsonl:2: invalid JSON (the line ends inside a string that starts at column 10: JSONL holds one record a line)"),
    (lambda p: (p / "c.jsonl").write_text('{"text": "a", "id": ' + "9" * 5000 + "}\n"),
     "c.jsonl:1: invalid JSON (an integer of more than 4,300 digits)"),  # not Python's advice to call it
    (lambda p: (p / "c.txt").write_bytes(b"plain words " * 3 + b"\xff\xfe" + b"more"), "bad byte at offset 36"),
    (lambda p: (p / "c.txt").write_bytes(b"ELF\x00\x01\x02 header"), "is not text (a NUL byte at offset 3)"),
])
def test_a_data_pickers_look_finds_what_preparing_would_refuse_at_its_start(tmp_path, make, expected):
    """``describe_source`` (the dashboard's Data control, before Start) reads the start of each JSONL or text
    file: a file that looked fine there no longer fails as a run's row."""
    from core.prepare import describe_source

    make(tmp_path)
    (path,) = tmp_path.iterdir()
    assert expected in one_line_error(lambda: describe_source(DataConfig(source=str(path))))


def test_the_look_reads_only_the_start_and_judges_no_line_cut_at_its_limit(tmp_path, monkeypatch):
    from core import sources
    from core.prepare import describe_source

    line = json.dumps({"text": "x" * 100}) + "\n"
    path = tmp_path / "c.jsonl"
    path.write_text(line * 10 + '{"text": "cut at the limit, and broken after it" oops}\n')
    monkeypatch.setattr(sources, "_CHECKED_BYTES", len(line) * 10 + 20)  # the broken line straddles the limit
    assert describe_source(DataConfig(source=str(path))).kind == "jsonl"
    assert "c.jsonl:11: invalid JSON" in one_line_error(lambda: load_corpus(str(path)))  # judged when read
    # read with their line ends, lines are judged as the look judges them: the same words, the column said
    path.write_text(line * 10 + '{"text": "a raw line break\n in a string"}\n')
    assert one_line_error(lambda: load_corpus(str(path))).endswith(
        "c.jsonl:11: invalid JSON (the line ends inside a string that starts at column 10: JSONL holds one record "
        "a line)")


def test_raw_surrogate_bytes_in_jsonl_are_read_as_their_escapes_are(tmp_path, monkeypatch):
    """Bytes ED A0-BF xx encode a surrogate (CESU-8, WTF-8: a scraper's half emoji); json.loads decodes them
    (surrogatepass), so hashing and tokenizing the line failed with a traceback. A lone one is U+FFFD, as its
    escape is; a pair is the character it encodes; Hangul (ED 80-9F) is text and stays."""
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "half an emoji \xed\xa0\xbd here"}\n'
                     b'{"text": "low half \xed\xb8\x80, pair \xed\xa0\xbd\xed\xb8\x80"}\n'
                     + '{"text": "한국어 텍스트"}\n'.encode() + json.dumps({"text": DOCS[0]}).encode())
    expected = ["half an emoji \ufffd here", "low half \ufffd, pair \U0001f600", "한국어 텍스트", DOCS[0]]
    assert load_corpus(str(path)).documents == expected
    data = prepare_data(DataConfig(source=str(path), layout="document", seq_len=16, vocab_size=300))
    store = data.store  # a tokenizer was trained on the documents (their hash failed) and encoded them
    ends = store.offsets.tolist()
    docs = [store.tokens[a + 1: b - 1].tolist() for a, b in zip(ends[:-1], ends[1:], strict=True)]
    assert [data.tokenizer.decode(ids) for ids in docs] == expected


def _string_column(values: list[bytes | None]):
    """A string column holding exactly these bytes: Arrow does not check them, and other writers do not either."""
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=raw.null_count)


def _write_table(path: Path, column) -> Path:
    table = pa.table({"text": column})
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=4)
    else:
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)
    return path


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_jsonl_in_utf16_or_utf32_is_refused_at_its_first_line(tmp_path, encoding):
    """json.loads guesses the encoding of bytes: a one-line UTF-16 file was read, and a longer one refused at its
    second line, its first taken."""
    for lines in (1, 3):
        path = tmp_path / f"c{lines}.jsonl"
        path.write_bytes("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(lines))
                         .rstrip("\n").encode(encoding))
        assert f"c{lines}.jsonl:1: not UTF-8 text" in one_line_error(lambda p=path: load_corpus(str(p)))


@pytest.mark.parametrize("name", ["c.parquet", "c.arrow"])
def test_bytes_that_are_no_utf8_in_a_text_column_are_one_line_naming_the_row(tmp_path, name):
    good = [d.encode() for d in DOCS[:9]]
    path = _write_table(tmp_path / name, _string_column(good + [b"caf\xe9 au lait"] + good))
    assert f"{name}: row 10: not UTF-8 text (bad byte at offset 3" in one_line_error(lambda: load_corpus(str(path)))
    # A surrogate's bytes are read as in JSONL, beside a null (no document).
    path.unlink()
    _write_table(path, _string_column(good[:5] + [b"cut \xed\xa0\xbd", None, b"\xed\xa0\xbd\xed\xb8\x80"] + good[5:]))
    assert load_corpus(str(path)).documents == DOCS[:5] + ["cut \ufffd", "\U0001f600"] + DOCS[5:9]


def _damaged_offsets(offsets: list[int], data: bytes, kind=None):
    """A text column whose offsets are what bit rot left: Arrow maps them from disk as they stand."""
    import struct

    kind = kind or pa.string()
    width = "q" if kind == pa.large_string() else "i"
    raw = struct.pack(f"<{len(offsets)}{width}", *offsets)
    return pa.Array.from_buffers(kind, len(offsets) - 1, [None, pa.py_buffer(raw), pa.py_buffer(data)])


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
@pytest.mark.parametrize("column", [
    _damaged_offsets([0, 12, 4, 30], b"good text \xff here and more text!"),  # a negative length
    _damaged_offsets([0, 4, 2_139_062_143, 30], b"x" * 30),  # far past the data: read, it segfaulted
    _damaged_offsets([0, 4, 1 << 40, 30], b"x" * 30, pa.large_string()),
    pa.DictionaryArray.from_arrays(pa.array([0, 1, 7], pa.int32()), pa.array(["a b", "c d"]), safe=False),
], ids=["negative-length", "past-the-data", "large-past-the-data", "dictionary-index"])
def test_damaged_offsets_in_an_arrow_file_are_one_line_not_a_crash(tmp_path, stream, column):
    table = pa.table({"text": column})
    path = tmp_path / "c.arrow"
    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(str(path), table.schema) as writer:
        writer.write_table(table)
    message = one_line_error(lambda: load_corpus(str(path)))
    assert message.startswith(f"cannot read {path}: damaged Arrow data in rows 1–3 (")


def test_a_damaged_batch_is_named_by_its_rows_and_text_columns_of_every_kind_still_load(tmp_path):
    docs = DOCS[:8]
    for kind in (pa.large_string(), pa.string_view(), pa.dictionary(pa.int8(), pa.string())):
        path = _write_table(tmp_path / f"{kind}.arrow".replace(" ", ""), pa.array(docs, pa.string()).cast(kind))
        assert load_corpus(str(path)).documents == docs
    good = pa.array(docs[:4], pa.string())
    bad = _damaged_offsets([0, 3, 1, 5, 9], b"123456789")
    table = pa.Table.from_batches([pa.record_batch([good], ["text"]), pa.record_batch([bad], ["text"])])
    path = tmp_path / "two.arrow"
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    assert "damaged Arrow data in rows 5–8 (" in one_line_error(lambda: load_corpus(str(path)))


@pytest.mark.parametrize("name", ["c.parquet", "c.arrow"])
def test_long_rows_are_turned_into_strings_a_few_at_a_time_in_the_same_order(tmp_path, name, monkeypatch):
    """8,192 rows at a time held gigabytes of text for book-length rows: a batch is bounded in bytes."""
    from core import sources

    path = tmp_path / name  # Parquet in row groups of 16, Arrow in record batches of 4
    write_parquet(path) if name.endswith(".parquet") else _write_table(path, pa.array(DOCS, pa.string()))
    converted: list[int] = []
    texts = sources._texts
    monkeypatch.setattr(sources, "_texts", lambda column, *a: converted.append(len(column)) or texts(column, *a))
    monkeypatch.setattr(sources, "_BATCH_BYTES", 3 * max(len(d) for d in DOCS))
    assert load_corpus(str(path)).documents == DOCS
    assert sum(converted) == len(DOCS) and max(converted) <= 4


def test_spark_job_markers_beside_parquet_shards_are_skipped_and_named(tmp_path):
    spark = tmp_path / "spark"
    spark.mkdir()
    write_parquet(spark / "part-00000-abc.snappy.parquet")
    (spark / "_SUCCESS").write_bytes(b"")
    (spark / "_committed_8051").write_text('{"added": ["part-00000-abc.snappy.parquet"], "removed": []}')
    (spark / "_started_8051").write_bytes(b"")
    source = resolve_source(str(spark))
    assert [f.rel for f in source.files] == ["part-00000-abc.snappy.parquet"]
    assert source.ignored == ("_SUCCESS", "_committed_8051", "_started_8051")
    assert load_corpus(str(spark)).documents == DOCS


@pytest.mark.parametrize("state, expected", [
    ({"_data_files": [{"filename": 5}]}, "unreadable state.json (a data file's name is 5, not a string)"),
    ({"_data_files": [{"filename": ["a.arrow"]}]}, "a data file's name is ['a.arrow'], not a string"),
    ({"_data_files": "data.arrow"}, "unreadable state.json"),
    ([{"filename": "data.arrow"}], "unreadable state.json"),
    ({"_data_files": [{"filename": "x" * 300}]}, "its data file 'xxx"),
    ({"_data_files": [{"filename": "a\nb.arrow"}]}, "its data file 'a\\nb.arrow' is missing"),
])
def test_a_malformed_dataset_state_is_one_line(tmp_path, state, expected):
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert expected in one_line_error(lambda: resolve_source(str(tmp_path)))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process' mappings from /proc")
@pytest.mark.parametrize("name", ["c.parquet", "stream.arrow", "file.arrow"])
def test_parquet_and_arrow_are_read_not_mapped_while_they_are_prepared(tmp_path, name):
    """A mapping's pages would stay in the process' resident set, which grew by the whole file as a preparation
    read it (304 MB of Arrow: a peak of 788 MB, 518 MB read)."""
    path, docs = tmp_path / name, DOCS * 50
    if name.endswith(".parquet"):
        write_parquet(path, docs, row_group_size=100)
    else:
        table = pa.table({"text": pa.array(docs, pa.string())})
        with (pa.ipc.new_stream if name.startswith("stream") else pa.ipc.new_file)(path, table.schema) as w:
            for batch in table.to_batches(max_chunksize=100):
                w.write_batch(batch)
    source = resolve_source(str(path))
    read, mapped = [], []
    for batch, _ in source.iter_documents(batch_chars=2_000):
        read.extend(batch)
        mapped += [line for line in Path("/proc/self/maps").read_text().splitlines() if str(path) in line]
    assert read == docs and len(read) > 10 * 2_000 // max(map(len, docs)) and mapped == []


def test_a_shard_with_a_wrong_text_column_is_named_by_its_path_not_its_base_name(tmp_path):
    """Two shards named a.parquet in one folder: "a.parquet: column 'text' holds int64" did not say which."""
    shards = tmp_path / "shards"
    (shards / "sub").mkdir(parents=True)
    write_parquet(shards / "a.parquet", DOCS)
    pq.write_table(pa.table({"text": list(range(len(DOCS)))}), shards / "sub" / "a.parquet")
    message = one_line_error(lambda: load_corpus(str(shards)))
    assert f"{shards / 'sub' / 'a.parquet'}: column 'text' holds int64, not text" in message
    pq.write_table(pa.table({"content": DOCS}), shards / "sub" / "a.parquet")
    message = one_line_error(lambda: load_corpus(str(shards)))
    assert f"{shards / 'sub' / 'a.parquet'} has no column 'text'" in message


def test_the_builtin_corpus_reads_as_whole_at_its_end_and_names_no_files():
    """Its preparation ended on "tokenizing: 0% of 466.3 kB", and began "(builtin, 0 files, …)"."""
    from core.event_text import event_line
    from core.events import DataPreparationStarted

    source = resolve_source("builtin")
    *_, (_, position) = source.iter_documents()
    assert position == source.bytes > 0
    started = DataPreparationStarted("", 0.0, source="builtin", source_kind="builtin", files=0,
                                     bytes_total=source.bytes, documents_total=None, train_tokenizer=False)
    assert event_line(started).text.startswith("preparing builtin (builtin, 466")
