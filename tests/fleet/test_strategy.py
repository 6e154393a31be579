"""Rollout strategies as users write them: what is accepted, and what each mistake says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.fleet.strategy import Canary, Pace, Pause, RolloutStrategy, StrategyError


def test_a_canary_takes_sessions_or_percent_not_both() -> None:
    with pytest.raises(StrategyError, match="sessions .* or percent, not both nor neither"):
        Canary(sessions=1, percent=5)
    with pytest.raises(StrategyError, match="not both nor neither"):
        Canary()


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (lambda: Canary(sessions=0), "canary.sessions is 0: give 1 to"),
        (lambda: Canary(percent=0), "canary.percent is 0: give 1 to 100"),
        (lambda: Canary(percent=101), "canary.percent is 101: give 1 to 100"),
        (lambda: Pause(seconds=0), "pause.durationSeconds is 0: give 1 to 604800"),
        (lambda: Pause(seconds=10**9), "or leave it out to pause until the rollout is resumed"),
        (lambda: Pace(max_concurrent=0), "maxConcurrentMigrations is 0: give 1 to"),
        (lambda: Pace(max_per_node=0), "maxConcurrentPerNode is 0"),
        (lambda: Pace(max_concurrent=2, max_per_node=3), "exceeds maxConcurrentMigrations"),
        (lambda: Pace(max_unavailable=-1), "maxUnavailable is -1"),
        (lambda: RolloutStrategy(failure_budget=-1), "failureBudget is -1"),
    ],
)
def test_each_mistake_names_the_field_and_the_fix(step: object, message: str) -> None:
    with pytest.raises(StrategyError, match=message) as caught:
        step()  # type: ignore[operator]
    assert caught.value.reason == "InvalidRolloutStrategy"


def test_a_canary_step_may_not_shrink() -> None:
    with pytest.raises(StrategyError, match=r"step 2 \(canary 5%\) is smaller than .*canary 10%"):
        RolloutStrategy(steps=(Canary(percent=10), Pause(), Canary(percent=5)))
    with pytest.raises(StrategyError, match="smaller than an earlier step"):
        RolloutStrategy(steps=(Canary(sessions=3), Canary(sessions=2)))
    # A count after a percentage depends on the fleet's size: allowed.
    RolloutStrategy(steps=(Canary(percent=50), Canary(sessions=2)))


def test_too_many_steps() -> None:
    with pytest.raises(StrategyError, match="65 steps: a strategy has at most 64"):
        RolloutStrategy(steps=(Pause(seconds=1),) * 65)


def test_defaults_are_safe() -> None:
    strategy = RolloutStrategy()
    assert strategy.pace == Pace(max_concurrent=10, max_per_node=2, max_unavailable=0)
    assert strategy.failure_budget == 0
    assert strategy.describe(strategy.final_step) == "all sessions"


@settings(max_examples=200, deadline=None)
@given(percent=st.integers(1, 100), movable=st.integers(0, 5000))
def test_a_percentage_rounds_up_and_never_exceeds_the_fleet(percent: int, movable: int) -> None:
    goal = Canary(percent=percent).goal(movable)
    assert goal <= movable
    assert goal * 100 >= percent * movable
    if movable:
        assert goal >= 1  # 1% of a small fleet is still one canary, never none
