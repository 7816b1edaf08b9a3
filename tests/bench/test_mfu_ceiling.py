"""The MFU ceiling: the step's matmuls and attention, counted as MFU counts them."""

from __future__ import annotations

import pytest

from bench.mfu_ceiling import Ceiling, linear_shapes, main, measure_ceiling
from core.config import ModelConfig, preset
from core.device import training_flops_per_token


def test_linear_shapes_are_the_models_matmul_weights():
    cfg = preset("small").model
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    embedding = cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    assert sum(i * o for i, o in linear_shapes(cfg)) == cfg.num_parameters() - embedding - norms


def test_ceiling_counts_the_step_flops_of_mfu_and_bounds_it():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=48, max_position_embeddings=16)
    c = measure_ceiling(cfg, micro_batch=2, seq_len=8, precision="fp32", peak_flops=1e9, repeats=1)
    assert c.rows == 16
    assert c.step_flops == training_flops_per_token(cfg, 8) * 16
    # MFU's count is the GEMMs, the causal attention and the norms' few weights (counted as matmuls)
    assert c.step_flops - c.gemm_flops - c.attention_flops == 6 * 16 * (2 * 2 + 1) * 32
    assert c.gemm_seconds > 0 and c.attention_seconds > 0
    assert c.mfu_gemm_attention() < c.mfu_gemm_only()  # attention's time can only lower the ceiling


def test_bf16_on_a_cpu_times_attention_in_fp32_as_the_model_runs_it(monkeypatch):
    import torch

    seen = set()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        seen.add((q.dtype, k.dtype, v.dtype))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                      intermediate_size=48, max_position_embeddings=16)
    measure_ceiling(cfg, micro_batch=2, seq_len=8, precision="bf16", peak_flops=1e9, repeats=1)
    assert seen == {(torch.float32,) * 3}


def test_ceiling_arithmetic():
    c = Ceiling(rows=10, step_flops=7e9, gemm_flops=6e9, attention_flops=1e9, gemm_seconds=1.0, attention_seconds=1.0,
                peak_flops=1e10)
    assert c.mfu_gemm_only() == pytest.approx(0.7)
    assert c.mfu_gemm_attention() == pytest.approx(0.35)


def test_cli_prints_the_ceiling_and_places_a_run(capsys, monkeypatch):
    monkeypatch.setattr("core.precision.matmul_peak", lambda device, precision: 1e9)
    assert main(["--preset", "tiny", "--precision", "fp32", "--repeats", "1", "--micro-batch", "1",
                 "--tokens-per-s", "1000"]) == 0
    out = capsys.readouterr().out
    assert "MFU ceiling:" in out and "a run at 1,000 tokens/s" in out


@pytest.mark.parametrize("args", [["--preset", "nope"], ["--repeats", "0"], ["--tokens-per-s", "nan"],
                                  ["--micro-batch", "x"]])
def test_bad_options_are_one_line_and_exit_2(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
