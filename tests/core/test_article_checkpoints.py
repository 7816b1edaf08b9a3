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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_base_a_refusal_names_is_the_tables_own_and_loads_when_given(dtype, tmp_path):
    """Read from one entry of a table saved in bf16, the base named was off by up to 16 % (5.53e+05 for 5e+05),
    and the base named, given back, was refused in turn."""
    path = tmp_path / "llama_model.pth"
    weights = article_model(11, rope_base=500_000.0).state_dict()
    torch.save({k: v.to(dtype) for k, v in weights.items()}, path)
    with pytest.raises(CheckpointError, match=r"its tables fit rope_theta ≈ 5e\+05\); give --config"):
        ck.load_checkpoint(make_model(5), path)
    model, _ = ck.model_from_checkpoint(path, make_model(0, rope_theta=5e5).config)
    assert model.config.rope_theta == 5e5


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("theta", [50.0, 10_000.0, 12_345.0, 500_000.0, 1e6])
def test_the_base_of_rotary_tables_is_told_in_every_precision(head_dim, theta):
    from core.checkpoint.infer import rope_theta_of
    from core.model import RotaryEmbedding

    cos = RotaryEmbedding(head_dim, 2048, theta).cos
    assert rope_theta_of(cos) == theta
    for half in (torch.bfloat16, torch.float16):  # the shortest figure whose table fits as a load checks it
        found = rope_theta_of(cos.to(half).float(), atol=2e-2)
        assert found is not None and abs(found / theta - 1) < 1e-3
        assert (RotaryEmbedding(head_dim, 2048, found).cos - cos.to(half).float()).abs().max() <= 2e-2
    assert rope_theta_of(torch.rand(2048, head_dim)) is None  # not a table of one base: none named


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
    with torch.no_grad():  # the article's own model, greedy among the tokenizer's ids (its embedding has more rows)
        for _ in range(4):
            ids = torch.cat([ids, article(ids)[:, -1:, :tok.vocab_size].argmax(-1)], dim=1)
    assert ids.max() < tok.vocab_size < article.lm_head.out_features
    assert text == tok.decode(ids[0].tolist())
    # Without its tokenizer, one line saying what to add.
    assert main(["generate", str(checkpoint)]) == 2
    assert "has no tokenizer: pass --tokenizer TOKENIZER.json" in capsys.readouterr().err


def test_generate_takes_the_model_section_of_a_config_as_the_refusal_of_another_base_asks(tmp_path, capsys):
    """The refusal says "give --config with its rope_theta"; a file holding only the model section was refused for
    the training's default sequence length (128), beyond this model's 64 positions, which generate never uses."""
    checkpoint, tok_file = _article_file(tmp_path, rope_base=500_000.0), _article_tokenizer(tmp_path / "bpe.json")
    assert main(["generate", str(checkpoint), "--tokenizer", str(tok_file), "--max-new-tokens", "1"]) == 2
    assert "its tables fit rope_theta ≈ 5e+05); give --config with its rope_theta" in capsys.readouterr().err
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"model": make_model(0, rope_theta=5e5).config.to_dict()}))
    assert main(["generate", str(checkpoint), "--config", str(config), "--tokenizer", str(tok_file),
                 "--max-new-tokens", "1"]) == 0, capsys.readouterr().err
    config.write_text(json.dumps({"model": {**make_model(0).config.to_dict(), "rope_thetaa": 5e5}}))
    assert main(["generate", str(checkpoint), "--config", str(config), "--tokenizer", str(tok_file)]) == 2
    assert "did you mean 'rope_theta'?" in capsys.readouterr().err  # still checked as a file a user wrote


def test_generate_never_samples_an_id_its_tokenizer_lacks(tmp_path):
    """512 embedding rows, a tokenizer of 300 tokens: ids 300-511 were sampled and printed as nothing."""
    model = make_model(0)
    out = model.generate(torch.tensor([[1, 2, 3]]), 200, temperature=5.0, vocab_limit=300,
                         generator=torch.Generator().manual_seed(0))
    assert out.size(1) == 203 and int(out[0, 3:].max()) < 300


def _tokenizer_without_unknown(path: Path, unigram: bool) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram() if unigram else models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = (trainers.UnigramTrainer(vocab_size=60, special_tokens=["<s>", "</s>", "<pad>"], show_progress=False)
               if unigram else trainers.BpeTrainer(vocab_size=60, special_tokens=["<s>", "</s>", "<pad>"],
                                                   show_progress=False))
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 20, trainer=trainer)
    tok.save(str(path))
    return path


def test_a_prompt_the_tokenizer_cannot_encode_is_one_line_and_one_it_drops_is_said(tmp_path, capsys):
    """A Unigram tokenizer without an unknown token raised "Encountered an unknown token" as a traceback; a BPE
    one without it left the characters out of the prompt, silently."""
    checkpoint = _article_file(tmp_path)
    unigram = _tokenizer_without_unknown(tmp_path / "unigram.json", unigram=True)
    assert main(["generate", str(checkpoint), "--tokenizer", str(unigram), "--prompt", "The 日本 fox",
                 "--max-new-tokens", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("speedboard: error: the tokenizer cannot encode the prompt's character '日' "
                           "(U+65E5)"), line
    bpe = _tokenizer_without_unknown(tmp_path / "bpe.json", unigram=False)
    assert main(["generate", str(checkpoint), "--tokenizer", str(bpe), "--prompt", "The 日本 fox",
                 "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert "warning: the tokenizer has no token for '日本' and no unknown token: left out of the prompt" in err


def test_a_tokenizer_trained_too_large_for_the_checkpoints_embedding_names_the_vocab_size_to_give(tmp_path,
                                                                                                     capsys):
    checkpoint = _article_file(tmp_path)  # 512 embedding rows; tiny trains a tokenizer of 2,048 tokens
    assert main(["train", "--init-from", str(checkpoint), "--data", "builtin", "--seq-len", "32",
                 "--micro-batch", "2", "--steps", "1", "--no-progress", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "has only 512 rows; give --vocab-size 512 (or the tokenizer its weights were trained with" in err


def test_an_embedding_smaller_than_any_trained_tokenizer_asks_for_the_tokenizer_alone(tmp_path, capsys):
    """--vocab-size 100 was suggested for a 100-row embedding, a size the next try refused (300 at least)."""
    checkpoint = _article_file(tmp_path, vocab_size=100)
    assert main(["train", "--init-from", str(checkpoint), "--data", "builtin", "--seq-len", "32",
                 "--micro-batch", "2", "--steps", "1", "--no-progress", "--out", str(tmp_path / "runs")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("has only 100 rows; give the tokenizer its weights were trained with (--tokenizer FILE): "
                         "no tokenizer is trained to fewer than 300 tokens"), line


def test_a_new_run_starts_from_an_article_checkpoint(tmp_path, capsys):
    checkpoint = _article_file(tmp_path)
    out = tmp_path / "runs"
    assert main(["train", "--init-from", str(checkpoint), "--data", str(corpus_file(tmp_path)), "--vocab-size",
                 "300", "--seq-len", "32", "--micro-batch", "2", "--steps", "1", "--eval-every", "0",
                 "--no-progress", "--out", str(out)]) == 0
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["model"] == make_model(0).config.to_dict() and config["init_from"] == str(checkpoint)
