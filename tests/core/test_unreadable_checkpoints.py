"""Checkpoints this user may not read: one line naming the file and "Permission denied", never a traceback,
never "missing", "corrupted" or "holds no checkpoint yet" (Python 3.11's ``Path.is_file`` raises on EACCES, and
safetensors and torch.load call an unreadable file missing)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import checkpoint as ck
from tests.core.checkpoint_helpers import make_model, make_tokenizer

ROOT = Path(__file__).resolve().parents[2]
READ = """
import json, sys
from core.checkpoint import read_checkpoint, tensor_shapes
from core.errors import CheckpointError
out = {}
for path in sys.argv[1:]:
    for name, read in (("read", read_checkpoint), ("shapes", tensor_shapes)):
        try:
            read(path)
            out[f"{name} {path}"] = "read"
        except CheckpointError as exc:
            out[f"{name} {path}"] = str(exc)
print(json.dumps(out))
"""


def as_a_user(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` run as a user whom file permissions bind: root keeps its uid but loses the capabilities that
    let it read any file."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: permissions cannot be made to bind")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    return subprocess.run([*prefix, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})


@pytest.fixture
def unreadable(tmp_path):
    """What each case points at, and the path in it that no one may read: a run whose checkpoints/ cannot be
    listed, a checkpoint folder that cannot be opened, one whose weights cannot be read, a sharded Hugging Face
    folder with an unreadable shard, and a state-dict file."""
    tok = make_tokenizer()
    run = tmp_path / "run"
    ck.save_checkpoint(run / "checkpoints" / "step_0000001", make_model(1), tokenizer=tok)
    closed = ck.save_checkpoint(tmp_path / "closed", make_model(1), tokenizer=tok)
    weights = ck.save_checkpoint(tmp_path / "weights", make_model(1), tokenizer=tok)
    shards = ck.export_hf(closed, tmp_path / "shards")
    state = load_file(shards / "model.safetensors")
    (shards / "model.safetensors").unlink()
    keys = sorted(state)
    placed = {k: "a.safetensors" if i < len(keys) // 2 else "b.safetensors" for i, k in enumerate(keys)}
    for name in ("a.safetensors", "b.safetensors"):
        save_file({k: state[k] for k in keys if placed[k] == name}, shards / name)
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": placed}))
    pt = tmp_path / "model.pt"
    torch.save(make_model(1).state_dict(), pt)
    cases = {run: run / "checkpoints", closed: closed, weights: weights / "model.safetensors", pt: pt,
             shards: shards / "b.safetensors"}
    for locked in cases.values():
        locked.chmod(0)
    yield cases
    for locked in cases.values():
        locked.chmod(0o700)


def test_an_unreadable_checkpoint_is_one_line_naming_what_cannot_be_read(unreadable):
    result = as_a_user([sys.executable, "-c", READ, *map(str, unreadable)])
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    for target, locked in unreadable.items():
        for reader in ("read", "shapes"):
            message = said[f"{reader} {target}"]
            assert message.startswith(f"cannot read {locked}") and message.endswith("Permission denied"), message


def test_the_command_line_says_it_in_one_line_with_exit_code_2(unreadable, tmp_path):
    closed = next(target for target in unreadable if target.name == "closed")
    result = as_a_user([sys.executable, "-m", "core.cli", "generate", str(closed), "--max-new-tokens", "2"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"speedboard: error: cannot read {closed}/config.json: "
                                                  f"Permission denied"], result.stderr


REPLACE = """
import os, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())  # the checkout, for its test helpers
from core.checkpoint import save_checkpoint
from tests.core.checkpoint_helpers import make_model, make_tokenizer
save_checkpoint(Path(sys.argv[1]), make_model(2), tokenizer=make_tokenizer())
"""


def test_replacing_a_read_only_checkpoint_leaves_no_hidden_copy(tmp_path):
    """Its folder (mode 0555) was renamed aside and could not be emptied: a full hidden ``.NAME.old-…`` copy
    stayed beside the new checkpoint without a word."""
    folder = ck.save_checkpoint(tmp_path / "ck", make_model(1), tokenizer=make_tokenizer())
    folder.chmod(0o555)
    try:
        result = as_a_user([sys.executable, "-c", REPLACE, str(folder)])
        assert result.returncode == 0, result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
        assert ck.read_checkpoint(folder).state_dict.keys() == make_model(2).state_dict().keys()
    finally:
        folder.chmod(0o755)


def test_an_unreadable_config_json_is_said_as_unreadable_not_as_damaged_json(tmp_path):
    folder = ck.save_checkpoint(tmp_path / "ck", make_model(1), tokenizer=make_tokenizer())
    (folder / "config.json").chmod(0)
    result = as_a_user([sys.executable, "-c", READ, str(folder)])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[f"read {folder}"] == f"cannot read {folder}/config.json: Permission denied"
