"""Reading every supported format into CPU tensors with clean keys, checked before anything is loaded.

A run that is still training rotates its checkpoints (``--keep``): the one a
reader picked may be removed while it is read. A reader therefore picks the
newest checkpoint and either reads it whole or, when it disappeared or was
replaced meanwhile, starts again with what is newest then (``_read_newest``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from core.checkpoint.folders import file_record
from core.checkpoint.keys import check_plain_tensors, clean_state_dict
from core.config import MAX_SEED, ModelConfig, RunConfig
from core.errors import CheckpointError, ConfigError, first_line
from core.json_text import parse_json
from core.paths import not_there, user_path
from core.runs import CHECKPOINTS_DIR, CONFIG_FILE, is_run_dir
from core.tokenizer import TOKENIZER_FILE, BPETokenizer

FORMAT = "speedboard-checkpoint"
FORMAT_VERSION = 2
"""2: config.json carries its own checksum (``config_sha256``), and a version-2 file without one is refused;
version 1 (written before) loads as before."""
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
_STEP_FOLDER = re.compile(r"step_(\d+)")
"""A run's own checkpoint folder: ``step_`` and the step (7 digits, more past step 9,999,999)."""
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _unsupported(path: Path) -> CheckpointError:
    kinds = "/".join((*PICKLE_SUFFIXES, ".safetensors"))
    return CheckpointError(f"unsupported checkpoint file {path.name}: use a checkpoint folder, a Hugging Face folder, "
                           f"or a {kinds} state dict")


CONFIG_CHECKSUM = "config_sha256"
"""config.json's own checksum: SHA-256 of its canonical JSON without this field (older checkpoints lack it)."""
_READ_ATTEMPTS = 5
"""How often a reader starts again when the checkpoint it reads is removed or replaced meanwhile."""

T = TypeVar("T")


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
    trainer_state: dict[str, Any] | None = None
    """Optimizer, schedule, counters and RNG states, when read with ``read_checkpoint(…, trainer_state=True)``."""

    @property
    def trainer_state_path(self) -> Path | None:
        path = self.source / STATE_FILE
        return path if self.kind == "speedboard" and path.is_file() else None

    def read_trainer_state(self) -> dict[str, Any]:
        """Optimizer, schedule, counters and RNG states, checked against config.json."""
        if self.trainer_state is not None:
            return self.trainer_state
        path = self.trainer_state_path
        if path is None:
            raise CheckpointError(f"{self.source} holds no trainer state ({STATE_FILE})")
        return load_trainer_state(path, _records(self.meta, self.source).get(STATE_FILE))


# ----------------------------------------------------------------------------- files
_CODE_REFUSALS = ("unsupported global", "unrecognized function", "can only create new object", "can only build")
"""What torch's weights-only unpickler says when it refuses a Python global (that is, code)."""


def _pickle_kind(path: Path) -> str | None:
    """"a plain pickle" when the file is one that ``torch.save`` never writes (protocol 3 or later)."""
    try:
        with open(path, "rb") as f:
            head = f.read(3)
    except OSError:
        return None
    plain = head[:2] == b"\x80\x03" or head in (b"\x80\x04\x95", b"\x80\x05\x95")  # protocol 3, or 4/5 framed
    return "a plain pickle, not a file written by torch.save" if plain else None


def _open_error(path: Path, exc: OSError) -> OSError:
    """The system's own answer to opening ``path``: safetensors and torch.load call a file that may not be read
    missing ("No such file or directory" where the truth is "Permission denied")."""
    try:
        with open(path, "rb"):
            return exc
    except OSError as real:
        return real


def _cannot_read(exc: OSError, path: Path) -> CheckpointError:
    return CheckpointError(f"cannot read {exc.filename or path}: {exc.strerror or first_line(exc)}")


def _torch_load(path: Path, what: str = "weights file", mmap: bool = False) -> Any:
    try:
        with warnings.catch_warnings():
            # torch warns about the pickle protocol before it refuses a file: the message below says it all.
            warnings.simplefilter("ignore")
            if not mmap:
                return torch.load(path, map_location="cpu", weights_only=True)
            with _utf8_path(path) as name:  # the memory map's reader, too, takes only a UTF-8 name
                return torch.load(name, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if any(marker in text.lower() for marker in _CODE_REFUSALS):
            raise CheckpointError(f"refused to load {path.name}: the {what} contains Python objects other than "
                                  f"tensors, and unpickling them could run code") from None
        detail = _pickle_kind(path) or first_line(ValueError(text.split("WeightsUnpickler error:")[-1]), 160)
        raise CheckpointError(f"{path.name} is not a PyTorch {what}, or is truncated or corrupted ({detail})") from None
    except OSError as exc:  # a file that cannot be read is not a corrupted one: the reader says which
        raise _open_error(path, exc) from None
    except Exception as exc:  # the unpickler raises many types on garbage (KeyError, EOFError, RuntimeError…)
        detail = first_line(exc, 160)
        if not isinstance(exc, RuntimeError) and detail != type(exc).__name__:
            detail = f"{type(exc).__name__}: {detail}"
        raise CheckpointError(f"{path.name} is not a PyTorch {what}, or is truncated or corrupted ({detail})") from None


@contextlib.contextmanager
def _utf8_path(path: Path) -> Iterator[str]:
    """A name of ``path`` that safetensors (and torch.load's memory map) can take: they refuse one that is not
    UTF-8 (a folder named in a Latin-1 locale, any byte of another encoding), which they saved without complaint.
    Such a file is opened here and named by its descriptor (``/proc/self/fd``, Linux)."""
    name = str(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        fd = os.open(path, os.O_RDONLY)
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    yield name


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        with _utf8_path(path) as name:
            return load_file(name, device="cpu")
    except OSError as exc:
        raise _open_error(path, exc) from None
    except Exception as exc:  # SafetensorError and friends: report, never crash
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first_line(exc, 160)})") from None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _extract_state_dict(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    """A state dict, or one nested under a common key (nanoGPT's ``model``, Lightning's ``state_dict``)."""
    if isinstance(obj, dict):
        if _is_state_dict(obj):
            return obj
        for key in ("model", "state_dict", "model_state_dict", "module"):
            if _is_state_dict(obj.get(key)):
                return obj[key]
    raise CheckpointError(f"{path.name} does not hold a model state dict")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except OSError as exc:  # not damaged JSON: a file this user may not read ("Permission denied")
        raise _cannot_read(exc, path) from None
    except ValueError as exc:  # UnicodeDecodeError and every JSON damage
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


def _shard_path(folder: Path, index: Path, shard: Any) -> Path:
    """A shard named by an index: a plain relative path inside ``folder``, never outside it."""
    if not isinstance(shard, str) or not shard:
        raise CheckpointError(f"{index} names a shard that is not a file name ({shard!r})")
    relative = Path(shard)
    if relative.is_absolute() or relative.drive or ".." in relative.parts:
        raise CheckpointError(f"{index} points outside its folder ({shard!r}): refused")
    return folder / relative


def _hf_weight_files(folder: Path) -> list[tuple[Path, set[str] | None]]:
    """The files that hold a Hugging Face folder's weights: one file, or every shard its index lists, each with the
    keys the index puts in it (None for a folder of one file)."""
    if (folder / WEIGHTS_FILE).is_file():
        return [(folder / WEIGHTS_FILE, None)]
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            weight_map = _read_json(index).get("weight_map", {})
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index} has no weight_map object")
            placed: dict[Path, set[str]] = {}
            for key, shard in weight_map.items():
                placed.setdefault(_shard_path(folder, index, shard), set()).add(key)
            if not placed:
                raise CheckpointError(f"{index} lists no weight files")
            for shard in placed:
                if not shard.is_file():
                    raise CheckpointError(f"{folder} is missing shard {shard.relative_to(folder)}")
            return sorted(placed.items())
    if (folder / "pytorch_model.bin").is_file():
        return [(folder / "pytorch_model.bin", None)]
    raise CheckpointError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _check_shard(path: Path, keys, listed: set[str] | None) -> None:
    """A shard holds the keys its index puts in it, no more, no fewer: one key in two shards was read from the
    last one, whatever the index said (a tensor of zeros loaded without a word)."""
    if listed is None:
        return
    keys = set(keys)
    if extra := sorted(keys - listed):
        raise CheckpointError(f"{path.name} holds {extra[0]}, which the folder's index does not place in it (it "
                              f"lists another shard for it, or none): the shards and the index disagree")
    if missing := sorted(listed - keys):
        raise CheckpointError(f"the folder's index places {missing[0]} in {path.name}, which does not hold it")


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix.lower() == ".safetensors":
        return _load_safetensors(path)
    return _extract_state_dict(_torch_load(path), path)


def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path, listed in _hf_weight_files(folder):
        tensors = _read_weights_file(path)
        _check_shard(path, tensors, listed)
        state.update(tensors)
    return state


# ----------------------------------------------------------------------------- finding the checkpoint
def list_checkpoints(folder: str | Path) -> list[Path]:
    """A run's own finished checkpoints in a folder (its ``checkpoints/``: ``step_NNNNNNN``), oldest first by
    step number, not by name (``step_10000000`` comes after ``step_9999999``). Anything else put there (an
    export, a copy) is neither the run's newest checkpoint nor removed by its keep-rotation."""
    folder = user_path(folder)
    try:
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []
    steps = {p: int(m.group(1)) for p in entries if (m := _STEP_FOLDER.fullmatch(p.name))}
    return sorted((p for p in steps if p.is_dir() and (p / CONFIG_FILE).is_file() and not _foreign(p)),
                  key=steps.__getitem__)


def _foreign(folder: Path) -> bool:
    """``folder``'s config.json says it is some other format (a Hugging Face export named like a checkpoint).

    One that cannot be read or parsed, or that bears either mark of ours (the format's name or the
    checksum), is not foreign: it stays the run's newest, so that reading it reports the damage
    instead of silently falling back to an older checkpoint.
    """
    try:
        meta = parse_json((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") != FORMAT and CONFIG_CHECKSUM not in meta


def latest_checkpoint(run_or_checkpoint: str | Path) -> Path:
    """Resolve what a user points at: a checkpoint folder or file itself, or a run folder's newest checkpoint."""
    path = user_path(run_or_checkpoint)
    try:
        return _latest_checkpoint(path)
    except OSError as exc:  # a folder this user may not read (Python 3.11's is_file raises then): said as such
        raise _cannot_read(exc, path) from None


def _latest_checkpoint(path: Path) -> Path:
    if not path.exists():
        raise CheckpointError(f"{path} {not_there(path)}")
    if path.is_file():
        return path
    if (path / CONFIG_FILE).is_file() and not is_run_dir(path):
        return path
    # A run folder, or its checkpoints/ folder itself (named as often as the run folder; it was said to hold
    # no checkpoints): the newest of them.
    for folder in (path / CHECKPOINTS_DIR, path):
        if folder.is_dir():
            with os.scandir(folder):  # one that cannot be listed is said so, not taken for one without checkpoints
                pass
    found = list_checkpoints(path / CHECKPOINTS_DIR) or list_checkpoints(path)
    if found:
        return found[-1]
    if is_run_dir(path):
        raise CheckpointError(f"run folder {path} holds no checkpoint yet")
    if os.path.lexists(path / CONFIG_FILE):  # a folder, a FIFO or a dangling link: say so, not "no config.json"
        raise CheckpointError(f"{path / CONFIG_FILE} is not a regular file")
    raise CheckpointError(f"{path} is not a checkpoint folder (no {CONFIG_FILE}) and holds no checkpoints")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _read_newest(raw: Path, read: Callable[[Path], T]) -> T:
    """``read`` the checkpoint ``raw`` resolves to; start again when it vanished or was replaced meanwhile.

    A live run's keep-rotation removes old checkpoints (renamed aside, then
    deleted) and a save to the same path replaces one: a failure while the
    folder is still the one that was picked is the checkpoint's own problem and
    is reported; otherwise the newest checkpoint is picked and read again.
    """
    if raw.name.startswith(".") and ".tmp-" in raw.name and os.path.isdir(raw):  # (isdir: never raises)
        raise CheckpointError(f"{raw} is an unfinished save, not a checkpoint")
    for _ in range(_READ_ATTEMPTS):
        resolved = latest_checkpoint(raw)
        before = _identity(resolved)
        try:
            return read(resolved)
        except (CheckpointError, OSError) as exc:
            if before is not None and _identity(resolved) == before:
                if isinstance(exc, OSError):
                    raise _cannot_read(exc, resolved) from None
                raise
    raise CheckpointError(f"the checkpoints of {raw} kept changing while being read ({_READ_ATTEMPTS} tries); "
                          f"try again")


# ----------------------------------------------------------------------------- config.json
def config_checksum(meta: dict[str, Any]) -> str:
    """SHA-256 of config.json's canonical JSON (sorted keys, no spaces) without its own checksum field."""
    body = {k: v for k, v in meta.items() if k != CONFIG_CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _records(meta: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """config.json's size and sha256 of each file; any other shape is a one-line error."""
    records = meta.get("files", {})
    ok = isinstance(records, dict) and all(
        isinstance(r, dict)
        and isinstance(r.get("bytes", 0), int) and not isinstance(r.get("bytes", 0), bool)
        and isinstance(r.get("sha256", ""), str)
        for r in records.values())
    if not ok:
        raise CheckpointError(f"{path / CONFIG_FILE} has an invalid record of its files (\"files\" must map each "
                              f"file name to its bytes and sha256)")
    return records


def _check_speedboard_meta(path: Path, meta: dict[str, Any], model_cfg: ModelConfig) -> None:
    """config.json is what was saved: its checksum matches, its records are well formed, its copies agree."""
    where = path / CONFIG_FILE
    if CONFIG_CHECKSUM not in meta and meta.get("format_version", 1) >= 2:
        raise CheckpointError(f"{where} lost its checksum (config_sha256) after it was saved: its settings cannot "
                              f"be trusted")
    if CONFIG_CHECKSUM in meta and meta[CONFIG_CHECKSUM] != config_checksum(meta):
        raise CheckpointError(f"{where} was changed after it was saved (its checksum differs): its settings "
                              f"cannot be trusted")
    _records(meta, path)
    named = _STEP_FOLDER.fullmatch(path.name)
    if named and path.parent.name == CHECKPOINTS_DIR and meta.get("step") != int(named.group(1)):
        # A run's newest checkpoint is found by these names: one renamed would be taken for another step.
        raise CheckpointError(f"{path} holds the checkpoint of step {meta.get('step')}, not of the step its "
                              f"name says: it was renamed (give it back its name, step_{meta.get('step'):07d})"
                              if isinstance(meta.get("step"), int) else
                              f"{path / CONFIG_FILE} records no step, though the folder is named for one")
    run = meta.get("run")
    if isinstance(run, dict) and "model" in run:
        try:
            same = ModelConfig.from_dict(run["model"]) == model_cfg
        except (TypeError, ConfigError):
            same = False
        if not same:
            raise CheckpointError(f"{where} holds two different model settings (\"model\" and \"run\".\"model\"): "
                                  f"it was edited or damaged")


def _config_problem(exc: Exception) -> str:
    """A config's problem in words: a missing key was said as the bare key ("('num_attention_heads')")."""
    if isinstance(exc, KeyError) and exc.args:
        return f"it has no {exc.args[0]!r} setting"
    return str(exc)


def _model_config_of(path: Path, meta: dict[str, Any]) -> tuple[str, ModelConfig]:
    if meta.get("format") == FORMAT:
        if not isinstance(meta.get("format_version"), int) or meta["format_version"] > FORMAT_VERSION:
            raise CheckpointError(f"{path} was written by a newer Speedboard (format {meta.get('format_version')})")
        try:
            model_cfg = ModelConfig.from_dict(meta["model"])
        except (KeyError, TypeError, AttributeError, ConfigError) as exc:
            raise CheckpointError(f"{path / CONFIG_FILE} has an invalid model config ({_config_problem(exc)})") \
                from None
        _check_speedboard_meta(path, meta, model_cfg)
        return "speedboard", model_cfg
    if meta.get("model_type") == "llama" or "LlamaForCausalLM" in (meta.get("architectures") or []):
        try:
            return "huggingface", ModelConfig.from_hf_dict(meta)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{path / CONFIG_FILE}: unsupported Hugging Face config "
                                  f"({_config_problem(exc)})") from None
    raise CheckpointError(f"{path} is neither a Speedboard checkpoint nor a Hugging Face Llama folder")


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
        parent's schedule exactly (see ``core.schedule.make_schedule``).
        """
        run = self.meta.get("run") if self.kind == "speedboard" else None
        if not isinstance(run, dict):
            return None
        try:
            return RunConfig.from_dict(run).replace(out_dir=None, resume=None, init_from=None, parent=None)
        except (TypeError, AttributeError, ConfigError) as exc:
            raise CheckpointError(f"{self.path / CONFIG_FILE} has an invalid run config ({exc})") from None

    @property
    def holds_trainer_state(self) -> bool:
        """A Speedboard checkpoint with its optimizer, schedule and data position: one that ``--resume`` continues
        (a bare state dict or a Hugging Face folder never holds one)."""
        return self.kind == "speedboard" and (self.path / STATE_FILE).is_file()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor shapes by clean name (a bare state dict's are read from its file without its weights)."""
        if self.kind == "state_dict":
            return tensor_shapes(self.path)
        return {}


def cannot_resume(source: str | Path) -> CheckpointError:
    return CheckpointError(f"cannot resume from {source}: it holds no trainer state (use init-from to start a new run "
                           f"from its weights)")


def peek_checkpoint(path: str | Path) -> CheckpointInfo:
    """Resolve ``path`` and read its config only (cheap: for building a run's config before loading)."""

    def peek(resolved: Path) -> CheckpointInfo:
        if resolved.is_file():
            return CheckpointInfo(resolved, "state_dict", None, {})
        meta = _read_json(resolved / CONFIG_FILE)
        kind, model_cfg = _model_config_of(resolved, meta)
        return CheckpointInfo(resolved, kind, model_cfg, meta)

    return _read_newest(user_path(path), peek)


def verify_checkpoint(path: str | Path, hash_files: bool = True) -> None:
    """Compare a Speedboard checkpoint's files with the sizes and SHA-256 its config.json recorded: every
    byte is read, nothing is loaded. A damaged checkpoint is refused where it is chosen (the dashboard's
    Load), not when a run starts from it. Other formats record no checksums: nothing to compare.
    ``hash_files=False``: presence and sizes only, in milliseconds whatever the model's size (a file missing,
    or cut short by a copy that did not finish), where every byte cannot be read (the window's own thread)."""

    def verify(resolved: Path) -> None:
        if resolved.is_file():
            return
        meta = _read_json(resolved / CONFIG_FILE)
        kind, _ = _model_config_of(resolved, meta)
        if kind != "speedboard":
            return
        _verify_speedboard_files(resolved, _records(meta, resolved), (resolved / STATE_FILE).is_file(),
                                 hash_state=hash_files, hash_files=hash_files)

    _read_newest(user_path(path), verify)


def _verify_speedboard_files(path: Path, records: dict[str, dict[str, Any]], has_state: bool,
                             hash_state: bool, hash_files: bool = True) -> None:
    """A Speedboard checkpoint folder's files present and as recorded: weights and tokenizer always, every
    other file config.json records (the tokenizer's ``tokenizer_config.json``, whose special tokens the run
    takes), and the trainer state where it is there or recorded (``hash_state=False``: its hash is checked
    when it is read)."""
    for part in (WEIGHTS_FILE, TOKENIZER_FILE):
        if not (path / part).is_file():
            raise _incomplete(path, part)
    if records.get(STATE_FILE) and not has_state:
        raise CheckpointError(f"checkpoint {path} is incomplete: {STATE_FILE} is missing")
    for name, record in records.items():
        if name == STATE_FILE:
            continue
        if Path(name).name != name or name in (".", ".."):  # a record names a file of this folder, no path
            raise CheckpointError(f"{path / CONFIG_FILE} records a file outside its folder ({name!r}): refused")
        if not (path / name).is_file():
            raise _incomplete(path, name)
        _verify_file(path / name, record, hash_it=hash_files)
    if has_state:
        _verify_file(path / STATE_FILE, records.get(STATE_FILE), hash_it=hash_state)


def _incomplete(path: Path, name: str) -> CheckpointError:
    # A folder, a named pipe or a dangling link in its place is not "missing": it is there and the wrong kind.
    kind = "is not a regular file" if os.path.lexists(path / name) else "is missing"
    return CheckpointError(f"checkpoint {path} is incomplete: {name} {kind}")


def check_tokenizer_fits(tokenizer: BPETokenizer, model_config: ModelConfig) -> None:
    # vocab_size is the highest id + 1: a tokenizer with holes in its ids needs a row for its top id.
    if tokenizer.vocab_size > model_config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding "
                              f"has only {model_config.vocab_size} rows")


# ----------------------------------------------------------------------------- reading
def _read_folder(path: Path, with_trainer_state: bool) -> LoadedCheckpoint:
    meta = _read_json(path / CONFIG_FILE)
    kind, model_cfg = _model_config_of(path, meta)
    records = _records(meta, path) if kind == "speedboard" else {}
    # Looked at once: a rotation may remove the folder while it is read, and a
    # trainer state that vanished after this point must fail the read (and so
    # start it again on the newest checkpoint), never read as "no state".
    has_state = kind == "speedboard" and (path / STATE_FILE).is_file()
    if kind == "speedboard":
        _verify_speedboard_files(path, records, has_state, hash_state=False)  # the state is hashed when read
    tokenizer = None
    if (path / TOKENIZER_FILE).is_file():
        tokenizer = BPETokenizer.load(path)
        check_tokenizer_fits(tokenizer, model_cfg)
    if kind == "speedboard":
        state = clean_state_dict(_load_safetensors(path / WEIGHTS_FILE), WEIGHTS_FILE)
    else:
        state = clean_state_dict(_read_hf_weights(path), path.name)
    if not state:
        raise CheckpointError(f"{path} holds no weights")
    trainer_state = None
    if with_trainer_state and has_state:
        trainer_state = load_trainer_state(path / STATE_FILE, records.get(STATE_FILE))
    return LoadedCheckpoint(path, kind, state, model_cfg, tokenizer, meta, trainer_state)


def _read_file(path: Path) -> LoadedCheckpoint:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        state = _load_safetensors(path)
    elif suffix in PICKLE_SUFFIXES:
        state = _extract_state_dict(_torch_load(path), path)
    else:
        raise _unsupported(path)
    if not state:
        raise CheckpointError(f"{path.name} holds no tensors")
    return LoadedCheckpoint(path, "state_dict", clean_state_dict(state, path.name))


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        if path.suffix.lower() == ".safetensors":
            with _utf8_path(path) as name, safe_open(name, framework="pt") as f:  # the header only: no data read
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        # A pickle has no header; a zip-format one is memory-mapped, so its weights are not read into RAM.
        state = _extract_state_dict(_torch_load(path, mmap=zipfile.is_zipfile(path)), path)
        return {k: tuple(v.shape) for k, v in state.items()}
    except CheckpointError:
        raise
    except OSError as exc:  # not a damaged file: one that cannot be read (the caller says why)
        raise _open_error(path, exc) from None
    except Exception as exc:  # SafetensorError and friends: report, never crash
        raise CheckpointError(f"{path.name} is truncated or corrupted ({first_line(exc, 160)})") from None


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Clean names and shapes of the weights ``path`` holds (resolved as ``read_checkpoint`` does).

    Cheap where the format allows: safetensors files are read by their header
    alone; a pickled state dict has to be unpickled whole. Checksums are not
    verified here (``read_checkpoint`` does that before anything is loaded).
    """

    def shapes_of(path: Path) -> dict[str, tuple[int, ...]]:
        if path.is_dir():
            kind, _ = _model_config_of(path, _read_json(path / CONFIG_FILE))
            if kind == "speedboard" and not (path / WEIGHTS_FILE).is_file():
                raise _incomplete(path, WEIGHTS_FILE)
            files = [(path / WEIGHTS_FILE, None)] if kind == "speedboard" else _hf_weight_files(path)
        elif path.suffix.lower() == ".safetensors" or path.suffix.lower() in PICKLE_SUFFIXES:
            files = [(path, None)]
        else:
            raise _unsupported(path)
        shapes: dict[str, tuple[int, ...]] = {}
        for file, listed in files:
            found = _file_shapes(file)
            _check_shard(file, found, listed)
            shapes.update(found)
        return clean_state_dict(shapes, path.name)  # keys only: it renames and drops entries, whatever their values

    return _read_newest(user_path(path), shapes_of)


def read_checkpoint(path: str | Path, *, trainer_state: bool = False) -> LoadedCheckpoint:
    """Read any supported format into CPU tensors with clean keys; changes no model.

    ``path`` may be a checkpoint folder, a run folder (its newest checkpoint,
    also while the run writes and rotates them), a Hugging Face folder or a
    state-dict file. ``trainer_state=True`` also reads and checks the trainer
    state, in the same pass. Every problem is a CheckpointError.
    """
    loaded = _read_newest(user_path(path),
                          lambda p: _read_file(p) if p.is_file() else _read_folder(p, trainer_state))
    check_plain_tensors(loaded.state_dict, loaded.source.name)  # every format: before any caller copies one
    return loaded


# ----------------------------------------------------------------------------- trainer state
_STATE_KEYS = {"step", "tokens", "samples", "optimizer", "schedule"}


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and value.layout == torch.strided and not (value.is_meta or value.is_quantized):
            return f"{value.item()!r} (a {value.dtype} tensor)"
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_trainer_state(state: Any, path: Path) -> dict[str, Any]:
    """Refuse, in one line, a trainer state whose structure or types are not what a resume uses.

    A checksum only proves the file is the one that was saved; a file crafted or
    written by another program can still hold anything.
    """
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path} is not a valid Speedboard trainer state: {what}")

    if not isinstance(state, dict) or not _STATE_KEYS <= state.keys():
        missing = sorted(_STATE_KEYS - state.keys()) if isinstance(state, dict) else []
        raise bad(f"{', '.join(missing)} missing" if missing else "not a dictionary")
    for name in ("step", "tokens", "samples"):
        if not _is_int(state[name]) or state[name] < 0:
            raise bad(f"{name} must be an integer ≥ 0, got {_short(state[name])}")
    if "seed" in state and not (_is_int(state["seed"]) and 0 <= state["seed"] <= MAX_SEED):
        raise bad(f"seed must be an integer between 0 and 2**63 - 1, got {_short(state['seed'])}")
    if "world_size" in state and not (_is_int(state["world_size"]) and state["world_size"] >= 1):
        raise bad(f"world_size must be an integer ≥ 1, got {_short(state['world_size'])}")
    wall = state.get("wall_time", 0.0)
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall < 0:
        raise bad(f"wall_time must be a finite number ≥ 0, got {_short(wall)}")
    for name in ("run_id", "parent"):
        if state.get(name) is not None and not isinstance(state[name], str):
            raise bad(f"{name} must be text, got {_short(state[name])}")
    if state.get("train_config") is not None and not isinstance(state["train_config"], dict):
        raise bad(f"train_config must be a dictionary, got {_short(state['train_config'])}")
    # Counts a resume compares with its own (a batch or a sample stream that changed): "x" was a ValueError
    # traceback at set-up, -5 a warning of "-5 training samples".
    for name, least in (("train_samples", 0), ("tokens_per_step", 1)):
        if state.get(name) is not None and not (_is_int(state[name]) and state[name] >= least):
            raise bad(f"{name} must be an integer ≥ {least}, got {_short(state[name])}")
    _check_schedule(state["schedule"], bad)
    _check_optimizer(state["optimizer"], bad)
    if not isinstance(state.get("scaler", {}), dict):
        raise bad(f"scaler must be a dictionary, got {_short(state['scaler'])}")
    _check_rng(state.get("rng") or {}, bad)
    return state


def _check_schedule(schedule: Any, bad: Callable[[str], CheckpointError]) -> None:
    names = ("max_lr", "min_lr", "warmup_tokens", "end_tokens", "start_tokens")
    if not isinstance(schedule, dict) or not set(names) <= schedule.keys():
        raise bad(f"schedule must hold {', '.join(names)}, got {_short(schedule)}")
    for name in ("max_lr", "min_lr"):
        value = schedule[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise bad(f"schedule {name} must be a finite number ≥ 0, got {_short(value)}")
    for name in ("warmup_tokens", "end_tokens", "start_tokens"):
        if not _is_int(schedule[name]) or schedule[name] < 0:
            raise bad(f"schedule {name} must be an integer ≥ 0, got {_short(schedule[name])}")
    if schedule["end_tokens"] <= schedule["start_tokens"]:
        raise bad(f"schedule ends (end_tokens {schedule['end_tokens']}) before it starts "
                  f"(start_tokens {schedule['start_tokens']})")


_ADAMW_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
"""AdamW's per-parameter tensors (the last with amsgrad only); its ``step`` is a count."""


def _check_optimizer(optimizer: Any, bad: Callable[[str], CheckpointError]) -> None:
    """An AdamW state_dict (the only optimizer a run makes): groups listing parameter indices once each, and per
    listed parameter a step count and dense floating-point moments. ``load_state_dict`` takes anything: a moment
    that is a number or a sparse tensor failed in the first step's fused kernel (a traceback of every tensor, after
    the run folder was made), and a state keyed "3" or -1 was dropped in silence, the resume then no longer exact."""
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict) \
            or not isinstance(optimizer.get("param_groups"), list):
        raise bad("optimizer must be an optimizer state_dict (state and param_groups)")
    listed: set[int] = set()
    for group in optimizer["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list) \
                or not all(_is_int(p) for p in group["params"]):
            raise bad(f"each optimizer param group must list its parameters by index, got {_short(group)}")
        if listed.intersection(group["params"]) or len(set(group["params"])) != len(group["params"]):
            raise bad("an optimizer parameter index is listed twice")
        listed.update(group["params"])
    for index, entry in optimizer["state"].items():
        if not _is_int(index) or index not in listed:
            raise bad(f"the optimizer state names parameter {index!r}, which no param group lists")
        if not isinstance(entry, dict):
            raise bad(f"the optimizer state of parameter {index!r} must map names to tensors or numbers")
        for name, value in entry.items():
            if name == "step":
                if not _is_count(value):
                    raise bad(f"the optimizer step of parameter {index!r} must be a count ≥ 0, got {_short(value)}")
                continue
            if name not in _ADAMW_MOMENTS:
                raise bad(f"the optimizer state of parameter {index!r} holds {name!r}, which AdamW does not keep")
            if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.layout == torch.strided
                    and not value.is_meta and not value.is_quantized):
                raise bad(f"{name} of parameter {index!r} must be a dense floating-point tensor, got "
                          f"{_short(value) if not isinstance(value, torch.Tensor) else _tensor_kind(value)}")
            # A NaN moment makes the first step's update NaN: the run then fails blaming its learning rate.
            if not bool(torch.isfinite(value).all()):
                raise bad(f"the optimizer state of parameter {index!r} is not finite (NaN or inf in {name}): it was "
                          f"saved from a diverged or damaged run; start a new run from its weights with --init-from")


def _is_count(value: Any) -> bool:
    """An optimizer step count: an integer or a whole float ≥ 0, as a number or a one-value tensor."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.layout != torch.strided or value.is_meta or value.is_complex():
            return False
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= 0 and float(value).is_integer()


def _tensor_kind(value: torch.Tensor) -> str:
    """What a tensor is, where it is not a dense floating-point one."""
    if value.is_meta:
        return "a meta tensor (no values)"
    if value.layout != torch.strided:
        return f"a {str(value.layout).removeprefix('torch.')} tensor"
    return f"a {str(value.dtype).removeprefix('torch.')} tensor"


def _check_rng(rng: Any, bad: Callable[[str], CheckpointError]) -> None:
    if not isinstance(rng, dict):
        raise bad(f"rng must be a dictionary, got {_short(rng)}")
    if "torch" in rng:
        value = rng["torch"]
        ok = isinstance(value, torch.Tensor) and value.dtype == torch.uint8
        if ok:
            try:
                torch.Generator().set_state(value)  # a scratch generator: the exact check torch itself makes
            except RuntimeError:
                ok = False
        if not ok:
            raise bad(f"rng torch must be a CPU random-generator state, got {_short(value)}")
    cuda = rng.get("cuda", [])
    if not isinstance(cuda, (list, tuple)) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                                                       for t in cuda):
        raise bad("rng cuda must be a list of CUDA random-generator states")


def peek_schedule(path: Path) -> dict[str, Any] | None:
    """The learning-rate schedule and training settings ``trainer_state.pt`` holds (its ``schedule`` and
    ``train_config``), read through a memory map, so the optimizer's tensors stay on disk: for a dashboard that
    checks a resume's budget before it starts one. None where the file cannot tell (the run says why)."""
    try:
        state = _check_trainer_state(_torch_load(path, "trainer state", mmap=zipfile.is_zipfile(path)), path)
    except (CheckpointError, OSError):
        return None
    config = state.get("train_config")
    return {"schedule": dict(state["schedule"]), "train_config": dict(config) if isinstance(config, dict) else {}}


def load_trainer_state(path: Path, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read ``trainer_state.pt`` (checked against its ``config.json`` record when given) and check its structure."""
    if record is not None:
        _verify_file(path, record)
    return _check_trainer_state(_torch_load(path, "trainer state"), path)
