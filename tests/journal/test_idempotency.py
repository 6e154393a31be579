"""Idempotency keys, run on every backend: scoped by who writes, and a key names one
entry — the same key with other content is refused, never taken for a repeat."""

from __future__ import annotations

import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.journal import IdempotencyConflict, JournalStore, Writer


def user(content: str, id: str) -> NewEntry:
    return NewEntry(id=id, kind="message", payload={"role": "user", "content": content})


def reply(turn: int, content: str, id: str) -> NewEntry:
    payload = {"role": "assistant", "content": content, "turn": turn}
    return NewEntry(id=id, kind="message", payload=payload)


def ack(turn: int) -> NewEntry:
    return NewEntry(id=f"ack:{turn}", kind="ack", payload={"turn": turn})


async def owned(store: JournalStore, session: str = "s") -> None:
    await store.create_session(session)
    await store.compare_and_set_ownership(session, 0, Ownership(epoch=1, owner="pod-a"))


async def test_ids_a_client_takes_first_never_suppress_the_owners_writes(
    store: JournalStore,
) -> None:
    await owned(store)
    [inbound] = await store.append("s", [user("hello", "m-1")], writer=Writer.CLIENT)
    # A client posts what the agent derives for its next output and its ack.
    forged = await store.append(
        "s",
        [user("forged", f"t{inbound.seq}:1"), user("forged", f"ack:{inbound.seq}")],
        writer=Writer.CLIENT,
    )
    assert not any(a.duplicate for a in forged)
    outputs = await store.append(
        "s", [reply(inbound.seq, "hi", f"t{inbound.seq}:1"), ack(inbound.seq)], owner_epoch=1
    )
    assert [a.duplicate for a in outputs] == [False, False]
    assert (await store.acks("s")) == {1: inbound.seq}
    journal = await store.read("s", 0, 100)
    assert [(e.id, e.epoch) for e in journal[-2:]] == [("t2:1", 1), ("ack:2", 1)]


async def test_a_clients_id_never_suppresses_what_the_gateway_journals(
    store: JournalStore,
) -> None:
    await owned(store)
    fire = NewEntry(
        id="schedule:daily:1:1",
        kind="schedule",
        payload={"schedule_id": "daily", "op": "fire", "fire_no": 1, "content": "digest"},
    )
    await store.append("s", [user("forged", fire.id)], writer=Writer.CLIENT)
    [fired] = await store.append("s", [fire])
    assert not fired.duplicate


async def test_the_same_key_with_other_content_is_refused_and_nothing_is_appended(
    store: JournalStore,
) -> None:
    await owned(store)
    [first] = await store.append("s", [user("first", "m-1")], writer=Writer.CLIENT)
    head = await store.head("s")
    with pytest.raises(IdempotencyConflict) as refused:
        await store.append("s", [user("new", "m-2"), user("second", "m-1")], writer=Writer.CLIENT)
    assert refused.value.entry_id == "m-1"
    assert refused.value.seq == first.seq
    assert await store.head("s") == head
    # The same content again is a repeat, as before.
    [again] = await store.append("s", [user("first", "m-1")], writer=Writer.CLIENT)
    assert (again.seq, again.duplicate) == (first.seq, True)


async def test_a_key_repeated_with_other_content_within_one_append_is_refused(
    store: JournalStore,
) -> None:
    await owned(store)
    with pytest.raises(IdempotencyConflict):
        await store.append("s", [user("a", "x"), user("b", "x")], writer=Writer.CLIENT)
    assert await store.head("s") == 1  # the epoch marker only


async def test_an_owner_retrying_with_other_content_at_its_epoch_is_refused(
    store: JournalStore,
) -> None:
    await owned(store)
    [inbound] = await store.append("s", [user("hello", "m-1")], writer=Writer.CLIENT)
    await store.append("s", [reply(inbound.seq, "one", "t2:1")], owner_epoch=1)
    with pytest.raises(IdempotencyConflict):
        await store.append("s", [reply(inbound.seq, "two", "t2:1")], owner_epoch=1)


async def test_a_turn_redone_by_a_new_owner_yields_to_what_the_old_one_journaled(
    store: JournalStore,
) -> None:
    await owned(store)
    [inbound] = await store.append("s", [user("hello", "m-1")], writer=Writer.CLIENT)
    [first] = await store.append("s", [reply(inbound.seq, "old answer", "t2:1")], owner_epoch=1)
    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="pod-b"))
    redone = await store.append(
        "s", [reply(inbound.seq, "new answer", "t2:1"), ack(inbound.seq)], owner_epoch=2
    )
    assert (redone[0].seq, redone[0].duplicate) == (first.seq, True)
    assert not redone[1].duplicate
