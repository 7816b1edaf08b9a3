"""A corpus of few, long documents: what preparing it costs, with the tokenizer's sample bounded in characters.

``bench.data_scale``'s documents are short (about 180 characters), so the tokenizer's
100,000 sample documents are a few MB. This bench writes the other shape: Parquet
shards (a ``text`` column, eight row groups a shard) of documents of 200–5,000 words
drawn Zipf-like from the built-in text's vocabulary (deterministic for a seed;
nothing is downloaded), about 4,700 documents per 100 MB, so that a 1 GB corpus
holds fewer than 100,000 documents and only the character bound
(``core.prepare.TOKENIZER_SAMPLE_CHARS``) keeps the tokenizer's sample small. Then
it runs ``speedboard prepare DIR --no-progress`` in a fresh cache folder and reports
its wall time, its tokenizer stage (documents sampled, seconds), the store
(tokens, bytes) and its peak resident memory (its own ``VmHWM``,
``bench.memory.ChildPeak``), and the start of ``speedboard train --preset tiny
--steps 1`` on the prepared store.

    python -m bench.long_docs                       # 1 GB in 8 shards (some minutes on 2 cores)
    python -m bench.long_docs --gigabytes 0.01      # a smoke test
    python -m bench.long_docs --workdir DIR --keep  # keep the corpus and the cache in DIR
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.module_cli import int_at_least, module_parser, output_file, positive_number, run_module, write_output

ROOT = Path(__file__).resolve().parents[1]
MIN_WORDS, MAX_WORDS = 200, 5_000
ROW_GROUPS = 8


def vocabulary() -> list[str]:
    """The distinct words of the built-in text, most frequent first (the Zipf ranks)."""
    from collections import Counter
    from pydoc_data.topics import topics

    counts = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", " ".join(topics.values())))
    return [w for w, _ in counts.most_common()]


def documents(rng, words, count: int) -> list[str]:
    """``count`` documents of MIN_WORDS..MAX_WORDS words, frequencies ∝ 1/rank, a full stop every ~15 words."""
    import numpy as np

    ranks = np.arange(1, len(words) + 1, dtype=np.float64)
    p = (1.0 / ranks) / (1.0 / ranks).sum()
    table = np.array(words + [w + "." for w in words], dtype=object)
    out = []
    for n in rng.integers(MIN_WORDS, MAX_WORDS + 1, size=count):
        ids = rng.choice(len(words), size=int(n), p=p)
        ids[rng.random(int(n)) < 1 / 15] += len(words)  # the sentence's last word carries its stop
        out.append(" ".join(table[ids]))
    return out


def build_corpus(folder: Path, gigabytes: float, shards: int = 8, seed: int = 0) -> dict:
    """Write ``shards`` Parquet files of together about ``gigabytes`` GB of text; their counts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = vocabulary()
    per_shard = gigabytes * 1e9 / shards
    docs_total = chars_total = 0
    for i in range(shards):
        docs, chars = [], 0
        while chars < per_shard:
            batch = documents(rng, words, 64)
            docs += batch
            chars += sum(map(len, batch))
        # Trim the last batch's overshoot: a shard ends at its size, within one document.
        while len(docs) > 1 and chars - len(docs[-1]) >= per_shard:
            chars -= len(docs.pop())
        table = pa.table({"text": docs})
        pq.write_table(table, folder / f"shard_{i:03d}.parquet", row_group_size=max(1, -(-len(docs) // ROW_GROUPS)))
        docs_total += len(docs)
        chars_total += chars
    return {"documents": docs_total, "text_chars": chars_total, "shards": shards,
            "parquet_bytes": sum(p.stat().st_size for p in folder.glob("*.parquet"))}


def measure_prepare(folder: Path, env: dict[str, str]) -> dict:
    """``speedboard prepare FOLDER --no-progress`` in its own process: wall time, peak RSS and what it printed."""
    from bench.memory import ChildPeak

    argv = [sys.executable, "-m", "core.cli", "prepare", str(folder), "--no-progress"]
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        peak = ChildPeak(proc.pid)  # not wait4's ru_maxrss: that starts at this process's own peak
        proc.wait()
        seconds = time.perf_counter() - t0
        peak_mib = peak.stop_mib()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"prepare failed ({proc.returncode}): {stderr.strip()[-500:]}")
    sampled = re.search(r"training the tokenizer on ([\d,]+) documents", stdout)
    store = re.search(r"prepared in \S+ \((.+)\)\s*$", stdout, re.MULTILINE)
    if not (sampled and store):
        raise RuntimeError(f"prepare's output changed: {stdout[-500:]}")
    store_dir = Path(store.group(1))
    manifest = json.loads((store_dir / "manifest.json").read_text(encoding="utf-8"))
    return {"prepare_seconds": seconds, "tokenizer_docs": int(sampled.group(1).replace(",", "")),
            "before_store_seconds": max(0.0, seconds - manifest["seconds"]), "store_seconds": manifest["seconds"],
            "tokens": manifest["tokens"], "store_bytes": sum(p.stat().st_size for p in store_dir.iterdir()),
            "prepare_peak_rss_mib": peak_mib}


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("long_docs", __doc__)
    parser.add_argument("--gigabytes", type=positive_number, default=1.0, help="text in the corpus (default 1)")
    parser.add_argument("--shards", type=int_at_least(1), default=8)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--workdir", help="where the corpus, cache and runs go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="leave the corpus and cache in --workdir")
    parser.add_argument("--json", type=output_file, help="write the figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="speedboard-long-docs-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        t0 = time.perf_counter()
        corpus = build_corpus(work / "corpus", args.gigabytes, args.shards, args.seed)
        print(f"corpus: {corpus['documents']:,} documents, {corpus['text_chars'] / 1e9:.3f} G characters in "
              f"{corpus['shards']} shards ({corpus['parquet_bytes'] / 1e6:,.0f} MB of Parquet), written in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPEEDBOARD_CACHE_DIR": str(work / "cache")}
        prep = measure_prepare(work / "corpus", env)
        from bench.data_scale import measure_start

        start = measure_start(work / "corpus", env, work / "runs")
        row = {**corpus, **prep, "first_step_seconds": start["first_step_seconds"],
               "train_peak_rss_mib": start["peak_rss_mib"], "from_store": start["from_store"]}
        print(f"prepare: {prep['prepare_seconds']:.0f} s in all, {prep['before_store_seconds']:.1f} s before the store "
              f"(start-up, the tokenizer trained on {prep['tokenizer_docs']:,} documents), "
              f"{prep['store_seconds']:.0f} s tokenizing into it: {prep['tokens']:,} tokens "
              f"({prep['store_bytes'] / 1e6:,.0f} MB store), "
              f"peak RSS {prep['prepare_peak_rss_mib']:,.0f} MiB")
        print(f"train: first step {start['first_step_seconds']:.2f} s after the start, peak RSS "
              f"{start['peak_rss_mib']:,.0f} MiB, from the store: {start['from_store']}")
        if not (args.keep and args.workdir):
            for sub in ("corpus", "cache", "runs"):
                _remove(work / sub)
    if args.json:
        write_output(args.json, json.dumps(row, indent=2))
    return 0


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run_module(main, "long_docs"))
