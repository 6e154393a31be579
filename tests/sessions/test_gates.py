"""Delivery gates: what an owner may process, during fences and epoch changes."""

from __future__ import annotations

import pytest

from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.sessions.gates import SessionGates, Superseded


async def _inbound(store: SQLiteJournalStore, count: int) -> list[JournalEntry]:
    await store.append(
        "s",
        [
            NewEntry(kind="message", payload={"role": "user", "content": f"m{n}"})
            for n in range(count)
        ],
    )
    return await store.read("s", 0, 1000)


async def test_no_more_than_the_window_is_released_ahead_of_the_acks(
    store: SQLiteJournalStore,
) -> None:
    gates = SessionGates(store, window=3)
    gate = await gates.get("s")
    entries = await _inbound(store, 5)  # seq 1 is the epoch marker, 2..6 inbound
    assert gate.release(entries, 1) == 4
    gate.acked([2])
    assert gate.release(entries, 1) == 5
    assert gate.outstanding == 3


async def test_a_fenced_gate_releases_nothing_new_until_lifted(store: SQLiteJournalStore) -> None:
    gates = SessionGates(store)
    gate = await gates.get("s")
    entries = await _inbound(store, 2)
    await gate.fence()
    assert gate.release(entries, 1) == 0
    await gate.unfence()
    assert gate.release(entries, 1) == 3


async def test_a_new_owner_asking_before_the_gate_heard_of_its_epoch_is_served(
    store: SQLiteJournalStore,
) -> None:
    gates = SessionGates(store)
    gate = await gates.get("s")
    entries = await _inbound(store, 1)
    # The epoch moves in the store (the fence's compare-and-set) before the gate is told.
    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="b"))
    with pytest.raises(Superseded):
        gate.release(entries, 2)  # the gate alone would turn the new owner away...
    await gates.catch_up(gate)  # ...so deliveries bring it up to the store first
    assert gate.release(entries, 2) == 2
    with pytest.raises(Superseded):
        gate.release(entries, 1)  # while the old owner is refused


async def test_a_gate_made_after_everything_was_acked_releases_what_comes_next(
    store: SQLiteJournalStore,
) -> None:
    """A replica that comes to serve an idle session (a moved lease, a restart) builds
    its gate from the journal: with nothing left unacked, the next message is released —
    not the session's first inbound entries again, which the owner would never ack (it
    is past them), stalling delivery for good."""
    assert (await _inbound(store, 6))[-1].seq == 7  # inbound at seq 2..7
    await store.append(
        "s", [NewEntry(id="ack:7", kind="ack", payload={"turn": 7})], owner_epoch=1, owner="a"
    )
    gate = await SessionGates(store).get("s")  # another process's gates
    assert gate.outstanding == 0
    [fresh] = await store.append(
        "s", [NewEntry(kind="message", payload={"role": "user", "content": "next"})]
    )
    assert gate.release(await store.read("s", 0, 1000), 1) == fresh.seq
    assert gate.outstanding == 1
