"""A compiled run next to an eager one: speedup column, compile time, saving a compiled model."""

from __future__ import annotations

import pytest
from safetensors import safe_open

from tests.gui.conftest import child, click, read_jsonl, run_once, wait_idle


@pytest.mark.slow
def test_eager_then_compiled_with_accumulation_and_save_while_compiled(qtbot, window, dialogs, tmp_path):
    eager = run_once(qtbot, window)

    mode = child(window, "compileModeCombo")
    mode.setCurrentIndex(mode.findData("default"))
    child(window, "accumStepsSpin").setValue(2)
    target = tmp_path / "compiled-save"
    dialogs.files["ask_save_target"] = str(target)
    click(window, "startButton")
    compiled = window.session.records[-1]
    # Save while the compiled model trains: served at the next optimizer step (or right after the run).
    qtbot.waitUntil(lambda: compiled.step >= 1, timeout=300_000)
    click(window, "saveButton")
    wait_idle(qtbot, window, timeout=300_000)
    qtbot.waitUntil(lambda: window.session.pending_save is None, timeout=60_000)

    assert compiled.state == "finished", compiled.message
    assert not dialogs.warnings()
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in keys
    assert not any("_orig_mod" in k for k in keys)

    events = read_jsonl(compiled.folder)
    kinds = [e["event"] for e in events]
    assert "compile_started" in kinds
    compile_done = next(e for e in events if e["event"] == "compile_finished")
    table = child(window, "runTable")
    assert table.rowCount() == 2
    if compile_done["fallback"]:  # no working compiler here: shown, never hidden
        assert table.item(1, table.column("Compile s")).text() == "fallback"
    else:
        assert table.item(1, table.column("Compile s")).text() == f"{compile_done['seconds']:.1f}"
        window.plots.refresh()
        assert child(window, "throughputPlot").region(compiled.key) is not None
    assert table.item(1, table.column("Compile")).text() == "default (model)"
    tps = [read_jsonl(r.folder)[-1]["median_tokens_per_s"] for r in (eager, compiled)]
    assert table.item(1, table.column("Speedup")).text().startswith(f"{tps[1] / tps[0]:.2f}×")
