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


@pytest.mark.parametrize("flag, value, message", [
    ("--steps", str(10**23), "expected an integer ≤ 2**63 - 1"),
    ("--repeats", str(10**23), "expected an integer ≤ 2**63 - 1"),
    ("--matmul-size", str(10**23), "expected an integer ≤ 2**63 - 1"),
    ("--matmul-size", str(10**7), "its GEMMs need"),  # would ask the allocator for 400 TB
    ("--probe-timeout", "inf", "--probe-timeout must be a number of seconds > 0"),
    ("--probe-timeout", "1e300", "--probe-timeout must be a number of seconds > 0"),
    ("--loss-tol", "inf", "--loss-tol must be a finite number > 0"),
])
def test_bench_refuses_huge_and_infinite_numbers_in_one_line(flag, value, message, capsys, tmp_path):
    code = None
    try:
        code = main(["bench", "--preset", "tiny", "--no-hf", "--cells", "off-a1", flag, value,
                     "--out", str(tmp_path / "bench")])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "bench").exists()


@pytest.mark.slow
def test_quick_bench_writes_json_markdown_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    pytest.importorskip("transformers")
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--effective-batch", "4", "--accum", "1,2", "--precision", "fp32",
                 "--out", str(out)]) == 0

    raw = json.loads((out / "bench.json").read_text())
    assert raw["config"]["preset"] == "tiny" and raw["device"]["type"] == "cpu"
    assert {"torch", "transformers"} <= raw["versions"].keys()
    names = [c["name"] for c in raw["cells"]]
    # The last three: memory only.
    assert names == ["off-a1-fp32", "off-a2-fp32", "off-a1-fp32-mb2", "off-a2-fp32-mb4", "off-a1-fp32-mb8"]
    # Every timed cell by the trainer and the bare loop; HF where it is compared (eager, no accumulation).
    assert sorted((r["cell"], r["runner"]) for r in raw["runs"]) == [
        ("off-a1-fp32", "bare"), ("off-a1-fp32", "hf"), ("off-a1-fp32", "speedboard"), ("off-a2-fp32", "bare"),
        ("off-a2-fp32", "speedboard")]
    assert raw["matmul_peak"]["flops"]["fp32"] > 0 and raw["flops_per_token"] > 0
    # Measured at the start and after each repeat, as the docs say (it was measured at the start alone).
    assert len(raw["matmul_peak"]["measurements"]["fp32"]) == 1 + raw["config"]["repeats"]

    summary = raw["summary"]
    a1, a2 = summary["cells"]["off-a1-fp32"], summary["cells"]["off-a2-fp32"]
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
    assert summary["loss"]["agree"], summary["loss"]  # same weights, same batches: the same loss everywhere
    assert {t["target"] for t in summary["targets"]} >= {"final losses agree across all runs, fp32"}

    # Each run's line gives the statistic of the tables (its median step), not its window's tokens/s.
    import re

    said = capsys.readouterr().out
    printed = re.findall(r"\] (\S+)\s+(speedboard|bare|hf)\s+([\d,]+) tok/s", said)
    assert len(printed) == 5
    for cell_name, runner, rate in printed:
        assert rate == f"{summary['cells'][cell_name][runner]['median']:,.0f}", (cell_name, runner)

    md = (out / "bench.md").read_text()
    assert "| off-a2-fp32 | 2 × 2 |" in md and "Memory of accumulation" in md and "trainer ÷ bare" in md
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in said


@pytest.mark.slow
def test_precisions_cross_the_cells_with_their_own_peak_and_tolerance(tmp_path):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--effective-batch", "2", "--accum", "1", "--precision", "fp32,bf16",
                 "--no-probes", "--no-hf", "--out", str(out)]) == 0
    raw = json.loads((out / "bench.json").read_text())
    assert [c["name"] for c in raw["cells"]] == ["off-a1-fp32", "off-a1-bf16"]
    assert set(raw["matmul_peak"]["flops"]) == {"fp32", "bf16"}
    summary = raw["summary"]
    assert summary["cells"]["off-a1-bf16"]["mfu"] > 0  # against bf16's own peak
    loss = summary["loss"]["per_precision"]
    assert loss["fp32"]["tolerance"] == pytest.approx(2e-3) and loss["bf16"]["tolerance"] == pytest.approx(3e-2)
    assert summary["loss"]["agree"], summary["loss"]  # bf16 against fp32 within bf16's tolerance
    assert {t["target"] for t in summary["targets"]} >= {"final losses agree across all runs, fp32",
                                                         "final losses agree across all runs, bf16",
                                                         "bf16 loss vs fp32 loss"}
    assert "| off-a1-bf16 | 2 × 1 |" in (out / "bench.md").read_text()
