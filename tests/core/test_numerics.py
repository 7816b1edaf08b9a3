"""fp32 and bf16 autocast agree: the short version of ``python -m bench.numerics`` (tiny preset, 30 steps)."""

from __future__ import annotations

from bench.numerics import FINAL_TOLERANCE, WINDOW_TOLERANCE, compare


def test_bf16_autocast_follows_the_fp32_loss_curve(tmp_path, single_thread):
    r = compare(steps=30, micro_batch=4, seq_len=64, window=5, out_dir=str(tmp_path))
    assert len(r.fp32) == len(r.bf16) == 30
    assert r.fp32[0] > r.fp32[-1] + 0.5  # it learned something, so agreement means something
    assert r.fp32 != r.bf16  # bf16 really rounded: the curves are close, not the same
    assert r.max_window_diff <= WINDOW_TOLERANCE, r.window_diffs
    assert r.final_diff <= FINAL_TOLERANCE, r.window_diffs
