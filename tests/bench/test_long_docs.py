"""bench.long_docs: the corpus it writes has the promised shape, and the bench runs end to end (no timing asserted)."""

from __future__ import annotations

import json

import pytest

from bench.long_docs import MAX_WORDS, MIN_WORDS, ROW_GROUPS, build_corpus


def test_the_corpus_is_long_documents_in_parquet_shards_the_same_for_a_seed(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    counts = build_corpus(tmp_path / "a", 0.002, shards=2, seed=3)
    shards = sorted((tmp_path / "a").glob("*.parquet"))
    assert len(shards) == 2 and counts["shards"] == 2
    texts = []
    for shard in shards:
        meta = pq.ParquetFile(shard).metadata
        assert meta.num_row_groups == min(ROW_GROUPS, meta.num_rows)
        texts += pq.read_table(shard).column("text").to_pylist()
    assert len(texts) == counts["documents"] and sum(map(len, texts)) == counts["text_chars"]
    assert counts["text_chars"] >= 0.002e9  # each shard is filled to its share, within one document
    for text in texts:
        assert MIN_WORDS <= len(text.split()) <= MAX_WORDS
    build_corpus(tmp_path / "b", 0.002, shards=2, seed=3)
    assert [p.read_bytes() for p in shards] == [p.read_bytes() for p in sorted((tmp_path / "b").glob("*.parquet"))]


@pytest.mark.slow
def test_the_bench_prepares_the_corpus_in_a_process_of_its_own_and_reports_it(tmp_path, monkeypatch, capsys):
    import bench.data_scale
    from bench.long_docs import main

    # The start of training from a store is bench.data_scale's own measurement (tests/bench/test_data_scale.py).
    started = []
    monkeypatch.setattr(bench.data_scale, "measure_start", lambda path, env, out: started.append(path) or
                        {"first_step_seconds": 1.5, "peak_rss_mib": 500.0, "from_store": True})
    out = tmp_path / "figures.json"
    assert main(["--gigabytes", "0.001", "--shards", "1", "--workdir", str(tmp_path / "work"),
                 "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert started == [tmp_path / "work" / "corpus"]
    assert row["tokenizer_docs"] == row["documents"]  # under the character bound, the whole corpus is the sample
    assert row["tokens"] > row["documents"] * MIN_WORDS and row["store_bytes"] > 0
    assert row["prepare_peak_rss_mib"] > 100 and row["prepare_seconds"] > row["store_seconds"] > 0
    assert "peak RSS" in capsys.readouterr().out
    assert not any((tmp_path / "work").iterdir())  # without --keep, nothing is left behind
