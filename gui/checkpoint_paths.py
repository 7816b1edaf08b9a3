"""What the Save and Load dialogs pick, checked before the torch thread is asked, and a checkpoint's name for people."""

from __future__ import annotations

import os
from pathlib import Path

from core.checkpoint import is_speedboard_checkpoint, replace_problem
from core.paths import control_character, unnameable
from core.runs import CHECKPOINTS_DIR
from gui.controller import CheckpointSummary

# Files that stand for their folder when picked in the Load dialog.
_FOLDER_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "trainer_state.pt",
                 "metrics.jsonl", "model.safetensors.index.json", "pytorch_model.bin.index.json")
LOAD_FILTER = ("Checkpoints (config.json model.safetensors pytorch_model.bin metrics.jsonl *.pt *.pth *.bin "
               "*.ckpt *.safetensors);;All files (*)")


def checkpoint_target(picked: str) -> str:
    """What a file picked in the Load dialog means: its folder (checkpoint, Hugging Face or run) or itself."""
    path = Path(picked)  # (os.path's tests never raise: pathlib's did for a folder that cannot be entered)
    if os.path.isdir(path):
        return str(path)
    if path.name in _FOLDER_FILES and os.path.isfile(path.parent / "config.json") or path.name == "metrics.jsonl":
        return str(path.parent)
    return str(path)


def save_target_problem(path: str) -> str | None:
    """Why a checkpoint folder cannot be written at ``path`` (checked before asking the torch thread)."""
    target = Path(path).expanduser()
    try:
        return _save_target_problem(target)
    except OSError as exc:  # a folder on the way that cannot be entered or listed: said in the dialog
        return f"cannot look into {exc.filename or target}: {exc.strerror or exc}; choose another folder."


def _save_target_problem(target: Path) -> str | None:
    if (why := unnameable(target)) is not None:  # else the first look at it raises "File name too long"
        return f"{why}."
    if target.exists() and not target.is_dir():
        return f"{target} is a file; a checkpoint is a folder, so choose a new name."
    if target.is_dir() and not is_speedboard_checkpoint(target) and any(target.iterdir()):
        return f"{target} is a folder with other files in it (not a Speedboard checkpoint); choose a new name."
    if (why := replace_problem(target)) is not None:  # a checkpoint, and files of the user's beside it
        return f"{target}: {why}; choose a new name."
    if (why := control_character(target)) is not None:
        return f"{why}."
    # The nearest part of the path that exists: a file two levels up was said as a folder that does not exist.
    above = next((folder for folder in target.parents if os.path.lexists(folder)), None)
    if above is not None and not above.is_dir():
        return f"{above} is a file, not a folder; choose a folder to save in."
    if not target.parent.is_dir():
        return f"the folder {target.parent} does not exist."
    if not os.access(target.parent, os.W_OK):
        return f"there is no permission to write in {target.parent}."
    return None


def checkpoint_name(info: CheckpointSummary) -> str:
    """A checkpoint as people know it: ``RUN / step_0000022`` for one a run saved, else its file or folder name."""
    path = Path(info.path)
    run = info.run_id
    if not run and path.parent.name == CHECKPOINTS_DIR:  # <run>/checkpoints/step_N: the run folder names it
        run = path.parent.parent.name
    return f"{run} / {path.name}" if run and run != path.name else path.name


def describe_checkpoint(info: CheckpointSummary) -> str:
    """``RUN / name (kind, size parameters, step N)``: the log, the load question and the Start-from label."""
    kind = {"speedboard": "Speedboard checkpoint", "huggingface": "Hugging Face model",
            "state_dict": "state dict"}.get(info.kind, info.kind)
    params = info.num_parameters
    size = f"{params / 1e6:.2f}M" if params >= 1e5 else f"{params / 1e3:.1f}k"
    at = f", step {info.step}" if info.step else ""
    return f"{checkpoint_name(info)} ({kind}, {size} parameters{at})"


def architecture_note(info: CheckpointSummary) -> str:
    """What the next run's model is, when a bare state dict decided it (for the log line of a load)."""
    cfg = info.model_config or {}
    widths = f"hidden {cfg.get('hidden_size')}, {cfg.get('num_layers')} layers, {cfg.get('num_heads')} heads"
    if info.architecture == "inferred":
        return f"; its architecture, read from its tensors: {widths}, vocabulary {cfg.get('vocab_size')}"
    if info.architecture == "settings":  # the preset's model, with the vocabulary of the embedding it holds
        return (f"; its tensors fit the preset's architecture ({widths}) with a vocabulary of "
                f"{cfg.get('vocab_size')}, its embedding's")
    return ""


def fit_message(info: CheckpointSummary, preset: str) -> str:
    """The message box of a Load refused because the weights do not fit."""
    name = checkpoint_name(info)
    if info.kind != "state_dict":
        return f"{name} cannot be loaded: its weights do not fit its own config.json.\n\n{info.fit_problem}"
    return (f"{name} does not fit the model of the {preset} preset, and a bare state dict does not say which "
            f"architecture it has (here its tensors do not tell it either).\n\n{info.fit_problem}\n\n"
            f"Choose the preset it was trained with and load it again, or load its checkpoint folder "
            f"(its config.json names the architecture). The next run's start is unchanged.")
