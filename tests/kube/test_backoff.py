"""Per-object backoff of failing reconciles, on a clock the test moves."""

from __future__ import annotations

from shadowpod.kube.backoff import FailureBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_failure_doubles_the_wait_up_to_the_cap_and_a_success_ends_it() -> None:
    clock = Clock()
    backoff = FailureBackoff(first_s=1.0, max_s=10.0, clock=clock)
    key = ("AgentSession", "ns", "bad")
    waits = []
    for _ in range(6):
        assert backoff.due(key, 1)
        waits.append(backoff.failed(key, 1))
        clock.now += waits[-1] - 0.01
        assert not backoff.due(key, 1)  # not before its wait is over
        clock.now += 0.01
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.due(("AgentSession", "ns", "other"), 1)  # per object
    backoff.succeeded(key)
    assert backoff.failed(key, 1) == 1.0  # forgotten: from the start again


def test_a_spec_change_is_tried_at_once_and_starts_the_waits_over() -> None:
    clock = Clock()
    backoff = FailureBackoff(first_s=1.0, clock=clock)
    key = ("AgentSession", "ns", "bad")
    for _ in range(4):
        backoff.failed(key, 1)
    assert not backoff.due(key, 1)
    assert backoff.due(key, 2)  # the user corrected it: a new generation
    assert backoff.failed(key, 2) == 1.0
