"""What the Save and Load dialogs pick, checked before the torch thread is asked, and a checkpoint's name for people."""

from __future__ import annotations

import os
from pathlib import Path

from gui.controller import CheckpointSummary

# Files that stand for their folder when picked in the Load dialog.
_FOLDER_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "trainer_state.pt",
                 "metrics.jsonl", "model.safetensors.index.json", "pytorch_model.bin.index.json")
LOAD_FILTER = ("Checkpoints (config.json model.safetensors pytorch_model.bin metrics.jsonl *.pt *.pth *.bin "
               "*.ckpt *.safetensors);;All files (*)")


def checkpoint_target(picked: str) -> str:
    """What a file picked in the Load dialog means: its folder (checkpoint, Hugging Face or run) or itself."""
    path = Path(picked)
    if path.is_dir():
        return str(path)
    if path.name in _FOLDER_FILES and (path.parent / "config.json").is_file() or path.name == "metrics.jsonl":
        return str(path.parent)
    return str(path)


def save_target_problem(path: str) -> str | None:
    """Why a checkpoint folder cannot be written at ``path`` (checked before asking the torch thread)."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        return f"{target} is a file; a checkpoint is a folder, so choose a new name."
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        return f"{target} is a folder with other files in it; choose a new name."
    if not target.parent.is_dir():
        return f"the folder {target.parent} does not exist."
    if not os.access(target.parent, os.W_OK):
        return f"there is no permission to write in {target.parent}."
    return None


def describe_checkpoint(info: CheckpointSummary) -> str:
    """``name (kind, size parameters, step N)``, as the log and the Start-from label show it."""
    kind = {"speedboard": "Speedboard checkpoint", "huggingface": "Hugging Face model",
            "state_dict": "state dict"}.get(info.kind, info.kind)
    params = info.num_parameters
    size = f"{params / 1e6:.2f}M" if params >= 1e5 else f"{params / 1e3:.1f}k"
    at = f", step {info.step}" if info.step else ""
    return f"{Path(info.path).name} ({kind}, {size} parameters{at})"
