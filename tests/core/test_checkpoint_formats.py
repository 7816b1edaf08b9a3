"""Every checkpoint format loads into an eager and into an already compiled model, with identical logits:

(a) Speedboard folders; (b) bare state dicts: a plain one in Hugging Face's names, the article series'
``LlamaForPretraining`` (``base_model.…`` with its rotary tables, as saved or from a compiled model), and
Lightning checkpoints of either (``model.`` in front, under ``state_dict``); (c) a state dict saved from a
compiled model without unwrapping (``_orig_mod.`` in front, or mid-key from per-block compilation);
(d) DDP keys (``module.``) and mixes with (c); (e) Hugging Face Llama folders (safetensors or .bin).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

from core import checkpoint as ck
from tests.core.article_model import article_model
from tests.core.checkpoint_helpers import (
    hf_llama,
    hf_logits,
    input_ids,
    logits,
    make_model,
    save_hf_folder,
)

pytestmark = pytest.mark.usefixtures("single_thread")

FORMATS = ["a_speedboard_folder", "b_plain_pth", "b_article_pth", "b_article_compiled_pth",
           "b_lightning_article_ckpt", "b_lightning_hf_names_ckpt", "c_compiled_pt", "c_compiled_safetensors",
           "c_per_block", "d_ddp", "d_ddp_of_compiled", "d_compiled_ddp", "d_ddp_per_block_nanogpt_style",
           "e_hf_safetensors", "e_hf_pytorch_bin"]
EXPECTED_KIND = {"a": "speedboard", "b": "state_dict", "c": "state_dict", "d": "state_dict", "e": "huggingface"}


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process gloo group, so that DDP wraps modules exactly as it does in a real job."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def per_block_compiled(model: torch.nn.Module) -> torch.nn.Module:
    """Per-block compilation as users write it: wrappers registered inside the model (keys get ``_orig_mod``)."""
    model = copy.deepcopy(model)
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = torch.compile(layer)
    return model


def build(fmt: str, folder: Path, tok) -> tuple[Path, torch.Tensor]:
    """Write checkpoint format ``fmt`` under ``folder``; return its path and the reference logits."""
    ids = input_ids()
    seed = 100 + FORMATS.index(fmt)  # each format its own weights: a load that did nothing cannot pass
    if fmt.startswith("e_"):
        pytest.importorskip("transformers")
        hf = hf_llama(seed)
        path = save_hf_folder(hf, folder / fmt, tok, weights="bin" if fmt.endswith("bin") else "safetensors")
        return path, hf_logits(hf, ids)
    ref = make_model(seed)
    expected = logits(ref, ids)
    if fmt == "a_speedboard_folder":
        return ck.save_checkpoint(folder / fmt, torch.compile(ref), tokenizer=tok), expected
    if fmt == "b_plain_pth":
        model = torch.compile(ref)
        path = folder / "model.pth"
        torch.save(getattr(model, "_orig_mod", model).state_dict(), path)
        return path, expected
    if fmt.startswith(("b_article", "b_lightning_article")):
        article = article_model(seed)
        state = (torch.compile(article) if "compiled" in fmt else article).state_dict()
        assert "base_model.rotary_emb.cos" in state or "_orig_mod.base_model.rotary_emb.cos" in state
        if fmt.startswith("b_lightning"):  # a LightningModule holding it as self.model, saved by the Trainer
            state = {"state_dict": {f"model.{k}": v for k, v in state.items()}, "epoch": 3, "global_step": 120}
        path = folder / (f"{fmt}.ckpt" if "lightning" in fmt else f"{fmt}.pth")
        torch.save(state, path)
        with torch.no_grad():
            return path, article(input_ids()).float()
    if fmt == "b_lightning_hf_names_ckpt":
        state = {"state_dict": {f"model.{k}": v for k, v in ref.state_dict().items()}, "epoch": 1}
        torch.save(state, folder / "lightning.ckpt")
        return folder / "lightning.ckpt", expected
    if fmt == "c_compiled_pt":
        state = torch.compile(ref).state_dict()
        assert next(iter(state)).startswith("_orig_mod.")
        torch.save(state, folder / "compiled.pt")
        return folder / "compiled.pt", expected
    if fmt == "c_compiled_safetensors":
        save_file(torch.compile(ref).state_dict(), str(folder / "compiled.safetensors"))
        return folder / "compiled.safetensors", expected
    if fmt == "c_per_block":
        state = per_block_compiled(ref).state_dict()
        assert "model.layers.0._orig_mod.self_attn.q_proj.weight" in state
        torch.save(state, folder / "per_block.pt")
        return folder / "per_block.pt", expected
    if fmt == "d_ddp":
        state = DDP(ref).state_dict()
        assert next(iter(state)).startswith("module.model.")
    elif fmt == "d_ddp_of_compiled":
        state = DDP(torch.compile(ref)).state_dict()
        assert next(iter(state)).startswith("module._orig_mod.")
    elif fmt == "d_compiled_ddp":
        state = torch.compile(DDP(ref)).state_dict()
        assert next(iter(state)).startswith("_orig_mod.module.")
    elif fmt == "d_ddp_per_block_nanogpt_style":
        model = DDP(torch.compile(per_block_compiled(ref)))
        state = model.state_dict()
        assert "module._orig_mod.model.layers.1._orig_mod.mlp.up_proj.weight" in state
        # nanoGPT-style: the weights nested under "model", with optimizer state and counters beside them.
        opt = torch.optim.AdamW(model.parameters())
        state = {"model": state, "optimizer": opt.state_dict(), "iter_num": 5, "best_val_loss": 1.25}
    else:
        raise AssertionError(fmt)
    torch.save(state, folder / f"{fmt}.pt")
    return folder / f"{fmt}.pt", expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_loads_into_an_eager_model(fmt, tmp_path, tok, process_group):
    path, expected = build(fmt, tmp_path, tok)
    loaded = ck.read_checkpoint(path)
    assert loaded.kind == EXPECTED_KIND[fmt[0]]
    assert not any("_orig_mod" in k or k.startswith("module.") for k in loaded.state_dict)
    model = make_model(0)
    assert not torch.allclose(logits(model, input_ids()), expected, atol=1e-3)
    ck.load_checkpoint(model, path)
    torch.testing.assert_close(logits(model, input_ids()), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["a_speedboard_folder", "e_hf_safetensors"])
def test_the_architecture_comes_from_the_checkpoint(fmt, tmp_path, tok):
    """A folder builds its own model; no current model or config is needed."""
    changes = dict(hidden_size=48, num_layers=3, num_heads=6, num_kv_heads=3, intermediate_size=80,
                   rope_theta=500_000.0, rms_norm_eps=1e-6)
    ids = input_ids()
    if fmt.startswith("e_"):
        pytest.importorskip("transformers")
        hf = hf_llama(3, **changes)
        path, expected = save_hf_folder(hf, tmp_path / "hf", tok), hf_logits(hf, ids)
    else:
        ref = make_model(3, **changes)
        path, expected = ck.save_checkpoint(tmp_path / "ckpt", ref, tokenizer=tok), logits(ref, ids)
    model, loaded = ck.model_from_checkpoint(path)
    assert model.config == loaded.model_config
    assert (model.config.hidden_size, model.config.num_layers, model.config.rope_theta) == (48, 3, 500_000.0)
    torch.testing.assert_close(logits(model, ids), expected, rtol=1e-5, atol=1e-5)
    assert loaded.tokenizer.encode("Hello, wörld!") == tok.encode("Hello, wörld!")


@pytest.mark.slow
def test_every_format_loads_into_an_already_compiled_model(tmp_path, tok, process_group):
    """One compiled model (compiled by its first call, as torch.compile is lazy), then every format
    loaded into it through the compiled wrapper: the compiled graph computes with the new weights."""
    target = make_model(0)
    compiled = torch.compile(target)
    ids = input_ids()
    with torch.no_grad():
        compiled(ids)  # compiles now
    graphs = dict(counters["stats"])
    assert graphs["unique_graphs"] >= 1
    have_hf = _has_transformers()
    for fmt in FORMATS:
        if fmt.startswith("e_") and not have_hf:
            continue
        folder = tmp_path / fmt
        folder.mkdir()
        path, expected = build(fmt, folder, tok)
        target.reset_parameters()  # other weights again: each load must really happen
        assert not torch.allclose(logits(compiled, ids), expected, atol=1e-3), fmt
        ck.load_checkpoint(compiled, path)
        torch.testing.assert_close(logits(compiled, ids), expected, rtol=1e-4, atol=1e-5, msg=fmt)
        torch.testing.assert_close(logits(target, ids), expected, rtol=1e-5, atol=1e-5, msg=fmt)
    assert counters["stats"]["unique_graphs"] == graphs["unique_graphs"]  # in-place loads: no recompilation


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_saving_through_ddp_and_compile_wrappers_writes_plain_keys(tmp_path, tok, process_group):
    ref = make_model(1)
    plain_keys = set(ref.state_dict())
    for name, wrapped in {"ddp_of_compiled": DDP(torch.compile(ref)), "compiled_ddp": torch.compile(DDP(ref)),
                          "ddp_of_per_block": DDP(per_block_compiled(ref))}.items():
        folder = ck.save_checkpoint(tmp_path / name, wrapped, tokenizer=tok)
        loaded = ck.read_checkpoint(folder)
        assert set(loaded.state_dict) == plain_keys, name
        model, _ = ck.model_from_checkpoint(folder)
        torch.testing.assert_close(logits(model, input_ids()), logits(ref, input_ids()), rtol=0, atol=0)

