"""Every number a payload carries is bounded and strict: a value that cannot be stored,
or is not the integer it claims to be, is refused with its field path when the entry
is built — never journaled, never a driver's overflow later."""

from __future__ import annotations

import math
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import MAX_SCHEDULE_PERIOD_S, MIN_SCHEDULE_PERIOD_S

INT64_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1

# (kind, the rest of a valid payload, field, smallest allowed, largest allowed)
BOUNDED_INTEGERS: Final[list[tuple[str, dict[str, Any], str, int, int]]] = [
    ("message", {"role": "assistant", "content": "x"}, "turn", 1, INT64_MAX),
    ("tool_call", {"call_id": "c", "tool": "t"}, "turn", 1, INT64_MAX),
    ("tool_result", {"call_id": "c"}, "turn", 1, INT64_MAX),
    ("memory", {"key": "k"}, "turn", 1, INT64_MAX),
    ("fact", {"fact_id": "f"}, "turn", 1, INT64_MAX),
    ("schedule", {"schedule_id": "s", "op": "cancel"}, "turn", 1, INT64_MAX),
    ("process", {"name": "p", "op": "started"}, "turn", 1, INT64_MAX),
    ("state", {}, "turn", 1, INT64_MAX),
    ("ack", {}, "turn", 1, INT64_MAX),
    ("schedule", {"schedule_id": "s", "op": "fire"}, "fire_no", 1, INT64_MAX),
    # pid_t is a signed 32-bit integer; 0 is not a process.
    ("process", {"name": "p", "op": "started"}, "pid", 1, INT32_MAX),
    # POSIX statuses, Python's negative signal numbers and Windows' 32-bit codes.
    ("process", {"name": "p", "op": "exited"}, "exit_code", -(2**31), 2**32 - 1),
    ("state", {}, "schema_version", 1, INT32_MAX),
    ("control", {"event": "epoch"}, "epoch", 0, INT64_MAX),
]
CASES: Final = [pytest.param(*case, id=f"{case[0]}.{case[2]}") for case in BOUNDED_INTEGERS]


def _locs(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in err["loc"]) for err in exc.errors()]


def _refused(kind: str, payload: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind=kind, payload=payload)
    return _locs(caught.value)


@pytest.mark.parametrize(("kind", "base", "field", "low", "high"), CASES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_integer_field_takes_every_value_in_its_range(
    data: st.DataObject, kind: str, base: dict[str, Any], field: str, low: int, high: int
) -> None:
    value = data.draw(st.integers(low, high) | st.sampled_from([low, high]), label=field)
    entry = NewEntry(kind=kind, payload={**base, field: value})
    assert entry.payload[field] == value


@pytest.mark.parametrize(("kind", "base", "field", "low", "high"), CASES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_integer_field_refuses_every_value_outside_its_range(
    data: st.DataObject, kind: str, base: dict[str, Any], field: str, low: int, high: int
) -> None:
    value = data.draw(
        st.integers(max_value=low - 1)
        | st.integers(min_value=high + 1)
        | st.sampled_from([low - 1, high + 1, 2**64, -(2**64)]),
        label=field,
    )
    assert _refused(kind, {**base, field: value}) == [f"payload.{field}"]


@pytest.mark.parametrize(("kind", "base", "field", "low", "high"), CASES)
@pytest.mark.parametrize("odd", [True, False, "7", 7.5, math.nan, "\u0663", [1], {"n": 1}])
def test_an_integer_field_refuses_what_is_not_an_integer(
    kind: str, base: dict[str, Any], field: str, low: int, high: int, odd: object
) -> None:
    # JSON true is not 1, "7" is not 7, and an Arabic-Indic digit is not a digit here.
    assert _refused(kind, {**base, field: odd}) == [f"payload.{field}"]


@pytest.mark.parametrize(("kind", "base", "field", "low", "high"), CASES)
def test_an_integer_valued_number_is_that_integer(
    kind: str, base: dict[str, Any], field: str, low: int, high: int
) -> None:
    """JSON Schema's ``integer`` (the OpenAPI document's) counts 7.0 and 7e0 as 7: the
    entry carries the integer itself, so every reader sees an int, never a float."""
    value = max(low, min(high, 7))
    entry = NewEntry(kind=kind, payload={**base, field: float(value)})
    assert entry.payload[field] == value
    assert type(entry.payload[field]) is int


@settings(max_examples=60, deadline=None)
@given(
    every_s=st.floats(MIN_SCHEDULE_PERIOD_S, MAX_SCHEDULE_PERIOD_S)
    | st.integers(math.ceil(MIN_SCHEDULE_PERIOD_S), int(MAX_SCHEDULE_PERIOD_S))
)
def test_a_schedule_period_within_its_bounds_is_taken(every_s: float) -> None:
    entry = NewEntry(kind="schedule", payload={"schedule_id": "s", "op": "set", "every_s": every_s})
    assert entry.payload["every_s"] == every_s


@settings(max_examples=60, deadline=None)
@given(
    every_s=st.floats(max_value=MIN_SCHEDULE_PERIOD_S, exclude_max=True)
    | st.floats(min_value=MAX_SCHEDULE_PERIOD_S, exclude_min=True)
    | st.sampled_from([0, -1, 1e300, math.inf, -math.inf, math.nan, 2**64])
)
def test_a_schedule_period_outside_its_bounds_is_refused(every_s: float) -> None:
    payload = {"schedule_id": "s", "op": "set", "every_s": every_s}
    assert _refused("schedule", payload) == ["payload.every_s"]


def test_the_schedule_period_bounds_are_a_second_and_a_leap_year() -> None:
    assert (MIN_SCHEDULE_PERIOD_S, MAX_SCHEDULE_PERIOD_S) == (1.0, 366 * 86_400.0)


def test_a_schedule_content_is_bounded_as_it_is_copied_into_every_fire() -> None:
    fits = {"schedule_id": "s", "op": "set", "every_s": 60, "content": "x" * 16_384}
    assert NewEntry(kind="schedule", payload=fits).payload == fits
    too_long = {**fits, "content": "x" * 16_385}
    assert _refused("schedule", too_long) == ["payload.content"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("owner", "o" * 254), ("owner", ""), ("reason", "r" * 1001)],
)
def test_control_strings_are_bounded(field: str, value: str) -> None:
    assert _refused("control", {"event": "fence", field: value}) == [f"payload.{field}"]


@settings(max_examples=60, deadline=None)
@given(
    epoch=st.integers(max_value=-1) | st.integers(min_value=INT64_MAX + 1) | st.booleans(),
)
def test_an_ownership_record_refuses_an_epoch_a_database_cannot_hold(epoch: int) -> None:
    with pytest.raises(ValidationError) as caught:
        Ownership(epoch=epoch, owner="pod")
    assert _locs(caught.value) == ["epoch"]
