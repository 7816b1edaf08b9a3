"""Saving and safe loading: plain keys from compiled models, the folder's contents, atomic writes,
and one clear message for every bad checkpoint with the model left exactly as it was."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from core import checkpoint as ck
from core.cli import main
from core.compile import compile_model
from core.errors import CheckpointError, SpeedboardError
from tests.core.checkpoint_helpers import (
    assert_unchanged,
    corpus_file,
    input_ids,
    logits,
    make_model,
    params_snapshot,
)

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[2]


def saved_keys(folder: Path) -> set[str]:
    with safe_open(str(folder / ck.WEIGHTS_FILE), "pt") as f:
        return set(f.keys())


# --------------------------------------------------------------------------- keys
@pytest.mark.parametrize("key, clean", [
    ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    ("_orig_mod.model.embed_tokens.weight", "model.embed_tokens.weight"),
    ("model.layers.0._orig_mod.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("module.lm_head.weight", "lm_head.weight"),
    ("module._orig_mod.model.norm.weight", "model.norm.weight"),
    ("_orig_mod.module.model.norm.weight", "model.norm.weight"),
    ("module.model.layers.1._orig_mod.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
])
def test_clean_key_removes_every_wrapper_form(key, clean):
    assert ck.clean_key(key) == clean


def test_compiled_models_write_plain_keys(tmp_path, tok):
    plain_keys = set(make_model(0).state_dict())
    whole = torch.compile(make_model(0))  # compilation is lazy: no call, no compile cost
    assert all(k.startswith("_orig_mod.") for k in whole.state_dict())  # the trap being avoided
    user_blocks = make_model(0)  # per-block compilation as users write it: wrappers registered in the model
    for i, layer in enumerate(user_blocks.model.layers):
        user_blocks.model.layers[i] = torch.compile(layer)
    assert any(".layers.0._orig_mod." in k for k in user_blocks.state_dict())
    ours = compile_model(make_model(0), "default", "block")  # Speedboard's own per-block compilation
    for name, model in {"whole": whole, "user_blocks": user_blocks, "ours": ours}.items():
        folder = ck.save_checkpoint(tmp_path / name, model, tokenizer=tok)
        keys = saved_keys(folder)
        assert keys == plain_keys, name
        assert not any("_orig_mod" in k or k.startswith("module.") for k in keys)


def test_gathered_weights_are_saved_with_plain_keys(tmp_path, tok):
    """Sharded training hands over a gathered state dict; its keys are cleaned like the model's own."""
    model = make_model(2)
    gathered = {f"_orig_mod.{k}": v.clone() for k, v in model.state_dict().items()}
    folder = ck.save_checkpoint(tmp_path / "gathered", make_model(9), tokenizer=tok, weights=gathered)
    assert saved_keys(folder) == set(model.state_dict())
    restored, _ = ck.model_from_checkpoint(folder)
    torch.testing.assert_close(logits(restored, input_ids()), logits(model, input_ids()), rtol=0, atol=0)


def test_tied_head_is_stored_once_and_loads_back(tmp_path, tok):
    model = make_model(3, tie_word_embeddings=True)
    folder = ck.save_checkpoint(tmp_path / "tied", model, tokenizer=tok)
    assert "lm_head.weight" not in saved_keys(folder)
    restored, _ = ck.model_from_checkpoint(folder)
    assert restored.lm_head.weight is restored.model.embed_tokens.weight
    ids = input_ids()
    torch.testing.assert_close(logits(restored, ids), logits(model, ids), rtol=0, atol=0)


# --------------------------------------------------------------------------- folder contents
def test_checkpoint_folder_holds_weights_config_tokenizer_and_trainer_state(micro):
    from core.trainer import train

    result = train(micro(train={"budget": 3}))
    folder = result.checkpoint
    assert folder == result.run_dir / "checkpoints" / "step_0000003"
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "config.json", "tokenizer.json",
                                                  "tokenizer_config.json", "trainer_state.pt"}
    meta = json.loads((folder / "config.json").read_text())
    assert meta["format"] == ck.FORMAT and meta["format_version"] == ck.FORMAT_VERSION
    assert meta["step"] == 3 and meta["tokens"] == 3 * 4 * 32
    assert meta["versions"]["torch"] == torch.__version__ and "safetensors" in meta["versions"]
    assert meta["run"]["train"]["micro_batch"] == 4 and meta["run"]["data"]["seq_len"] == 32
    assert meta["model"]["hidden_size"] == 32 and meta["run"]["model"] == meta["model"]
    assert set(meta["files"]) == {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "trainer_state.pt"}
    state = ck.read_checkpoint(folder).read_trainer_state()
    assert (state["step"], state["tokens"], state["samples"]) == (3, 3 * 4 * 32, 12)
    assert state["optimizer"]["state"] and state["schedule"]["end_tokens"] == 3 * 4 * 32
    assert isinstance(state["rng"]["torch"], torch.Tensor) and "scaler" in state


def test_run_folder_resolves_to_its_newest_checkpoint(micro, tmp_path):
    from core.trainer import train

    result = train(micro(train={"budget": 4, "save_every": 2}))
    assert ck.latest_checkpoint(result.run_dir) == result.run_dir / "checkpoints" / "step_0000004"
    assert ck.read_checkpoint(result.run_dir).meta["step"] == 4
    # Its checkpoints/ folder means the same (it was said to hold no checkpoints).
    assert ck.latest_checkpoint(result.run_dir / "checkpoints") == result.run_dir / "checkpoints" / "step_0000004"
    # Its own checkpoints go by step number, past 7 digits too; an export put beside them is not one of them.
    folder = result.run_dir / "checkpoints"
    for name in ("step_9999999", "step_10000000", "zz_export"):
        shutil.copytree(folder / "step_0000004", folder / name)
    assert [p.name for p in ck.list_checkpoints(folder)] == \
        ["step_0000002", "step_0000004", "step_9999999", "step_10000000"]
    assert ck.latest_checkpoint(result.run_dir) == folder / "step_10000000"
    # A copy named for another step is refused when read, not taken for that step.
    with pytest.raises(CheckpointError, match=r"holds the checkpoint of step 4, not of the step its name says"):
        ck.read_checkpoint(result.run_dir)
    for name in ("step_9999999", "step_10000000"):
        shutil.rmtree(folder / name)
    # Nor is an export that was given a checkpoint's name: the run's newest stays its own.
    ck.export_hf(result.run_dir, folder / "step_99999999")
    assert ck.list_checkpoints(folder)[-1].name == "step_0000004"
    assert ck.read_checkpoint(result.run_dir).read_trainer_state()["step"] == 4
    # A checkpoint of ours whose config.json is damaged stays the newest: reading it reports the damage.
    damaged = folder / "step_0000004" / "config.json"
    damaged.write_text(damaged.read_text().replace('"format"', '"formaX"'))
    assert ck.latest_checkpoint(result.run_dir) == folder / "step_0000004"
    with pytest.raises(CheckpointError):
        ck.read_checkpoint(result.run_dir)
    shutil.rmtree(result.run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match="holds no checkpoint yet"):
        ck.read_checkpoint(result.run_dir)


# --------------------------------------------------------------------------- atomic save
def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, tok, monkeypatch):
    """A save that fails between writing and renaming leaves the previous checkpoint loadable and
    nothing that looks like a checkpoint; a crash there leaves only a hidden folder no loader accepts."""
    folder = tmp_path / "checkpoints"
    old_model, new_model = make_model(0), make_model(1)
    ids = input_ids()
    expected = logits(old_model, ids)
    previous = ck.save_checkpoint(folder / "step_0000001", old_model, tokenizer=tok, step=1)

    real_rename = os.rename

    def rename_fails_for_new_folders(src, dst):
        if ".tmp-" in Path(src).name:
            raise OSError(28, "No space left on device")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_fails_for_new_folders)
    with pytest.raises(CheckpointError, match="no space left on the device"):  # a new step next to the old one
        ck.save_checkpoint(folder / "step_0000002", new_model, tokenizer=tok, step=2)
    with pytest.raises(CheckpointError, match="no space left on the device"):  # replacing the old one itself
        ck.save_checkpoint(previous, new_model, tokenizer=tok, step=2)
    assert sorted(p.name for p in folder.iterdir()) == ["step_0000001"]  # no half folder, hidden or not

    # A crash at the same point: the temporary folder is never cleaned up.
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(CheckpointError):
        ck.save_checkpoint(folder / "step_0000003", new_model, tokenizer=tok, step=3)
    monkeypatch.undo()
    (leftover,) = [p for p in folder.iterdir() if p.name.startswith(".")]
    assert (leftover / "config.json").is_file()  # fully written, but never renamed into place
    assert ck.list_checkpoints(folder) == [previous]
    with pytest.raises(CheckpointError, match="unfinished save"):
        ck.read_checkpoint(leftover)

    loaded = ck.read_checkpoint(previous)
    assert loaded.meta["step"] == 1
    restored, _ = ck.model_from_checkpoint(previous)
    torch.testing.assert_close(logits(restored, ids), expected, rtol=0, atol=0)


def test_a_save_that_fills_the_disk_says_so_though_removing_it_frees_the_disk(tmp_path, tok, monkeypatch):
    """torch.save on a full disk says only "unexpected pos …": the disk is asked why, and it was asked after the
    half-written folder was removed, when the disk was no longer full (12 MB tmpfs: the raw torch error shown)."""
    import core.checkpoint.folders as folders

    def torch_save_on_a_full_disk(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 7163776 vs 7163664")

    def disk_full_while_the_half_folder_exists(exc, where):
        half = [p for p in Path(where).iterdir() if p.name.startswith(".") and ".tmp-" in p.name]
        return "the disk is full (512 bytes free)" if half else f"{type(exc).__name__}: {exc}"

    monkeypatch.setattr(folders, "why_write_failed", disk_full_while_the_half_folder_exists)
    monkeypatch.setattr(torch, "save", torch_save_on_a_full_disk)
    with pytest.raises(CheckpointError, match=r"the disk is full \(512 bytes free\)$"):
        ck.save_checkpoint(tmp_path / "step_0000001", make_model(0), tokenizer=tok, step=1,
                           trainer_state={"step": 1})
    assert list(tmp_path.iterdir()) == []  # and the half folder is gone


def test_save_replaces_an_old_checkpoint_but_never_other_folders(tmp_path, tok):
    target = tmp_path / "ckpt"
    ck.save_checkpoint(target, make_model(0), tokenizer=tok, step=1)
    ck.save_checkpoint(target, make_model(1), tokenizer=tok, step=2)  # e.g. "save to …" twice
    assert ck.read_checkpoint(target).meta["step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]

    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.txt").write_text("years of work")
    with pytest.raises(CheckpointError, match="not a Speedboard checkpoint"):
        ck.save_checkpoint(precious, make_model(0), tokenizer=tok)
    assert [p.name for p in precious.iterdir()] == ["chapter1.txt"]
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    with pytest.raises(CheckpointError, match="a file of that name exists"):
        ck.save_checkpoint(a_file, make_model(0), tokenizer=tok)
    assert a_file.read_text() == "keep me"

    # A checkpoint with the user's own files beside it: replacing the folder deleted them.
    (target / "notes.txt").write_text("mine")
    (target / "eval").mkdir()
    (target / "eval" / "results.csv").write_text("0.5")
    with pytest.raises(CheckpointError, match=r"other files that replacing it would delete \(eval, notes.txt\)"):
        ck.save_checkpoint(target, make_model(0), tokenizer=tok)
    assert (target / "notes.txt").read_text() == "mine" and (target / "eval" / "results.csv").read_text() == "0.5"
    assert ck.read_checkpoint(target).meta["step"] == 2
    looks_like_one = tmp_path / "looks"  # a config.json that says "checkpoint", and nothing of one
    looks_like_one.mkdir()
    (looks_like_one / "config.json").write_text('{"format": "speedboard-checkpoint"}')
    (looks_like_one / "thesis.tex").write_text("years of work")
    with pytest.raises(CheckpointError, match=r"would delete \(thesis.tex\)"):
        ck.save_checkpoint(looks_like_one, make_model(0), tokenizer=tok)
    assert (looks_like_one / "thesis.tex").read_text() == "years of work"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_called_config_json_is_not_read(tmp_path):
    """Asking whether a folder holds a checkpoint read its config.json: a named pipe of that name blocked the
    dashboard's window until something wrote to it."""
    folder = tmp_path / "odd"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    assert not ck.is_speedboard_checkpoint(folder)  # returns: a blocked read would hang the test (timeout)
    assert "not a Speedboard checkpoint" in ck.replace_problem(folder)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX links and permissions")
def test_a_folder_written_keeps_its_link_its_mode_and_its_place(tmp_path, tok, monkeypatch):
    """An empty folder made for an export was swapped for a new one: a link to it became a real folder (the one
    it named left empty), a private 0700 folder came back 0755, and a shell standing in it was left in a
    deleted folder. A checkpoint replaced keeps the replaced folder's mode."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    ck.save_checkpoint(tmp_path / "link", make_model(0), tokenizer=tok, step=1)
    assert (tmp_path / "link").is_symlink() and ck.read_checkpoint(real).meta["step"] == 1

    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    inode = private.stat().st_ino
    monkeypatch.chdir(private)
    ck.save_checkpoint(Path("."), make_model(0), tokenizer=tok, step=2)
    assert (private.stat().st_ino, private.stat().st_mode & 0o777) == (inode, 0o700)  # the same folder, filled
    assert ck.read_checkpoint(private).meta["step"] == 2
    ck.save_checkpoint(private, make_model(1), tokenizer=tok, step=3)  # replaced (not empty): the mode stays
    assert private.stat().st_mode & 0o777 == 0o700 and ck.read_checkpoint(private).meta["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "private", "real"]


@pytest.mark.parametrize("made_empty", [False, True])
def test_an_export_never_replaces_what_another_writer_put_there_meanwhile(made_empty, tmp_path):
    """Two exports to one folder at once both said "exported to OUT", and OUT held only one of them: each had
    found it absent (or empty) before writing, and the later rename swapped the earlier export away."""
    from core.checkpoint.folders import AtomicFolder

    target = tmp_path / "out"
    if made_empty:
        target.mkdir()
    with pytest.raises(CheckpointError, match=f"^export folder {target} exists and is not empty$"):
        with AtomicFolder(target, "export", replace=False) as tmp:
            (tmp / "config.json").write_text("mine")
            target.mkdir(exist_ok=True)  # the other export, finished first
            (target / "config.json").write_text("theirs")
    assert (target / "config.json").read_text() == "theirs" and [p.name for p in target.iterdir()] == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no hidden folder left beside it


def test_a_crash_while_filling_an_empty_folder_leaves_no_folder_a_loader_takes(tmp_path, tok, monkeypatch):
    """Files go in one by one, config.json last: before it, the folder is no checkpoint to any loader."""
    import core.checkpoint.folders as folders

    target = tmp_path / "ckpt"
    target.mkdir()
    moved: list[str] = []
    real_rename = os.rename

    def rename(src, dst):
        if Path(dst).parent == target:
            moved.append(Path(dst).name)
            if len(moved) == 2:
                raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(folders.os, "rename", rename)
    with pytest.raises(CheckpointError, match="cannot write the checkpoint"):
        ck.save_checkpoint(target, make_model(0), tokenizer=tok)
    assert "config.json" not in moved and not (target / "config.json").exists()
    with pytest.raises(CheckpointError):
        ck.read_checkpoint(target)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no hidden folder left beside it


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_every_checkpoint_file_gets_the_same_mode_under_the_umask(micro, tmp_path, tok, umask):
    """model.safetensors was 0600 while the rest was 0644: a checkpoint copied or shared lost its weights.
    The trainer's checkpoints (what the CLI and the dashboard write), an explicit save and an export alike; and
    the run folder's own files (metrics.jsonl was 0644 under a group-writable umask)."""
    from core.trainer import train

    before = os.umask(umask)
    try:
        result = train(micro(train={"budget": 2}))
        saved = ck.save_checkpoint(tmp_path / "saved", make_model(0), tokenizer=tok, step=1)
        exported = ck.export_hf(saved, tmp_path / "exported")
    finally:
        os.umask(before)
    expected = 0o666 & ~umask
    for folder in (result.checkpoint, saved, exported):
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}
        assert "model.safetensors" in modes and set(modes.values()) == {oct(expected)}, (folder, modes)
        assert not (folder / ".mode-probe").exists()
    run_files = {p.name: oct(p.stat().st_mode & 0o777) for p in result.run_dir.iterdir() if p.is_file()}
    assert "metrics.jsonl" in run_files and set(run_files.values()) == {oct(expected)}, run_files


# --------------------------------------------------------------------------- bad input: all or nothing
def _good_folder(tmp_path: Path, tok, **model_changes) -> Path:
    return ck.save_checkpoint(tmp_path / f"good{len(list(tmp_path.iterdir()))}", make_model(7, **model_changes),
                              tokenizer=tok)


def _edit_config(folder: Path, checksum: bool = False, **changes) -> None:
    """Edit a checkpoint's config.json as an older Speedboard wrote it (without its own checksum), or, with
    ``checksum``, keep the saved checksum (now wrong)."""
    meta = json.loads((folder / "config.json").read_text())
    meta.update(changes)
    if not checksum:
        meta.pop(ck.CONFIG_CHECKSUM)
        meta.setdefault("format_version", 1) if "format_version" in changes else meta.update(format_version=1)
    (folder / "config.json").write_text(json.dumps(meta))


def _bad(kind: str, tmp_path: Path, tok) -> Path:
    """Build one kind of bad checkpoint under ``tmp_path`` and return its path."""
    if kind == "missing":
        return tmp_path / "nowhere"
    if kind == "link_loop":  # said as "does not exist" though the link was there to see
        (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
        (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
        return tmp_path / "loop_a"
    if kind == "broken_link":
        (tmp_path / "latest").symlink_to(tmp_path / "step_0000010")
        return tmp_path / "latest"
    if kind == "truncated_weights_in_folder":
        folder = _good_folder(tmp_path, tok)
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        return folder
    if kind == "truncated_weights_unrecorded":  # an older folder without size/sha256 records
        folder = _good_folder(tmp_path, tok)
        _edit_config(folder, files={})
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        return folder
    if kind == "corrupted_weights":  # same size, flipped bytes: only the checksum can tell
        folder = _good_folder(tmp_path, tok)
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[-64:] = bytes(b ^ 0xFF for b in data[-64:])
        (folder / "model.safetensors").write_bytes(bytes(data))
        return folder
    if kind == "truncated_pt":
        path = tmp_path / "weights.pt"
        torch.save(make_model(7).state_dict(), path)
        path.write_bytes(path.read_bytes()[:1000])
        return path
    if kind == "empty_pt":
        path = tmp_path / "weights.pth"
        path.write_bytes(b"")
        return path
    if kind == "text_as_pt":
        path = tmp_path / "weights.pt"
        path.write_text("these are not weights")
        return path
    if kind == "garbage_safetensors":
        path = tmp_path / "weights.safetensors"
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
        return path
    if kind == "unsupported_file":
        path = tmp_path / "notes.txt"
        path.write_text("hello")
        return path
    if kind == "tokenizer_config_edited":
        folder = _good_folder(tmp_path, tok)
        cfg = folder / "tokenizer_config.json"
        cfg.write_text(cfg.read_text().replace('"bos_token"', '"bos_tokeN"'))  # same size, other content
        return folder
    if kind == "record_outside_folder":
        folder = _good_folder(tmp_path, tok)
        meta = json.loads((folder / "config.json").read_text())
        _edit_config(folder, files={**meta["files"], "../x": {"bytes": 1}})
        return folder
    if kind in ("meta_tensor_pt", "sparse_tensor_pt", "int_key_pt"):
        state = dict(make_model(7).state_dict())
        norm = state.pop("model.norm.weight")  # the last one copied
        if kind == "int_key_pt":
            state[1] = norm
        else:
            state["model.norm.weight"] = norm.to("meta") if kind == "meta_tensor_pt" else norm.to_sparse()
        path = tmp_path / "last.pt"
        torch.save(state, path)
        return path
    if kind == "pt_without_state_dict":
        path = tmp_path / "numbers.pt"
        torch.save({"step": 3, "loss": 1.5}, path)
        return path
    if kind == "folder_without_config":
        folder = tmp_path / "empty_folder"
        folder.mkdir()
        return folder
    if kind in ("config_is_a_folder", "config_is_a_fifo"):  # read neither as "no config.json" nor by blocking
        folder = tmp_path / "odd_config"
        folder.mkdir()
        if kind == "config_is_a_folder":
            (folder / "config.json").mkdir()
        else:
            os.mkfifo(folder / "config.json")
        return folder
    removed = {"folder_missing_weights": "model.safetensors", "folder_missing_tokenizer": "tokenizer.json",
               "tokenizer_config_missing": "tokenizer_config.json"}
    if kind in removed:
        folder = _good_folder(tmp_path, tok)
        (folder / removed[kind]).unlink()
        return folder
    if kind in ("weights_are_a_folder", "tokenizer_is_a_fifo"):  # there, and the wrong kind: not "missing"
        folder = _good_folder(tmp_path, tok)
        if kind == "weights_are_a_folder":
            (folder / "model.safetensors").unlink()
            (folder / "model.safetensors").mkdir()
        else:
            (folder / "tokenizer.json").unlink()
            os.mkfifo(folder / "tokenizer.json")
        return folder
    if kind == "config_not_json":
        folder = _good_folder(tmp_path, tok)
        (folder / "config.json").write_text("{ truncated")
        return folder
    if kind == "unknown_folder_config":
        folder = tmp_path / "other"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
        return folder
    if kind == "newer_format":
        folder = _good_folder(tmp_path, tok)
        _edit_config(folder, format_version=ck.FORMAT_VERSION + 1)
        return folder
    if kind == "architecture_mismatch":
        return _good_folder(tmp_path, tok, hidden_size=64, num_heads=8, num_kv_heads=4)
    if kind == "architecture_mismatch_state_dict":
        path = tmp_path / "wider_mlp.pt"
        torch.save(make_model(7, intermediate_size=96).state_dict(), path)
        return path
    if kind == "missing_keys":
        path = tmp_path / "partial.pt"
        state = make_model(7).state_dict()
        del state["model.layers.1.mlp.up_proj.weight"], state["model.norm.weight"]
        torch.save(state, path)
        return path
    if kind == "unexpected_keys":
        path = tmp_path / "deeper.safetensors"
        save_file(make_model(7, num_layers=3).state_dict(), str(path))
        return path
    if kind == "float8_weights":
        path = tmp_path / "fp8.safetensors"
        save_file({k: v.to(torch.float8_e4m3fn) for k, v in make_model(7).state_dict().items()}, str(path))
        return path
    if kind in ("hf_zero_heads", "hf_huge_positions", "hf_width_as_text"):
        folder = tmp_path / kind
        folder.mkdir()
        hf = make_model(0).config.to_hf_dict()
        if kind == "hf_zero_heads":
            hf.pop("head_dim", None)
            hf["num_attention_heads"] = 0  # hidden_size // heads: a ZeroDivisionError's traceback
        elif kind == "hf_width_as_text":
            hf["hidden_size"] = "32"  # was "head_dim × num_attention_heads must equal hidden_size"
        else:
            hf["max_position_embeddings"] = 10**12  # rotary tables of 4 TB
        (folder / "config.json").write_text(json.dumps(hf))
        save_file(make_model(7).state_dict(), str(folder / "model.safetensors"))
        return folder
    if kind == "non_float_weights":
        path = tmp_path / "ints.pt"
        torch.save({k: v.to(torch.int32) for k, v in make_model(7).state_dict().items()}, path)
        return path
    if kind == "tokenizer_too_large":
        return _good_folder(tmp_path, tok, vocab_size=tok.vocab_size - 10)
    if kind == "shapeless_config_mismatch":  # same shapes, different math
        return _good_folder(tmp_path, tok, rope_theta=500_000.0)
    if kind == "own_head_into_tied_model":
        path = tmp_path / "untied.pt"
        torch.save(make_model(7).state_dict(), path)
        return path
    if kind == "config_edited":  # one setting changed by hand, the saved checksum kept: other maths
        folder = _good_folder(tmp_path, tok)
        text = (folder / "config.json").read_text()
        assert '"rope_theta": 10000.0' in text
        (folder / "config.json").write_text(text.replace('"rope_theta": 10000.0', '"rope_theta": 10001.0'))
        return folder
    if kind == "config_copies_disagree":  # an older folder (no checksum) whose two model copies differ
        folder = ck.save_checkpoint(tmp_path / "two_copies", make_model(7), tokenizer=tok,
                                    run_config={"model": make_model(7).config.to_dict()})
        meta = json.loads((folder / "config.json").read_text())
        _edit_config(folder, model={**meta["model"], "rms_norm_eps": 1e-6})
        return folder
    if kind == "files_not_a_mapping":
        folder = _good_folder(tmp_path, tok)
        _edit_config(folder, files=[1])
        return folder
    if kind == "random_bytes_pt":
        path = tmp_path / "weights.pt"
        path.write_bytes(bytes(torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0),
                                             dtype=torch.uint8).tolist()))
        return path
    if kind == "raw_pickle":  # pickle.dump of a state dict: not what torch.save writes
        path = tmp_path / "weights.pt"
        path.write_bytes(pickle.dumps(make_model(7).state_dict(), protocol=4))
        return path
    if kind in ("hf_index_outside", "hf_index_absolute"):
        folder = tmp_path / "hf_sharded"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(make_model(0).config.to_hf_dict()))
        outside = tmp_path / "elsewhere.safetensors"
        save_file(make_model(7).state_dict(), str(outside))
        shard = "../elsewhere.safetensors" if kind == "hf_index_outside" else str(outside)
        weight_map = {k: shard for k in make_model(7).state_dict()}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return folder
    if kind in ("hf_shard_key_twice", "hf_shard_key_missing"):
        # Two shards; the index places every key once. "twice": the second shard also holds the first key (zeros),
        # which was read last and loaded without a word; "missing": the first shard lacks a key placed in it.
        folder = tmp_path / "hf_sharded"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(make_model(0).config.to_hf_dict()))
        state = make_model(7).state_dict()
        keys = list(state)
        first, second = {k: state[k] for k in keys[:10]}, {k: state[k] for k in keys[10:]}
        if kind == "hf_shard_key_twice":
            second[keys[0]] = torch.zeros_like(state[keys[0]])
        else:
            del first[keys[1]]
        save_file(first, str(folder / "model-00001-of-00002.safetensors"))
        save_file(second, str(folder / "model-00002-of-00002.safetensors"))
        weight_map = {k: "model-00001-of-00002.safetensors" if i < 10 else "model-00002-of-00002.safetensors"
                      for i, k in enumerate(keys)}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return folder
    raise AssertionError(kind)


BAD_CASES = {
    "missing": "nowhere does not exist",
    "link_loop": "loop_a is a symbolic link that loops back on itself",
    "broken_link": r"latest is a broken symbolic link \(to .*step_0000010, which does not exist\)",
    "truncated_weights_in_folder": "model.safetensors in .* is truncated or damaged",
    "truncated_weights_unrecorded": "model.safetensors is truncated or corrupted",
    "corrupted_weights": "model.safetensors in .* is corrupted: its checksum differs",
    "truncated_pt": "weights.pt is not a PyTorch weights file, or is truncated or corrupted",
    "empty_pt": "weights.pth is not a PyTorch weights file, or is truncated or corrupted",
    "text_as_pt": "weights.pt is not a PyTorch weights file",
    "garbage_safetensors": "weights.safetensors is truncated or corrupted",
    "unsupported_file": r"unsupported checkpoint file notes\.txt: .* or a \.pt/\.pth/\.bin/\.ckpt/\.safetensors "
                        r"state dict",
    "pt_without_state_dict": "numbers.pt does not hold a model state dict",
    "folder_without_config": "is not a checkpoint folder",
    "config_is_a_folder": r"odd_config/config\.json is not a regular file",
    "config_is_a_fifo": r"odd_config/config\.json is not a regular file",
    "folder_missing_weights": "is incomplete: model.safetensors is missing",
    "folder_missing_tokenizer": "is incomplete: tokenizer.json is missing",
    "weights_are_a_folder": "is incomplete: model.safetensors is not a regular file",
    "tokenizer_is_a_fifo": "is incomplete: tokenizer.json is not a regular file",
    "config_not_json": "config.json is not readable JSON",
    "unknown_folder_config": "neither a Speedboard checkpoint nor a Hugging Face Llama folder",
    "newer_format": "written by a newer Speedboard",
    "architecture_mismatch": r"architecture mismatch .*model\.embed_tokens\.weight: expected \(512, 32\), "
                             r"found \(512, 64\)",
    "architecture_mismatch_state_dict": r"architecture mismatch .*model\.layers\.0\.mlp\.gate_proj\.weight: "
                                        r"expected \(64, 32\), found \(96, 32\)",
    "missing_keys": r"missing keys model\.layers\.1\.mlp\.up_proj\.weight, model\.norm\.weight",
    "unexpected_keys": r"unexpected keys model\.layers\.2\.",
    "non_float_weights": "non-float tensors",
    "float8_weights": r"holds quantized weights \(.*float8_e4m3fn.*dequantize them first",
    "hf_zero_heads": "num_attention_heads must be a positive integer, got 0",
    "hf_width_as_text": "hidden_size must be a positive integer, got '32'",
    "hf_huge_positions": "max_position_embeddings",
    "tokenizer_too_large": r"the tokenizer has \d+ tokens but the model's embedding has only \d+ rows",
    "shapeless_config_mismatch": "architecture mismatch .*rope_theta: expected 10000.0, found 500000.0",
    "own_head_into_tied_model": "has its own output head",
    "config_edited": r"config\.json was changed after it was saved \(its checksum differs\)",
    "config_copies_disagree": r"config\.json holds two different model settings",
    "files_not_a_mapping": r"config\.json has an invalid record of its files",
    "random_bytes_pt": r"weights\.pt is not a PyTorch weights file, or is truncated or corrupted",
    "raw_pickle": r"weights\.pt is not a PyTorch weights file.*\(a plain pickle, not a file written by torch\.save\)",
    "hf_index_outside": r"points outside its folder \('\.\./elsewhere\.safetensors'\): refused",
    "hf_index_absolute": r"points outside its folder \('/.*elsewhere\.safetensors'\): refused",
    "hf_shard_key_twice": r"model-00002-of-00002\.safetensors holds model\.embed_tokens\.weight, which the "
                          r"folder's index does not place in it",
    "hf_shard_key_missing": r"the folder's index places .* in model-00001-of-00002\.safetensors, which does not "
                            r"hold it",
    # The last tensor is one no weight can be copied from: 38 of 39 weights were overwritten before it raised.
    "meta_tensor_pt": r"last\.pt holds a tensor no weight can be loaded from: model\.norm\.weight is on the meta "
                      r"device",
    "sparse_tensor_pt": r"last\.pt holds a tensor no weight can be loaded from: model\.norm\.weight is sparse_coo",
    "int_key_pt": r"last\.pt is no model state dict: it names a tensor 1 \(int\), not by text",
    # Its special tokens (BOS/EOS/PAD) are the run's: swapped, a resume trained and exported with them swapped.
    "tokenizer_config_edited": r"tokenizer_config\.json in .* is corrupted: its checksum differs",
    "tokenizer_config_missing": r"is incomplete: tokenizer_config\.json is missing",
    "record_outside_folder": r"records a file outside its folder \('\.\./x'\): refused",
}


@pytest.mark.parametrize("target", ["eager", "compiled"])
@pytest.mark.parametrize("kind", list(BAD_CASES))
def test_bad_checkpoint_gives_one_clear_error_and_changes_nothing(kind, target, tmp_path, tok):
    model = make_model(5, tie_word_embeddings=kind == "own_head_into_tied_model")
    before = params_snapshot(model)
    # torch.compile is lazy: the wrapper is what users hold, and no compile happens here.
    into = torch.compile(model) if target == "compiled" else model
    path = _bad(kind, tmp_path, tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing printed before the one line (torch warns about raw pickles)
        with pytest.raises(CheckpointError, match=BAD_CASES[kind]) as err:
            ck.load_checkpoint(into, path)
    assert isinstance(err.value, ValueError) and isinstance(err.value, SpeedboardError)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400
    assert_unchanged(model, before)


def test_a_checkpoint_in_a_folder_named_in_another_encoding_loads(tmp_path, tok):
    """Saved without complaint, it was "truncated or corrupted" when read: safetensors takes only UTF-8 paths,
    and a folder named in a Latin-1 locale (é as the byte E9) is none."""
    import os

    parent = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9"))
    folder = ck.save_checkpoint(parent / "step_0000001", make_model(7), tokenizer=tok)
    model = make_model(5)
    ck.load_checkpoint(model, folder)
    assert ck.tensor_shapes(folder) == {k: tuple(v.shape) for k, v in ck.read_checkpoint(folder).state_dict.items()}
    assert_unchanged(model, params_snapshot(make_model(7)))
    bare = parent / "weights\udcff.safetensors"  # a bare file of such a name too
    bare.write_bytes((folder / "model.safetensors").read_bytes())
    ck.load_checkpoint(make_model(5), bare)
    # And a PyTorch pickle: its shapes are read through a memory map, whose reader also takes only UTF-8 names
    # (`train --init-from` and the dashboard's Load called the file "not a PyTorch weights file").
    pickled = parent / "weights.pt"
    torch.save(make_model(7).state_dict(), pickled)
    assert ck.tensor_shapes(pickled) == ck.tensor_shapes(folder)
    ck.load_checkpoint(make_model(5), pickled)


def test_malicious_pickle_is_refused_and_never_runs(tmp_path, tok):
    """A pickle whose ``__reduce__`` creates a file: refused, and the file is never created."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    data = pickle.dumps({"model.norm.weight": torch.ones(32), "x": Payload()}, protocol=2)
    pickle.loads(data).get("x").close()  # control: an ordinary unpickler does run it
    assert marker.exists()
    marker.unlink()

    model = make_model(5)
    before = params_snapshot(model)
    bare = tmp_path / "evil.pt"
    bare.write_bytes(data)
    saved = tmp_path / "evil_saved.pth"
    torch.save({"model": {"model.norm.weight": torch.ones(32)}, "extra": Payload()}, saved)
    hf = tmp_path / "hf_folder"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(make_model(0).config.to_hf_dict()))
    shutil.copy(bare, hf / "pytorch_model.bin")
    for path in (bare, saved, hf):
        with pytest.raises(CheckpointError, match="refused to load .*could run code"):
            ck.load_checkpoint(model, path)
        assert not marker.exists()
    with pytest.raises(CheckpointError, match="refused"):
        ck.load_trainer_state(bare)
    assert not marker.exists()
    assert_unchanged(model, before)


# --------------------------------------------------------------------------- the CLI: exit code 2, one line
ALL_COMMANDS = ("export", "init-from", "resume", "generate")


@pytest.mark.parametrize("kind, commands, message", [
    ("truncated_weights_in_folder", ALL_COMMANDS, None),
    ("text_as_pt", ALL_COMMANDS, None),
    ("folder_missing_weights", ALL_COMMANDS, None),
    ("tokenizer_too_large", ALL_COMMANDS, None),
    ("missing", ALL_COMMANDS, None),
    ("link_loop", ALL_COMMANDS, None),
    ("broken_link", ("resume", "generate"), None),
    ("config_edited", ALL_COMMANDS, None),
    ("random_bytes_pt", ("init-from", "resume", "generate"), None),
])
def test_cli_reports_a_bad_checkpoint_in_one_line(kind, commands, message, tmp_path, tok, capsys):
    path = str(_bad(kind, tmp_path, tok))
    out_dir, export_to = tmp_path / "out", tmp_path / "exported"
    # A checkpoint folder brings its tokenizer (--vocab-size beside it is refused); a bare file trains one.
    vocab = [] if Path(path).is_dir() else ["--vocab-size", "512"]
    small = ["--data", str(corpus_file(tmp_path)), *vocab, "--seq-len", "32", "--micro-batch", "2",
             "--steps", "1", "--out", str(out_dir), "--no-progress"]
    argvs = {"export": ["export", path, "--format", "hf", str(export_to)],
             "init-from": ["train", "--init-from", path, *small],
             "resume": ["train", "--resume", path, *small],
             "generate": ["generate", path, "--max-new-tokens", "2"]}
    for command in commands:
        assert main(argvs[command]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("speedboard: error: ") and err.count("\n") == 1, err
        assert re.search(message or BAD_CASES[kind], err), err
    assert not out_dir.exists() and not export_to.exists()  # nothing written, not even a run folder


def test_cli_bad_checkpoint_in_a_real_process_has_no_traceback(tmp_path, tok):
    bad = _bad("corrupted_weights", tmp_path, tok)
    proc = subprocess.run([sys.executable, "-m", "core.cli", "export", str(bad), str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("speedboard: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "checksum differs" in proc.stderr
    assert not (tmp_path / "out").exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # ended and reaped: no process has this id now (ids are not reused at once)


def test_next_save_clears_what_a_crashed_save_left(tmp_path, tok):
    """A crash mid-save leaves hidden folders; the next save of that name removes the temporary one and
    puts a checkpoint moved aside between the two renames back, leaving live processes' folders alone."""
    folder = tmp_path / "checkpoints"
    target = ck.save_checkpoint(folder / "final", make_model(0), tokenizer=tok, step=1)
    dead = _dead_pid()
    # A crash between "old away" and "new in": only the moved-aside checkpoint and a full temporary folder.
    moved = folder / f".final.old-{dead}-abc123"
    os.rename(target, moved)
    crashed_tmp = folder / f".final.tmp-{dead}-def456"
    shutil.copytree(moved, crashed_tmp)
    live_tmp = folder / f".final.tmp-{os.getpid()}-0a0b0c"  # this process's own: never swept
    live_tmp.mkdir()
    other = folder / f".other.tmp-{dead}-111111"  # another checkpoint's leftover: not this save's business
    other.mkdir()

    assert sorted(ck.sweep_leftovers(target)) == sorted([moved, crashed_tmp])
    assert ck.read_checkpoint(target).meta["step"] == 1  # the last good checkpoint is back under its name
    assert sorted(p.name for p in folder.iterdir()) == sorted(["final", live_tmp.name, other.name])

    # Moved aside while a newer save did land: the stale copy is removed, the newer one kept.
    os.rename(shutil.copytree(target, folder / "copy"), folder / f".final.old-{dead}-222222")
    ck.save_checkpoint(target, make_model(1), tokenizer=tok, step=2)
    assert ck.read_checkpoint(target).meta["step"] == 2
    assert sorted(p.name for p in folder.iterdir()) == sorted(["final", live_tmp.name, other.name])


def test_a_name_the_file_system_allows_is_saved_and_its_leftovers_found_again(tmp_path, tok):
    """A folder name of 235-255 bytes was refused ("File name too long"): its hidden temporary sibling, the name
    with ".tmp-PID@HOST-RANDOM" added, went past the file system's 255 bytes."""
    from core.checkpoint.folders import _hidden

    target = tmp_path / ("é" * 120 + "x" * 10)  # 250 bytes
    saved = ck.save_checkpoint(target, make_model(0), tokenizer=tok, step=1)
    assert ck.read_checkpoint(saved).meta["step"] == 1
    dead = _dead_pid()
    # A crash between "old away" and "new in", as the save names it: found by that name's own sweep, put back.
    aside = _hidden(target, "old")
    assert len(aside.name.encode()) < 255
    moved = aside.with_name(aside.name.replace(f"-{os.getpid()}@", f"-{dead}@"))
    os.rename(saved, moved)
    assert ck.sweep_leftovers(target) == [moved] and ck.read_checkpoint(target).meta["step"] == 1


def test_a_bare_state_dict_meets_the_named_presets_model(tmp_path, tok, capsys):
    """``--init-from weights.pt --preset tiny``: the preset's architecture, the vocabulary of the weights'
    embedding; without --preset a state dict whose shapes do not tell the heads asks for one."""
    path = str(_bad("architecture_mismatch_state_dict", tmp_path, tok))
    small = ["--data", str(corpus_file(tmp_path)), "--vocab-size", "300", "--seq-len", "32", "--steps", "1",
             "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(["train", "--init-from", path, "--preset", "tiny", *small]) == 2
    err = capsys.readouterr().err
    assert re.search(r"architecture mismatch .*model\.embed_tokens\.weight: expected \(512, 128\), "
                     r"found \(512, 32\)", err), err
    assert main(["train", "--init-from", path, *small]) == 2
    assert "cannot be read from its tensors; give --preset or --config" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_older_checkpoint_without_a_config_checksum_still_loads(tmp_path, tok):
    folder = _good_folder(tmp_path, tok)
    assert ck.CONFIG_CHECKSUM in json.loads((folder / "config.json").read_text())
    _edit_config(folder)  # as written before config.json carried its checksum
    model = make_model(0)
    ck.load_checkpoint(model, folder)
    torch.testing.assert_close(logits(model, input_ids()), logits(make_model(7), input_ids()), rtol=0, atol=0)


def test_a_current_checkpoint_whose_config_lost_its_checksum_is_refused(tmp_path, tok):
    """Deleting the checksum must not turn an edited config.json (here another RoPE base) into an older
    checkpoint that loads unchecked: only format 1 was written without one."""
    folder = _good_folder(tmp_path, tok)
    meta = json.loads((folder / "config.json").read_text())
    assert meta["format_version"] == ck.FORMAT_VERSION >= 2
    meta.pop(ck.CONFIG_CHECKSUM)
    meta["model"]["rope_theta"] = 10001.0
    (folder / "config.json").write_text(json.dumps(meta))
    model = make_model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="lost its checksum"):
        ck.load_checkpoint(model, folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_verify_checkpoint_reads_every_file_against_its_record_and_loads_nothing(tmp_path, tok):
    good = _good_folder(tmp_path, tok)
    ck.verify_checkpoint(good)  # intact: silent
    for kind in ("corrupted_weights", "truncated_weights_in_folder", "folder_missing_tokenizer"):
        with pytest.raises(CheckpointError, match=BAD_CASES[kind]):
            ck.verify_checkpoint(_bad(kind, tmp_path, tok))
    tokenizer = _good_folder(tmp_path, tok) / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"', "'", 1))  # same size, other bytes
    with pytest.raises(CheckpointError, match="tokenizer.json in .* is corrupted: its checksum differs"):
        ck.verify_checkpoint(tokenizer.parent)
    bare = tmp_path / "weights.pt"
    torch.save(make_model(7).state_dict(), bare)
    ck.verify_checkpoint(bare)  # other formats record no checksums: nothing to compare


def test_a_config_json_of_pathological_json_is_one_error(micro):
    from core.trainer import train

    result = train(micro(train={"budget": 1}))
    meta = result.run_dir / "checkpoints" / "step_0000001" / "config.json"
    for text in ("[" * 100_000 + "]" * 100_000, '{"step": ' + "9" * 5000 + "}"):
        meta.write_text(text)
        with pytest.raises(CheckpointError):
            ck.read_checkpoint(result.run_dir)


def _other_volume(monkeypatch, target: Path, full_after: int | None = None) -> None:
    """``target`` as the mount point of a volume of its own: a rename into it from beside it is EXDEV (and with
    ``full_after``, the copy of the file after that many fails as a full volume's would)."""
    import errno

    import core.checkpoint.folders as folders

    rename, copyfile = os.rename, folders.shutil.copyfile
    copied = []

    def cross_device(src, dst, *args, **kwargs):
        if Path(dst).parent == target and Path(src).parent != target:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(src, dst, *args, **kwargs)

    def filling(src, dst, *args, **kwargs):
        if full_after is not None and len(copied) >= full_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        copied.append(dst)
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(folders.os, "rename", cross_device)
    monkeypatch.setattr(folders.shutil, "copyfile", filling)


def test_an_empty_mounted_volume_is_filled_in_place(tmp_path, tok, monkeypatch):
    """`speedboard export CKPT /mnt/empty-volume`: "Invalid cross-device link", because the files staged beside
    the folder, on the parent's file system, were renamed into it."""
    target = tmp_path / "volume"
    target.mkdir()
    _other_volume(monkeypatch, target)
    ck.save_checkpoint(target, make_model(0), tokenizer=tok, step=2)
    monkeypatch.undo()
    assert ck.read_checkpoint(target).meta["step"] == 2
    assert not [p.name for p in target.iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["volume"]  # nothing staged left beside it


def test_a_volume_that_fills_up_part_way_is_left_empty(tmp_path, tok, monkeypatch):
    target = tmp_path / "volume"
    target.mkdir()
    _other_volume(monkeypatch, target, full_after=1)
    with pytest.raises(CheckpointError, match="cannot write the checkpoint to"):
        ck.save_checkpoint(target, make_model(0), tokenizer=tok, step=2)
    monkeypatch.undo()
    assert list(target.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["volume"]
