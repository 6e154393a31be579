"""An owner's snapshots: a requested one is never dropped, whatever is in progress;
periodic ones of sessions alike fall apart; what is stored loads back the same."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest

from shadowpod.agent.snapshots import Snapshotter, periodic_offset, state_digest, state_json
from shadowpod.domain.errors import StateDocumentInvalid
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.schema import load_state
from shadowpod.domain.state import AgentState, PendingInbound, SessionState
from shadowpod.journal.codec import load_state_json
from tests.domain.builders import JournalBuilder


class Store:
    """Stores snapshots' watermarks. ``hold_first``: the first store waits until
    released (a slow gateway); ``fail_first``: it raises (a gateway gone away)."""

    def __init__(self, *, hold_first: bool = False, fail_first: bool = False) -> None:
        self.stored: list[int] = []
        self.calls = 0
        self.first_started = asyncio.Event()
        self.release_first = asyncio.Event()
        if not hold_first:
            self.release_first.set()
        self._fail_first = fail_first
        self._changed = asyncio.Condition()

    async def __call__(self, view: SessionState, document: bytes) -> None:
        self.calls += 1
        if self.calls == 1:
            self.first_started.set()
            await self.release_first.wait()
            if self._fail_first:
                raise ConnectionError("gateway went away")
        async with self._changed:
            self.stored.append(view.watermark)
            self._changed.notify_all()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(5), self._changed:
            await self._changed.wait_for(lambda: len(self.stored) >= count)


class Owner:
    """A folder fed with inbound messages, reporting to a Snapshotter as the runtime does."""

    def __init__(self, snapshots: Snapshotter, *, owner: bool = True) -> None:
        self.journal = JournalBuilder()
        self.folder = StateFolder(SessionState())
        self.snapshots = snapshots
        self.owner = owner

    def apply(self, count: int, *, requested: bool = False) -> None:
        for n in range(count):
            seq = self.journal.inbound(f"m{n}")
            self.folder.apply(self.journal.entries[seq - 1])
        self.snapshots.applied(self.folder, count, owner=self.owner, requested=requested)


async def _no_more(snapshots: Snapshotter) -> None:
    await asyncio.sleep(0.05)  # room for a further (unwanted) snapshot to show up
    await snapshots.cancel()


@pytest.mark.parametrize(
    ("every", "first", "during", "stored"),
    [
        # A periodic snapshot falls due at seq 3; while it is stored, the engine asks
        # for one at seq 5 or later: that one is taken once the first is stored.
        pytest.param(3, (3, False), [(2, True)], [3, 5], id="request-during-periodic"),
        # Three requests while a requested one is stored: one more serves them all.
        pytest.param(0, (1, True), [(1, True)] * 3, [1, 4], id="requests-during-request"),
    ],
)
async def test_a_request_while_a_snapshot_is_stored_gets_one_taken_after_it(
    every: int, first: tuple[int, bool], during: list[tuple[int, bool]], stored: list[int]
) -> None:
    store = Store(hold_first=True)
    snapshots = Snapshotter("s", every=every, store=store)
    owner = Owner(snapshots)

    owner.apply(first[0], requested=first[1])
    await store.first_started.wait()
    for count, requested in during:
        owner.apply(count, requested=requested)
    store.release_first.set()

    await store.wait_for(len(stored))
    await _no_more(snapshots)
    assert store.stored == stored


async def test_a_failed_requested_snapshot_is_taken_again_with_the_next_entries() -> None:
    store = Store(fail_first=True)
    snapshots = Snapshotter("s", every=0, store=store)
    owner = Owner(snapshots)

    owner.apply(1, requested=True)
    await store.first_started.wait()
    await asyncio.sleep(0.05)
    assert store.stored == []

    owner.apply(1)
    await store.wait_for(1)
    await _no_more(snapshots)
    assert store.stored == [2]


async def test_a_shadow_takes_no_snapshot_even_when_asked() -> None:
    store = Store()
    snapshots = Snapshotter("s", every=1, store=store)
    Owner(snapshots, owner=False).apply(2, requested=True)
    await _no_more(snapshots)
    assert store.calls == 0


def test_sessions_that_grow_alike_snapshot_at_different_points() -> None:
    """Eight sessions started together would otherwise all store a multi-megabyte
    snapshot at the same moment, and again at every doubling."""
    every = 10_000
    offsets = [periodic_offset(f"demo-{n}", every) for n in range(8)]
    assert len(set(offsets)) == 8
    assert all(0 <= offset < every // 4 for offset in offsets)
    assert periodic_offset("demo-0", every) == periodic_offset("demo-0", every)
    assert periodic_offset("demo-0", 3) == 0


async def test_a_periodic_snapshot_falls_due_at_every_plus_the_sessions_offset() -> None:
    every = 100
    session = next(f"s{n}" for n in range(100) if periodic_offset(f"s{n}", every) > 0)
    offset = periodic_offset(session, every)
    store = Store()
    snapshots = Snapshotter(session, every=every, store=store)
    owner = Owner(snapshots)

    owner.apply(every + offset - 1)
    await asyncio.sleep(0.05)
    assert store.stored == []
    owner.apply(1)
    await store.wait_for(1)
    await _no_more(snapshots)
    assert store.stored == [every + offset]


def test_the_fast_state_encoding_loads_back_to_the_same_state() -> None:
    """What an owner stores (``state_json``) is the document pydantic would write."""
    document = json.loads((Path(__file__).parent.parent / "fixtures" / "state_v1.json").read_text())
    state = load_state(document)  # every surface, from a stored v1 state
    state.pending[12] = PendingInbound(
        seq=12, id="m12", kind="message", content="hi", meta={"k": [1, 2.5, None]}, started=True
    )
    state.agent = AgentState(values={"count": 3, "profile": {"greeted": True}}, schema_version=2)

    encoded = state_json(state)

    assert SessionState.model_validate_json(encoded) == state
    assert orjson.loads(encoded) == orjson.loads(state.model_dump_json())
    assert load_state_json(encoded) == state


def test_a_value_beyond_64_bits_is_still_encoded_and_loads_back() -> None:
    state = SessionState(memory={"big": 2**70}, agent=AgentState(values={"ids": [2**65, -(2**80)]}))
    assert SessionState.model_validate_json(state_json(state)) == state
    assert load_state_json(state_json(state)) == state  # orjson reads no such integer


def test_a_stored_document_that_is_not_a_state_says_so() -> None:
    with pytest.raises(StateDocumentInvalid, match="the document is a JSON list"):
        load_state_json(b"[1, 2]")
    with pytest.raises(StateDocumentInvalid, match="schema_version is None"):
        load_state_json(b'{"transcript": []}')


def test_the_digest_is_equal_for_equal_states_however_they_were_made() -> None:
    """A promoted owner's state (restored from a snapshot, then folded) is checked
    against a fold of the journal from scratch by this digest."""
    document = json.loads((Path(__file__).parent.parent / "fixtures" / "state_v1.json").read_text())
    state = load_state(document)
    state.pending[12] = PendingInbound(seq=12, id="m12", kind="message", content="hi")
    restored = load_state_json(state_json(state))
    reordered = restored.model_copy(
        update={"memory": dict(reversed(list(restored.memory.items()))) | {"b": 1, "a": 2}}
    )
    with_both = state.model_copy(update={"memory": state.memory | {"a": 2, "b": 1}})

    assert state_digest(restored) == state_digest(state)
    assert state_digest(reordered) == state_digest(with_both)  # key order does not count
    assert state_digest(with_both) != state_digest(state)
