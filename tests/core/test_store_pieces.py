"""Long documents: cut into pieces where the ids stay those of the whole document, and written to the store as
their pieces come, so memory does not grow with how a text is broken into documents."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

import core.token_store as ts
from core.sources import resolve_source
from core.token_store import plain_text_tokenizer, write_store
from core.tokenizer import iter_pieces, train_bpe

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def indented_text(lines: int = 400, seed: int = 0) -> str:
    """Code-like and prose-like lines: indentation (spaces, tabs), trailing spaces, lines of spaces alone, CRLF,
    double spaces, digits, contractions and letters outside ASCII; no blank line."""
    rng = random.Random(seed)
    words = ["alpha", "be", "c", "don't", "it's", "12345", "3.14", "(x)", "--", "日本語", "naïve", "e\u0301", "!!",
             "'s", "“q”", "a-b", "$"]
    out = []
    for _ in range(lines):
        line = rng.choice(["", "", " ", "    ", "\t", "  \t"]) + " ".join(rng.choice(words)
                                                                         for _ in range(rng.randint(0, 8)))
        out.append(line + rng.choice(["", "", " ", "  ", "\t", "\r"]))
    return "\n".join(out)


def _bpe(pre_tokenizer, text: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def tokenizer(kind: str, text: str) -> Tokenizer:
    if kind == "gpt2":  # Speedboard's own: ByteLevel without a prefix space
        return plain_text_tokenizer(train_bpe([text], 400))
    if kind == "prefix-space":
        return _bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), text)
    if kind == "llama3":
        return _bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), text)
    if kind == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator([text], trainers.WordPieceTrainer(vocab_size=400, special_tokens=["[UNK]"],
                                                                  show_progress=False))
        return tok
    tok = Tokenizer(models.Unigram())  # SentencePiece-style
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.train_from_iterator([text], trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>"], unk_token="<unk>",
                                                            show_progress=False))
    return tok


def cut_into_pieces_of(chars: int, monkeypatch) -> None:
    """Documents longer than ``chars`` cut into pieces of ``chars`` at most (1 Mi and 128 Ki characters, really)."""
    monkeypatch.setattr("core.tokenizer.LONG_DOCUMENT_CHARS", chars)
    monkeypatch.setattr("core.tokenizer.PIECE_CHARS", chars)


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("kind", ["gpt2", "prefix-space", "llama3", "bert", "sentencepiece"])
def test_pieces_give_the_ids_of_the_whole_document(kind, monkeypatch):
    cut_into_pieces_of(120, monkeypatch)
    text = indented_text()
    tok = tokenizer(kind, text)
    pieces = list(iter_pieces(text))
    assert "".join(pieces) == text and len(pieces) > 50 and max(map(len, pieces)) <= 120
    assert min(map(len, pieces[:-1])) >= 60  # a cut in the piece's second half: no run of tiny pieces
    assert [i for p in pieces for i in ids(tok, p)] == ids(tok, text)


def test_a_cut_after_a_line_break_before_indentation_would_change_the_ids():
    """What the cuts avoid: GPT-2's pre-tokenizer joins a line break with the indentation after it."""
    tok = tokenizer("gpt2", indented_text())
    assert ids(tok, "x = 1\n") + ids(tok, "    return x") != ids(tok, "x = 1\n    return x")
    assert ids(tok, "x = 1") + ids(tok, " \n    return x") == ids(tok, "x = 1 \n    return x")


def test_where_no_cut_keeps_the_ids_pieces_still_stay_within_the_bound(monkeypatch):
    cut_into_pieces_of(200, monkeypatch)
    assert list(iter_pieces("x" * 450)) == ["x" * 200, "x" * 200, "x" * 50]  # a blob: cut anywhere
    lines = "\n".join(["日本語のテキスト"] * 60)  # no space: after a line break between two lines
    pieces = list(iter_pieces(lines))
    assert "".join(pieces) == lines and all(p.endswith("テキスト\n") for p in pieces[:-1])
    spaced = "\n".join(["  indented  "] * 60)  # no exact cut: after a line break still
    pieces = list(iter_pieces(spaced))
    assert "".join(pieces) == spaced and all(p.endswith("\n") and len(p) <= 200 for p in pieces[:-1])
    assert list(iter_pieces("short")) == ["short"]


def test_a_long_document_is_written_as_its_pieces_come(tmp_path, monkeypatch):
    """Long documents among short ones, at a batch's start and end: every document's tokens are [BOS], the ids of
    the whole document, [EOS], at its offset; an encoding job holds a batch's characters at most (pieces of one
    document or of several, and short documents); a document's tokens are written (and counted) before it ends."""
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    cut_into_pieces_of(300, monkeypatch)
    long = [indented_text(120, seed) for seed in range(3)]
    docs = [long[0], "a short one", "another short one", long[1], long[2], "the last"]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    tok = train_bpe(docs, 400)
    jobs = []
    real_encoder = ts._encoder

    def encoder(*args):
        encode = real_encoder(*args)

        def watched(unit):
            jobs.append((sum(not (o and c) for o, c in zip(unit.opens, unit.closes, strict=True)), unit.chars))
            return encode(unit)

        return watched

    monkeypatch.setattr(ts, "_encoder", encoder)
    progress = []
    source = resolve_source(str(path))
    store = write_store(source, tok, source.fingerprint(), tokenizer_origin="test", batch_chars=2000,
                        progress=lambda done, d, t: progress.append((done, d, t)))
    plain = plain_text_tokenizer(tok)
    assert store.num_documents == len(docs) and int(store.offsets[-1]) == store.num_tokens == len(store.tokens)
    for i, doc in enumerate(docs):
        got = store.tokens[int(store.offsets[i]):int(store.offsets[i + 1])].tolist()
        assert got == [tok.bos_id, *ids(plain, doc), tok.eos_id], i
    assert sum(pieces for pieces, _ in jobs) > 20 and all(chars < 2000 + 300 for _, chars in jobs)
    assert [t for _, _, t in progress] == sorted(t for _, _, t in progress)
    assert any(d0 == d1 and t0 < t1 for (_, d0, t0), (_, d1, t1) in zip(progress, progress[1:], strict=False))
    assert [b for b, _, _ in progress] == sorted(b for b, _, _ in progress) and progress[-1][0] == source.bytes


def test_a_long_document_trains_the_tokenizer_as_whole(monkeypatch):
    """Pieces cut where the ids stay those of the whole text train the same tokenizer as the whole text does."""
    text = indented_text()
    whole = train_bpe([text], 400).to_str()
    cut_into_pieces_of(120, monkeypatch)
    assert train_bpe([text], 400).to_str() == whole


def unbroken(lines: int, seed: int) -> str:
    """``indented_text`` without its blank lines: one paragraph."""
    return "\n".join(line for line in indented_text(lines, seed).split("\n") if line.strip())


def long_paragraph_file(tmp_path, seed: int = 0):
    """Paragraphs, some far longer than the reader's bound, one with spaces around it, one at the file's end."""
    rng = random.Random(seed)
    paragraphs = [unbroken(rng.randint(1, 4), seed=i) for i in range(6)]
    paragraphs[1] = "  " + unbroken(60, seed=11) + "   \n  "  # long, spaces around it
    paragraphs[4] = unbroken(90, seed=12)  # long, between short ones
    paragraphs.append(unbroken(70, seed=13))  # long, the file's last
    text = "\n\n".join(paragraphs)
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8", newline="")
    return path, text.replace("\r\n", "\n").replace("\r", "\n")  # as the reader reads line ends


@pytest.mark.parametrize("chunk", [97, 389])
def test_a_paragraph_longer_than_the_readers_bound_is_one_document(tmp_path, monkeypatch, chunk):
    """A text of 82 MB without a blank line (over the 64 Mi-character bound) was cut into two documents mid-word
    (an EOS and a BOS inside it): the reader hands it on in Continued parts, ending each where the ids stay."""
    from core.sources import Continued, _read_text, joined_documents, paragraphs

    path, text = long_paragraph_file(tmp_path)
    monkeypatch.setattr("core.sources._READ_CHUNK", chunk)
    monkeypatch.setattr("core.sources.MAX_PARAGRAPH_CHARS", 400)
    texts = [t for t, _ in _read_text(path)]
    expected = paragraphs(text)
    assert sum(isinstance(t, Continued) for t in texts) >= 5  # the long ones came in parts
    assert list(joined_documents(texts)) == expected
    tok = tokenizer("gpt2", text)
    rest = iter(texts)
    for doc in expected:  # the parts of each document give the ids of the whole
        parts = [next(rest)]
        while isinstance(parts[-1], Continued):
            parts.append(next(rest))
        assert [i for part in parts for i in ids(tok, part)] == ids(tok, doc)


def test_a_paragraph_longer_than_the_readers_bound_is_stored_as_one_document(tmp_path, monkeypatch):
    from core.sources import paragraphs

    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    path, text = long_paragraph_file(tmp_path, seed=1)
    tok = train_bpe([text], 400)
    plain = plain_text_tokenizer(tok)
    expected = paragraphs(text)
    monkeypatch.setattr("core.sources._READ_CHUNK", 101)
    monkeypatch.setattr("core.sources.MAX_PARAGRAPH_CHARS", 300)
    source = resolve_source(str(path))
    store = write_store(source, tok, source.fingerprint(), tokenizer_origin="test", batch_chars=500)
    assert store.num_documents == len(expected)
    for i, doc in enumerate(expected):
        got = store.tokens[int(store.offsets[i]):int(store.offsets[i + 1])].tolist()
        assert got == [tok.bos_id, *ids(plain, doc), tok.eos_id], i


def test_a_long_paragraph_whose_rest_is_only_spaces_still_ends(tmp_path, monkeypatch):
    """The last part of a document handed on in parts may be nothing but spaces: it still closes the document. (A
    run of spaces longer than the bound is handed on too, so it stays in the document: memory stays bounded.)"""
    from core.sources import Continued, _read_text, joined_documents

    path = tmp_path / "spaces.txt"
    path.write_text("a b " * 30 + "   \n\nnext\n\n" + "x" * 50 + " " * 500 + "\n\n" + "y" * 600, encoding="utf-8")
    monkeypatch.setattr("core.sources._READ_CHUNK", 64)
    monkeypatch.setattr("core.sources.MAX_PARAGRAPH_CHARS", 100)
    texts = [t for t, _ in _read_text(path)]
    assert any(isinstance(t, Continued) for t in texts)
    docs = list(joined_documents(texts))
    assert docs[:2] == [("a b " * 30).rstrip(), "next"] and docs[3] == "y" * 600
    assert docs[2].rstrip(" ") == "x" * 50 and len(docs) == 4
