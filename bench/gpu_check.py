"""Everything a CUDA machine should confirm, in one prepared run of at most 8 minutes.

    python -m bench.gpu_check --out DIR          # writes DIR/gpu_check.json and DIR/gpu_check.log

Parts, in order of importance, each in its own process with its own time box
(a part that fails, hangs or runs out of time is recorded as such and the next
one starts), all within one overall deadline (``--budget``, default 470 s):

1. ``environment``: GPU, driver, torch/CUDA/Triton versions, bf16 support.
2. ``equivalence``: gradient accumulation is exact on CUDA (micro-batch 8 × 1,
   2 × 4 and 1 × 8 hand the optimizer the same gradients and log the same
   loss) and a compiled step (``default``, 2 × 4) matches the eager 8 × 1, in
   fp32 and bf16, each within its precision's tolerance.
3. ``save_load``: a checkpoint saved from a compiled run loads into an eager
   model (same logits) and back into a compiled one (same logits).
4. ``oom``: a real CUDA out-of-memory error in a micro-step (the allocator
   capped just above what micro-batch 32 needs, then micro-batch 64 asked
   for) is redone with half the micro-batch and twice the accumulation, and
   every optimizer step gets the gradients of a run trained 32 × 2 from the start.
5. ``cuda_graph_grads``: ``bench.cuda_graph_grads`` in bf16: are CUDA-graph
   modes still wrong with accumulation > 1 in this release?
6. ``train``: tiny and small in bf16, ``speedboard train`` with compile off,
   ``default``, ``reduce-overhead`` (accumulation 1) and
   ``max-autotune-no-cudagraphs`` with accumulation 4: tokens/s, MFU, compile
   seconds, loss.
7. ``dashboard``: the window, offscreen, trains tiny eagerly then compiled on CUDA.
8. ``bench_base``: ``speedboard bench --preset base --device cuda`` with the
   cells that fit the time left.

Without CUDA it says so in one line and exits with code 2, having run nothing.
The exit code is 0 when every part that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.module_cli import module_parser, positive_number, run_module

BUDGET_S = 470.0
"""The whole check: 8 minutes less start-up and writing the results."""
PARTS = ("environment", "equivalence", "save_load", "oom", "cuda_graph_grads", "train", "dashboard", "bench_base")
IN_PROCESS = {"environment": 30, "equivalence": 90, "save_load": 60, "oom": 60}
"""The parts this module runs itself (``--part NAME`` in a subprocess), with their time boxes in seconds."""
TRAIN_RUNS = [  # (preset, compile mode, accumulation, steps, time box in seconds)
    (p, mode, accum, steps, box)
    for p, steps in (("tiny", 40), ("small", 30))
    for mode, accum, box in (("off", 1, 40), ("default", 1, 70), ("reduce-overhead", 1, 70),
                             ("max-autotune-no-cudagraphs", 4, 100))
]


class Log:
    """Lines to the terminal and to the log file, as they happen."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole check

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()


def _run(argv: list[str], timeout: float, log: Log, env: dict[str, str] | None = None) -> dict:
    """One subprocess, its output into the log; never raises."""
    log(f"$ {' '.join(argv)}   (time box {timeout:.0f} s)")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, timeout),
                           env={**os.environ, **(env or {})})
        out, rc, timed_out = p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out += (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        rc, timed_out = None, True
    seconds = time.perf_counter() - t0
    for line in out.splitlines()[-60:]:
        log(f"    {line}")
    log(f"  -> {'timed out' if timed_out else f'exit {rc}'} after {seconds:.1f} s")
    return {"argv": argv, "rc": rc, "timed_out": timed_out, "seconds": round(seconds, 1), "tail": out[-4000:]}


def _json_tail(out: str) -> dict | None:
    """The last line of a part's output that is a JSON object (what the in-process parts print)."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------------- in-process parts (``--part NAME``)
def part_environment() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
    return {"ok": True, "gpu": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 1024**3, 1), "devices": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
            "bf16": torch.cuda.is_bf16_supported(), "nvidia_smi": smi}


PART_DEVICE = "cuda"
"""Where the in-process parts run (``--part-device cpu`` smoke-tests their code on a machine without CUDA)."""


def _micro_config(out_dir: str, **train):
    from core.config import DataConfig, ModelConfig, RunConfig, TrainConfig

    return RunConfig(
        model=ModelConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=128, max_position_embeddings=64),
        data=DataConfig(seq_len=32, vocab_size=512, layout="document"),
        train=TrainConfig(**{"micro_batch": 8, "accum_steps": 1, "budget": 1, "lr": 1e-2, "min_lr": 1e-3,
                             "warmup_ratio": 0.0, "eval_every": 0, "eval_batches": 1, "sample_tokens": 1,
                             "device": PART_DEVICE, "precision": "fp32", **train}),
        preset="micro", out_dir=out_dir)


class _StepGradients:
    """The gradients of every optimizer step, as ``optimizer.step`` sees them.

    Accumulation is compared on gradients, not on parameters after the step:
    Adam's first steps move each weight by about ``lr`` whatever the size of its
    gradient, so two parameter sets after a step differ by at most ~2 × ``lr``
    even when their gradients disagree (a parameter tolerance of bf16's size
    would pass anything).
    """

    def __enter__(self) -> list[list]:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.steps: list[list] = []

        def capture(optimizer, args, kwargs):
            # CPU–GPU sync: none; the clones stay on the device until compared
            self.steps.append([p.grad.detach().float().clone() for g in optimizer.param_groups for p in g["params"]])

        self._handle = register_optimizer_step_pre_hook(capture)
        return self.steps

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def _grad_rel_diff(a: list, b: list) -> float:
    """The largest difference of two steps' gradients, relative to each tensor's largest gradient."""
    # CPU–GPU sync: one .item() per tensor, once per check
    return max(((x - y).abs().max() / x.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b, strict=True))


def _one_step(out_dir: str, **train):
    """A run of the micro model (one step unless ``budget`` says more): its first step's gradients and logged
    loss, and the run's result."""
    from core.events import ListSink, StepMetrics
    from core.trainer import Trainer

    sink = ListSink()
    with _StepGradients() as steps:
        trainer = Trainer(_micro_config(out_dir, **{"grad_clip": 0.0, **train}), sink=sink)
        result = trainer.run()
    assert len(steps) == int(trainer.cfg.train.budget), len(steps)  # budget_kind "steps"
    return steps[0], sink.of(StepMetrics)[0].loss, result


GRAD_RTOL = {"fp32": 1e-4, "bf16": 2e-2}
"""Gradient agreement between splits of one window, of each tensor's largest gradient (bf16: 8 bits of mantissa)."""
LOSS_RTOL = {"fp32": 1e-5, "bf16": 1e-2}


def part_equivalence(out_dir: str) -> dict:
    from core.compile import reset_compiler

    results, ok = {}, True

    def judge(name: str, grads, loss, ref, ref_loss, rtol: float, loss_rtol: float) -> None:
        nonlocal ok
        d = _grad_rel_diff(ref, grads)
        good = d <= rtol and abs(loss - ref_loss) <= loss_rtol * abs(ref_loss)
        results[name] = {"max_grad_rel_diff": d, "grad_rtol": rtol, "loss": loss, "ref_loss": ref_loss, "ok": good}
        ok &= good

    for precision in ("fp32", "bf16"):
        ref, ref_loss, _ = _one_step(out_dir, precision=precision)
        for mb, accum in ((2, 4), (1, 8)):
            grads, loss, _ = _one_step(out_dir, precision=precision, micro_batch=mb, accum_steps=accum)
            judge(f"accumulation {precision} {mb}x{accum}", grads, loss, ref, ref_loss,
                  GRAD_RTOL[precision], LOSS_RTOL[precision])
        grads, loss, _ = _one_step(out_dir, precision=precision, micro_batch=2, accum_steps=4, compile_mode="default")
        reset_compiler()
        # compiled kernels sum in another order than eager ones: fp32 gets a looser bound, bf16 its own
        judge(f"compiled default 2x4 == eager 8x1 {precision}", grads, loss, ref, ref_loss,
              GRAD_RTOL[precision] * (10 if precision == "fp32" else 1.5), LOSS_RTOL[precision] * 10)
    return {"ok": ok, "checks": results}


def part_save_load(out_dir: str) -> dict:
    import torch

    from core import checkpoint as ckpt_io
    from core.compile import compile_model, reset_compiler
    from core.model import LlamaForCausalLM

    # The equivalence part's compiled split: its graphs, cached on disk, serve here too (a cold compile less).
    _, _, result = _one_step(out_dir, compile_mode="default", budget=2, micro_batch=2, accum_steps=4)
    loaded = ckpt_io.read_checkpoint(result.checkpoint)
    keys_clean = not any(k.startswith(("_orig_mod.", "module.")) for k in loaded.state_dict)
    eager = LlamaForCausalLM(loaded.model_config).to(PART_DEVICE).eval()
    ckpt_io.load_weights(eager, loaded.state_dict, source=str(result.checkpoint))
    ids = torch.randint(0, loaded.model_config.vocab_size, (2, 16), device=PART_DEVICE)
    with torch.no_grad():
        eager_logits = eager(ids)
        reset_compiler()
        again = LlamaForCausalLM(loaded.model_config).to(PART_DEVICE).eval()
        compiled = compile_model(again, "default", "model")
        ckpt_io.load_weights(compiled, loaded.state_dict, source=str(result.checkpoint))
        compiled_logits = compiled(ids)
    d = (eager_logits - compiled_logits).abs().max().item()
    weights_same = all(torch.equal(loaded.state_dict[k], v.cpu()) for k, v in again.state_dict().items())
    return {"ok": keys_clean and weights_same and d <= 1e-3, "checkpoint": str(result.checkpoint),
            "keys_clean": keys_clean, "weights_round_trip": weights_same, "max_logit_diff_eager_vs_compiled": d}


def part_oom(out_dir: str) -> dict:
    import torch

    from core.config import config_from_preset
    from core.events import ListSink, MicroBatchChanged, StepMetrics
    from core.trainer import Trainer

    if PART_DEVICE != "cuda":
        return {"ok": None, "skipped": "needs CUDA's caching allocator (a real out-of-memory error)"}

    def run(micro: int, accum: int) -> tuple[list[list], list[float], ListSink]:
        cfg = config_from_preset("small", data={"seq_len": 512}, train={
            "micro_batch": micro, "accum_steps": accum, "budget": 2, "precision": "bf16", "device": "cuda",
            "eval_every": 0, "eval_batches": 1, "sample_every": 0, "sample_tokens": 1, "seed": 1337,
            "warmup_ratio": 0.0, "grad_clip": 0.0}).replace(out_dir=out_dir)
        sink = ListSink()
        with _StepGradients() as steps:
            Trainer(cfg, sink=sink).run()
        return steps, [m.loss for m in sink.of(StepMetrics)], sink

    torch.cuda.reset_peak_memory_stats()
    reference, ref_losses, _ = run(32, 2)  # the split the redone step falls back to, from the start
    need = torch.cuda.max_memory_allocated()  # CPU–GPU sync: allocator statistics, read once
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    cap = int(need * 1.2) + (256 << 20)  # room for 32 × 2, not for 64 × 1 (twice the activations)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    try:
        grads, losses, sink = run(64, 1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    changes = [(c.step, c.old_micro, c.new_micro, c.new_accum, c.reason) for c in sink.of(MicroBatchChanged)]
    redone = bool(changes) and changes[0][1:4] == (64, 32, 2)
    # every optimizer step ran once (the failed attempt never reached it) with the reference's gradients
    same_steps = len(grads) == len(reference) == 2
    diff = max(_grad_rel_diff(r, g) for r, g in zip(reference, grads, strict=False)) if same_steps else None
    return {"ok": redone and same_steps and diff <= GRAD_RTOL["bf16"], "cap_gib": round(cap / 1024**3, 2),
            "peak_32x2_gib": round(need / 1024**3, 2), "changes": changes, "losses": losses,
            "reference_losses": ref_losses, "optimizer_steps": len(grads), "max_grad_rel_diff_vs_32x2": diff}


def _in_process(name: str, out_dir: str) -> int:
    fn = {"environment": lambda: part_environment(), "equivalence": lambda: part_equivalence(out_dir),
          "save_load": lambda: part_save_load(out_dir), "oom": lambda: part_oom(out_dir)}[name]
    print(json.dumps(fn(), default=str))
    return 0


# ---------------------------------------------------------------------- the parts as subprocesses
def _metrics(run_dir: Path) -> dict:
    """Median tokens/s, MFU, compile seconds and losses from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["event"] == "step" and not r.get("warmup")]
    started = next((r for r in rows if r["event"] == "run_started"), {})
    finished = next((r for r in rows if r["event"] == "finished"), {})
    compiled = next((r for r in rows if r["event"] == "compile_finished"), {})
    mfus = sorted(r["mfu"] for r in steps)
    return {"median_tokens_per_s": finished.get("median_tokens_per_s"),
            "median_mfu": mfus[len(mfus) // 2] if mfus else None,
            "matmul_peak_flops": started.get("matmul_peak_flops"), "precision": started.get("precision"),
            "compile_seconds": compiled.get("seconds"), "compile_fallback": compiled.get("fallback"),
            "final_loss": finished.get("final_loss"), "peak_mem_gib": finished.get("peak_mem_gib"),
            "warnings": [r["message"] for r in rows if r["event"] == "warning"]}


def check(out: Path, budget: float, parts: tuple[str, ...], log: Log) -> dict:
    py = sys.executable
    deadline = time.monotonic() + budget
    report: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": budget, "parts": {}}
    env = {"TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache"), "SPEEDBOARD_HOME": str(out / "home"),
           "SPEEDBOARD_CACHE_DIR": str(out / "cache"), "QT_QPA_PLATFORM": "offscreen", "PYTHONUNBUFFERED": "1"}

    def left() -> float:
        return deadline - time.monotonic()

    def boxed(box: float) -> float | None:
        """The part's time box, cut to what is left; None when too little is left to be worth starting."""
        return None if left() < min(box, 20.0) else min(box, left())

    def record(name: str, result: dict) -> None:
        report["parts"][name] = result
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))

    for name in parts:
        log(f"== {name} ({left():.0f} s left)")
        if name in IN_PROCESS:
            box = boxed(IN_PROCESS[name])
            if box is None:
                record(name, {"ok": None, "skipped": "no time left"})
                continue
            r = _run([py, "-m", "bench.gpu_check", "--part", name, "--out", str(out)], box, log, env)
            found = _json_tail(r["tail"]) or {}
            record(name, {**found, "ok": bool(found.get("ok")) and r["rc"] == 0, "run": r})
        elif name == "cuda_graph_grads":
            box = boxed(90)
            if box is None:
                record(name, {"ok": None, "skipped": "no time left"})
                continue
            r = _run([py, "-m", "bench.cuda_graph_grads", "--device", "cuda", "--precision", "bf16"], box, log, env)
            record(name, {"ok": r["rc"] == 0, "run": r, "note": "exit 1 means a CUDA-graph mode gave wrong "
                                                                 "accumulated gradients (the refusal is still needed)"})
        elif name == "train":
            runs = []
            for preset, mode, accum, steps, box_s in TRAIN_RUNS:
                box = boxed(box_s)
                tag = f"{preset}-{mode}-a{accum}"
                if box is None:
                    runs.append({"run": tag, "ok": None, "skipped": "no time left"})
                    continue
                run_id = f"gpu-{tag}"
                r = _run([py, "-m", "core.cli", "train", "--preset", preset, "--device", "cuda", "--precision",
                          "bf16", "--compile", mode, "--accum", str(accum), "--steps", str(steps), "--eval-every", "0",
                          "--log-every", "10", "--out", str(out / "runs"), "--run-id", run_id], box, log, env)
                entry: dict = {"run": tag, "ok": r["rc"] == 0, "seconds": r["seconds"], "timed_out": r["timed_out"]}
                try:
                    entry.update(_metrics(out / "runs" / run_id))
                except (OSError, ValueError, KeyError):
                    entry["tail"] = r["tail"][-1500:]
                runs.append(entry)
                record(name, {"ok": all(x["ok"] is not False for x in runs), "runs": runs})
            record(name, {"ok": all(x["ok"] is not False for x in runs), "runs": runs})
        elif name == "dashboard":
            box = boxed(90)
            if box is None:
                record(name, {"ok": None, "skipped": "no time left"})
                continue
            r = _run([py, "-m", "bench.dashboard_screenshot", "--out", str(out / "dashboard.png"), "--tokens",
                      "32768", "--eval-every", "4"], box, log, env)
            record(name, {"ok": r["rc"] == 0, "run": r, "screenshot": str(out / "dashboard.png")})
        elif name == "bench_base":
            box = boxed(left())
            if box is None or left() < 60:
                record(name, {"ok": None, "skipped": "no time left"})
                continue
            # Eager and default at accumulation 1 and 4 first: the cells that fit; CUDA-graph cells are covered above.
            r = _run([py, "-m", "speedboard", "bench", "--preset", "base", "--device", "cuda", "--precision", "bf16",
                      "--cells", "off-a1,default-model-a1,default-model-a4", "--accum", "1,4", "--steps", "3",
                      "--repeats", "1", "--no-hf", "--no-probes", "--out", str(out / "bench-base")], box - 5, log, env)
            bench_json = out / "bench-base" / "bench.json"
            summary = json.loads(bench_json.read_text()).get("summary") if bench_json.exists() else None
            record(name, {"ok": r["rc"] == 0, "run": r, "summary": summary})
    report["wall_s"] = round(budget - left(), 1)
    report["ok"] = all(p.get("ok") is not False for p in report["parts"].values())
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    p = module_parser("gpu_check", __doc__)
    p.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.log and the runs")
    p.add_argument("--budget", type=positive_number, default=BUDGET_S, help="seconds for all parts together")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--part", choices=tuple(IN_PROCESS), help=argparse.SUPPRESS)
    p.add_argument("--part-device", default="cuda", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    import torch

    if args.part and args.part_device != "cuda":
        global PART_DEVICE
        PART_DEVICE = args.part_device
        return _in_process(args.part, str(Path(args.out).expanduser().resolve() / "runs"))

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); this check needs a CUDA GPU",
              file=sys.stderr)
        return 2
    out = Path(args.out).expanduser().resolve()
    if args.part:
        return _in_process(args.part, str(out / "runs"))
    parts = tuple(x.strip() for x in args.parts.split(",") if x.strip())
    unknown = [x for x in parts if x not in PARTS]
    if unknown or not args.budget > 0:
        print(f"gpu_check: unknown part {unknown[0]!r}; parts are {', '.join(PARTS)}" if unknown
              else f"gpu_check: --budget must be positive, got {args.budget}", file=sys.stderr)
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpu_check: cannot create {out} ({exc.strerror})", file=sys.stderr)
        return 2
    log = Log(out / "gpu_check.log")
    log(f"gpu_check: {', '.join(parts)} within {args.budget:.0f} s -> {out}")
    report = check(out, args.budget, parts, log)
    for name, r in report["parts"].items():
        log(f"{name:<18} {'ok' if r.get('ok') else 'skipped' if r.get('ok') is None else 'FAILED'}")
    log(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.log'} in {report['wall_s']:.0f} s")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_module(main, "gpu_check"))
