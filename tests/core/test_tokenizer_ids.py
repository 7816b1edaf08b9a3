"""Token ids as a tokenizer numbers them (holes and all), and prompts encoded as training encodes documents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.checkpoint import check_tokenizer_fits, save_checkpoint
from core.cli import main
from core.config import DataConfig
from core.data import prepare_data
from core.errors import CheckpointError, DataError
from core.events import ListSink
from core.tokenizer import BPETokenizer, load_tokenizer_file
from core.trainer import Trainer
from tests.conftest import micro_config
from tests.core.checkpoint_helpers import make_model, make_tokenizer, micro_model_config


def holed_tokenizer(tok: BPETokenizer, path: Path, shift: int = 0) -> Path:
    """``tok`` without <|pad|> (id 0) and <|bos|> (id 1), <|eos|> renamed <|endoftext|>, every id + ``shift``:
    fewer entries than its highest id + 1, as GPT-2-style files cut from a larger vocabulary have."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for name in ("<|pad|>", "<|bos|>"):
        del vocab[name]
    vocab["<|endoftext|>"] = vocab.pop("<|eos|>")
    data["model"]["vocab"] = {k: v + shift for k, v in vocab.items()}
    added = [t for t in data["added_tokens"] if t["content"] not in ("<|pad|>", "<|bos|>")]
    for t in added:
        t["content"] = "<|endoftext|>" if t["content"] == "<|eos|>" else t["content"]
        t["id"] += shift
    data["added_tokens"] = added
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def top_words(tok: BPETokenizer, count: int = 2) -> str:
    """Text made of the tokenizer's highest ids."""
    top = tok.vocab_size - 1
    return "".join(tok.decode([i]) for i in range(top - count + 1, top + 1))


def test_vocab_size_is_the_highest_id_plus_one(tmp_path, tok):
    holed = BPETokenizer.load(holed_tokenizer(tok, tmp_path / "tok.json"))
    assert len(holed.tok.get_vocab(with_added_tokens=True)) == tok.vocab_size - 2
    assert holed.vocab_size == tok.vocab_size  # ids 2..299: the embedding needs 300 rows
    assert holed.bos_id == holed.eos_id == 2
    assert max(holed.encode(top_words(holed))) == holed.vocab_size - 1


def test_an_embedding_of_as_many_rows_as_entries_is_too_small_for_ids_with_holes(tmp_path, tok):
    holed = BPETokenizer.load(holed_tokenizer(tok, tmp_path / "tok.json"))
    with pytest.raises(CheckpointError, match="the tokenizer has 300 tokens but the model's embedding has only 298"):
        check_tokenizer_fits(holed, micro_model_config(vocab_size=298))
    check_tokenizer_fits(holed, micro_model_config(vocab_size=300))


def test_a_tokenizer_whose_ids_reach_past_any_vocabulary_is_refused_before_any_work(tmp_path, cache, tok, capsys):
    """One id of four billion in a hand-edited file: prepare tokenized for minutes and gigabytes into a uint32
    store, and train then refused the 15,000 GiB model it asked for."""
    from core.tokenizer import MAX_TOKEN_ID

    at_the_end = holed_tokenizer(tok, tmp_path / "ok.json", shift=MAX_TOKEN_ID - (tok.vocab_size - 1))
    assert BPETokenizer.load(at_the_end).vocab_size == MAX_TOKEN_ID + 1  # the last id allowed
    beyond = holed_tokenizer(tok, tmp_path / "far.json", shift=4_000_000_000)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to prepare\n\n" * 50, encoding="utf-8")
    assert main(["prepare", str(corpus), "--tokenizer", str(beyond), "--no-progress"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "its highest token id is 4,000,000,299 (for 298 tokens)" in err, err
    assert "is it a Hugging Face tokenizer.json?" not in err  # it is one: the question is for a file that is none
    assert not (cache / "stores").exists() or not any((cache / "stores").iterdir())


def test_a_tokenizer_with_holes_trains_on_its_top_ids(tmp_path, cache, tok):
    """Its top ids used to index past an embedding sized by the number of entries (IndexError mid-run)."""
    tok_file = holed_tokenizer(tok, tmp_path / "tok.json")
    holed = BPETokenizer.load(tok_file)
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"{top_words(holed)} {i} " * 8 for i in range(40)), encoding="utf-8")
    cfg = micro_config(tmp_path, data={"source": str(text), "tokenizer": str(tok_file)})
    cfg = cfg.replace(train={"budget": 2})
    trainer = Trainer(cfg, sink=ListSink())
    trainer.run()
    assert int(trainer.data.store.tokens.max()) == holed.vocab_size - 1
    (run,) = (tmp_path / "runs").iterdir()
    saved = json.loads((run / "config.json").read_text())
    assert saved["config"]["model"]["vocab_size"] == tok.vocab_size
    assert trainer.model.model.embed_tokens.num_embeddings == tok.vocab_size


def test_the_store_dtype_holds_ids_above_65535_of_a_small_vocabulary(tmp_path, cache, tok):
    """298 entries with ids 70,002..70,299 need uint32 (uint16, chosen from the count, overflowed)."""
    tok_file = holed_tokenizer(tok, tmp_path / "tok.json", shift=70_000)
    holed = BPETokenizer.load(tok_file)
    assert holed.vocab_size == 70_000 + tok.vocab_size
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"{top_words(holed)} doc {i}" for i in range(20)), encoding="utf-8")
    data = prepare_data(DataConfig(source=str(text), seq_len=16, tokenizer=str(tok_file)))
    assert data.store.manifest["dtype"] == "uint32" and data.store.tokens.dtype == np.uint32
    first = data.store.tokens[: int(data.store.offsets[1])]
    assert first[0] == first[-1] == holed.eos_id == 70_002  # BOS and EOS are one <|endoftext|>
    assert int(first.max()) == holed.vocab_size - 1


# ----------------------------------------------------------------------------- generate's prompt and tokenizer
@pytest.fixture
def checkpoint(tmp_path, tok) -> Path:
    """A micro model with its own tokenizer (300 tokens), saved as a Speedboard checkpoint."""
    return save_checkpoint(tmp_path / "ckpt", make_model(0), tokenizer=tok)


def generate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args, "--max-new-tokens", "2", "--device", "cpu"])
    out, err = capsys.readouterr()
    return code, out, err


def test_special_token_names_in_the_prompt_are_text_as_in_training(checkpoint, capsys, tok):
    """They were fed as PAD/EOS control tokens, and vanished from the printed prompt."""
    prompt = "Hello <|pad|> world <|eos|> again <|bos|>"
    code, out, err = generate(capsys, str(checkpoint), "--prompt", prompt)
    assert code == 0, err
    assert out.startswith(prompt)
    from core.cli import _prompt_ids

    ids = _prompt_ids(tok, prompt)
    assert not {tok.pad_id, tok.bos_id, tok.eos_id} & set(ids) and tok.decode(ids) == prompt


def test_a_prompt_that_is_not_utf8_is_one_line(checkpoint, capsys):
    """Bytes such as caf\\xe9 (Latin-1) in argv reach Python as a lone surrogate: a TypeError in the tokenizer."""
    code, out, err = generate(capsys, str(checkpoint), "--prompt", "caf\udce9")
    assert (code, out, err) == (2, "", "speedboard: error: the prompt is not UTF-8 text\n")


def test_a_utf8_prompt_decoded_in_another_locale_is_read_as_utf8(checkpoint, capsys):
    """Under LC_ALL=C PYTHONUTF8=0, "Thé" reaches Python as "Th" and two lone surrogates: it was refused as
    not UTF-8, though its bytes are."""
    code, out, err = generate(capsys, str(checkpoint), "--prompt", "Th\udcc3\udca9")
    assert code == 0, err
    assert out.startswith("Thé")


def test_generate_refuses_another_tokenizer_than_the_checkpoints_own(tmp_path, checkpoint, capsys, tok):
    """--tokenizer is for a checkpoint without one; a different file was used silently (its ids mean other text)."""
    other = make_tokenizer(320).save(tmp_path)
    code, out, err = generate(capsys, str(checkpoint), "--tokenizer", str(other))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"speedboard: error: tokenizer {other} is not the one of {checkpoint}")
    (tmp_path / "same").mkdir()
    same = tok.save(tmp_path / "same")  # an identical copy is the checkpoint's own
    code, out, err = generate(capsys, str(checkpoint), "--tokenizer", str(same), "--prompt", "The")
    assert code == 0 and out.startswith("The"), err
    (tmp_path / "exported").mkdir()  # so is the copy `speedboard export` writes, with a BOS post-processor
    exported = tok.save(tmp_path / "exported", for_hf=True)
    assert exported.read_text() != same.read_text()
    code, out, err = generate(capsys, str(checkpoint), "--tokenizer", str(exported), "--prompt", "The")
    assert code == 0 and out.startswith("The"), err


def test_a_tokenizer_in_a_folder_whose_name_is_not_utf8_reads_back(tmp_path):
    """A run saved under such a folder (its name's bytes kept as surrogate escapes) could never be read back:
    tokenizers' from_file takes a str path only."""
    import os

    from core.tokenizer import BPETokenizer, train_bpe

    tok = train_bpe(["a few words of text, and some more words of text"] * 20, 300)
    folder = tmp_path / os.fsdecode(b"out\xfe")
    folder.mkdir()
    tok.save(folder)
    assert BPETokenizer.load(folder).to_str() == tok.to_str()


def test_a_tokenizer_file_saved_with_a_byte_order_mark_reads(tmp_path):
    """Windows' editors open a saved file with a BOM, which JSON refuses: "it is not JSON (line 1 column 1)"."""
    from core.tokenizer import train_bpe

    tok = train_bpe(["a few words of text, and some more words of text"] * 20, 300)
    path = tmp_path / "tokenizer.json"
    path.write_text("\ufeff" + tok.to_str(), encoding="utf-8")
    assert load_tokenizer_file(path).to_str() == tok.to_str()


@pytest.mark.parametrize("text, why", [
    ('{"a": 1}', 'it is JSON without a tokenizer\'s "model" (its keys: a)'),  # the library named line 1 column 5
    ("[1, 2]", "it holds a JSON list, not a tokenizer's object"),
    ("not json", "it is not JSON ("),
])
def test_a_file_that_is_no_tokenizer_says_what_it_is(tmp_path, text, why):
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    with pytest.raises(CheckpointError) as err:
        BPETokenizer.load(path)
    assert str(err.value).startswith(f"cannot read tokenizer {path}: {why}")
    with pytest.raises(DataError) as err:  # given with --tokenizer: asked whether it is one
        load_tokenizer_file(path)
    assert str(err.value).endswith("(is it a Hugging Face tokenizer.json?)")


def test_a_tokenizer_file_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    """A read that failed (a file removed by a checkpoint rotation, no permission) raised UnboundLocalError."""
    from core.errors import DataError
    from core.tokenizer import load_tokenizer_file, train_bpe

    path = train_bpe(["a few words of text, and some more words of text"] * 20, 300).save(tmp_path)

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(PermissionError):
        BPETokenizer.load(path)  # as it is: a rotating run's reader tries its newest checkpoint again
    with pytest.raises(DataError, match=f"cannot read tokenizer {path}: Permission denied"):
        load_tokenizer_file(path)
