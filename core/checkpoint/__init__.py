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

config.json also holds its own checksum (``config_sha256``), so an edited setting
is refused rather than loaded with other maths.

Readable formats: that folder (or a run folder: its newest checkpoint, also
while a live run rotates them); a ``.pt``/``.pth``/``.bin``/``.safetensors``
state dict (plain, compiled, per-block compiled, DDP, or a mix; Hugging Face's
names, the article series' ``LlamaForPretraining`` names, or either under a
Lightning module's ``model.``); a Hugging Face Llama folder. Pickles are read
with ``torch.load(weights_only=True)`` only, so a file never runs code.
"""

from core.checkpoint.folders import (
    AtomicFolder,
    check_writable,
    file_record,
    remove_folder,
    sweep_folder,
    sweep_leftovers,
    sweep_runs,
)
from core.checkpoint.infer import embedding_rows, infer_model_config
from core.checkpoint.keys import ROPE_TABLES, clean_key, clean_state_dict, model_state_dict, plain_module
from core.checkpoint.load import (
    check_compatible,
    check_config_matches,
    check_finite,
    check_weight_dtypes,
    load_checkpoint,
    load_weights,
    model_from_checkpoint,
    model_shapes,
    shape_problem,
)
from core.checkpoint.read import (
    CONFIG_CHECKSUM,
    FORMAT,
    FORMAT_VERSION,
    PICKLE_SUFFIXES,
    STATE_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    CheckpointInfo,
    LoadedCheckpoint,
    cannot_resume,
    check_tokenizer_fits,
    config_checksum,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    peek_checkpoint,
    peek_schedule,
    read_checkpoint,
    tensor_shapes,
    verify_checkpoint,
)
from core.checkpoint.save import export_hf, is_speedboard_checkpoint, replace_problem, save_checkpoint
from core.runs import CHECKPOINTS_DIR, CONFIG_FILE

__all__ = [
    "CHECKPOINTS_DIR", "CONFIG_CHECKSUM", "CONFIG_FILE", "FORMAT", "FORMAT_VERSION", "PICKLE_SUFFIXES",
    "ROPE_TABLES", "STATE_FILE", "TOKENIZER_FILE", "WEIGHTS_FILE", "AtomicFolder", "CheckpointInfo",
    "LoadedCheckpoint", "cannot_resume", "check_compatible", "check_config_matches", "check_finite",
    "check_weight_dtypes",
    "check_tokenizer_fits", "check_writable",
    "clean_key", "clean_state_dict", "config_checksum", "embedding_rows", "export_hf", "file_record",
    "infer_model_config", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "load_trainer_state",
    "load_weights", "model_from_checkpoint", "model_shapes", "model_state_dict", "peek_checkpoint", "peek_schedule",
    "is_speedboard_checkpoint", "replace_problem", "shape_problem",
    "plain_module", "read_checkpoint", "remove_folder", "save_checkpoint", "tensor_shapes", "sweep_folder",
    "sweep_leftovers", "sweep_runs", "verify_checkpoint",
]
