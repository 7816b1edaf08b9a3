"""Saving: a Speedboard checkpoint folder, and a Hugging Face export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from core.checkpoint.folders import AtomicFolder, check_writable, file_record
from core.checkpoint.keys import clean_state_dict, model_state_dict, plain_module
from core.checkpoint.load import check_finite
from core.checkpoint.read import (
    CONFIG_CHECKSUM,
    FORMAT,
    FORMAT_VERSION,
    STATE_FILE,
    WEIGHTS_FILE,
    config_checksum,
    read_checkpoint,
)
from core.compile import CompiledModel
from core.config import ModelConfig
from core.errors import CheckpointError
from core.json_text import finite_json, parse_json
from core.paths import user_path
from core.runs import CONFIG_FILE, library_versions
from core.tokenizer import TOKENIZER_FILE, BPETokenizer

_OWN_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE, STATE_FILE, TOKENIZER_FILE, "tokenizer_config.json"})
"""What a save writes into a checkpoint folder (its config.json records them too)."""


def _checkpoint_config(folder: Path) -> dict | None:
    """The config.json of a Speedboard checkpoint in ``folder``, else None. Only a regular file is read: a named
    pipe of that name would block the reader (the dashboard's window) until something wrote to it."""
    config = folder / CONFIG_FILE
    try:
        if not config.is_file():
            return None
        data = parse_json(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def is_speedboard_checkpoint(folder: str | Path) -> bool:
    """``folder`` holds a Speedboard checkpoint (its config.json says so)."""
    return _checkpoint_config(Path(folder)) is not None


def replace_problem(target: Path) -> str | None:
    """Why a save must not write ``target``, or None: it may be missing, an empty folder, or a Speedboard
    checkpoint holding nothing but its own files. A replacement swaps the whole folder, so anything else in it
    (notes, an evaluation beside the weights, a folder that only looks like a checkpoint) would be deleted."""
    if not target.exists():
        return None
    if not target.is_dir():
        return "a file of that name exists"
    names = {entry.name for entry in target.iterdir()}
    if not names:
        return None
    config = _checkpoint_config(target)
    if config is None:
        return "the folder exists, is not empty and is not a Speedboard checkpoint"
    recorded = config.get("files")
    others = sorted(names - _OWN_FILES - (set(recorded) if isinstance(recorded, dict) else set()))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3:,} more" if len(others) > 3 else "")
        return f"it holds a checkpoint and other files that replacing it would delete ({shown})"
    return None


def _check_replaceable(target: Path, what: str) -> None:
    """Never replace something that is not ours: only a missing target, an empty folder or an old checkpoint."""
    if (problem := replace_problem(target)) is not None:
        verb = "refusing to write" if target.is_dir() else "cannot write"  # a folder of the user's, or a file
        raise CheckpointError(f"{verb} the {what} to {target}: {problem}")


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
    target = user_path(path)
    check_writable(target, "checkpoint")
    _check_replaceable(target, "checkpoint")
    # Every failure to write in here is one CheckpointError (AtomicFolder), the temporary folder removed.
    with AtomicFolder(target, "checkpoint") as tmp:
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        tokenizer.save(tmp)
        if trainer_state is not None:
            torch.save(trainer_state, tmp / STATE_FILE)
        meta["files"] = {f.name: file_record(f) for f in sorted(tmp.iterdir())}
        meta = json.loads(finite_json(meta, default=str))  # the values as a reader will see them
        meta[CONFIG_CHECKSUM] = config_checksum(meta)
        # config.json last: a folder without it is never taken for a checkpoint.
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return target


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write a folder that ``transformers`` loads with ``from_pretrained`` (model and tokenizer)."""
    loaded = read_checkpoint(checkpoint)
    if loaded.model_config is None:
        raise CheckpointError(f"{checkpoint} is a bare state dict; export needs a checkpoint folder "
                              f"(it holds the model config and the tokenizer)")
    if loaded.tokenizer is None:
        raise CheckpointError(f"{checkpoint} has no tokenizer to export")
    check_finite(loaded.state_dict, str(loaded.source), "export an earlier checkpoint")
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
    target = user_path(out)
    check_writable(target, "export")
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"export folder {target} is a file; name a new or empty folder")
    if target.exists() and any(target.iterdir()):
        raise CheckpointError(f"export folder {target} exists and is not empty")
    with AtomicFolder(target, "export", replace=False) as tmp:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(hf, indent=2), encoding="utf-8")
        (tmp / "generation_config.json").write_text(json.dumps(special_ids, indent=2), encoding="utf-8")
        tok.save(tmp, for_hf=True, max_length=cfg.max_position_embeddings)  # BOS first, as training did
        special = {k: v for k, v in tok.hf_config().items() if k in ("bos_token", "eos_token", "pad_token")}
        (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
    return target
