"""Checkpoints that survive torch.compile and DDP, in both directions.

Saving always goes through the plain module (``unwrap``), so ``_orig_mod.`` and
``module.`` never reach a file. Loading accepts every key form these wrappers
produce, anywhere in a key, and checks everything before it changes a single
parameter: a failed load leaves the model exactly as it was.

A Speedboard checkpoint is a folder, written atomically::

    model.safetensors   weights of the uncompiled module, plain names
    config.json         model/data/train config, versions, step, tokens, format version
    tokenizer.json      (+ tokenizer_config.json) the tokenizer
    trainer_state.pt    optimizer, scheduler position, GradScaler, counters, RNG states

Readable formats: that folder; a ``.pt``/``.pth``/``.bin``/``.safetensors``
state dict (plain, compiled, per-block compiled, DDP, or a mix); a Hugging Face
Llama folder. Pickles are read with ``torch.load(weights_only=True)`` only.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import secrets
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.compile import unwrap
from core.config import ModelConfig
from core.errors import CheckpointError, ConfigError
from core.tokenizer import BPETokenizer

FORMAT = "speedboard-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
STATE_FILE = "trainer_state.pt"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_WRAPPER_PARTS = ("_orig_mod",)
_DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older HF checkpoints saved; derived here


# --------------------------------------------------------------------------- keys
def clean_key(key: str) -> str:
    """Remove wrapper components: ``_orig_mod`` anywhere (whole-model or per-block
    torch.compile) and leading ``module`` (DDP), in any mix."""
    parts = [p for p in key.split(".") if p not in _WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts.pop(0)
    return ".".join(parts)


def clean_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = clean_key(key)
        if new.endswith(_DROPPED_SUFFIXES):
            continue
        if new in out:
            raise CheckpointError(f"two entries map to the same parameter {new!r} ({key!r})")
        out[new] = value
    return out


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights of the plain module on the CPU, with plain names (never ``_orig_mod.``)."""
    plain = unwrap(model)
    state = clean_state_dict(plain.state_dict())
    if getattr(getattr(plain, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: stored once, as HF does
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


# --------------------------------------------------------------------------- atomic folders
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not possible on every platform (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFolder:
    """Write into a hidden temporary folder, fsync, then rename into place.

    A crash before the rename leaves only a hidden ``.name.tmp-*`` folder, which
    no loader accepts, and any earlier folder of the same name intact.
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.tmp = self.target.parent / f".{self.target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        for f in self.tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(self.tmp)
        self.commit()

    def commit(self) -> None:
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{secrets.token_hex(3)}"
            os.rename(self.target, old)
        os.rename(self.tmp, self.target)
        _fsync_dir(self.target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- save
def save_checkpoint(path: str | Path, model: torch.nn.Module, *, tokenizer: BPETokenizer,
                    run_config: dict[str, Any] | None = None, trainer_state: dict[str, Any] | None = None,
                    step: int = 0, tokens: int = 0, extra: dict[str, Any] | None = None) -> Path:
    """Save a checkpoint folder atomically; ``model`` may be compiled or DDP-wrapped."""
    from safetensors.torch import save_file

    from core.runs import library_versions

    plain = unwrap(model)
    model_cfg: ModelConfig = plain.config
    weights = model_state_dict(plain)
    assert not any("_orig_mod" in k or k.startswith("module.") for k in weights)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model_cfg.to_dict(),
        "step": step,
        "tokens": tokens,
        "versions": library_versions(),
        **({"run": run_config} if run_config else {}),
        **(extra or {}),
    }
    target = Path(path)
    with AtomicFolder(target) as tmp:
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        tokenizer.save(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, tmp / STATE_FILE)
        # config.json last: a folder without it is never taken for a checkpoint.
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    return target


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write a folder that ``transformers`` loads with ``from_pretrained``."""
    from safetensors.torch import save_file

    loaded = read_checkpoint(checkpoint)
    if loaded.tokenizer is None:
        raise CheckpointError(f"{checkpoint} has no tokenizer to export")
    cfg = loaded.model_config
    if cfg is None:
        raise CheckpointError(f"{checkpoint} has no model config; export needs a checkpoint folder")
    weights = dict(loaded.state_dict)
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    tok = loaded.tokenizer
    hf = cfg.to_hf_dict()
    hf.update({"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id})
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise CheckpointError(f"export folder {target} exists and is not empty")
    with AtomicFolder(target) as tmp:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2), encoding="utf-8")
        gen = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
        tok.save(tmp)
        special = {k: v for k, v in tok.hf_config().items() if k.endswith("_token")}
        (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    return target


# --------------------------------------------------------------------------- read
@dataclass
class LoadedCheckpoint:
    source: Path
    kind: str
    """``speedboard``, ``state_dict`` or ``huggingface``."""
    state_dict: dict[str, torch.Tensor]
    model_config: ModelConfig | None = None
    tokenizer: BPETokenizer | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def trainer_state_path(self) -> Path | None:
        path = self.source / STATE_FILE
        return path if self.kind == "speedboard" and path.is_file() else None


def _torch_load(path: Path, what: str = "file") -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "weights only load failed" in first.lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(f"refused to load {path.name}: the {what} contains Python objects other than "
                                  f"tensors, and unpickling them could run code") from None
        raise CheckpointError(f"{path.name} is not a valid PyTorch {what} ({first or 'unpickling failed'})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first})") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # SafetensorError and friends: report, never crash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first})") from None


def _extract_state_dict(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    """A state dict, or one nested under a common key (nanoGPT's ``model``, Lightning's ``state_dict``)."""
    if isinstance(obj, dict):
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        for key in ("model", "state_dict", "model_state_dict", "module"):
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return inner
    raise CheckpointError(f"{path.name} does not hold a model state dict")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return data


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / WEIGHTS_FILE).is_file():
        return _load_safetensors(folder / WEIGHTS_FILE)
    for index_name, loader in (("model.safetensors.index.json", _load_safetensors),
                               ("pytorch_model.bin.index.json", lambda p: _torch_load(p, "weights file"))):
        index = folder / index_name
        if index.is_file():
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                if not (folder / shard).is_file():
                    raise CheckpointError(f"{folder} is missing shard {shard}")
                state.update(_extract_state_dict(loader(folder / shard), folder / shard))
            return state
    if (folder / "pytorch_model.bin").is_file():
        return _extract_state_dict(_torch_load(folder / "pytorch_model.bin", "weights file"),
                                   folder / "pytorch_model.bin")
    raise CheckpointError(f"{folder} has no model.safetensors or pytorch_model.bin")


def read_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read any supported format into CPU tensors with clean keys; changes no model."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if path.is_dir():
        if path.name.startswith(".") and ".tmp-" in path.name:
            raise CheckpointError(f"{path} is an unfinished save, not a checkpoint")
        cfg_file = path / CONFIG_FILE
        if not cfg_file.is_file():
            raise CheckpointError(f"{path} is not a checkpoint folder (no {CONFIG_FILE})")
        meta = _read_json(cfg_file)
        tok_file = path / TOKENIZER_FILE
        tokenizer = BPETokenizer.load(path) if tok_file.is_file() else None
        if meta.get("format") == FORMAT:
            if meta.get("format_version", 0) > FORMAT_VERSION:
                raise CheckpointError(f"{path} was written by a newer Speedboard (format {meta['format_version']})")
            for part in (WEIGHTS_FILE, TOKENIZER_FILE):
                if not (path / part).is_file():
                    raise CheckpointError(f"checkpoint {path} is incomplete: {part} is missing")
            try:
                model_cfg = ModelConfig.from_dict(meta["model"])
            except (KeyError, TypeError, ConfigError) as exc:
                raise CheckpointError(f"{path}/{CONFIG_FILE} has an invalid model config ({exc})") from None
            state = clean_state_dict(_load_safetensors(path / WEIGHTS_FILE))
            return LoadedCheckpoint(path, "speedboard", state, model_cfg, tokenizer, meta)
        if meta.get("model_type") == "llama" or "LlamaForCausalLM" in meta.get("architectures", []):
            try:
                model_cfg = ModelConfig.from_hf_dict(meta)
            except (KeyError, TypeError, ConfigError) as exc:
                raise CheckpointError(f"{path}/{CONFIG_FILE}: unsupported Hugging Face config ({exc})") from None
            state = clean_state_dict(_read_hf_weights(path))
            return LoadedCheckpoint(path, "huggingface", state, model_cfg, tokenizer, meta)
        raise CheckpointError(f"{path} is neither a Speedboard checkpoint nor a Hugging Face Llama folder")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        state = _load_safetensors(path)
    elif suffix in PICKLE_SUFFIXES:
        state = _extract_state_dict(_torch_load(path, "weights file"), path)
    else:
        raise CheckpointError(f"unsupported checkpoint file {path.name}: use a checkpoint folder, "
                              f"a Hugging Face folder, or a .pt/.pth/.bin/.safetensors state dict")
    if not state:
        raise CheckpointError(f"{path.name} holds no tensors")
    return LoadedCheckpoint(path, "state_dict", clean_state_dict(state))


# --------------------------------------------------------------------------- apply
def check_compatible(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Raise CheckpointError naming the first differences; change nothing."""
    plain = unwrap(model)
    expected = clean_state_dict(plain.state_dict())
    tied = getattr(getattr(plain, "config", None), "tie_word_embeddings", False)
    if tied:
        expected.pop("lm_head.weight", None)
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
                  for k in expected if k in state and expected[k].shape != state[k].shape]
    if mismatched:
        raise CheckpointError(f"architecture mismatch with {source}: " + "; ".join(mismatched[:3])
                              + (f" (+{len(mismatched) - 3} more)" if len(mismatched) > 3 else ""))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing keys " + ", ".join(missing[:3]) + (" …" if len(missing) > 3 else ""))
        if unexpected:
            parts.append("unexpected keys " + ", ".join(unexpected[:3]) + (" …" if len(unexpected) > 3 else ""))
        raise CheckpointError(f"{source} does not match the model: " + "; ".join(parts))
    bad = [k for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"{source} holds non-float tensors for weights: {', '.join(bad[:3])}")


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model`` (plain, compiled or DDP), all or nothing."""
    state = clean_state_dict(state)
    check_compatible(model, state, source)
    plain = unwrap(model)
    params = dict(plain.named_parameters())
    params.update(dict(plain.named_buffers()))
    with torch.no_grad():
        for key, value in state.items():
            target = params.get(key)
            if target is None:  # the tied head: same tensor as the embedding
                continue
            target.copy_(value.to(dtype=target.dtype))


def check_tokenizer_fits(tokenizer: BPETokenizer, model_config: ModelConfig) -> None:
    if tokenizer.vocab_size > model_config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                              f"has only {model_config.vocab_size} rows")


def load_trainer_state(path: Path) -> dict[str, Any]:
    state = _torch_load(path, "trainer state")
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path} is not a Speedboard trainer state")
    return state


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Finished checkpoints under a run's ``checkpoints/`` folder, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_FILE).is_file())


def latest_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """A checkpoint folder itself, or the newest one inside a run folder."""
    path = Path(run_or_checkpoint).expanduser()
    if path.is_file() or (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        return path
    found = list_checkpoints(path / "checkpoints")
    if not found:
        if path.exists():
            raise CheckpointError(f"{path} holds no checkpoint")
        raise CheckpointError(f"{path} does not exist")
    return found[-1]
