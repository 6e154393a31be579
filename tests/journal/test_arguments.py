"""Every integer a caller hands the store is checked before any query, on every
backend: out of range (or not an integer at all) is an ``InvalidArgument`` — a
``ShadowpodError`` that is also a ``ValueError``, which the gateway answers with a 400
naming the argument — never a driver's ``OverflowError`` (a 500), never a change."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.errors import InvalidArgument
from shadowpod.journal.store import JournalStore
from tests.journal.conftest import SyncStore
from tests.journal.test_contract import msg

INT64_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1

Call = Callable[[JournalStore, Any], Awaitable[object]]


async def _follow(store: JournalStore, after: Any) -> None:
    store.follow("s", after)  # refused when called, before any iteration


async def _follow_batches(store: JournalStore, after: Any) -> None:
    store.follow_batches("s", after)


def _snapshot(store: JournalStore, watermark: Any, schema_version: Any) -> Awaitable[object]:
    return store.put_snapshot(
        "s", watermark=watermark, schema_version=schema_version, document_json=b"{}"
    )


# (argument, the call with it, smallest allowed, largest allowed)
ARGUMENTS: Final[list[tuple[str, Call, int, int]]] = [
    ("after", lambda store, v: store.read("s", v, 10), 0, INT64_MAX),
    ("limit", lambda store, v: store.read("s", 0, v), 1, INT64_MAX),
    ("after", lambda store, v: store.read_json("s", v, 10), 0, INT64_MAX),
    ("limit", lambda store, v: store.read_json("s", 0, v), 1, INT64_MAX),
    ("after", _follow, 0, INT64_MAX),
    ("after", _follow_batches, 0, INT64_MAX),
    ("owner_epoch", lambda store, v: store.append("s", [msg("x")], owner_epoch=v), 1, INT64_MAX),
    (
        "expect_epoch",
        lambda store, v: store.compare_and_set_ownership("s", v, Ownership(epoch=1, owner="a")),
        0,
        INT64_MAX,
    ),
    (
        "epoch",  # an ownership record built without validation
        lambda store, v: store.compare_and_set_ownership(
            "s", 0, Ownership.model_construct(epoch=v, owner="a")
        ),
        0,
        INT64_MAX,
    ),
    ("watermark", lambda store, v: _snapshot(store, v, 3), 0, INT64_MAX),
    ("schema_version", lambda store, v: _snapshot(store, 0, v), 1, INT32_MAX),
    ("watermark", lambda store, v: store.get_snapshot("s", v), 0, INT64_MAX),
    ("keep_snapshots", lambda store, v: store.apply_retention("s", keep_snapshots=v), 1, INT64_MAX),
]
NAMES: Final = [
    "read.after",
    "read.limit",
    "read_json.after",
    "read_json.limit",
    "follow.after",
    "follow_batches.after",
    "append.owner_epoch",
    "compare_and_set_ownership.expect_epoch",
    "compare_and_set_ownership.epoch",
    "put_snapshot.watermark",
    "put_snapshot.schema_version",
    "get_snapshot.watermark",
    "apply_retention.keep_snapshots",
]
CASES: Final = [pytest.param(*case, id=name) for case, name in zip(ARGUMENTS, NAMES, strict=True)]
SETTINGS: Final = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _outside(low: int, high: int) -> st.SearchStrategy[object]:
    return (
        st.integers(max_value=low - 1)
        | st.integers(min_value=high + 1)
        | st.sampled_from([low - 1, high + 1, 2**64, -(2**63) - 1])
        | st.booleans()
        | st.sampled_from([1.0, "1", None if low > 0 else "0"])
    )


@pytest.fixture
def session(sync_store: SyncStore) -> SyncStore:
    sync_store(sync_store.store.create_session("s"))
    return sync_store


@pytest.mark.parametrize(("name", "call", "low", "high"), CASES)
@SETTINGS
@given(data=st.data())
def test_an_argument_out_of_range_is_refused_naming_it(
    session: SyncStore, data: st.DataObject, name: str, call: Call, low: int, high: int
) -> None:
    value = data.draw(_outside(low, high), label=name)
    if value is None and name == "owner_epoch":
        return  # None is "not an owner write"
    head = session(session.store.head("s"))
    with pytest.raises(InvalidArgument) as caught:
        session(call(session.store, value))
    assert isinstance(caught.value, ValueError) and caught.value.reason == "InvalidArgument"
    assert str(caught.value).startswith(f"{name} must be")
    assert session(session.store.head("s")) == head


@pytest.mark.parametrize(("name", "call", "low", "high"), CASES)
@SETTINGS
@given(data=st.data())
def test_an_argument_in_range_is_never_refused_for_its_range(
    session: SyncStore, data: st.DataObject, name: str, call: Call, low: int, high: int
) -> None:
    value = data.draw(st.integers(low, high) | st.sampled_from([low, high]), label=name)
    try:
        session(call(session.store, value))
    except InvalidArgument as exc:
        raise AssertionError(f"{name}={value} refused: {exc}") from exc
    except ShadowpodError:
        pass  # the store's own answer (Fenced, EpochConflict, ...): the value was taken
