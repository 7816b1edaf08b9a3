"""The learning rate is a function of tokens consumed."""

import math

import pytest

from core.config import TrainConfig
from core.errors import ConfigError
from core.schedule import LRSchedule, Position, budget_tokens, make_schedule


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


# ---------------------------------------------------------------- the schedule a run makes (make_schedule)
NEW = Position(step=0, tokens=0, tokens_per_step=1000, epoch_tokens=25_000)


def parent_state(train: TrainConfig, schedule: LRSchedule) -> dict:
    return {"schedule": schedule.to_dict(), "train_config": train.to_dict()}


@pytest.mark.parametrize(("kind", "budget", "tokens"), [("steps", 30, 30_000), ("tokens", 12_345, 12_345),
                                                      ("tokens", 10, 1000), ("epochs", 0.5, 12_500)])
def test_a_budget_in_any_unit_is_counted_in_tokens(kind, budget, tokens):
    assert budget_tokens(TrainConfig(budget_kind=kind, budget=budget), NEW) == tokens


def test_a_new_run_warms_up_over_its_share_of_the_budget():
    train = TrainConfig(budget_kind="steps", budget=100, lr=1e-3, min_lr=1e-4, warmup_ratio=0.1)
    assert make_schedule(train, NEW) == LRSchedule(1e-3, 1e-4, warmup_tokens=10_000, end_tokens=100_000)


def test_a_resume_of_a_stopped_parent_follows_its_schedule_by_tokens_whatever_the_batch():
    train = TrainConfig(budget_kind="steps", budget=100, lr=1e-3, min_lr=1e-4)
    theirs = make_schedule(train, NEW)
    here = Position(step=10, tokens=40_000, tokens_per_step=4000, epoch_tokens=25_000)  # accumulation × 4 now
    assert make_schedule(train, here, parent_state(train, theirs)) == theirs


def test_a_budget_changed_on_resume_is_the_lineages_new_total():
    train = TrainConfig(budget_kind="steps", budget=100)
    theirs = make_schedule(train, NEW)
    longer = TrainConfig(budget_kind="steps", budget=150)
    here = Position(step=40, tokens=40_000, tokens_per_step=2000, epoch_tokens=25_000)
    resumed = make_schedule(longer, here, parent_state(train, theirs))
    # 110 steps remain at the new batch: the horizon is counted from the lineage's start, in steps.
    assert resumed.end_tokens == 40_000 + 110 * 2000
    assert (resumed.warmup_tokens, resumed.start_tokens) == (theirs.warmup_tokens, theirs.start_tokens)
    with pytest.raises(ConfigError, match="already used up"):
        make_schedule(TrainConfig(budget_kind="steps", budget=40), here, parent_state(train, theirs))


def test_a_finished_parent_gets_a_new_cosine_without_warmup():
    train = TrainConfig(budget_kind="steps", budget=100, lr=1e-3, min_lr=1e-4)
    theirs = make_schedule(train, NEW)
    here = Position(step=100, tokens=100_000, tokens_per_step=1000, epoch_tokens=25_000)
    assert make_schedule(train, here, parent_state(train, theirs)) == LRSchedule(1e-3, 1e-4, 0, 200_000, 100_000)


def test_a_total_set_on_resume_inside_the_warmup_is_refused():
    """--steps 10 on a resume of a 40-step run warming up for 20 ended at step 10, still warming up: the learning
    rate never reached its peak nor decayed."""
    train = TrainConfig(budget_kind="steps", budget=40, warmup_ratio=0.5)
    theirs = make_schedule(train, NEW)  # warms up to 20,000 tokens: step 20
    here = Position(step=5, tokens=5_000, tokens_per_step=1000, epoch_tokens=25_000)
    with pytest.raises(ConfigError, match=r"inside the warmup the lineage keeps \(to 20,000 tokens, about step 20\)"):
        make_schedule(TrainConfig(budget_kind="steps", budget=20), here, parent_state(train, theirs))
    past = make_schedule(TrainConfig(budget_kind="steps", budget=21), here, parent_state(train, theirs))
    assert past.end_tokens == 21_000 and past.warmup_tokens == 20_000  # a step past it: warmup, then its cosine
