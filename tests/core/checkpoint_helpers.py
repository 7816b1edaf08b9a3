"""Small builders shared by the checkpoint tests: a micro model, a tokenizer, reference logits."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from core.config import ModelConfig
from core.model import LlamaForCausalLM
from core.tokenizer import BPETokenizer, train_bpe

TEXT = ("Checkpoints survive torch.compile. A compiled model is a wrapper whose state dict keys carry a "
        "prefix; save through the original module and load weights before compiling.")


def micro_model_config(**changes) -> ModelConfig:
    """The shape of ``tests.conftest.micro_config``'s model: a few thousand parameters."""
    base = dict(vocab_size=512, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                intermediate_size=64, max_position_embeddings=64)
    return ModelConfig(**{**base, **changes})


def make_model(seed: int, **changes) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(micro_model_config(**changes)).eval()


def make_tokenizer(vocab_size: int = 300) -> BPETokenizer:
    docs = [TEXT, "def f(x):\n    return x + 1", "Hello, wörld! " * 3, "The quick brown fox jumps over the lazy dog."]
    return train_bpe(docs * 4, vocab_size)


def input_ids(vocab: int = 300, batch: int = 2, length: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab, (batch, length), generator=gen)


@torch.no_grad()
def logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).float()


def params_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_unchanged(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed"


@contextlib.contextmanager
def one_thread():
    """Tiny models run fastest single-threaded, above all on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def corpus_file(folder: Path) -> Path:
    """A small corpus so that runs set up in milliseconds (the built-in one takes seconds to tokenize)."""
    path = folder / "corpus.txt"
    if not path.exists():
        paragraphs = [f"Paragraph {i}: " + " ".join(f"word{(i * 7 + j) % 53} and more text" for j in range(12))
                      for i in range(120)]
        path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- Hugging Face (test-only dependency)
def hf_llama(seed: int, **changes):
    """A random ``transformers.LlamaForCausalLM`` with the micro shape (``changes`` edit the ModelConfig)."""
    import transformers

    hf_config = transformers.LlamaConfig(**micro_model_config(**changes).to_hf_dict())
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(hf_config).eval()


def save_hf_folder(hf_model, folder: Path, tokenizer: BPETokenizer, weights: str = "safetensors") -> Path:
    """What a Hugging Face user shares: ``save_pretrained`` for the model and the tokenizer.

    ``weights="bin"`` writes the older ``pytorch_model.bin`` (transformers ≥ 5 saves only safetensors).
    """
    from transformers import PreTrainedTokenizerFast

    if weights == "safetensors":
        hf_model.save_pretrained(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        hf_model.config.save_pretrained(folder)
        torch.save(hf_model.state_dict(), folder / "pytorch_model.bin")
    assert (folder / ("model.safetensors" if weights == "safetensors" else "pytorch_model.bin")).is_file()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer.tok, bos_token=tokenizer.bos_token,
                                   eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token)
    fast.save_pretrained(folder)
    return folder


@torch.no_grad()
def hf_logits(hf_model, ids: torch.Tensor) -> torch.Tensor:
    return hf_model(ids).logits.float()
