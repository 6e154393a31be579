"""Rules the store enforces in the transaction of the write, on every backend: the
fence guarantee of the ownership record, and turns that name inbound entries."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.journal import (
    InvalidOwnership,
    InvalidSnapshot,
    JournalStore,
    SnapshotNotFound,
)
from shadowpod.journal.errors import InvalidTurn, OwnerChangeNeedsNewEpoch
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.store import MAX_SNAPSHOTS_PER_SESSION
from tests.conftest import PG_DSN
from tests.journal.test_contract import ack, msg


def reply(turn: int, content: str = "r") -> NewEntry:
    return msg(content, role="assistant", turn=turn)


# --- ownership --------------------------------------------------------------------------


async def test_a_new_owner_at_the_same_epoch_is_refused_and_the_old_owner_stays(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    before = await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    head = await store.head("s")

    with pytest.raises(OwnerChangeNeedsNewEpoch) as caught:
        await store.compare_and_set_ownership("s", 1, Ownership(epoch=1, owner="pod-b"))

    assert caught.value.reason == "OwnerChangeNeedsNewEpoch"
    assert isinstance(caught.value, ValueError)  # a 400 at the gateway
    assert "a new owner needs a new, larger epoch" in str(caught.value)
    assert "ask for epoch 2" in str(caught.value)
    assert await store.get_ownership("s") == before
    assert await store.head("s") == head  # no epoch marker either
    # The right way: a new owner at a new epoch, and the old one is fenced.
    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="pod-b"))
    assert (await store.get_ownership("s")).owner == "pod-b"


async def test_the_first_owner_needs_an_epoch_too(store: JournalStore) -> None:
    await store.create_session("s")
    with pytest.raises(OwnerChangeNeedsNewEpoch, match="ask for epoch 1"):
        await store.compare_and_set_ownership("s", 0, Ownership(epoch=0, owner="pod-a"))
    assert await store.get_ownership("s") == Ownership()


async def test_the_fence_and_the_same_owner_change_at_the_same_epoch(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    owned = await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    fenced = await store.compare_and_set_ownership(
        "s", 1, owned.model_copy(update={"fence": FenceState.FENCED})
    )
    assert (fenced.epoch, fenced.owner, fenced.fence) == (1, "pod-a", FenceState.FENCED)
    restarted = await store.compare_and_set_ownership("s", 1, Ownership(epoch=5, owner="pod-a"))
    assert restarted.epoch == 5  # an epoch may jump; it never goes back


async def _raw_update(store: JournalStore, assignments: str) -> None:
    """An update of the ownership record that does not go through the store's checks."""
    if isinstance(store, SQLiteJournalStore):
        conn = sqlite3.connect(store.path)
        try:
            conn.execute(f"UPDATE sessions SET {assignments} WHERE name = 's'")
            conn.commit()
        finally:
            conn.close()
    else:
        assert isinstance(store, PostgresJournalStore)
        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute(f"UPDATE {store.schema}.sessions SET {assignments} WHERE name = 's'")


@pytest.mark.parametrize(
    "assignments",
    ["owner = 'intruder'", "epoch = 1", "epoch = 0, owner = 'intruder'", "owner = NULL"],
)
async def test_the_database_refuses_an_update_that_breaks_the_rule(
    store: JournalStore, assignments: str
) -> None:
    await store.create_session("s")
    owned = await store.compare_and_set_ownership("s", 0, Ownership(epoch=2, owner="pod-a"))
    with pytest.raises((sqlite3.IntegrityError, psycopg.Error), match="may not lower its epoch"):
        await _raw_update(store, assignments)
    assert await store.get_ownership("s") == owned
    await _raw_update(store, "fence = 'fenced'")  # what keeps the rule still goes through
    await _raw_update(store, "epoch = 3, owner = 'pod-b'")
    assert (await store.get_ownership("s")).owner == "pod-b"


async def test_an_invalid_ownership_change_is_a_value_error_with_a_reason(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=3, owner="pod-a"))
    with pytest.raises(InvalidOwnership) as caught:
        await store.compare_and_set_ownership("s", 3, Ownership(epoch=2, owner="pod-a"))
    assert caught.value.reason == "EpochDecrease"
    assert "an epoch never goes down (current 3, requested 2)" in str(caught.value)


# --- turns: acks and outputs name inbound entries ---------------------------------------


async def _owned_with_a_turn(store: JournalStore) -> int:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    [inbound] = await store.append("s", [msg("hi")])
    return inbound.seq


async def test_an_ack_beyond_the_head_is_refused_and_not_reported(store: JournalStore) -> None:
    inbound = await _owned_with_a_turn(store)
    head = await store.head("s")

    with pytest.raises(InvalidTurn) as caught:
        await store.append("s", [ack(head + 1_000)], owner_epoch=1)

    assert caught.value.reason == "InvalidTurn"
    assert isinstance(caught.value, ValueError)
    assert f"an ack names turn {head + 1_000}, beyond the journal's head ({head})" in str(
        caught.value
    )
    assert await store.head("s") == head
    assert await store.acks("s") == {}  # the acked position is not what was claimed
    await store.append("s", [ack(inbound)], owner_epoch=1)
    assert await store.acks("s") == {1: inbound}


@pytest.mark.parametrize("named", ["own output", "epoch marker", "assistant message"])
async def test_an_ack_of_an_entry_that_is_not_inbound_is_refused(
    store: JournalStore, named: str
) -> None:
    inbound = await _owned_with_a_turn(store)
    [output] = await store.append("s", [reply(inbound)], owner_epoch=1)
    [assistant] = await store.append("s", [msg("from no owner", role="assistant")])
    seq = {"own output": output.seq, "epoch marker": 1, "assistant message": assistant.seq}[named]
    head = await store.head("s")
    with pytest.raises(InvalidTurn, match="not an inbound entry"):
        await store.append("s", [ack(seq)], owner_epoch=1)
    assert (await store.head("s"), await store.acks("s")) == (head, {})


async def test_an_output_must_name_an_inbound_turn_too(store: JournalStore) -> None:
    inbound = await _owned_with_a_turn(store)
    head = await store.head("s")
    for turn in (head + 1, 1):  # beyond the head; the epoch marker
        with pytest.raises(InvalidTurn, match=f"a 'message' output names turn {turn}"):
            await store.append("s", [reply(inbound), reply(turn)], owner_epoch=1)
    assert await store.head("s") == head  # nothing of the append, not even its valid part
    await store.append("s", [reply(inbound), ack(inbound)], owner_epoch=1)


async def test_a_schedule_fire_is_a_turn(store: JournalStore) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    fire = NewEntry(kind="schedule", payload={"schedule_id": "t", "op": "fire", "fire_no": 1})
    [fired] = await store.append("s", [fire])
    await store.append("s", [reply(fired.seq), ack(fired.seq)], owner_epoch=1)
    assert await store.acks("s") == {1: fired.seq}


async def test_a_turn_removed_by_retention_may_still_be_named(store: JournalStore) -> None:
    inbound = await _owned_with_a_turn(store)
    await store.append("s", [reply(inbound), ack(inbound)], owner_epoch=1)
    head = await store.head("s")
    await store.put_snapshot("s", watermark=head, schema_version=3, document_json=b"{}")
    retention = await store.apply_retention("s", keep_snapshots=1)
    assert retention.truncated_through >= inbound
    # An owner repeating its last ack (after a restart) is not refused for it.
    await store.append("s", [ack(inbound)], owner_epoch=1)


# --- snapshots: a session's share of the disk is bounded --------------------------------


async def test_a_session_keeps_its_newest_snapshots_only(store: JournalStore) -> None:
    await store.create_session("s")
    await store.append("s", [msg(str(n)) for n in range(MAX_SNAPSHOTS_PER_SESSION + 4)])
    for watermark in range(1, MAX_SNAPSHOTS_PER_SESSION + 5):
        await store.put_snapshot(
            "s", watermark=watermark, schema_version=3, document_json=b'{"w": %d}' % watermark
        )
    kept = [i.watermark for i in await store.list_snapshots("s")]
    assert kept == list(range(5, MAX_SNAPSHOTS_PER_SESSION + 5))
    with pytest.raises(SnapshotNotFound):
        await store.get_snapshot("s", 4)
    # One older than all those kept would be dropped at once: it is refused instead.
    with pytest.raises(InvalidSnapshot, match=f"the {MAX_SNAPSHOTS_PER_SESSION} newest"):
        await store.put_snapshot("s", watermark=2, schema_version=3, document_json=b"{}")
    # Replacing one that is kept is no new snapshot.
    await store.put_snapshot("s", watermark=5, schema_version=3, document_json=b'{"again": 1}')
    assert [i.watermark for i in await store.list_snapshots("s")] == kept
