"""The ExchangeFence closes the gate in a gap between the owner's turns when it can."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import FenceState
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.sessions.fence import ExchangeFence, FenceOutcome
from shadowpod.sessions.gates import SessionGate, SessionGates


class OldOwner:
    """What the gateway's routes do for the owner at epoch 1: deliveries through the
    gate, and its acks journaled and shown to the gate."""

    def __init__(self, store: SQLiteJournalStore, gate: SessionGate) -> None:
        self.store = store
        self.gate = gate

    async def message(self, content: str) -> int:
        [appended] = await self.store.append(
            "s", [NewEntry(kind="message", payload={"role": "user", "content": content})]
        )
        return appended.seq

    async def deliver(self) -> int:
        """The release watermark after offering it everything journaled."""
        return self.gate.release(await self.store.read("s", 0, 1000), 1)

    async def finish(self, turn: int) -> None:
        await self.store.append("s", [NewEntry(kind="ack", payload={"turn": turn})], 1)
        self.gate.acked([turn])


@dataclass
class Fencing:
    gate: SessionGate
    owner: OldOwner
    busy: int  # the turn the owner is in when the fence starts
    exchange: asyncio.Task[FenceOutcome]


async def _fence_a_busy_owner(store: SQLiteJournalStore, idle_wait_s: float) -> Fencing:
    """An exchange to ``b`` started while the owner is in a turn."""
    gates = SessionGates(store)
    gate = await gates.get("s")
    owner = OldOwner(store, gate)
    busy = await owner.message("a turn in progress")
    assert await owner.deliver() == busy
    fence = ExchangeFence(store, gates, idle_wait_s=idle_wait_s)
    exchange = asyncio.create_task(fence.exchange("s", expect_epoch=1, new_owner="b", timeout_s=10))
    return Fencing(gate, owner, busy, exchange)


async def test_the_gate_closes_once_the_owner_is_between_turns(
    store: SQLiteJournalStore,
) -> None:
    fencing = await _fence_a_busy_owner(store, idle_wait_s=5.0)
    gate, owner, busy, exchange = fencing.gate, fencing.owner, fencing.busy, fencing.exchange
    await asyncio.sleep(0.2)
    # The owner is mid-turn: the gate stays open, and what arrives meanwhile still
    # goes to it (it is the owner until the gap), instead of waiting out its turn.
    assert not gate.fenced and not exchange.done()
    meanwhile = await owner.message("arrives during the turn")
    assert await owner.deliver() == meanwhile
    await owner.finish(busy)
    await asyncio.sleep(0.1)
    assert not gate.fenced  # one turn to go
    await owner.finish(meanwhile)

    outcome = await asyncio.wait_for(exchange, 5)
    assert outcome.epoch == 2 and outcome.acked == meanwhile
    assert outcome.waited_s < 0.05  # closed in the gap: nothing left to wait for
    assert (await store.get_ownership("s")).owner == "b"


async def test_an_owner_without_a_gap_is_fenced_after_the_idle_wait(
    store: SQLiteJournalStore,
) -> None:
    fencing = await _fence_a_busy_owner(store, idle_wait_s=0.1)
    gate, owner, busy, exchange = fencing.gate, fencing.owner, fencing.busy, fencing.exchange
    await asyncio.sleep(0.3)
    assert gate.fenced and not exchange.done()  # closed anyway; now waiting for the turn
    held = await owner.message("held for the new owner")
    assert await owner.deliver() == busy  # not released to the old owner
    await owner.finish(busy)

    outcome = await asyncio.wait_for(exchange, 5)
    assert outcome.epoch == 2 and outcome.acked == busy
    assert outcome.released_through == busy < held < outcome.fence_seq


async def test_a_fence_abandoned_while_it_waits_for_a_gap_is_lifted(
    store: SQLiteJournalStore,
) -> None:
    """The caller going away (its request cancelled) must not leave the session fenced."""
    fencing = await _fence_a_busy_owner(store, idle_wait_s=5.0)
    gate, busy, exchange = fencing.gate, fencing.busy, fencing.exchange
    await asyncio.sleep(0.2)
    assert (await store.get_ownership("s")).fence is FenceState.FENCED  # recorded, waiting

    exchange.cancel()
    with pytest.raises(asyncio.CancelledError):
        await exchange

    ownership = await store.get_ownership("s")
    assert (ownership.epoch, ownership.owner, ownership.fence) == (1, "a", FenceState.OPEN)
    assert not gate.fenced
    markers = [e.payload["event"] for e in await store.read("s", busy, 10) if e.kind == "control"]
    assert markers == ["fence", "unfence"]
