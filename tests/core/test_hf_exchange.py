"""Hugging Face exchange in both directions, checked against ``transformers`` itself (a test-only dependency):
the same logits (max abs difference ≤ 1e-4 in fp32) and the same tokenization."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from core import checkpoint as ck
from core.cli import main
from core.config import DataConfig, ModelConfig
from core.data import SampleOrder, prepare_data
from core.errors import CheckpointError
from core.events import RunStarted, StepMetrics
from core.runs import read_events
from tests.core.checkpoint_helpers import (
    hf_llama,
    hf_logits,
    input_ids,
    logits,
    make_model,
    save_hf_folder,
)

pytestmark = pytest.mark.usefixtures("single_thread")

transformers = pytest.importorskip("transformers")

TEXTS = ["def f(x):\n    return x + 1", "Hello, wörld! The quick brown fox.", "  spaces\tand\ttabs  ", "ünïcödé 🙂"]


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows, the second right-padded: the attention mask must give the same logits on real tokens."""
    ids = input_ids(vocab=vocab)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    return ids, mask


# --------------------------------------------------------------------------- export
@pytest.mark.parametrize("arch", ["trained_run", "custom_arch"])
def test_export_loads_in_transformers_with_the_same_logits_and_tokens(arch, micro, tmp_path, tok):
    if arch == "trained_run":
        from core.trainer import train

        checkpoint = train(micro(train={"budget": 3})).checkpoint
    else:  # rope theta, norm eps, GQA ratio and tied head must all survive the translation
        # (larger weights than the default init, so that each of them visibly changes the logits)
        model = make_model(4, rope_theta=500_000.0, rms_norm_eps=1e-6, num_kv_heads=1, tie_word_embeddings=True,
                           initializer_range=0.2)
        checkpoint = ck.save_checkpoint(tmp_path / "ckpt", model, tokenizer=tok)
    out = tmp_path / "hf"
    assert main(["export", str(checkpoint), "--format", "hf", str(out)]) == 0
    ours, loaded = ck.model_from_checkpoint(checkpoint)

    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf.dtype == torch.float32
    ids, mask = padded_batch(ours.config.vocab_size)
    assert (hf_logits(hf, ids) - logits(ours, ids)).abs().max().item() <= 1e-4
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask).logits
        mine = ours(ids, mask)
    assert (theirs - mine)[mask.bool()].abs().max().item() <= 1e-4

    from core.token_store import plain_text_tokenizer

    as_text = plain_text_tokenizer(loaded.tokenizer)  # how training and generate read a document or a prompt
    # A special token's name in a document is text: Hugging Face read "<|eos|>" in it as the EOS token.
    for text in [*TEXTS, f"a {loaded.tokenizer.eos_token} b {loaded.tokenizer.bos_token}"]:
        expected = as_text.encode(text, add_special_tokens=False).ids
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == expected
        assert hf_tok.decode(expected) == loaded.tokenizer.decode(expected)
        # As every training sample, and ``speedboard generate``'s prompt, the text comes after BOS.
        assert hf_tok(text)["input_ids"] == [loaded.tokenizer.bos_id, *expected]
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == \
        (loaded.tokenizer.bos_id, loaded.tokenizer.eos_id, loaded.tokenizer.pad_id)
    assert hf.config.tie_word_embeddings == ours.config.tie_word_embeddings
    # Its length is the model's positions: truncation and transformers' too-long warning took 1e30.
    positions = ours.config.max_position_embeddings
    assert hf_tok.model_max_length == positions
    assert len(hf_tok("x " * (2 * positions), truncation=True)["input_ids"]) == positions


def test_export_refuses_what_it_cannot_do_in_one_line(tmp_path, tok, capsys):
    bare = tmp_path / "weights.pt"
    torch.save(make_model(0).state_dict(), bare)
    assert main(["export", str(bare), str(tmp_path / "out")]) == 2
    assert "bare state dict" in capsys.readouterr().err
    checkpoint = ck.save_checkpoint(tmp_path / "ckpt", make_model(0), tokenizer=tok)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert main(["export", str(checkpoint), "--format", "hf", str(busy)]) == 2
    err = capsys.readouterr().err
    assert "exists and is not empty" in err and err.count("\n") == 1
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    assert main(["export", str(checkpoint), "--format", "hf", str(busy / "keep.txt")]) == 2
    assert "keep.txt is a file; name a new or empty folder" in capsys.readouterr().err
    assert (busy / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- import
@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_a_transformers_llama_loads_into_speedboard(weights, tmp_path, tok):
    hf = hf_llama(21)
    folder = save_hf_folder(hf, tmp_path / "hf", tok, weights=weights)
    loaded = ck.read_checkpoint(folder)
    assert loaded.kind == "huggingface" and loaded.model_config.vocab_size == 512
    ours = make_model(0)
    ck.load_weights(ours, loaded.state_dict, str(folder))
    ids, mask = padded_batch(512)
    assert (logits(ours, ids) - hf_logits(hf, ids)).abs().max().item() <= 1e-4
    with torch.no_grad():
        assert (ours(ids, mask) - hf(ids, attention_mask=mask).logits)[mask.bool()].abs().max().item() <= 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert (loaded.tokenizer.bos_id, loaded.tokenizer.eos_id, loaded.tokenizer.pad_id) == \
        (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id)


@pytest.mark.parametrize("key, rope", [
    ("rope_parameters", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64, "rope_theta": 10_000.0}),
    ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0}),
    ("rope_scaling", {"type": "linear", "factor": 2.0}),
])
def test_a_scaled_rope_is_refused_in_either_of_transformers_spellings(key, rope, tmp_path, tok, capsys):
    """transformers ≥ 5 writes a scaled RoPE as rope_parameters (and rope_scaling: null): it loaded as plain RoPE,
    logits 6e-3 away from the model's, and its export dropped the scaling."""
    folder = save_hf_folder(hf_llama(23), tmp_path / "hf", tok)
    config = json.loads((folder / "config.json").read_text())
    config.update({"rope_scaling": None, "rope_parameters": None, key: rope})
    (folder / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # transformers' own progress while saving
    with pytest.raises(CheckpointError, match=f"unsupported Hugging Face config \\({key} .* is not supported"):
        ck.read_checkpoint(folder)
    assert main(["generate", str(folder), "--prompt", "x", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is not supported (only plain rotary embeddings)" in err, err


def test_a_hugging_face_config_without_a_setting_names_it_in_words(tmp_path, capsys):
    """{"model_type": "llama", "hidden_size": 32}: "unsupported Hugging Face config ('num_attention_heads')", a
    bare key in brackets, at Load and on the command line."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    with pytest.raises(CheckpointError) as caught:
        ck.peek_checkpoint(folder)
    assert str(caught.value).endswith("unsupported Hugging Face config (it has no 'num_attention_heads' setting)")
    assert main(["generate", str(folder), "--prompt", "x", "--max-new-tokens", "1"]) == 2
    assert capsys.readouterr().err.strip().endswith("(it has no 'num_attention_heads' setting)")


def test_rope_theta_is_read_where_transformers_reads_it():
    base = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 128}
    assert ModelConfig.from_hf_dict({**base, "rope_theta": 5e5}).rope_theta == 5e5  # transformers < 5
    both = {**base, "rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    assert ModelConfig.from_hf_dict(both).rope_theta == 5e5  # ≥ 5: rope_parameters first
    assert ModelConfig.from_hf_dict(base).rope_theta == 1e4


def test_tie_word_embeddings_is_read_as_written_not_as_truthy_text():
    """"tie_word_embeddings": "no" was read as True (bool of a non-empty string), and the folder's own lm_head
    then refused at Start as if the config tied it."""
    from core.errors import ConfigError

    base = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 128}
    assert ModelConfig.from_hf_dict({**base, "tie_word_embeddings": True}).tie_word_embeddings is True
    assert ModelConfig.from_hf_dict({**base, "tie_word_embeddings": None}).tie_word_embeddings is False  # null
    assert ModelConfig.from_hf_dict(base).tie_word_embeddings is False
    for written in ("no", 0, "false"):
        with pytest.raises(ConfigError, match="tie word embeddings must be true or false"):
            ModelConfig.from_hf_dict({**base, "tie_word_embeddings": written})


def test_train_init_from_a_transformers_folder(tmp_path, tok):
    """``speedboard train --init-from HF_FOLDER``: the run starts from the Hugging Face weights."""
    from tests.core.checkpoint_helpers import corpus_file

    hf = hf_llama(22)
    folder = save_hf_folder(hf, tmp_path / "hf", tok)
    corpus, out = corpus_file(tmp_path), tmp_path / "runs"
    argv = ["train", "--init-from", str(folder), "--steps", "2", "--data", str(corpus), "--seq-len", "32",
            "--micro-batch", "2", "--eval-every", "0", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    (run_dir,) = out.iterdir()
    events = read_events(run_dir)
    started = next(e for e in events if isinstance(e, RunStarted))
    assert started.config["model"] == ModelConfig.from_hf_dict(hf.config.to_dict()).to_dict()
    assert started.config["init_from"] == str(folder) and started.start_step == 0
    first = next(e for e in events if isinstance(e, StepMetrics))

    # The first step's loss is the Hugging Face model's on the same batch: same weights, same tokenizer.
    data = prepare_data(DataConfig(source=str(corpus), seq_len=32), ck.read_checkpoint(folder).tokenizer)
    batch = data.train.batch(SampleOrder(len(data.train), started.config["train"]["seed"]).take(0, 2))
    with torch.no_grad():
        out_logits = hf(batch.inputs).logits
    loss = F.cross_entropy(out_logits.reshape(-1, out_logits.size(-1)), batch.targets.reshape(-1))
    assert first.loss == pytest.approx(loss.item(), rel=1e-4)
    saved = json.loads((run_dir / "checkpoints" / "step_0000002" / "config.json").read_text())
    assert saved["model"] == started.config["model"]
