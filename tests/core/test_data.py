"""Corpora, tokenizer, sample layouts, split and order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from core.config import DataConfig
from core.data import IGNORE_INDEX, SampleOrder, TokenDataset, load_corpus, prepare_data, split_train_val
from core.errors import DataError
from core.tokenizer import BOS, EOS, PAD, BPETokenizer, train_bpe


@pytest.fixture(scope="module")
def builtin():
    return load_corpus("builtin")


def test_builtin_corpus_needs_no_download(builtin):
    assert builtin.num_chars > 400_000
    assert len(builtin.documents) > 1000


def test_tokenizer_round_trip_and_specials(builtin):
    tok = train_bpe(builtin.documents[:400], 600)
    assert [tok.pad_id, tok.bos_id, tok.eos_id] == [0, 1, 2]
    text = "def f(x):\n    return x ** 2  # naïve ünïcode ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size <= 600


def test_tokenizer_save_and_load(tmp_path, builtin):
    tok = train_bpe(builtin.documents[:200], 400)
    tok.save(tmp_path)
    again = BPETokenizer.load(tmp_path)
    assert again.to_str() == tok.to_str() and again.pad_id == 0 and again.bos_token == BOS and again.eos_token == EOS
    assert again.pad_token == PAD


def test_packed_layout_has_no_padding_and_shifted_targets():
    data = prepare_data(DataConfig(seq_len=32, vocab_size=512))
    batch = data.train.batch([0, 1, 2])
    assert batch.attention_mask is None
    assert batch.inputs.shape == batch.targets.shape == (3, 32)
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert batch.num_targets == 3 * 32
    # Consecutive windows continue each other (stride seq_len, one token overlap).
    rows = data.train.samples
    assert rows.shape[1] == 33


def test_document_layout_pads_and_ignores_pad_targets(tmp_path):
    docs = ["short one.", "a much longer paragraph " * 20, "mid sized text here, yes."]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs * 10))
    data = prepare_data(DataConfig(source=str(path), layout="document", seq_len=32, vocab_size=300))
    tok = data.tokenizer
    rows = torch.cat([data.train.samples, data.val.samples])
    assert (rows[:, 0] == tok.bos_id).all()
    batch = data.train.batch(list(range(len(data.train))))
    assert batch.attention_mask is not None
    pad_inputs = batch.inputs == tok.pad_id
    assert torch.equal(batch.attention_mask.bool(), ~pad_inputs)
    assert (batch.targets[batch.targets != IGNORE_INDEX] != tok.pad_id).all()
    assert batch.num_targets == int((batch.targets != IGNORE_INDEX).sum())
    assert 0 < batch.num_targets < batch.targets.numel()  # uneven documents
    # Short documents end with EOS then padding; the long one is truncated.
    short = [r for r in rows.tolist() if tok.eos_id in r]
    assert short and all(r[r.index(tok.eos_id) + 1:] == [tok.pad_id] * (32 - r.index(tok.eos_id)) for r in short)


def test_validation_is_held_out_and_spread_over_the_corpus():
    samples = torch.arange(100 * 5, dtype=torch.int32).view(100, 5)  # every row unique
    train, val = split_train_val(TokenDataset(samples, pad_id=None), 0.1)
    t, v = set(train.samples[:, 0].tolist()), set(val.samples[:, 0].tolist())
    assert len(v) == 10 and len(t) == 90 and not t & v
    assert min(v) < 100 and max(v) > 400  # from the start and the end of the corpus
    data = prepare_data(DataConfig(seq_len=32, vocab_size=512, val_fraction=0.1))
    assert len(data.train) > 5 * len(data.val) > 0


def test_sample_order_is_seeded_and_position_only():
    order = SampleOrder(10, seed=3)
    whole = order.take(0, 25)
    parts = np.concatenate([order.take(0, 8), order.take(8, 9), order.take(17, 8)])
    assert np.array_equal(whole, parts)
    assert sorted(whole[:10]) == list(range(10)) and sorted(whole[10:20]) == list(range(10))
    assert not np.array_equal(whole[:10], whole[10:20])  # a new permutation per epoch
    assert np.array_equal(SampleOrder(10, seed=3).take(5, 10), whole[5:15])
    assert not np.array_equal(SampleOrder(10, seed=4).take(0, 10), whole[:10])


def test_text_file_and_folder_sources(tmp_path):
    (tmp_path / "a.txt").write_text("first paragraph\n\nsecond paragraph\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.md").write_text("# title\n\nbody text")
    (sub / "ignored.bin").write_bytes(b"\x00\x01")
    assert load_corpus(str(tmp_path / "a.txt")).documents == ["first paragraph", "second paragraph"]
    assert load_corpus(str(tmp_path)).documents == ["first paragraph", "second paragraph", "# title", "body text"]


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text(""), "is empty"),
    (lambda p: p.write_bytes(b"caf\xe9 latin-1"), "not UTF-8"),
    (lambda p: p.write_text("{not json"), None),
    (lambda p: p.symlink_to(p.with_name("moved.txt")), "c.txt is a broken symbolic link (to "),
    (lambda p: p.symlink_to(p), "c.txt is a symbolic link that loops back on itself"),  # was "Too many levels…"
])
def test_bad_sources_give_one_line(tmp_path, setup, message):
    path = tmp_path / ("c.jsonl" if message is None else "c.txt")
    setup(path)
    with pytest.raises(DataError) as err:
        load_corpus(str(path))
    assert "\n" not in str(err.value)
    if message:
        assert message in str(err.value)


def test_corpus_shorter_than_one_sample(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("just a few words")
    with pytest.raises(DataError, match="fewer than one sample"):
        prepare_data(DataConfig(source=str(path), seq_len=64, vocab_size=300))


def test_a_new_tokenizers_sample_is_bounded_in_characters_too(tmp_path, monkeypatch):
    """Few, long documents: 62,227 documents of 16 KB (1 GB) were all under the 100,000-document bound, held in
    RAM whole (1.6 GB peak) and trained on for 137 s. The sample stops at the character bound, a document that
    crosses it cut there."""
    import core.prepare
    from core.config import DataConfig

    corpus = tmp_path / "long.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " + "word " * 400}) + "\n" for i in range(30)))
    monkeypatch.setattr(core.prepare, "TOKENIZER_SAMPLE_CHARS", 5_000)
    trained_on = []

    def train_bpe(docs, vocab_size):
        trained_on.extend(docs)
        raise core.prepare.DataError("stop here")

    monkeypatch.setattr(core.prepare, "train_bpe", train_bpe)
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(core.prepare.DataError, match="stop here"):
        core.prepare.prepare_corpus(DataConfig(source=str(corpus), seq_len=16, vocab_size=300))
    assert sum(map(len, trained_on)) == 5_000 and len(trained_on) == 3  # 2 whole documents and the third's start
    assert "documents at most, 0 Mi characters at most" in core.prepare.trained_origin(DataConfig())  # said
