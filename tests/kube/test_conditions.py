"""Conditions keep their transition time until their status changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shadowpod.kube.conditions import find, set_condition, with_defaults
from shadowpod.kube.models.v1alpha1 import SessionCondition

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


def test_a_new_reason_is_not_a_transition_but_a_new_status_is() -> None:
    first = set_condition(
        [], SessionCondition, "Ready", "False", "Starting", "pod pending", generation=1, at=T0
    )
    reworded = set_condition(
        first,
        SessionCondition,
        "Ready",
        "False",
        "ImagePull",
        "pulling",
        generation=2,
        at=T0 + timedelta(seconds=5),
    )
    ready = set_condition(
        reworded,
        SessionCondition,
        "Ready",
        "True",
        "OwnerServing",
        "",
        generation=2,
        at=T0 + timedelta(seconds=9),
    )
    assert [c.last_transition_time for c in (first[0], reworded[0], ready[0])] == [
        T0,
        T0,
        T0 + timedelta(seconds=9),
    ]
    assert reworded[0].reason == "ImagePull"
    assert reworded[0].observed_generation == 2


def test_defaults_fill_in_missing_types_and_leave_set_ones() -> None:
    ready = set_condition(
        [], SessionCondition, "Ready", "True", "OwnerServing", "", generation=3, at=T0
    )
    conditions = with_defaults(
        ready,
        SessionCondition,
        [
            ("Ready", "Unknown", "Reconciling", ""),
            ("Migrating", "False", "NoMigration", ""),
            ("Degraded", "False", "AsExpected", ""),
        ],
        generation=3,
    )
    assert [c.type for c in conditions] == ["Ready", "Migrating", "Degraded"]
    found = find(conditions, "Ready")
    assert found is not None and found.status == "True"
