"""The article series' checkpoints ("Pretraining a Llama Model on Your Local GPU"): its bare state dicts
tell their architecture through their shapes, their rotary tables are checked and dropped, and they
generate and start runs from the command line. (Its key layouts load with every other format in
test_checkpoint_formats.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core import checkpoint as ck
from core.cli import main
from core.errors import CheckpointError
from core.tokenizer import load_tokenizer_file
from tests.core.article_model import article_model
from tests.core.checkpoint_helpers import corpus_file, input_ids, logits, make_model

pytestmark = pytest.mark.usefixtures("single_thread")


def _article_file(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "llama_model.pth"
    torch.save(article_model(11, **changes).state_dict(), path)
    return path


def test_an_article_checkpoint_brings_its_architecture_in_its_tensors(tmp_path):
    """No config travels with it: the embedding, the layers, k_proj and the rotary tables tell the architecture."""
    model, loaded = ck.model_from_checkpoint(_article_file(tmp_path))
    assert loaded.model_config is None  # a bare state dict …
    assert model.config == make_model(0).config  # … whose shapes gave exactly the model it was trained as
    with torch.no_grad():
        expected = article_model(11)(input_ids()).float()
    torch.testing.assert_close(logits(model, input_ids()), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes, message", [
    ({"rope_base": 500_000.0}, r"another RoPE base \(its tables fit rope_theta ≈ 5e\+05\)"),
    ({"num_attention_heads": 2, "num_key_value_heads": 1}, r"for head size 16, but this model's head size is 8"),
])
def test_rotary_tables_of_another_base_or_head_size_are_refused(changes, message, tmp_path):
    model = make_model(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=message):
        ck.load_checkpoint(model, _article_file(tmp_path, **changes))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # unchanged


def test_a_state_dict_whose_shapes_do_not_tell_the_heads_asks_for_a_preset(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(make_model(0).state_dict(), path)  # no rotary tables: the head size is not in any shape
    with pytest.raises(CheckpointError, match="cannot be read from its tensors; give --preset or --config"):
        ck.model_from_checkpoint(path)
    model, _ = ck.model_from_checkpoint(path, make_model(0).config)  # named: fine
    torch.testing.assert_close(logits(model, input_ids()), logits(make_model(0), input_ids()), rtol=0, atol=0)


def _article_tokenizer(path: Path) -> Path:
    """A tokenizer.json alone, with the article's special tokens ([BOT], [EOT], [PAD]), as its bpe_50K.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[PAD]", "[BOT]", "[EOT]", "[UNK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 20, trainer=trainer)
    tok.save(str(path))
    return path


def test_generate_from_an_article_checkpoint_with_its_tokenizer(tmp_path, capsys):
    checkpoint, tok_file = _article_file(tmp_path), _article_tokenizer(tmp_path / "bpe.json")
    tok = load_tokenizer_file(tok_file)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("[BOT]", "[EOT]", "[PAD]")
    assert main(["generate", str(checkpoint), "--tokenizer", str(tok_file), "--prompt", "The quick",
                 "--max-new-tokens", "4"]) == 0
    text = capsys.readouterr().out.strip()
    ids = torch.tensor([[tok.bos_id, *tok.encode("The quick")]])
    article = article_model(11)
    with torch.no_grad():  # the article's own model, greedy
        for _ in range(4):
            ids = torch.cat([ids, article(ids)[:, -1:].argmax(-1)], dim=1)
    assert text == tok.decode(ids[0].tolist())
    # Without its tokenizer, one line saying what to add.
    assert main(["generate", str(checkpoint)]) == 2
    assert "has no tokenizer: pass --tokenizer TOKENIZER.json" in capsys.readouterr().err


def test_a_new_run_starts_from_an_article_checkpoint(tmp_path, capsys):
    checkpoint = _article_file(tmp_path)
    out = tmp_path / "runs"
    assert main(["train", "--init-from", str(checkpoint), "--data", str(corpus_file(tmp_path)), "--vocab-size",
                 "300", "--seq-len", "32", "--micro-batch", "2", "--steps", "1", "--eval-every", "0",
                 "--no-progress", "--out", str(out)]) == 0
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["model"] == make_model(0).config.to_dict() and config["init_from"] == str(checkpoint)
