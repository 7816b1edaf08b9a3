"""Data at scale: preparing a corpus, and starting to train on it, at 5, 50 and 500 MB.

For each size a synthetic corpus is written from the built-in text (CPython's
documentation topics, repeated; nothing is downloaded), then measured in one run:

- preparation: characters per second tokenized into the token store (the
  tokenizer's training on the first documents is timed apart), beside the bare
  throughput of the same tokenizer's ``encode_batch`` on the same documents in
  the same batches (on the first 50 MB at most: the rate does not depend on the
  size); their ratio is what reading, packing and writing cost;
- the time from starting ``speedboard train`` (tiny preset, ``--steps 1``) to
  its first optimizer step, with the store prepared;
- the peak resident memory of that training process (its own ``VmHWM``, ``bench.memory.ChildPeak``).

Targets: preparation ≥ 0.8× bare ``encode_batch``; start to first step ≤ 5 s at
every size; peak memory at 500 MB ≤ 1.15× that at 5 MB.

    python -m bench.data_scale                 # 5, 50, 500 MB (several minutes on 2 cores)
    python -m bench.data_scale --quick         # 0.2 and 1 MB: a smoke test
    python -m bench.data_scale --sizes 5,50 --json out.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import module_parser, output_file, positive_numbers, run_module, write_output

ROOT = Path(__file__).resolve().parents[1]
BARE_LIMIT_CHARS = 50_000_000


def build_corpus(path: Path, megabytes: float) -> int:
    """A text file of about ``megabytes`` MB: the built-in topics, repeated, each copy numbered."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    target = int(megabytes * 1e6)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        copy = 0
        while written < target:
            chunk = f"Copy {copy}.\n\n{text}\n\n"
            if written + len(chunk) > target:
                cut = chunk.rfind("\n\n", 0, max(2, target - written))
                chunk = chunk[: cut + 2] if cut > 0 else chunk[: target - written]
            f.write(chunk)
            written += len(chunk.encode("utf-8"))
            copy += 1
    return path.stat().st_size


def measure_prepare(path: Path) -> dict:
    """Prepare ``path`` for the tiny preset (in this process); the store's own timing and counts."""
    from core.config import config_from_preset
    from core.events import ListSink
    from core.prepare import prepare_corpus

    cfg = dataclasses.replace(config_from_preset("tiny").data, source=str(path))
    sink = ListSink()
    t0 = time.perf_counter()
    prepared = prepare_corpus(cfg, sink=sink)
    total = time.perf_counter() - t0
    manifest = prepared.store.manifest
    return {"tokenizer": prepared.tokenizer, "source": prepared.source, "store_seconds": manifest["seconds"],
            "text_chars": manifest["text_chars"], "tokens": manifest["tokens"], "documents": manifest["documents"],
            "total_seconds": total, "tokenizer_seconds": max(0.0, total - manifest["seconds"])}


def measure_bare(source, tokenizer, limit_chars: int = BARE_LIMIT_CHARS) -> dict:
    """Seconds inside ``encode_batch`` (and ``encode_batch_fast``) on the source's own batches."""
    from core.token_store import plain_text_tokenizer

    tok = plain_text_tokenizer(tokenizer)  # the store's own encoder settings
    variants = {"encode_batch": tok.encode_batch}
    if hasattr(tok, "encode_batch_fast"):
        variants["encode_batch_fast"] = tok.encode_batch_fast
    out = {}
    for name, fn in variants.items():
        chars, seconds = 0, 0.0
        for docs, _ in source.iter_documents():
            t = time.perf_counter()
            fn(docs, add_special_tokens=False)
            seconds += time.perf_counter() - t
            chars += sum(map(len, docs))
            if chars >= limit_chars:
                break
        out[name] = chars / seconds / 1e6
    return out


def measure_start(path: Path, env: dict[str, str], out_dir: Path) -> dict:
    """Seconds from starting ``speedboard train`` to its first step's line, and the process' peak RSS."""
    argv = [sys.executable, "-m", "core.cli", "train", "--preset", "tiny", "--data", str(path), "--steps", "1",
            "--eval-every", "0", "--no-progress", "--log-every", "1", "--device", "cpu", "--out", str(out_dir)]
    from bench.memory import ChildPeak

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = ChildPeak(proc.pid)
    first = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if first is None and line.startswith("step ") and line.split()[1] == "1":
            first = time.perf_counter() - t0
    stderr = proc.stderr.read()
    proc.wait()
    peak_mib = peak.stop_mib()
    if proc.returncode != 0 or first is None:
        raise RuntimeError(f"training failed ({proc.returncode}): {stderr.strip()[-500:]}")
    from_store = any("from its token store" in line for line in lines)
    return {"first_step_seconds": first, "peak_rss_mib": peak_mib, "from_store": from_store}


def run(sizes: list[float], workdir: Path) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    cache = workdir / "cache"
    os.environ["SPEEDBOARD_CACHE_DIR"] = str(cache)  # a fresh cache: every corpus is prepared here
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPEEDBOARD_CACHE_DIR": str(cache)}
    rows = []
    for mb in sizes:
        path = workdir / f"corpus_{mb:g}MB.txt"
        size = build_corpus(path, mb)
        prep = measure_prepare(path)
        bare = measure_bare(prep["source"], prep["tokenizer"])
        start = measure_start(path, env, workdir / "runs")
        store_rate = prep["text_chars"] / prep["store_seconds"] / 1e6
        row = {"size_mb": size / 1e6, "documents": prep["documents"], "tokens": prep["tokens"],
               "tokenizer_seconds": prep["tokenizer_seconds"], "prepare_seconds": prep["store_seconds"],
               "prepare_mchars_s": store_rate, "bare_encode_batch_mchars_s": bare["encode_batch"],
               "bare_encode_batch_fast_mchars_s": bare.get("encode_batch_fast"),
               "ratio_to_encode_batch": store_rate / bare["encode_batch"], **start}
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    fast = r["bare_encode_batch_fast_mchars_s"]
    return (f"{r['size_mb']:8.1f} MB | {r['documents']:>10,} docs | {r['tokens']:>12,} tokens | tokenizer "
            f"{r['tokenizer_seconds']:6.1f} s | prepare {r['prepare_seconds']:7.1f} s = {r['prepare_mchars_s']:5.2f} "
            f"M chars/s | bare encode_batch {r['bare_encode_batch_mchars_s']:5.2f}"
            f"{f' (fast {fast:5.2f})' if fast else ''} → ratio {r['ratio_to_encode_batch']:.2f} | "
            f"first step {r['first_step_seconds']:5.2f} s | peak RSS {r['peak_rss_mib']:6.0f} MiB")


def markdown(rows: list[dict]) -> str:
    head = ("| corpus | documents | tokens | tokenizer training | preparation | bare `encode_batch` (`_fast`) | "
            "ratio | start → first step | peak RSS |\n|---|---|---|---|---|---|---|---|---|")

    def bare(r: dict) -> str:
        fast = r["bare_encode_batch_fast_mchars_s"]
        return f"{r['bare_encode_batch_mchars_s']:.2f}{f' ({fast:.2f})' if fast else ''} M chars/s"

    body = [f"| {r['size_mb']:.3g} MB | {r['documents']:,} | {r['tokens']:,} | {r['tokenizer_seconds']:.1f} s | "
            f"{r['prepare_seconds']:.1f} s, {r['prepare_mchars_s']:.2f} M chars/s | {bare(r)} | "
            f"{r['ratio_to_encode_batch']:.2f} | {r['first_step_seconds']:.2f} s | {r['peak_rss_mib']:.0f} MiB |"
            for r in rows]
    if len(rows) > 1:
        ratio = rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"]
        body.append(f"\nPeak RSS, largest over smallest corpus: {ratio:.3f}×")
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("data_scale", __doc__)
    parser.add_argument("--sizes", type=positive_numbers, default=(5.0, 50.0, 500.0),
                        help="corpus sizes in MB, comma-separated")
    parser.add_argument("--quick", action="store_true", help="0.2 and 1 MB: a smoke test")
    parser.add_argument("--json", type=output_file, help="write the rows to this file")
    parser.add_argument("--workdir", help="where corpora, cache and runs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    sizes = [0.2, 1.0] if args.quick else list(args.sizes)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix="speedboard-data-scale-") as tmp:
        rows = run(sizes, Path(args.workdir) if args.workdir else Path(tmp))
    print()
    print(markdown(rows))
    if load is not None:
        print(f"\nload average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    if args.json:
        write_output(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "data_scale"))
