"""``speedboard bench`` end to end on the tiny preset, eager cells, one timed step: the output's shape."""

from __future__ import annotations

import json

import pytest

from speedboard.cli import main


def test_bench_rejects_bad_options_in_one_line(capsys, tmp_path):
    assert main(["bench", "--cells", "nothing-*", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "matches no cell" in err
    assert main(["bench", "--effective-batch", "6"]) == 2
    assert "not divisible" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_bench_writes_json_markdown_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("transformers")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--effective-batch", "4", "--accum", "1,2", "--precision", "fp32,bf16",
                 "--out", str(out)]) == 0

    raw = json.loads((out / "bench.json").read_text())
    assert raw["config"]["preset"] == "tiny" and raw["device"]["type"] == "cpu"
    assert {"torch", "transformers"} <= raw["versions"].keys()
    names = [c["name"] for c in raw["cells"]]
    # The last three: memory only (first precision).
    assert names == ["off-a1-fp32", "off-a2-fp32", "off-a1-bf16", "off-a2-bf16", "off-a1-fp32-mb2",
                     "off-a2-fp32-mb4", "off-a1-fp32-mb8"]
    # Every timed cell by the trainer and the bare loop; HF where it is compared (eager, no accumulation, fp32).
    assert sorted((r["cell"], r["runner"]) for r in raw["runs"]) == sorted(
        [("off-a1-fp32", "hf")] + [(f"off-a{k}-{p}", runner) for k in (1, 2) for p in ("fp32", "bf16")
                                   for runner in ("speedboard", "bare")])
    assert set(raw["matmul_peak"]["flops"]) == {"fp32", "bf16"} and min(raw["matmul_peak"]["flops"].values()) > 0
    assert raw["flops_per_token"] > 0

    summary = raw["summary"]
    a1, a2 = summary["cells"]["off-a1-fp32"], summary["cells"]["off-a2-fp32"]
    assert summary["cells"]["off-a1-bf16"]["mfu"] > 0  # against bf16's own peak
    assert a1["speedup_vs_eager_a1"] == pytest.approx(1.0)
    for row in (a1, a2):
        assert row["speedboard"]["median"] > 0 and row["bare"]["median"] > 0
        assert 0 < row["mfu"] and row["trainer_vs_bare"] > 0
        assert 0 < row["train_mem_gib"] < row["peak_gib"]
    assert a1["ours_vs_hf"] > 0
    assert 0 <= a1["bookkeeping_share"] < 0.5  # the Trainer's loop outside its own timed step
    assert [(m["micro_batch"], m["accum"], m["plain_batch"]) for m in summary["memory"]] == [(2, 2, 4), (4, 2, 8)]
    for m in summary["memory"]:
        # The shape only: at this micro size the gap between the peaks is within the allocator's noise
        # (docs/benchmarks.md holds the small-preset measurement of the promise).
        assert m["plain_train_gib"] > 0 and m["micro_train_gib"] > 0 and m["accum_train_gib"] > 0
        assert m["extra_gib"] == pytest.approx(m["accum_train_gib"] - m["micro_train_gib"])
        # The gradients that accumulation keeps between micro-steps: fp32, one per parameter.
        assert m["grad_gib"] == pytest.approx(raw["config"]["num_parameters"] * 4 / 1024**3)
    # Same weights, same batches: the same loss everywhere, within each precision's tolerance.
    assert summary["loss"]["agree"], summary["loss"]
    assert summary["loss"]["per_precision"]["bf16"]["tolerance"] == pytest.approx(3e-2)
    assert {t["target"] for t in summary["targets"]} >= {"final losses agree across all runs, fp32",
                                                         "final losses agree across all runs, bf16",
                                                         "bf16 loss vs fp32 loss"}

    md = (out / "bench.md").read_text()
    assert "| off-a2-bf16 | 2 × 2 |" in md and "Memory of accumulation" in md and "trainer ÷ bare" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out
