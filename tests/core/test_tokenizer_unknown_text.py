"""A tokenizer that cannot encode a document's text is one line naming the document; one that leaves such text
out silently (a BPE without an unknown token) is a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from core.cli import main
from core.config import DataConfig
from core.events import ListSink, WarningRaised
from core.prepare import prepare_corpus
from core.tokenizer import BPETokenizer, drops_unknown_text, train_bpe
from tests.core.store_helpers import ENGLISH, jsonl, one_line, store_folders


def unigram_without_unk(folder: Path) -> Path:
    """A SentencePiece-style tokenizer with no unknown token: text outside its vocabulary cannot be encoded."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(ENGLISH, trainers.UnigramTrainer(vocab_size=60, special_tokens=["<s>", "</s>", "<pad>"],
                                                             show_progress=False))
    path = folder / "unigram.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("long", [False, True])
def test_text_a_tokenizer_cannot_encode_is_one_line_naming_the_document(long, tmp_path, cache, capsys, monkeypatch):
    monkeypatch.setattr("core.tokenizer.LONG_DOCUMENT_CHARS", 100)
    monkeypatch.setattr("core.tokenizer.PIECE_CHARS", 100)
    bad = ("some text " * 30 if long else "") + "with 日本語 characters"
    data = jsonl(tmp_path / "c.jsonl", ["plain english text", bad, "more plain text"])
    code = main(["prepare", str(data), "--tokenizer", str(unigram_without_unk(tmp_path)), "--no-progress"])
    err = one_line(capsys, code)
    assert f"tokenizer {tmp_path / 'unigram.json'} cannot encode document 2 of {data}" in err, err
    assert f"it begins {bad[:60]!r}" in err and "which holds '日' (U+65E5)" in err, err
    assert store_folders(cache) == []


def _whitespace_bpe(unk: str | None) -> BPETokenizer:
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(ENGLISH, trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"],
                                                         show_progress=False))
    return BPETokenizer(tok)


def test_a_tokenizer_that_drops_unknown_text_is_a_warning(tmp_path, cache):
    dropping = _whitespace_bpe(None)
    assert dropping.encode("plain 日本語") == dropping.encode("plain")  # what the warning is about
    assert drops_unknown_text(dropping) and not drops_unknown_text(_whitespace_bpe("<unk>"))
    assert not drops_unknown_text(train_bpe(ENGLISH, 300))  # byte-level over all 256 bytes: nothing to drop
    data = str(jsonl(tmp_path / "c.jsonl", ENGLISH))
    for tok, warned in ((dropping, True), (train_bpe(ENGLISH, 300), False)):
        sink = ListSink()
        prepare_corpus(DataConfig(source=data), tok, tokenizer_origin="the given one", sink=sink)
        messages = [e.message for e in sink.of(WarningRaised)]
        assert messages == (["tokenizer the given one has no unknown token: a character it has no token for is left "
                             "out of the tokens, without a trace"] if warned else [])


def test_a_tokenizer_that_cannot_encode_the_samples_prompt_samples_without_one(tmp_path, cache):
    """The first sample encoded "The" with a Unigram vocabulary of lowercase text and no unknown token: the
    tokenizer's bare Exception failed the run after its training, with no final checkpoint."""
    from core.control import Control
    from core.events import SampleGenerated
    from core.trainer import Trainer
    from tests.conftest import micro_config

    data = jsonl(tmp_path / "c.jsonl", ENGLISH * 20)
    cfg = micro_config(tmp_path, data={"source": str(data), "tokenizer": str(unigram_without_unk(tmp_path)),
                                       "seq_len": 16}, train={"budget": 2})
    sink = ListSink()
    result = Trainer(cfg, Control(), sink).run()
    assert result.checkpoint is not None and result.step == 2
    warned = [e.message for e in sink.of(WarningRaised) if "samples' prompt" in e.message]
    assert len(warned) == 1 and warned[0].startswith("the tokenizer cannot encode the samples' prompt 'The' (")
    assert warned[0].endswith("): samples start from the beginning-of-text token alone")
    samples = sink.of(SampleGenerated)
    assert samples and all(s.prompt == "" for s in samples)


def _lowercase_bpe(folder: Path) -> Path:
    """A BPE vocabulary of lowercase text with no unknown token: 'T' and 'é' are left out of what it encodes."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([d.lower() for d in ENGLISH] * 20,
                            trainers.BpeTrainer(vocab_size=80, special_tokens=["<s>", "</s>", "<pad>"],
                                                show_progress=False))
    path = folder / "lower.json"
    tok.save(str(path))
    return path


def test_the_characters_a_bpe_leaves_out_are_named_as_they_are(tmp_path, cache, capsys):
    """Read from the offsets of the tokens kept, which tokenizers shifts after a dropped character, 'The' was
    said to lose its 'e' (it lost 'T'), and 'ab été cd' its 'té' (it lost both 'é'); and the training's samples
    began from 'he' without a word."""
    from core.control import Control
    from core.events import SampleGenerated
    from core.trainer import Trainer
    from tests.conftest import micro_config

    data = jsonl(tmp_path / "c.jsonl", [d.lower() for d in ENGLISH] * 20)
    cfg = micro_config(tmp_path, data={"source": str(data), "tokenizer": str(_lowercase_bpe(tmp_path)),
                                       "seq_len": 16}, train={"budget": 2, "sample_every": 2})
    sink = ListSink()
    result = Trainer(cfg, Control(), sink).run()
    warned = [e.message for e in sink.of(WarningRaised) if "samples' prompt" in e.message]
    assert warned == ["the tokenizer has no token for 'T' and no unknown token: the samples' prompt 'The' is "
                      "read without it"]
    assert sink.of(SampleGenerated)
    capsys.readouterr()
    for prompt, dropped in (("The", "T"), ("ab été cd", "é")):
        assert main(["generate", str(result.checkpoint), "--prompt", prompt, "--max-new-tokens", "1"]) == 0
        err = capsys.readouterr().err
        assert f"warning: the tokenizer has no token for {dropped!r} and no unknown token: left out" in err, err
