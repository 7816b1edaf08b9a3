"""The GPU check is ready to run: without CUDA it starts, says so in one line and exits with code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bench import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    out = tmp_path / "gpu"
    p = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "Traceback" not in p.stderr
    assert p.stdout == "" and not out.exists()  # nothing ran, nothing was written


def test_the_plan_fits_the_budget_and_covers_the_issue():
    assert gpu_check.BUDGET_S <= 8 * 60
    runs = {(p, m, a) for p, m, a, _, _ in gpu_check.TRAIN_RUNS}
    for preset in ("tiny", "small"):
        assert {(preset, "off", 1), (preset, "default", 1), (preset, "reduce-overhead", 1),
                (preset, "max-autotune-no-cudagraphs", 4)} <= runs
    assert gpu_check.PARTS == ("environment", "equivalence", "save_load", "oom", "cuda_graph_grads", "train",
                               "dashboard", "bench_base")
    # the in-process parts' boxes, the subprocess parts' and the smallest train runs fit the budget together
    assert sum(gpu_check.IN_PROCESS.values()) + 90 + 90 < gpu_check.BUDGET_S


def test_a_run_folders_metrics_are_summarised(tmp_path):
    import json

    rows = [{"event": "run_started", "precision": "bf16", "matmul_peak_flops": 1e15},
            {"event": "compile_finished", "seconds": 12.5, "fallback": False},
            {"event": "step", "warmup": True, "mfu": 0.01},
            {"event": "step", "warmup": False, "mfu": 0.40}, {"event": "step", "warmup": False, "mfu": 0.42},
            {"event": "step", "warmup": False, "mfu": 0.41},
            {"event": "warning", "message": "careful"},
            {"event": "finished", "median_tokens_per_s": 1e6, "final_loss": 3.2, "peak_mem_gib": 1.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    m = gpu_check._metrics(tmp_path)
    assert m["median_mfu"] == 0.41 and m["compile_seconds"] == 12.5 and m["median_tokens_per_s"] == 1e6
    assert m["precision"] == "bf16" and m["warnings"] == ["careful"]


def test_one_failing_or_hanging_part_never_hides_the_others(tmp_path, monkeypatch):
    import json

    calls = []

    def fake_run(argv, timeout, log, env=None):
        calls.append((argv, timeout))
        if "equivalence" in argv:  # crashes
            return {"argv": argv, "rc": 1, "timed_out": False, "seconds": 1.0, "tail": "Traceback …"}
        if "bench.cuda_graph_grads" in argv:  # hangs until its time box
            return {"argv": argv, "rc": None, "timed_out": True, "seconds": timeout, "tail": ""}
        return {"argv": argv, "rc": 0, "timed_out": False, "seconds": 1.0, "tail": '{"ok": true, "gpu": "X"}'}

    monkeypatch.setattr(gpu_check, "_run", fake_run)
    log = gpu_check.Log(tmp_path / "gpu_check.log")
    report = gpu_check.check(tmp_path, 470.0, gpu_check.PARTS, log)
    parts = report["parts"]
    assert set(parts) == set(gpu_check.PARTS)
    assert parts["environment"]["ok"] and parts["environment"]["gpu"] == "X"
    assert parts["equivalence"]["ok"] is False and parts["cuda_graph_grads"]["ok"] is False
    assert parts["save_load"]["ok"] and parts["oom"]["ok"] and parts["dashboard"]["ok"]
    assert parts["bench_base"]["ok"] is True
    assert len(parts["train"]["runs"]) == len(gpu_check.TRAIN_RUNS)
    assert report["ok"] is False
    assert json.loads((tmp_path / "gpu_check.json").read_text())["parts"].keys() == parts.keys()
    assert all(timeout <= 470.0 for _, timeout in calls)


def test_parts_that_no_longer_fit_are_skipped_not_started(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_check, "_run", lambda argv, timeout, log, env=None: calls.append(argv) or
                        {"argv": argv, "rc": 0, "timed_out": False, "seconds": 0.0, "tail": '{"ok": true}'})
    report = gpu_check.check(tmp_path, 10.0, gpu_check.PARTS, gpu_check.Log(tmp_path / "log"))
    assert calls == []  # 10 s leave no part its minimum of 20 s
    assert all(p.get("ok") is None or p.get("runs") for p in report["parts"].values())
    assert all(r["skipped"] == "no time left" for r in report["parts"]["train"]["runs"])
    assert report["ok"] is True  # nothing failed; the JSON says what was skipped


def test_the_out_of_memory_part_needs_cudas_allocator(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--part", "oom", "--part-device", "cpu",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and '"skipped": "needs CUDA' in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("part", ["equivalence", "save_load"])
def test_the_in_process_parts_pass_on_the_cpu(tmp_path, part):
    """The parts' own code runs and passes here, so a lent GPU's minutes are not spent on their bugs."""
    import json

    p = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--part", part, "--part-device", "cpu",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    result = gpu_check._json_tail(p.stdout)
    assert result["ok"] is True, json.dumps(result, indent=1)
    if part == "equivalence":
        checks = result["checks"]
        assert len(checks) == 6 and all(c["ok"] for c in checks.values())
        # gradients, not parameters after Adam's step: fp32 splits agree far inside the bound
        assert all(c["max_grad_rel_diff"] < 1e-5 for name, c in checks.items() if "accumulation fp32" in name)


def test_a_wrong_accumulation_would_fail_the_check():
    """The gradient comparison sees a window divided by the accumulation steps (the classic bug)."""
    g = [torch.randn(4, 4), torch.randn(8)]
    assert gpu_check._grad_rel_diff(g, [x.clone() for x in g]) == 0.0
    assert gpu_check._grad_rel_diff(g, [x / 4 for x in g]) > 0.5
    assert gpu_check._grad_rel_diff(g, [x * (1 + 5e-3) for x in g]) <= gpu_check.GRAD_RTOL["bf16"]
