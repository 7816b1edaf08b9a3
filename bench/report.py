"""From raw runs to the summary, the targets, and the three outputs: JSON, Markdown, PNG."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from core.errors import SpeedboardError
from core.event_text import counted
from core.mfu import mfu_text, utilization

GIB = 1024**3

# Targets of the 2-core CPU (small, fp32) and of a GPU (base, bf16); the rest hold everywhere.
DEVICE_TARGETS = {"cpu": {"compile_speedup": 1.15, "mfu": 0.50}, "cuda": {"compile_speedup": 1.3, "mfu": 0.40}}
TRAINER_VS_BARE = 0.97
OURS_VS_HF = 1.0
BLOCK_COMPILE_FASTER = 2.0
BLOCK_SPEED_WITHIN = 0.95
ACCUM_MEMORY_MAX = 1.10
PLAIN_BATCH_MEMORY_MIN = 1.25
"""A plain batch b·k must cost at least this much more than micro-batch b: "clearly more"."""


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def peak_flops(raw: dict[str, Any], precision: str) -> float:
    """The matmul peak of ``precision`` (a benchmark written before precisions were crossed holds one figure)."""
    flops = raw["matmul_peak"]["flops"]
    return flops if isinstance(flops, (int, float)) else flops.get(precision) or max(flops.values())


def _precision(raw: dict[str, Any], cell: dict[str, Any]) -> str:
    return cell.get("precision") or raw["config"]["precision"]


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians and ranges per cell and runner, ratios, the memory table, loss agreement and targets.

    A run that failed (its ``error``) counts in no figure; its cell lists the error.
    """
    fpt = raw["flops_per_token"]
    by: dict[tuple[str, str], list[dict]] = {}
    failures: dict[str, list[str]] = {}
    for r in raw["runs"]:
        if r.get("error"):
            failures.setdefault(r["cell"], []).append(f"{r['runner']}: {r['error']}")
            continue
        by.setdefault((r["cell"], r["runner"]), []).append(r)
    cells = {}
    tps = raw["config"]["tokens_per_step"]
    for c in raw["cells"]:
        name = c["name"]
        row: dict[str, Any] = {**c, "precision": _precision(raw, c), "failures": sorted(set(failures.get(name, [])))}
        for runner in ("speedboard", "bare", "hf"):
            row[runner] = _stats(_step_rates(by.get((name, runner), []), tps))
        sb = by.get((name, "speedboard"), [])
        if row["speedboard"]:
            row["mfu"] = utilization(row["speedboard"]["median"], fpt, peak_flops(raw, row["precision"]))
            row["loss"] = sb[0]["losses"][-1]
            compiles = [r.get("compiler_seconds") or r["compile_seconds"] for r in sb
                        if (r.get("compiler_seconds") or r["compile_seconds"]) is not None]
            row["compile_in_process_s"] = statistics.median(compiles) if compiles else None
            row["warnings"] = sorted({w for r in sb for w in r["warnings"]})
        shares = [b / t for r in sb for b, t in zip(r.get("bookkeeping_seconds", []), r["step_seconds"], strict=False)]
        row["bookkeeping_share"] = statistics.median(shares) if shares else None
        for key, (a, b) in (("trainer_vs_bare", ("speedboard", "bare")), ("ours_vs_hf", ("bare", "hf"))):
            if row[a] and row[b]:
                paired = _stats(_paired(by.get((name, a), []), by.get((name, b), []), tps))
                row[f"{key}_paired"] = paired
                # The median of the back-to-back ratios, whose range is beside it (the speed advisor's statistic):
                # the ratio of the medians pooled over repeats fell outside that range on a busy machine, 0.136
                # beside 0.19–0.58. Without pairs, the ratio of the medians.
                row[key] = paired["median"] if paired else row[a]["median"] / row[b]["median"]
        probe = raw.get("probes", {}).get(name, {})
        # The compiler's own clock where available; the Trainer's figure (warm-up minus steady steps) beside it.
        for kind in ("cold", "warm"):
            p = probe.get(kind, {})
            own = p.get("compiler_seconds")
            row[f"compile_{kind}_s"] = own if own is not None else p.get("compile_seconds")
            row[f"trainer_compile_{kind}_s"] = p.get("compile_seconds")
        mem = probe.get("warm") or probe.get("memory") or {}
        if "peak_bytes" in mem:
            row["peak_gib"] = mem["peak_bytes"] / GIB
            row["train_mem_gib"] = max(0, mem["peak_bytes"] - mem["baseline_bytes"]) / GIB  # never "-0.00"
            row["peak_with_compile_gib"] = mem["peak_with_compile_bytes"] / GIB
        row["probe_errors"] = {k: v["error"] for k, v in probe.items() if "error" in v}
        cells[name] = row
    reference = _eager_a1(cells)
    eager_a1 = cells.get(reference, {}).get("speedboard")
    for row in cells.values():
        if eager_a1 and row.get("speedboard"):
            row["speedup_vs_eager_a1"] = row["speedboard"]["median"] / eager_a1["median"]
    grad_gib = raw["config"].get("num_parameters", 0) * 4 / 1024**3  # fp32 gradients (params stay fp32 under autocast)
    summary = {"cells": cells, "memory": _memory_table(cells, grad_gib), "loss": _loss_agreement(raw, by),
               "speedup_reference": reference}
    summary["targets"] = _targets(raw, cells, summary)
    return summary


def _eager_a1(cells: dict[str, dict]) -> str | None:
    """The cell every speedup is against: eager, no accumulation, fp32 when measured."""
    eager = [n for n, r in cells.items() if r["mode"] == "off" and r["accum"] == 1 and not r.get("memory_only")]
    eager.sort(key=lambda n: cells[n]["precision"] != "fp32")
    return eager[0] if eager else None


def median_step_rate(run: dict, tokens_per_step: int) -> float:
    """One run's tokens/s as the tables give it: the median of its timed steps."""
    return statistics.median(_step_rates([run], tokens_per_step))


def _step_rates(runs: list[dict], tokens_per_step: int) -> list[float]:
    """Tokens/s of every timed step of every repeat (a run without per-step times counts as its window)."""
    rates = []
    for r in runs:
        per_step = r.get("tokens_per_step", tokens_per_step)
        rates += [per_step / t for t in r["step_seconds"]] if r.get("step_seconds") else [r["tokens_per_s"]]
    return rates


def _paired(a: list[dict], b: list[dict], tokens_per_step: int) -> list[float]:
    """Ratio of the two runners' median steps within each repeat (they ran back to back): the headline ratio is
    their median, the range their min–max. Their window throughputs, a slow first step inside, put a 1.024
    headline beside a range of 0.94–0.97."""
    other = {r["repeat"]: median_step_rate(r, tokens_per_step) for r in b}
    return [median_step_rate(r, tokens_per_step) / other[r["repeat"]] for r in a if r["repeat"] in other]


def _memory_table(cells: dict[str, dict], grad_gib: float) -> list[dict]:
    """Micro-batch b with accumulation k against b with none and against a plain batch b·k (eager cells).

    ``extra_gib`` (b × k minus b × 1) is set beside ``grad_gib``, the size of the gradients: those
    buffers must outlive a micro-step, so they coexist with the next micro-batch's activations,
    while without accumulation they only appear as backward frees the activations.
    """
    rows = []
    for row in cells.values():
        if row["mode"] != "off" or row["accum"] == 1:
            continue
        b, k = row["micro_batch"], row["accum"]
        same = [r for r in cells.values() if r["mode"] == "off" and r["accum"] == 1
                and r["precision"] == row["precision"]]
        alone = next((r for r in same if r["micro_batch"] == b), None)
        plain = next((r for r in same if r["micro_batch"] == b * k), None)
        if not alone or "train_mem_gib" not in row or not alone.get("train_mem_gib"):
            continue  # (no ratio to a micro-batch whose training used nothing measurable)
        entry = {"micro_batch": b, "accum": k,
                 "accum_peak_gib": row["peak_gib"], "accum_train_gib": row["train_mem_gib"],
                 "micro_peak_gib": alone["peak_gib"], "micro_train_gib": alone["train_mem_gib"],
                 "accum_ratio": row["train_mem_gib"] / alone["train_mem_gib"],
                 "extra_gib": row["train_mem_gib"] - alone["train_mem_gib"], "grad_gib": grad_gib}
        if plain and "train_mem_gib" in plain:
            entry.update(plain_batch=b * k, plain_peak_gib=plain["peak_gib"], plain_train_gib=plain["train_mem_gib"],
                         plain_ratio=plain["train_mem_gib"] / alone["train_mem_gib"])
        rows.append(entry)
    return rows


def _agreement(losses: dict[str, float], ref_key: str, tol: float) -> dict:
    ref = losses[ref_key]
    deviations = {k: v - ref for k, v in losses.items()}
    worst = max(deviations, key=lambda k: abs(deviations[k]))
    return {"reference": ref_key, "reference_loss": ref, "tolerance": tol, "max_abs_deviation": abs(deviations[worst]),
            "worst": worst, "agree": abs(deviations[worst]) <= tol, "losses": losses}


def _loss_agreement(raw: dict, by: dict) -> dict:
    """Per precision, the final loss of every run against Speedboard's eager, no-accumulation run of that
    precision (or its first run), within that precision's tolerance; and each precision's reference against
    fp32's, within the lower precision's tolerance (bf16 changes the rounding, not the math)."""
    precision_of = {c["name"]: _precision(raw, c) for c in raw["cells"]}
    tols = raw["config"].get("loss_tolerances") or {raw["config"]["precision"]: raw["config"]["loss_tolerance"]}
    per: dict[str, dict] = {}
    for r in raw["runs"]:
        if r["repeat"] == 0 and not r.get("error") and r["losses"]:
            per.setdefault(precision_of.get(r["cell"], raw["config"]["precision"]), {})[
                f"{r['cell']}/{r['runner']}"] = r["losses"][-1]
    if not per:
        return {}
    out: dict[str, Any] = {"tokens": raw["config"]["total_steps"] * raw["config"]["tokens_per_step"],
                           "per_precision": {}}
    for precision, losses in per.items():
        ref_key = next((k for k in losses if k.startswith("off-a1") and k.endswith("/speedboard")), next(iter(losses)))
        out["per_precision"][precision] = _agreement(losses, ref_key, tols.get(precision, 3e-2))
    agreements = list(out["per_precision"].values())
    fp32 = out["per_precision"].get("fp32")
    if fp32:
        for precision, a in out["per_precision"].items():
            if precision != "fp32":
                deviation = a["reference_loss"] - fp32["reference_loss"]
                a["vs_fp32"] = {"deviation": deviation, "agree": abs(deviation) <= a["tolerance"]}
    worst = max(agreements, key=lambda a: a["max_abs_deviation"] / a["tolerance"])
    out.update({k: worst[k] for k in ("reference", "reference_loss", "tolerance", "max_abs_deviation", "worst")})
    out["agree"] = all(a["agree"] and a.get("vs_fp32", {}).get("agree", True) for a in agreements)
    out["losses"] = {k: v for a in agreements for k, v in a["losses"].items()}
    return out


def _target(name: str, value: float | None, goal: str, met: bool | None, note: str = "") -> dict:
    return {"target": name, "value": value, "goal": goal, "met": met, "note": note}


def _targets(raw: dict, cells: dict[str, dict], summary: dict) -> list[dict]:
    device = raw["device"]["type"]
    goals = DEVICE_TARGETS.get(device, DEVICE_TARGETS["cpu"])
    out = []
    for row in cells.values():
        if row["mode"] == "default" and row["scope"] == "model" and row.get("speedboard"):
            eager_name = row["name"].replace(f"default-model-a{row['accum']}", f"off-a{row['accum']}", 1)
            eager = cells.get(eager_name, {}).get("speedboard")
            if eager:
                v = row["speedboard"]["median"] / eager["median"]
                out.append(_target(f"compile speedup, {row['name']} vs {eager_name}", v,
                                   f"≥ {goals['compile_speedup']:.2f}×", v >= goals["compile_speedup"]))
            out.append(_target(f"MFU, {row['name']}", row["mfu"], f"≥ {goals['mfu']:.0%} of matmul peak",
                               row["mfu"] >= goals["mfu"]))
        if row["mode"] == "default" and row["scope"] == "block" and row.get("speedboard"):
            whole = cells.get(row["name"].replace("-block-", "-model-"))
            if whole and whole.get("compile_cold_s") and row.get("compile_cold_s"):
                v = whole["compile_cold_s"] / row["compile_cold_s"]
                out.append(_target(f"per-block cold compile faster, {row['name']}", v,
                                   f"≥ {BLOCK_COMPILE_FASTER:.0f}× faster than whole model", v >= BLOCK_COMPILE_FASTER))
            if whole and whole.get("speedboard"):
                v = row["speedboard"]["median"] / whole["speedboard"]["median"]
                out.append(_target(f"per-block tokens/s vs whole model, {row['name']}", v,
                                   f"≥ {BLOCK_SPEED_WITHIN:.2f}×", v >= BLOCK_SPEED_WITHIN))
        if "trainer_vs_bare" in row:
            v = row["trainer_vs_bare"]
            out.append(_target(f"Speedboard trainer vs bare loop, {row['name']}", v, f"≥ {TRAINER_VS_BARE:.2f}×",
                               v >= TRAINER_VS_BARE))
        if "ours_vs_hf" in row:
            v = row["ours_vs_hf"]
            out.append(_target(f"Speedboard model vs HF Llama, {row['name']}", v, f"≥ {OURS_VS_HF:.2f}×",
                               v >= OURS_VS_HF))
    for m in summary["memory"]:
        out.append(_target(f"memory, micro-batch {m['micro_batch']} × accum {m['accum']} vs × 1", m["accum_ratio"],
                           f"≤ {ACCUM_MEMORY_MAX:.2f}×", m["accum_ratio"] <= ACCUM_MEMORY_MAX))
        if "plain_ratio" in m:
            out.append(_target(f"memory, plain batch {m['plain_batch']} vs micro-batch {m['micro_batch']}",
                               m["plain_ratio"], f"≥ {PLAIN_BATCH_MEMORY_MIN:.2f}×",
                               m["plain_ratio"] >= PLAIN_BATCH_MEMORY_MIN))
    for precision, loss in summary["loss"].get("per_precision", {}).items():
        out.append(_target(f"final losses agree across all runs, {precision}", loss["max_abs_deviation"],
                           f"≤ {loss['tolerance']:g} (absolute)", loss["agree"], f"worst: {loss['worst']}"))
        if "vs_fp32" in loss:
            v = loss["vs_fp32"]
            out.append(_target(f"{precision} loss vs fp32 loss", abs(v["deviation"]),
                               f"≤ {loss['tolerance']:g} (absolute)", v["agree"]))
    return out


# ----------------------------------------------------------------------------- writers
class ReportNotWritten(SpeedboardError):
    """A report file that could not be written (full disk, file-size limit, no permission): one line."""


def _not_written(path: Path, exc: OSError) -> ReportNotWritten:
    from core.paths import why_write_failed

    return ReportNotWritten(f"cannot write {path}: {why_write_failed(exc, path.parent)}")


def _stage(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """``write`` into a new hidden file beside ``path``, synced to disk; its name is returned.

    Nothing is left behind when it fails (a full disk, Ctrl-C): ``path`` itself is not touched.
    An ``OSError`` becomes a ``ReportNotWritten`` naming ``path`` and the reason.
    """
    from core.paths import hidden_form

    tmp = path.with_name(f".{hidden_form(path.name)}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        # O_EXCL: never someone else's file; 0o666: the permissions a plain write gets under the umask.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as exc:
        _discard(tmp)
        if isinstance(exc, OSError):
            raise _not_written(path, exc) from None
        raise
    return tmp


def _discard(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def _publish(staged: list[tuple[Path, Path]]) -> None:
    """Rename each staged file over its target (atomic per file), all or none: a file replaced is kept aside
    until every one is in place and put back when a later one cannot be (one the user cannot replace, a
    rename refused), so a failure leaves an earlier report whole; the staged files not placed are removed."""
    placed: list[tuple[Path, Path | None]] = []  # each target in place, with the earlier file kept aside
    try:
        for tmp, path in staged:
            kept = _keep_aside(path) if len(staged) > 1 else None
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if kept is not None:
                    _discard(kept)
                raise _not_written(path, exc) from None
            placed.append((path, kept))
    except BaseException:
        for path, kept in reversed(placed):
            with contextlib.suppress(OSError):
                if kept is not None:
                    os.replace(kept, path)  # the earlier report's file, back
                else:
                    path.unlink()  # there was none: the folder is as it was
        raise
    finally:
        done = {path for path, _ in placed}
        for tmp, path in staged:
            if path not in done:
                _discard(tmp)
    for _, kept in placed:
        if kept is not None:
            _discard(kept)


def _keep_aside(path: Path) -> Path | None:
    """A hidden copy of ``path`` (a hard link, else a copy) to put back; None where there is no file there."""
    from core.paths import hidden_form

    if not path.is_file():
        return None
    kept = path.with_name(f".{hidden_form(path.name)}.{os.getpid()}-{secrets.token_hex(4)}.old")
    try:
        try:
            os.link(path, kept)
        except OSError:  # no hard links here, or a file the user may not link (immutable): its bytes, then
            shutil.copy2(path, kept)
    except OSError as exc:
        _discard(kept)
        raise _not_written(path, exc) from None
    return kept


def _write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    _publish([(_stage(path, write), path)])


def _json_bytes(raw: dict) -> bytes:
    return (json.dumps(raw, indent=1, sort_keys=False) + "\n").encode("utf-8")


def write_json(raw: dict, path: Path) -> None:
    """``raw`` as JSON at ``path``, whole or not at all: a file already there stays as it was if this fails."""
    data = _json_bytes(raw)
    _write(path, lambda f: f.write(data))


def report_files(path: Path) -> tuple[Path, Path, Path]:
    """The files of the report whose JSON is ``path``: the JSON, its Markdown and its chart."""
    return path, path.with_suffix(".md"), path.with_suffix(".png")


def write_reports(raw: dict, path: Path) -> list[Path]:
    """The report as JSON at ``path``, beside it as Markdown (``.md``) and, with matplotlib, a chart (``.png``).

    All or none: the three are written beside their targets first and renamed into
    place only once all three are complete, so a failure (``ReportNotWritten``,
    naming the file and why) leaves the folder as it was, an earlier report included.
    Returns the paths written; the ``.png`` is missing from them without matplotlib (and an earlier one removed).
    """
    json_path, md_path, png_path = report_files(path)
    json_data, md_data = _json_bytes(raw), _markdown_bytes(raw)
    staged: list[tuple[Path, Path]] = []
    try:
        staged.append((_stage(json_path, lambda f: f.write(json_data)), json_path))
        staged.append((_stage(md_path, lambda f: f.write(md_data)), md_path))
        try:
            figure = _figure(raw)
        except ImportError:
            figure = None
        if figure is not None:
            try:
                staged.append((_stage(png_path, lambda f: _save_figure(figure, f)), png_path))
            finally:
                _close_figure(figure)
    except BaseException:
        for tmp, _ in staged:
            _discard(tmp)
        raise
    _publish(staged)
    if figure is None:  # without matplotlib: an earlier report's chart is not left beside this one's tables
        with contextlib.suppress(OSError):
            png_path.unlink(missing_ok=True)
    return [target for _, target in staged]


def _f(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _range(s: dict | None) -> str:
    if not s:
        return "–"
    if s["n"] == 1:
        return f"{s['median']:,.0f}"
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"


def _ratio(value: float | None, paired: dict | None) -> str:
    if value is None:
        return "–"
    if not paired or paired["n"] < 2:
        return f"{value:.3f}"
    return f"{value:.3f} ({paired['min']:.2f}–{paired['max']:.2f})"


def markdown(raw: dict) -> str:
    s, cfg = raw["summary"], raw["config"]
    dev = raw["device"]
    precisions = cfg.get("precisions") or [cfg["precision"]]
    peaks = "; ".join(f"{p} {peak_flops(raw, p) / 1e9:,.1f} GFLOP/s" for p in precisions)
    # The speedups' reference: fp32 eager where measured, else the precision that was (bf16 alone: bf16 eager).
    reference = s["cells"].get(s.get("speedup_reference") or "", {}).get("precision", "fp32")
    # Every cell trains the same steps, so that their losses compare: an eager cell, warm after one step, times
    # the steps a compiled one spends compiling too.
    more = max((r.get("timed_steps") or 0 for r in raw.get("runs", [])), default=0)
    eager = (f" ({more:,} for eager cells: they warm up in one step, and every cell trains the same "
             f"{cfg['total_steps']:,} steps, so that their losses compare)" if more > cfg["steps"] else "")
    lines = [
        f"**{cfg['preset']}** preset ({cfg['num_parameters'] / 1e6:.1f}M parameters), **{dev['name']}**, "
        f"{', '.join(precisions)}; effective batch {cfg['effective_batch']} × {cfg['seq_len']} tokens = "
        f"{cfg['tokens_per_step']:,} tokens per optimizer step; {counted(cfg['steps'], 'timed step')} after "
        f"warm-up{eager} × {counted(cfg['repeats'], 'interleaved repeat')} (tokens/s: median and min–max over all "
        f"timed steps); "
        f"matmul peak (MFU's denominator, per precision: this machine's highest, as the CLI and the "
        f"dashboard use it): {peaks}; "
        f"{raw['flops_per_token'] / 1e6:,.1f} MFLOP per token; torch {raw['versions'].get('torch')}.",
        "",
        f"| cell | micro × accum | tokens/s median (min–max) | vs {reference} eager a1 | MFU | compile cold / warm (s) "
        "| peak mem (GiB) | training mem (GiB) | loss | trainer ÷ bare |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if raw.get("interrupted"):
        lines[1:1] = ["", f"**Partial results**: {raw['interrupted']}."]
    for row in s["cells"].values():
        if row["memory_only"]:
            continue
        compile_s = "–" if row["mode"] == "off" else f"{_f(row['compile_cold_s'], '{:.1f}')} / " \
                                                       f"{_f(row['compile_warm_s'], '{:.1f}')}"
        mfu = "–" if row.get("mfu") is None else mfu_text(row["mfu"])
        lines.append(
            f"| {row['name']} | {row['micro_batch']} × {row['accum']} | {_range(row['speedboard'])} | "
            f"{_f(row.get('speedup_vs_eager_a1'), '{:.2f}×')} | {mfu} | {compile_s} | "
            f"{_f(row.get('peak_gib'), '{:.2f}')} | {_f(row.get('train_mem_gib'), '{:.2f}')} | "
            f"{_f(row.get('loss'), '{:.4f}')} | {_f(row.get('trainer_vs_bare'), '{:.3f}')} |")
    refs = [r for r in s["cells"].values() if r.get("bare")]
    if refs:
        lines += ["", "References, measured side by side (tokens/s, median and min–max over all timed steps; "
                      "ratios: the median of the ratios of the median steps of runs made back to back, and in "
                      "brackets their range; "
                      "bookkeeping: the Trainer's loop iteration outside its timed optimizer step):", "",
                  "| cell | Speedboard trainer | bare loop, our model | trainer ÷ bare | Trainer bookkeeping "
                  "| bare loop, HF Llama | our model ÷ HF |", "|---|---|---|---|---|---|---|"]
        for row in refs:
            lines.append(f"| {row['name']} | {_range(row['speedboard'])} | {_range(row['bare'])} | "
                         f"{_ratio(row.get('trainer_vs_bare'), row.get('trainer_vs_bare_paired'))} | "
                         f"{_f(row.get('bookkeeping_share'), '{:.3%}')} | {_range(row.get('hf'))} | "
                         f"{_ratio(row.get('ours_vs_hf'), row.get('ours_vs_hf_paired'))} |")
    if s["memory"]:
        unit = "CUDA max allocated" if dev["type"] == "cuda" else "peak RSS"
        lines += ["", f"Memory of accumulation ({unit}; training memory = peak − the process before the model "
                      "existed; ratios on training memory; extra = what b × k holds beyond b × 1, beside the size "
                      "of the gradients that accumulation keeps between micro-steps; GiB):", "",
                  "| micro-batch b | accum k | b × k: peak / training | b × 1: peak / training "
                  "| plain batch b·k × 1: peak / training | (b×k) ÷ (b×1) | extra / gradients "
                  "| (b·k×1) ÷ (b×1) |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in s["memory"]:
            plain = (f"{m['plain_batch']}: {m['plain_peak_gib']:.2f} / {m['plain_train_gib']:.2f}"
                     if "plain_ratio" in m else "–")
            lines.append(f"| {m['micro_batch']} | {m['accum']} | {m['accum_peak_gib']:.2f} / "
                         f"{m['accum_train_gib']:.2f} | {m['micro_peak_gib']:.2f} / {m['micro_train_gib']:.2f} | "
                         f"{plain} | {m['accum_ratio']:.3f} | {_f(m.get('extra_gib'), '{:.3f}')} / "
                         f"{_f(m.get('grad_gib'), '{:.3f}')} | {_f(m.get('plain_ratio'), '{:.2f}')} |")
    loss = s["loss"]
    for precision, a in loss.get("per_precision", {}).items():
        versus = ""
        if "vs_fp32" in a:
            versus = (f"; against fp32's reference {a['vs_fp32']['deviation']:+.2e}: "
                      f"{'agrees' if a['vs_fp32']['agree'] else 'DISAGREES'}")
        lines += ["", f"Loss after {loss['tokens']:,} tokens, {precision}: reference {a['reference']} = "
                      f"{a['reference_loss']:.5f}; largest deviation {a['max_abs_deviation']:.2e} "
                      f"({a['worst']}), tolerance {a['tolerance']:g}: "
                      f"{'all runs agree' if a['agree'] else 'DISAGREE'}{versus}."]
    if s["targets"]:
        lines += ["", "| target | value | goal | met |", "|---|---|---|---|"]
        for t in s["targets"]:
            value = "–" if t["value"] is None else (f"{t['value']:.0%}" if t["target"].startswith("MFU")
                                                    else f"{t['value']:.3g}")
            met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
            lines.append(f"| {t['target']} | {value} | {t['goal']} | {met} |")
    for r in raw.get("cuda_graph_grads", []):
        lines.append(f"\nCUDA-graph mode {r['mode']} with accumulation {r['accum']}: accumulated gradients differ from "
                     f"eager by at most {r['max_relative_difference']:.2e} (relative; tolerance {r['tolerance']:g}): "
                     f"{'correct' if r['ok'] else 'WRONG'}.")
    problems = [f"- {row['name']}: {w}" for row in s["cells"].values() for w in row.get("warnings", [])]
    problems += [f"- {row['name']} FAILED, {f}" for row in s["cells"].values() for f in row.get("failures", [])]
    problems += [f"- {row['name']} probe {k}: {e}" for row in s["cells"].values()
                 for k, e in row.get("probe_errors", {}).items()]
    if problems:
        lines += ["", "Warnings:", "", *problems]
    return "\n".join(lines) + "\n"


def _markdown_file(raw: dict) -> str:
    head = f"# Speedboard benchmark\n\n`{raw['command']}` — {raw['created']}\n\n"
    return head + markdown(raw)


def _markdown_bytes(raw: dict) -> bytes:
    # A path that is not UTF-8 (a folder named with a byte 0xff: its command line holds a lone surrogate) is
    # written as its escape, "\udcff": it made the encoding fail once everything had been measured.
    return _markdown_file(raw).encode("utf-8", errors="backslashreplace")


def write_markdown(raw: dict, path: Path) -> None:
    """The report as Markdown at ``path``, whole or not at all."""
    data = _markdown_bytes(raw)
    _write(path, lambda f: f.write(data))


def write_png(raw: dict, path: Path) -> None:
    """The chart (``_figure``) as a PNG at ``path``, whole or not at all; ImportError without matplotlib."""
    figure = _figure(raw)
    try:
        _write(path, lambda f: _save_figure(figure, f))
    finally:
        _close_figure(figure)


def _save_figure(fig, f: IO[bytes]) -> None:
    fig.savefig(f, format="png", dpi=110)


def _close_figure(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _figure(raw: dict):
    """Tokens/s per cell and runner (bars: median, whiskers: min–max) above peak memory per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in raw["summary"]["cells"].values() if not r["memory_only"]]
    names = [r["name"] for r in rows]
    x = list(range(len(rows)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(7.0, 0.9 * len(rows) + 2), 7), sharex=True)
    width = 0.27
    for i, (runner, label) in enumerate((("speedboard", "Speedboard trainer"), ("bare", "bare loop"),
                                         ("hf", "bare loop, HF Llama"))):
        xs, ys, lo, hi = [], [], [], []
        for j, r in enumerate(rows):
            st = r.get(runner)
            if st:
                xs.append(j + (i - 1) * width)
                ys.append(st["median"])
                lo.append(st["median"] - st["min"])
                hi.append(st["max"] - st["median"])
        if xs:
            ax1.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
    ax1.set_ylabel("tokens/s")
    ax1.margins(y=0.25)  # headroom: the legend sits above the tallest whisker
    if ax1.get_legend_handles_labels()[0]:  # a partial report (stopped before a run) has no bars to name
        ax1.legend(fontsize=8, ncol=3, loc="upper center")
    precisions = ", ".join(raw["config"].get("precisions") or [raw["config"]["precision"]])
    ax1.set_title(f"{raw['config']['preset']} on {raw['device']['name']}, {precisions}", fontsize=10)
    peaks = [r.get("peak_gib") or 0.0 for r in rows]
    train = [r.get("train_mem_gib") or 0.0 for r in rows]
    ax2.bar(x, peaks, 0.5, color="#bbbbbb", label="peak")
    ax2.bar(x, train, 0.5, color="#4c72b0", label="training (peak − process before the model)")
    ax2.set_ylabel("GiB")
    ax2.margins(y=0.25)
    ax2.legend(fontsize=8, ncol=2, loc="upper center")
    ax2.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report BENCH_JSON``: summarise again and rewrite it, and bench.md and bench.png beside it."""
    import sys

    from bench.module_cli import module_parser

    p = module_parser("report", main.__doc__.replace("``", ""))
    p.add_argument("bench_json", type=Path, help="a bench.json that speedboard bench wrote")
    path = p.parse_args(argv).bench_json
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or not str(raw.get("schema", "")).startswith("speedboard-bench/"):
            raise ReportNotWritten(f"{path} is not a report of speedboard bench")
        raw["summary"] = summarise(raw)
        write_reports(raw, path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        print(f"python -m bench.report: error: cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
              file=sys.stderr)
        return 2
    except ReportNotWritten as exc:
        print(f"python -m bench.report: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
