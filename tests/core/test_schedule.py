"""The learning rate is a function of tokens consumed."""

import math

from core.schedule import LRSchedule


def test_warmup_then_cosine_to_minimum():
    s = LRSchedule(max_lr=1.0, min_lr=0.1, warmup_tokens=100, end_tokens=1100)
    assert s(50) == 0.5 and s(100) == 1.0
    assert math.isclose(s(600), 0.55)
    assert math.isclose(s(1100), 0.1) and math.isclose(s(5000), 0.1)


def test_schedule_is_invariant_to_the_effective_batch():
    """Runs with accumulation 1 and 4 see the same LR at the same token counts."""
    s = LRSchedule(3e-3, 3e-4, warmup_tokens=2048, end_tokens=64 * 1024)
    small_steps = {t: s(t) for t in range(1024, 64 * 1024 + 1, 1024)}
    big_steps = {t: s(t) for t in range(4096, 64 * 1024 + 1, 4096)}
    for t, lr in big_steps.items():
        assert lr == small_steps[t]


def test_extension_segment_starts_from_its_own_origin():
    s = LRSchedule(1.0, 0.0, warmup_tokens=0, end_tokens=300, start_tokens=100)
    assert s(100) == 1.0 and math.isclose(s(200), 0.5) and math.isclose(s(300), 0.0)
