"""Checkpoints that survive torch.compile and DDP, in both directions.

Saving always goes through the plain module (``unwrap``), so ``_orig_mod.`` and
``module.`` never reach a file. Loading accepts every key form these wrappers
produce, anywhere in a key, and checks everything before it changes a single
parameter: a failed load leaves the model exactly as it was.

A Speedboard checkpoint is a folder, written atomically::

    model.safetensors   weights of the uncompiled module, plain names
    config.json         model/data/train config, versions, step, tokens, format version,
                        size and sha256 of every other file (written last)
    tokenizer.json      (+ tokenizer_config.json) the tokenizer
    trainer_state.pt    optimizer, scheduler position, GradScaler, counters, RNG states

Readable formats: that folder (or a run folder: its newest checkpoint); a
``.pt``/``.pth``/``.bin``/``.safetensors`` state dict (plain, compiled,
per-block compiled, DDP, or a mix); a Hugging Face Llama folder. Pickles are
read with ``torch.load(weights_only=True)`` only, so a file never runs code.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.compile import CompiledModel, unwrap
from core.config import ModelConfig, RunConfig
from core.errors import CheckpointError, ConfigError
from core.tokenizer import BPETokenizer

FORMAT = "speedboard-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
STATE_FILE = "trainer_state.pt"
CHECKPOINTS_DIR = "checkpoints"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_WRAPPER_PARTS = ("_orig_mod",)
_DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older HF checkpoints saved; derived here
# Config fields that change the math without changing any weight's shape: a
# checkpoint that differs in one of them would load "fine" and compute garbage.
_SHAPELESS_FIELDS = ("num_heads", "num_kv_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                     "max_position_embeddings")


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


def plain_module(model: torch.nn.Module | CompiledModel) -> torch.nn.Module:
    """The uncompiled module under a ``CompiledModel``, torch.compile and DDP wrappers."""
    if isinstance(model, CompiledModel):
        model = model.model
    return unwrap(model)


def model_state_dict(model: torch.nn.Module | CompiledModel) -> dict[str, torch.Tensor]:
    """Weights of the plain module on the CPU, with plain names (never ``_orig_mod.``)."""
    plain = plain_module(model)
    # clean_state_dict as well: per-block wrappers registered as submodules
    # (``layers[i] = torch.compile(layers[i])``) put ``_orig_mod`` mid-key.
    state = clean_state_dict(plain.state_dict())
    if getattr(getattr(plain, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: stored once, as HF does
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


# --------------------------------------------------------------------------- atomic folders
def _fsync(path: Path) -> None:
    """Flush a file or folder to disk; a no-op where the platform cannot (folders on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFolder:
    """Write into a hidden temporary folder, fsync, then rename into place.

    An error or a crash before the rename leaves any earlier folder of the same
    name intact and no new folder under the target name; a crash leaves at most
    a hidden ``.name.tmp-*`` folder, which no loader accepts. Replacing an
    existing folder takes two renames (old away, new in); an error between them
    puts the old one back. The next save of the same name clears what a crashed
    one left (``sweep_leftovers``).
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.tmp = self.target.parent / f".{self.target.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(self.target)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            for f in self.tmp.iterdir():
                _fsync(f)
            _fsync(self.tmp)
            self.commit()
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def commit(self) -> None:
        old = None
        if self.target.exists():
            old = self.target.parent / f".{self.target.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
            os.rename(self.target, old)
        try:
            os.rename(self.tmp, self.target)
        except BaseException:
            if old is not None:
                os.rename(old, self.target)
            raise
        _fsync(self.target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # this process: its own saves are never swept from under it
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # exists, but belongs to someone else (or the OS will not say): leave it
        return True
    return True


def sweep_leftovers(target: Path) -> list[Path]:
    """Clear what crashed saves of ``target`` left behind; returns the folders removed or restored.

    Only folders of processes that are gone are touched: their hidden
    ``.NAME.tmp-PID-*`` folders (never renamed into place) are removed, and a
    ``.NAME.old-PID-*`` folder (the previous checkpoint, moved aside just before
    the crash) is put back under its name if nothing took that name since, else removed.
    """
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-(\d+)-[0-9a-f]+")
    touched = []
    for leftover in sorted(target.parent.iterdir()):
        match = pattern.fullmatch(leftover.name)
        if not match or not leftover.is_dir() or _process_alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not target.exists():
            os.rename(leftover, target)  # the last good checkpoint, back under its own name
        else:
            shutil.rmtree(leftover, ignore_errors=True)
        touched.append(leftover)
    return touched


def _is_speedboard_checkpoint(folder: Path) -> bool:
    try:
        return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _check_replaceable(target: Path, what: str) -> None:
    """Never replace something that is not ours: only a missing target, an empty folder or an old checkpoint."""
    if not target.exists():
        return
    if not target.is_dir():
        raise CheckpointError(f"cannot write the {what} to {target}: a file of that name exists")
    if any(target.iterdir()) and not _is_speedboard_checkpoint(target):
        raise CheckpointError(f"refusing to write the {what} to {target}: the folder exists, is not empty "
                              f"and is not a Speedboard checkpoint")


def _file_record(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def _os_error(exc: OSError, target: Path, what: str) -> CheckpointError:
    reason = exc.strerror or str(exc) or type(exc).__name__
    return CheckpointError(f"cannot write the {what} to {target}: {reason}")


# --------------------------------------------------------------------------- save
def save_checkpoint(path: str | Path, model: torch.nn.Module | CompiledModel, *, tokenizer: BPETokenizer,
                    run_config: dict[str, Any] | None = None, trainer_state: dict[str, Any] | None = None,
                    step: int = 0, tokens: int = 0, extra: dict[str, Any] | None = None,
                    weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Save a checkpoint folder atomically; ``model`` may be compiled (whole or per block) or DDP-wrapped.

    ``weights`` replaces the model's own state dict where it had to be gathered
    first (sharded training); it is cleaned like any other. Replaces ``path``
    only if it is an earlier Speedboard checkpoint or an empty folder.
    """
    from safetensors.torch import save_file

    from core.runs import library_versions

    plain = plain_module(model)
    model_cfg: ModelConfig = plain.config
    if weights is None:
        weights = model_state_dict(plain)
    else:
        weights = {k: v.detach().to("cpu").contiguous() for k, v in clean_state_dict(weights).items()}
        if model_cfg.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
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
    target = Path(path).expanduser()
    _check_replaceable(target, "checkpoint")
    try:
        with AtomicFolder(target) as tmp:
            save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
            tokenizer.save(tmp)
            if trainer_state is not None:
                torch.save(trainer_state, tmp / STATE_FILE)
            meta["files"] = {f.name: _file_record(f) for f in sorted(tmp.iterdir())}
            # config.json last: a folder without it is never taken for a checkpoint.
            (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    except OSError as exc:
        raise _os_error(exc, target, "checkpoint") from None
    return target


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write a folder that ``transformers`` loads with ``from_pretrained`` (model and tokenizer)."""
    from safetensors.torch import save_file

    loaded = read_checkpoint(checkpoint)
    if loaded.model_config is None:
        raise CheckpointError(f"{checkpoint} is a bare state dict; export needs a checkpoint folder "
                              f"(it holds the model config and the tokenizer)")
    if loaded.tokenizer is None:
        raise CheckpointError(f"{checkpoint} has no tokenizer to export")
    cfg = loaded.model_config
    weights = dict(loaded.state_dict)
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    tok = loaded.tokenizer
    special_ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    hf = cfg.to_hf_dict()
    # transformers ≥ 5 reads rope_theta from rope_parameters, older releases from the top level.
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    hf.update(special_ids)
    target = Path(out).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CheckpointError(f"export folder {target} exists and is not empty")
    try:
        with AtomicFolder(target) as tmp:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS_FILE),
                      metadata={"format": "pt"})
            (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2), encoding="utf-8")
            (tmp / "generation_config.json").write_text(json.dumps(special_ids, indent=2), encoding="utf-8")
            tok.save(tmp)
            special = {k: v for k, v in tok.hf_config().items() if k.endswith("_token")}
            (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    except OSError as exc:
        raise _os_error(exc, target, "export") from None
    return target


# --------------------------------------------------------------------------- read
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


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if len(line) > limit:  # some libraries put a paragraph on one line
        cut = line.find(". ")
        line = line[:cut] if 0 < cut < limit else line[:limit] + "…"
    return line


def _torch_load(path: Path, what: str = "weights file") -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(f"refused to load {path.name}: the {what} contains Python objects other than "
                                  f"tensors, and unpickling them could run code") from None
        raise CheckpointError(f"{path.name} is not a PyTorch {what} or is corrupted ({_first_line(exc)})") from None
    except Exception as exc:  # the unpickler raises many types on garbage (KeyError, EOFError, RuntimeError…)
        detail = _first_line(exc)
        if not isinstance(exc, RuntimeError) and detail != type(exc).__name__:
            detail = f"{type(exc).__name__}: {detail}"
        raise CheckpointError(f"{path.name} is not a PyTorch {what}, or is truncated or corrupted ({detail})") from None


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # SafetensorError and friends: report, never crash
        raise CheckpointError(f"{path.name} is truncated or corrupted ({_first_line(exc)})") from None


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
        raise CheckpointError(f"{path} is not readable JSON ({_first_line(exc)})") from None
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
    if hash_it and "sha256" in record and _file_record(path)["sha256"] != record["sha256"]:
        raise CheckpointError(f"{path.name} in {path.parent} is corrupted: its checksum differs from the saved one")


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / WEIGHTS_FILE).is_file():
        return _load_safetensors(folder / WEIGHTS_FILE)
    for index_name, loader in (("model.safetensors.index.json", _load_safetensors),
                               ("pytorch_model.bin.index.json", _torch_load)):
        index = folder / index_name
        if index.is_file():
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
            if not shards:
                raise CheckpointError(f"{index} lists no weight files")
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                if not (folder / shard).is_file():
                    raise CheckpointError(f"{folder} is missing shard {shard}")
                state.update(_extract_state_dict(loader(folder / shard), folder / shard))
            return state
    if (folder / "pytorch_model.bin").is_file():
        return _extract_state_dict(_torch_load(folder / "pytorch_model.bin"), folder / "pytorch_model.bin")
    raise CheckpointError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _is_run_folder(path: Path) -> bool:
    from core.runs import METRICS_FILE

    return (path / METRICS_FILE).is_file() or (path / CHECKPOINTS_DIR).is_dir()


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
    if (path / CONFIG_FILE).is_file() and not _is_run_folder(path):
        return path
    found = list_checkpoints(path / CHECKPOINTS_DIR)
    if found:
        return found[-1]
    if _is_run_folder(path):
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


def load_trainer_state(path: Path, record: dict[str, Any] | None = None) -> dict[str, Any]:
    if record is not None:
        _verify_file(path, record)
    state = _torch_load(path, "trainer state")
    if not isinstance(state, dict) or not {"step", "tokens", "samples", "optimizer", "schedule"} <= state.keys():
        raise CheckpointError(f"{path} is not a Speedboard trainer state")
    return state


# --------------------------------------------------------------------------- apply
def _more(items: list[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f" (+{len(items) - shown} more)" if len(items) > shown else "")


def check_compatible(model: torch.nn.Module | CompiledModel, state: dict[str, torch.Tensor],
                     source: str = "checkpoint") -> None:
    """Raise CheckpointError naming the first differences; change nothing."""
    plain = plain_module(model)
    expected = clean_state_dict(plain.state_dict())
    tied = getattr(getattr(plain, "config", None), "tie_word_embeddings", False)
    if tied:
        expected.pop("lm_head.weight", None)
        head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
        if head is not None and not (embed is not None and head.shape == embed.shape and torch.equal(head, embed)):
            raise CheckpointError(f"{source} has its own output head (lm_head.weight), but this model ties "
                                  f"the head to the embedding")
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
                  for k in expected if k in state and expected[k].shape != state[k].shape]
    if mismatched:
        raise CheckpointError(f"architecture mismatch with {source}: {_more(mismatched)}")
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {_more(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_more(unexpected)}")
        raise CheckpointError(f"{source} does not match the model: " + "; ".join(parts))
    bad = [k for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"{source} holds non-float tensors for weights: {_more(bad)}")


def load_weights(model: torch.nn.Module | CompiledModel, state: dict[str, torch.Tensor],
                 source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model`` (plain, compiled whole or per block, or DDP), all or nothing.

    Weights are copied in place, so a model compiled before the load computes
    with the new values without recompiling.
    """
    state = clean_state_dict(state)
    check_compatible(model, state, source)
    plain = plain_module(model)
    params = dict(plain.named_parameters())
    params.update(dict(plain.named_buffers()))
    with torch.no_grad():
        for key, value in state.items():
            target = params.get(key)
            if target is None:  # the tied head: same tensor as the embedding
                continue
            target.copy_(value.to(dtype=target.dtype))


def check_config_matches(model: torch.nn.Module | CompiledModel, model_config: ModelConfig,
                         source: str = "checkpoint") -> None:
    """Refuse a checkpoint whose architecture differs in a way weight shapes do not show."""
    current = getattr(plain_module(model), "config", None)
    if not isinstance(current, ModelConfig):
        return
    diffs = [f"{name}: expected {getattr(current, name)!r}, found {getattr(model_config, name)!r}"
             for name in _SHAPELESS_FIELDS if getattr(current, name) != getattr(model_config, name)]
    if diffs:
        raise CheckpointError(f"architecture mismatch with {source}: {_more(diffs)}")


def load_checkpoint(model: torch.nn.Module | CompiledModel, path: str | Path) -> LoadedCheckpoint:
    """Read ``path`` (any format) and load its weights into ``model``, all or nothing."""
    loaded = read_checkpoint(path)
    check_compatible(model, loaded.state_dict, str(loaded.source))  # shapes first: the clearest message
    if loaded.model_config is not None:
        check_config_matches(model, loaded.model_config, str(loaded.source))
    load_weights(model, loaded.state_dict, str(loaded.source))
    return loaded


def model_from_checkpoint(path: str | Path) -> tuple[torch.nn.Module, LoadedCheckpoint]:
    """A new (uncompiled, CPU) model built from the checkpoint's own config, with its weights."""
    from core.model import LlamaForCausalLM

    loaded = read_checkpoint(path)
    if loaded.model_config is None:
        raise CheckpointError(f"{loaded.source} is a bare state dict without a config; "
                              f"load it into an existing model instead")
    model = LlamaForCausalLM(loaded.model_config)
    load_weights(model, loaded.state_dict, str(loaded.source))
    return model, loaded
