"""Every session's position in one read (``JournalStore.positions``), on every backend:
what the operator compares its sessions' status with, without a read per session."""

from __future__ import annotations

from shadowpod.domain.ownership import Ownership
from shadowpod.journal import JournalStore
from tests.journal.test_idempotency import ack, owned, reply, user


async def test_positions_are_each_sessions_head_acked_turn_and_ownership(
    store: JournalStore,
) -> None:
    assert await store.positions() == []
    await owned(store, "a")
    await store.create_session("b")
    first, _ = await store.append("a", [user("hi", "m1"), user("there", "m2")])
    await store.append("a", [reply(first.seq, "hello", "r1"), ack(first.seq)], owner_epoch=1)
    await store.compare_and_set_ownership("a", 1, Ownership(epoch=2, owner="pod-b"))
    positions = {p.session: p for p in await store.positions()}
    assert set(positions) == {"a", "b"}
    a, b = positions["a"], positions["b"]
    assert (a.head, a.acked, a.epoch, a.fence) == (
        (await store.head("a")),
        first.seq,
        2,
        (await store.get_ownership("a")).fence.value,
    )
    assert (b.head, b.acked, b.epoch, b.fence) == (0, 0, 0, "open")
    await store.append("b", [user("x", "x")])
    assert {p.session: p.head for p in await store.positions()}["b"] == 1
