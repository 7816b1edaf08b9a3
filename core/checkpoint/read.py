"""Reading every supported format into CPU tensors with clean keys, checked before anything is loaded."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from core.checkpoint.folders import file_record
from core.checkpoint.keys import clean_state_dict
from core.config import ModelConfig, RunConfig
from core.errors import CheckpointError, ConfigError, first_line
from core.runs import CHECKPOINTS_DIR, CONFIG_FILE, is_run_dir
from core.tokenizer import BPETokenizer

FORMAT = "speedboard-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
STATE_FILE = "trainer_state.pt"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclass
class LoadedCheckpoint:
    source: Path
    kind: str
    """``speedboard``, ``state_dict`` or ``huggingface``."""
    state_dict: dict[str, torch.Tensor]
    """CPU tensors with clean keys (no ``_orig_mod.``/``module.``)."""
    model_config: ModelConfig | None = None
    """The architecture, when the checkpoint carries one (folders); None for a bare state dict."""
    tokenizer: BPETokenizer | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def trainer_state_path(self) -> Path | None:
        path = self.source / STATE_FILE
        return path if self.kind == "speedboard" and path.is_file() else None

    def read_trainer_state(self) -> dict[str, Any]:
        """Optimizer, schedule, counters and RNG states, checked against config.json."""
        path = self.trainer_state_path
        if path is None:
            raise CheckpointError(f"{self.source} holds no trainer state ({STATE_FILE})")
        return load_trainer_state(path, self.meta.get("files", {}).get(STATE_FILE))


def _torch_load(path: Path, what: str = "weights file") -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(f"refused to load {path.name}: the {what} contains Python objects other than "
                                  f"tensors, and unpickling them could run code") from None
        raise CheckpointError(f"{path.name} is not a PyTorch {what} or is corrupted ({first_line(exc, 160)})") from None
    except Exception as exc:  # the unpickler raises many types on garbage (KeyError, EOFError, RuntimeError…)
        detail = first_line(exc, 160)
        if not isinstance(exc, RuntimeError) and detail != type(exc).__name__:
            detail = f"{type(exc).__name__}: {detail}"
        raise CheckpointError(f"{path.name} is not a PyTorch {what}, or is truncated or corrupted ({detail})") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # SafetensorError and friends: report, never crash
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first_line(exc, 160)})") from None


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
        raise CheckpointError(f"{path} is not readable JSON ({first_line(exc, 160)})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return data


def _verify_file(path: Path, record: dict[str, Any] | None, hash_it: bool = True) -> None:
    """Compare a file with the size and sha256 that config.json recorded at save time."""
    if not isinstance(record, dict):
        return  # written before records existed, or not recorded
    size = path.stat().st_size
    if "bytes" in record and size != record["bytes"]:
        raise CheckpointError(f"{path.name} in {path.parent} is truncated or damaged: "
                              f"{size} bytes, {record['bytes']} when saved")
    if hash_it and "sha256" in record and file_record(path)["sha256"] != record["sha256"]:
        raise CheckpointError(f"{path.name} in {path.parent} is corrupted: its checksum differs from the saved one")


def _hf_weight_files(folder: Path) -> list[Path]:
    """The files that hold a Hugging Face folder's weights: one file, or every shard its index lists."""
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
            if not shards:
                raise CheckpointError(f"{index} lists no weight files")
            for shard in shards:
                if not (folder / shard).is_file():
                    raise CheckpointError(f"{folder} is missing shard {shard}")
            return [folder / shard for shard in shards]
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    raise CheckpointError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix.lower() == ".safetensors":
        return _load_safetensors(path)
    return _extract_state_dict(_torch_load(path), path)


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in _hf_weight_files(folder):
        state.update(_read_weights_file(path))
    return state


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Finished checkpoints in a folder (a run's ``checkpoints/``), oldest first by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_FILE).is_file())


def latest_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """Resolve what a user points at: a checkpoint folder or file itself, or a run folder's newest checkpoint."""
    path = Path(run_or_checkpoint).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if path.is_file():
        return path
    if (path / CONFIG_FILE).is_file() and not is_run_dir(path):
        return path
    found = list_checkpoints(path / CHECKPOINTS_DIR)
    if found:
        return found[-1]
    if is_run_dir(path):
        raise CheckpointError(f"run folder {path} holds no checkpoint yet")
    raise CheckpointError(f"{path} is not a checkpoint folder (no {CONFIG_FILE}) and holds no checkpoints")


@dataclass
class CheckpointInfo:
    """What ``config.json`` says, read without loading any weights."""

    path: Path
    kind: str
    model_config: ModelConfig | None
    meta: dict[str, Any]

    @property
    def run_config(self) -> RunConfig | None:
        """The settings the checkpoint was trained with (Speedboard checkpoints saved by a run), else None.

        The base of a resumed run's config: a budget left as it is continues the
        parent's schedule exactly (see ``Trainer._make_schedule``).
        """
        run = self.meta.get("run") if self.kind == "speedboard" else None
        if not isinstance(run, dict):
            return None
        try:
            return RunConfig.from_dict(run).replace(out_dir=None, resume=None, init_from=None, parent=None)
        except (TypeError, AttributeError, ConfigError) as exc:
            raise CheckpointError(f"{self.path / CONFIG_FILE} has an invalid run config ({exc})") from None


def _model_config_of(path: Path, meta: dict[str, Any]) -> tuple[str, ModelConfig]:
    if meta.get("format") == FORMAT:
        if not isinstance(meta.get("format_version"), int) or meta["format_version"] > FORMAT_VERSION:
            raise CheckpointError(f"{path} was written by a newer Speedboard (format {meta.get('format_version')})")
        try:
            return "speedboard", ModelConfig.from_dict(meta["model"])
        except (KeyError, TypeError, AttributeError, ConfigError) as exc:
            raise CheckpointError(f"{path / CONFIG_FILE} has an invalid model config ({exc})") from None
    if meta.get("model_type") == "llama" or "LlamaForCausalLM" in (meta.get("architectures") or []):
        try:
            return "huggingface", ModelConfig.from_hf_dict(meta)
        except (KeyError, TypeError, AttributeError, ConfigError) as exc:
            raise CheckpointError(f"{path / CONFIG_FILE}: unsupported Hugging Face config ({exc})") from None
    raise CheckpointError(f"{path} is neither a Speedboard checkpoint nor a Hugging Face Llama folder")


def peek_checkpoint(path: str | Path) -> CheckpointInfo:
    """Resolve ``path`` and read its config only (cheap: for building a run's config before loading)."""
    resolved = latest_checkpoint(path)
    if resolved.is_file():
        return CheckpointInfo(resolved, "state_dict", None, {})
    meta = _read_json(resolved / CONFIG_FILE)
    kind, model_cfg = _model_config_of(resolved, meta)
    return CheckpointInfo(resolved, kind, model_cfg, meta)


def check_tokenizer_fits(tokenizer: BPETokenizer, model_config: ModelConfig) -> None:
    if tokenizer.vocab_size > model_config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                              f"has only {model_config.vocab_size} rows")


def read_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """Read any supported format into CPU tensors with clean keys; changes no model.

    ``path`` may be a checkpoint folder, a run folder (its newest checkpoint), a
    Hugging Face folder or a state-dict file. Every problem is a CheckpointError.
    """
    raw = Path(path).expanduser()
    if raw.is_dir() and raw.name.startswith(".") and ".tmp-" in raw.name:
        raise CheckpointError(f"{raw} is an unfinished save, not a checkpoint")
    path = latest_checkpoint(raw)
    if path.is_dir():
        meta = _read_json(path / CONFIG_FILE)
        kind, model_cfg = _model_config_of(path, meta)
        records = meta.get("files", {}) if kind == "speedboard" else {}
        required = (WEIGHTS_FILE, TOKENIZER_FILE) if kind == "speedboard" else ()
        for part in required:
            if not (path / part).is_file():
                raise CheckpointError(f"checkpoint {path} is incomplete: {part} is missing")
        if kind == "speedboard" and records.get(STATE_FILE) and not (path / STATE_FILE).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {STATE_FILE} is missing")
        tokenizer = None
        if (path / TOKENIZER_FILE).is_file():
            _verify_file(path / TOKENIZER_FILE, records.get(TOKENIZER_FILE))
            tokenizer = BPETokenizer.load(path)
            check_tokenizer_fits(tokenizer, model_cfg)
        if kind == "speedboard":
            _verify_file(path / WEIGHTS_FILE, records.get(WEIGHTS_FILE))
            if (path / STATE_FILE).is_file():
                _verify_file(path / STATE_FILE, records.get(STATE_FILE), hash_it=False)  # hashed when read
            state = clean_state_dict(_load_safetensors(path / WEIGHTS_FILE))
        else:
            state = clean_state_dict(_read_hf_weights(path))
        if not state:
            raise CheckpointError(f"{path} holds no weights")
        return LoadedCheckpoint(path, kind, state, model_cfg, tokenizer, meta)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        state = _load_safetensors(path)
    elif suffix in PICKLE_SUFFIXES:
        state = _extract_state_dict(_torch_load(path), path)
    else:
        raise CheckpointError(f"unsupported checkpoint file {path.name}: use a checkpoint folder, "
                              f"a Hugging Face folder, or a .pt/.pth/.bin/.safetensors state dict")
    if not state:
        raise CheckpointError(f"{path.name} holds no tensors")
    return LoadedCheckpoint(path, "state_dict", clean_state_dict(state))


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix.lower() != ".safetensors":  # a pickle has no header: it is read whole
        return {k: tuple(v.shape) for k, v in _read_weights_file(path).items()}
    try:
        with safe_open(str(path), framework="pt") as f:  # the header only: no tensor data is read
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # SafetensorError and friends: report, never crash
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first_line(exc, 160)})") from None


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Clean names and shapes of the weights ``path`` holds (resolved as ``read_checkpoint`` does).

    Cheap where the format allows: safetensors files are read by their header
    alone; a pickled state dict has to be unpickled whole. Checksums are not
    verified here (``read_checkpoint`` does that before anything is loaded).
    """
    raw = Path(path).expanduser()
    if raw.is_dir() and raw.name.startswith(".") and ".tmp-" in raw.name:
        raise CheckpointError(f"{raw} is an unfinished save, not a checkpoint")
    path = latest_checkpoint(raw)
    if path.is_dir():
        kind, _ = _model_config_of(path, _read_json(path / CONFIG_FILE))
        if kind == "speedboard" and not (path / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {WEIGHTS_FILE} is missing")
        files = [path / WEIGHTS_FILE] if kind == "speedboard" else _hf_weight_files(path)
    elif path.suffix.lower() == ".safetensors" or path.suffix.lower() in PICKLE_SUFFIXES:
        files = [path]
    else:
        raise CheckpointError(f"unsupported checkpoint file {path.name}")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(_file_shapes(file))
    return clean_state_dict(shapes)  # keys only: it renames and drops entries, whatever their values


def load_trainer_state(path: Path, record: dict[str, Any] | None = None) -> dict[str, Any]:
    if record is not None:
        _verify_file(path, record)
    state = _torch_load(path, "trainer state")
    if not isinstance(state, dict) or not {"step", "tokens", "samples", "optimizer", "schedule"} <= state.keys():
        raise CheckpointError(f"{path} is not a Speedboard trainer state")
    return state
