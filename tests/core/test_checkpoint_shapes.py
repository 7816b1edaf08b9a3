"""Tensor names and shapes of a checkpoint, read cheaply (safetensors: the header only)."""

from __future__ import annotations

import pytest

from core import checkpoint as ck
from core.checkpoint import read as ck_read
from core.checkpoint.read import tensor_shapes
from core.errors import CheckpointError
from tests.core.checkpoint_helpers import make_model
from tests.core.test_checkpoint_formats import FORMATS, build, process_group  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("fmt", FORMATS)
def test_shapes_are_what_a_full_read_finds(fmt, tmp_path, tok, process_group):  # noqa: F811
    path, _ = build(fmt, tmp_path, tok)
    full = ck.read_checkpoint(path).state_dict
    shapes = tensor_shapes(path)
    assert shapes == {k: tuple(v.shape) for k, v in full.items()}
    assert not any("_orig_mod" in k or k.startswith("module.") for k in shapes)


def test_a_safetensors_checkpoint_is_read_by_its_header_alone(tmp_path, tok, monkeypatch):
    model = make_model(1)
    path = ck.save_checkpoint(tmp_path / "ckpt", model, tokenizer=tok)

    def no_tensor_data(*args, **kwargs):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(ck_read, "load_file", no_tensor_data)
    shapes = tensor_shapes(path)
    assert shapes["model.embed_tokens.weight"] == tuple(model.model.embed_tokens.weight.shape)
    assert set(shapes) == set(ck.model_state_dict(model))


def test_a_run_folder_means_its_newest_checkpoint(tmp_path, tok):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    ck.save_checkpoint(run / "checkpoints" / "step_0000001", make_model(1), tokenizer=tok, step=1)
    ck.save_checkpoint(run / "checkpoints" / "step_0000002", make_model(2, num_layers=1), tokenizer=tok, step=2)
    shapes = tensor_shapes(run)
    assert "model.layers.0.mlp.up_proj.weight" in shapes and "model.layers.1.mlp.up_proj.weight" not in shapes


def test_damaged_or_foreign_files_are_one_line_errors(tmp_path, tok):
    path = ck.save_checkpoint(tmp_path / "ckpt", make_model(1), tokenizer=tok)
    weights = path / ck.WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        tensor_shapes(path)
    (path / ck.WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        tensor_shapes(path)
    garbage = tmp_path / "weights.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="weights.pt"):
        tensor_shapes(garbage)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="unsupported"):
        tensor_shapes(tmp_path / "notes.txt")


@pytest.mark.parametrize("changes, words", [
    ({}, None),
    ({"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2}, "architecture mismatch"),
    ({"intermediate_size": 96}, "mlp.gate_proj.weight: expected (96, 32), found (64, 32)"),
    ({"num_layers": 3}, "missing keys model.layers.2."),
    ({"vocab_size": 600}, "model.embed_tokens.weight: expected (600, 32), found (512, 32)"),
])
def test_shape_problem_says_before_loading_what_check_compatible_says_when_loading(changes, words, tmp_path, tok):
    """The fit is checked from the file's shapes alone, naming the first differing keys and shapes."""
    from tests.core.checkpoint_helpers import micro_model_config

    path = ck.save_checkpoint(tmp_path / "ckpt", make_model(1), tokenizer=tok)
    target = micro_model_config(**changes)
    problem = ck.shape_problem(target, tensor_shapes(path), "ckpt")
    loaded = ck.read_checkpoint(path).state_dict
    if words is None:
        assert problem is None
        ck.check_compatible(make_model(2, **changes), loaded, "ckpt")
        return
    assert problem is not None and words in problem, problem
    with pytest.raises(CheckpointError):
        ck.check_compatible(make_model(2, **changes), loaded, "ckpt")


def test_model_shapes_are_those_of_a_built_model():
    from tests.core.checkpoint_helpers import micro_model_config

    model = make_model(0)
    expected = {k: tuple(v.shape) for k, v in ck.model_state_dict(model).items()}
    assert ck.model_shapes(micro_model_config()) == expected
