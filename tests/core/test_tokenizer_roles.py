"""Which tokens of a user's tokenizer.json play BOS, EOS and PAD, how they decode, and how an export hands them on:
the special tokens before look-alike pieces of text, the roles never shown as text, a file's own post-processor
replaced by the BOS the model was trained with, and a tokenizer_config.json that names what is not there refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from core.errors import CheckpointError, DataError
from core.tokenizer import BPETokenizer, load_tokenizer_file

ARTICLE = ["[UNK]", "[BOT]", "[EOT]", "[PAD]"]
HTML = ["old price <s>$72</s> now $1.", "was <s>$19</s> only today", "new price <s>$90</s> <s>$65</s>"] * 30


def _byte_level(path: Path, texts: list[str], special: list[str], marked: bool = True) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=special if marked else [],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    if not marked:
        tok.add_tokens(special)  # added, but not marked special
    tok.save(str(path))
    return path


def _word_level(path: Path, vocab: dict[str, int], special: list[str]) -> Path:
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(special)
    tok.save(str(path))
    return path


def test_the_special_tokens_play_the_roles_before_pieces_of_text_of_the_same_names(tmp_path):
    """A vocabulary that learned "<s>" and "</s>" as words (HTML strike-through) took them for BOS and EOS over its
    special [BOT] and [EOT]: documents began and ended with visible text."""
    words = {"[UNK]": 0, "<s>": 1, "</s>": 2, "old": 3, "price": 4}
    tok = load_tokenizer_file(_word_level(tmp_path / "t.json", words, ARTICLE[1:]))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("[BOT]", "[EOT]", "[PAD]")
    assert tok.decode([tok.bos_id, *tok.encode("old <s> price"), tok.eos_id]) == "old <s> price"
    # With no special token of a role's names, a piece of text of those names still plays it.
    plain = load_tokenizer_file(_word_level(tmp_path / "p.json", words, []))
    assert (plain.bos_token, plain.eos_token) == ("<s>", "</s>")


def test_roles_added_but_not_marked_special_are_not_shown_as_text(tmp_path):
    tok = load_tokenizer_file(_byte_level(tmp_path / "t.json", HTML, ARTICLE, marked=False))
    assert tok.bos_token == "[BOT]" and not tok.tok.get_added_tokens_decoder()[tok.bos_id].special
    ids = [tok.bos_id, *tok.encode("old price"), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "old price"
    assert tok.decode(ids, skip_special=False).startswith("[BOT]")


def test_an_export_puts_the_trained_bos_before_a_text_whatever_post_processor_the_file_had(tmp_path):
    """A WordPiece file with a BERT template exported as [CLS] … [SEP], where the model was trained on [BOT] …."""
    transformers = pytest.importorskip("transformers")
    words = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "lazy": 3, "dog": 4}
    path = tmp_path / "bert.json"
    _word_level(path, words, ARTICLE[1:])
    raw = Tokenizer.from_file(str(path))
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1),
                                                                                                 ("[SEP]", 2)])
    raw.save(str(path))
    tok = load_tokenizer_file(path)
    out = tmp_path / "hf"
    out.mkdir()
    tok.save(out, for_hf=True)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert hf("lazy dog")["input_ids"] == [tok.bos_id, *tok.encode("lazy dog")]
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_a_byte_level_post_processor_is_kept_beside_the_bos(tmp_path):
    path = _byte_level(tmp_path / "gpt.json", HTML, ARTICLE)
    raw = Tokenizer.from_file(str(path))
    raw.post_processor = processors.ByteLevel(trim_offsets=True)
    raw.save(str(path))
    tok = load_tokenizer_file(path)
    out = tmp_path / "hf"
    out.mkdir()
    tok.save(out, for_hf=True)
    saved = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert saved.encode("old price").ids == [tok.bos_id, *tok.encode("old price")]
    assert "ByteLevel" in json.dumps(json.loads(saved.to_str())["post_processor"])


@pytest.mark.parametrize("config, message", [
    ({"bos_token": "<|im_start|>"}, "names '<|im_start|>' as its bos_token, which tokenizer.json does not hold"),
    ({"eos_token": {"content": "<eos>"}}, "names '<eos>' as its eos_token, which tokenizer.json does not hold"),
    ({"pad_token": ["[PAD]"]}, "names ['[PAD]'] as its pad_token, which tokenizer.json does not hold"),
    ("{not json", "cannot read"),
    ([1, 2], "holds no object of settings"),
])
def test_a_tokenizer_config_that_names_what_is_not_there_is_refused(config, message, tmp_path):
    """Named roles that were not there (or a file that was no JSON) were dropped without a word for the usual
    names: the user named them."""
    folder = tmp_path / "tok"
    folder.mkdir()
    _byte_level(folder / "tokenizer.json", HTML, ARTICLE)
    (folder / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(DataError) as caught:
        load_tokenizer_file(folder)
    assert message in str(caught.value) and "is it a Hugging Face" not in str(caught.value)
    with pytest.raises(CheckpointError):
        BPETokenizer.load(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "[BOT]", "pad_token": None}))
    assert load_tokenizer_file(folder).bos_token == "[BOT]"


def test_a_store_framed_by_other_role_ids_is_prepared_again(tmp_path, cache):
    """The same tokenizer file with its roles chosen otherwise (as an earlier version chose "<s>" over [BOT]) left a
    store whose documents were framed by the old ids, reused as it was."""
    from core.config import DataConfig
    from core.data import prepare_data
    from core.token_store import MANIFEST

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(HTML), encoding="utf-8")
    cfg = DataConfig(source=str(corpus), seq_len=16, tokenizer=str(_byte_level(tmp_path / "t.json", HTML, ARTICLE)),
                     layout="document")
    data = prepare_data(cfg)
    manifest_file = data.store.path / MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["tokenizer"]["bos_id"] = data.tokenizer.bos_id + 7
    manifest_file.write_text(json.dumps(manifest))
    again = prepare_data(cfg)
    assert not again.corpus.from_store and again.store.path == data.store.path
    assert json.loads(manifest_file.read_text())["tokenizer"]["bos_id"] == data.tokenizer.bos_id
