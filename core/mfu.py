"""Model FLOPs utilization: one formula for every figure shown (the CLI's step lines, the dashboard's run table,
``speedboard tune`` and ``speedboard bench``), and when its denominator deserves to be measured again.

The denominator is this machine's matmul peak in the run's precision (``core.precision.matmul_peak``), measured and
cached; the numerator the model's FLOP/s (``core.device.training_flops_per_token`` × tokens/s). No torch here: the
reports and the window compute it from recorded figures.
"""

from __future__ import annotations

PEAK_CHECK_MFU = 0.9
"""A training step (or a tune trial's median step) at this share of the cached matmul peak or more has the peak
measured again, once: a figure cached while the machine was busy reads low, and an MFU near 100% is how it shows."""


def peak_share(tokens_per_s: float, flops_per_token: float, peak_flops: float | None,
               world_size: int = 1) -> float | None:
    """The model's FLOP/s over the matmul peak of all ``world_size`` processes, as measured: past 1 where the cached
    peak reads low (what ``PEAK_CHECK_MFU`` is compared with). None without a peak."""
    if not (peak_flops and peak_flops > 0 and flops_per_token):
        return None
    return tokens_per_s * flops_per_token / (peak_flops * world_size)


def utilization(tokens_per_s: float, flops_per_token: float, peak_flops: float | None,
                world_size: int = 1) -> float | None:
    """MFU: ``peak_share`` at most 1, as it is shown: a model's FLOP/s beyond the measured GEMM peak proves the peak
    low, not the model faster. None without a peak."""
    share = peak_share(tokens_per_s, flops_per_token, peak_flops, world_size)
    return None if share is None else min(1.0, share)


def mfu_text(mfu: float) -> str:
    """MFU as the tables show it: whole percents, with a decimal below 10% (a tiny model's 0.7% read "1%",
    2.5% "2%", beside the CLI's "0.7%")."""
    return f"{mfu:.1%}" if mfu < 0.1 else f"{mfu:.0%}"
