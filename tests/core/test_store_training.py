"""Training on the token store: exact accumulation, resume, micro-batches built one at a time, micro-batches that
cannot fit refused before anything is allocated. (Rank equivalence on the store: every run reads its data from the
store, so tests/core/test_distributed.py's DDP and FSDP equivalence tests run on it.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.config import ModelConfig
from core.errors import ConfigError
from core.events import ListSink, StepMetrics
from core.memory_budget import check_fits, estimate_training_memory
from core.trainer import Trainer, train
from tests.core.dist_helpers import forwards, record

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


@pytest.fixture(scope="module")
def parquet_corpus(tmp_path_factory) -> str:
    """Two Parquet shards of uneven documents under a 'content' column."""
    folder = tmp_path_factory.mktemp("parquet")
    words = "the quick brown fox jumps over a lazy dog while the cat sleeps".split()
    rows = [" ".join(words[j % len(words)] for j in range(2 + (i * 7) % 59)) for i in range(120)]
    for k in range(2):
        pq.write_table(pa.table({"content": rows[k * 60:(k + 1) * 60]}), folder / f"part-{k}.parquet")
    return str(folder)


def store_config(micro, corpus: str, layout: str = "document", **train_):
    return micro(data={"source": corpus, "text_field": "content", "layout": layout, "vocab_size": 300},
                 train={"warmup_ratio": 0.0, **train_})


def params_of(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("layout", ["packed", "document"])
def test_accumulation_is_exact_on_the_store(micro, parquet_corpus, layout):
    results = []
    for mb, accum in ((8, 1), (2, 4), (1, 8)):
        sink = ListSink()
        trainer = Trainer(store_config(micro, parquet_corpus, layout, micro_batch=mb, accum_steps=accum, budget=2),
                          sink=sink)
        trainer.run()
        results.append((params_of(trainer), [s.loss for s in sink.of(StepMetrics)]))
    ref, ref_losses = results[0]
    for params, losses in results[1:]:
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for key in ref:
            assert torch.allclose(ref[key], params[key], atol=2e-6, rtol=0), key


def test_micro_batches_are_read_one_at_a_time(micro, parquet_corpus, monkeypatch):
    """No global batch is built up front: every read from the store is one micro-batch."""
    from core.samples import SplitView

    sizes = []
    real = SplitView.batch

    def spy(self, indices):
        sizes.append(len(np.asarray(indices)))
        return real(self, indices)

    monkeypatch.setattr(SplitView, "batch", spy)
    train(store_config(micro, parquet_corpus, micro_batch=2, accum_steps=5, budget=2, eval_every=0))
    assert sizes[:10] == [2] * 10  # two optimizer steps of five micro-batches (validation follows)


def test_resume_continues_the_same_sample_stream(micro, parquet_corpus, tmp_path):
    whole = record(store_config(micro, parquet_corpus, micro_batch=2, accum_steps=2, budget=4, save_every=2))
    first = record(store_config(micro, parquet_corpus, micro_batch=2, accum_steps=2, budget=4, save_every=2)
                   .replace(out_dir=str(tmp_path / "first")), )
    checkpoint = next((tmp_path / "first").rglob("step_0000002"))
    resumed = record(store_config(micro, parquet_corpus, micro_batch=2, accum_steps=2, budget=4)
                     .replace(resume=str(checkpoint), out_dir=str(tmp_path / "second")))
    assert forwards(resumed["timeline"]) == {s: f for s, f in forwards(whole["timeline"]).items() if s > 2}
    assert forwards(first["timeline"]) == forwards(whole["timeline"])
    losses = {e["step"]: e["loss"] for e in whole["events"] if e["event"] == "step"}
    again = {e["step"]: e["loss"] for e in resumed["events"] if e["event"] == "step"}
    assert again == pytest.approx({s: loss for s, loss in losses.items() if s > 2}, rel=1e-5)


def test_a_micro_batch_that_cannot_fit_is_refused_before_anything_is_allocated(micro, tmp_path, monkeypatch):
    cfg = micro(train={"micro_batch": 100_000_000})
    with pytest.raises(ConfigError, match=r"micro-batch 100,000,000 × 32 tokens needs at least .* GiB") as err:
        train(cfg)
    assert err.value.field == "micro_batch" and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()
    model = ModelConfig(vocab_size=50_000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=3,
                        intermediate_size=3072, max_position_embeddings=2048)
    est = estimate_training_memory(model, 8, 1024)
    assert est.weights == 4 * model.num_parameters() and est.optimizer == 2 * est.weights
    assert estimate_training_memory(model, 16, 1024).activations == 2 * est.activations
    assert estimate_training_memory(model, 8, 1024, shards=4).weights == -(-model.num_parameters() // 4) * 4
    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (est.states // 2, "memory of a small GPU"))
    with pytest.raises(ConfigError, match="the model alone needs about"):
        check_fits(model, 1, 1024, "bf16", torch.device("cpu"))
    monkeypatch.setattr("core.memory_budget.device_memory", lambda device: (est.total * 2, "RAM"))
    check_fits(model, 8, 1024, "fp32", torch.device("cpu"))  # fits: no error
