"""The JournalStore contract, run on every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from shadowpod.domain.entries import JournalEntry, NewEntry, entry_from_json
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.journal import (
    EpochConflict,
    Fenced,
    IdempotencyConflict,
    InvalidOwnership,
    JournalStore,
    JournalTruncated,
    SessionExists,
    SessionNotFound,
    SnapshotBeyondHead,
    SnapshotNotFound,
)
from shadowpod.journal.spool import SnapshotSpool
from shadowpod.journal.store import COPY_PIECE_BYTES
from tests.conftest import StoreFactory


def msg(content: str, id: str | None = None, role: str = "user", **extra: Any) -> NewEntry:
    payload = {"role": role, "content": content, **extra}
    return (
        NewEntry(kind="message", payload=payload)
        if id is None
        else NewEntry(id=id, kind="message", payload=payload)
    )


def ack(turn: int) -> NewEntry:
    return NewEntry(kind="ack", payload={"turn": turn})


async def _read_all(store: JournalStore, session: str, after: int = 0) -> list[JournalEntry]:
    return await store.read(session, after, 1_000_000)


# --- appending --------------------------------------------------------------------------


async def test_appends_get_gap_free_seqs_from_one_and_read_back_in_order(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    first = await store.append("s", [msg("a"), msg("b")])
    second = await store.append("s", [msg("c")])
    assert [a.seq for a in first + second] == [1, 2, 3]
    entries = await _read_all(store, "s")
    assert [(e.seq, e.payload["content"], e.epoch) for e in entries] == [
        (1, "a", 0),
        (2, "b", 0),
        (3, "c", 0),
    ]
    assert all(e.ts.tzinfo is not None for e in entries)
    assert await store.head("s") == 3


async def test_a_repeated_id_returns_the_original_seq_and_appends_nothing(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    [original] = await store.append("s", [msg("hello", id="client-1")])
    again = await store.append("s", [msg("hello", id="client-1"), msg("new", id="client-2")])
    assert (original.seq, original.duplicate) == (1, False)
    assert [(a.seq, a.id, a.duplicate) for a in again] == [
        (1, "client-1", True),
        (2, "client-2", False),
    ]
    assert [e.id for e in await _read_all(store, "s")] == ["client-1", "client-2"]


async def test_a_repeated_id_within_one_append_is_appended_once(store: JournalStore) -> None:
    await store.create_session("s")
    results = await store.append("s", [msg("x", id="dup"), msg("x", id="dup")])
    assert [(a.seq, a.duplicate) for a in results] == [(1, False), (1, True)]
    assert await store.head("s") == 1


async def test_ids_are_per_session(store: JournalStore) -> None:
    await store.create_session("s1")
    await store.create_session("s2")
    await store.append("s1", [msg("x", id="same")])
    [in_other] = await store.append("s2", [msg("x", id="same")])
    assert (in_other.seq, in_other.duplicate) == (1, False)


async def test_concurrent_appends_to_one_session_stay_gap_free(store: JournalStore) -> None:
    await store.create_session("s")

    async def writer(n: int) -> list[int]:
        seqs = []
        for k in range(20):
            [a] = await store.append("s", [msg(f"{n}-{k}", id=f"{n}-{k}")])
            seqs.append(a.seq)
        return seqs

    results = await asyncio.gather(*(writer(n) for n in range(16)))
    seqs = sorted(seq for r in results for seq in r)
    assert seqs == list(range(1, 16 * 20 + 1))
    for r in results:  # each writer saw its own appends in increasing order
        assert r == sorted(r)
    entries = await _read_all(store, "s")
    assert len({e.id for e in entries}) == 320


async def test_an_empty_append_appends_nothing(store: JournalStore) -> None:
    await store.create_session("s")
    assert await store.append("s", []) == []
    assert await store.head("s") == 0


# --- fencing ----------------------------------------------------------------------------


async def test_owner_writes_carry_the_epoch_and_a_stale_epoch_is_fenced(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    [inbound] = await store.append("s", [msg("hi")])
    [reply, _] = await store.append(
        "s", [msg("r", role="assistant", turn=inbound.seq), ack(inbound.seq)], owner_epoch=1
    )
    assert (await store.read("s", reply.seq - 1, 1))[0].epoch == 1

    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="pod-a"))  # restarted
    head = await store.head("s")
    with pytest.raises(Fenced) as caught:
        await store.append("s", [msg("late", role="assistant")], owner_epoch=1)
    assert (caught.value.epoch, caught.value.current, caught.value.reason) == (1, 2, "Fenced")
    assert "must stop" in str(caught.value)
    assert await store.head("s") == head


async def test_after_an_epoch_bump_the_old_owner_can_write_nothing(store: JournalStore) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    await store.append("s", [msg("before", role="assistant")], owner_epoch=1)
    bumped = await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="pod-b"))
    with pytest.raises(Fenced):
        await store.append("s", [msg("after", role="assistant")], owner_epoch=1)
    await store.append("s", [msg("new owner", role="assistant")], owner_epoch=2)
    entries = await _read_all(store, "s")
    assert bumped.fence_seq is not None
    assert all(e.epoch != 1 for e in entries if e.seq > bumped.fence_seq)


async def test_fenced_and_accepted_appends_in_flight_together_do_not_affect_each_other(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=3, owner="pod"))
    outcomes = await asyncio.gather(
        *(
            store.append(
                "s", [msg(f"m{n}", id=f"m{n}", role="assistant")], owner_epoch=3 if n % 2 else 2
            )
            for n in range(40)
        ),
        return_exceptions=True,
    )
    fenced = [o for o in outcomes if isinstance(o, Fenced)]
    assert len(fenced) == 20
    ids = sorted(e.id for e in await _read_all(store, "s") if e.kind == "message")
    assert ids == sorted(f"m{n}" for n in range(40) if n % 2)


# --- reading and following --------------------------------------------------------------


async def test_read_pages_by_after_and_limit(store: JournalStore) -> None:
    await store.create_session("s")
    await store.append("s", [msg(str(n)) for n in range(10)])
    assert [e.seq for e in await store.read("s", 3, 4)] == [4, 5, 6, 7]
    assert await store.read("s", 10, 5) == []
    assert await store.read("s", 99, 5) == []
    with pytest.raises(ValueError, match="limit"):
        await store.read("s", 0, 0)


async def test_read_json_is_read_encoded_from_memory_and_from_the_database(
    store_factory: StoreFactory,
) -> None:
    writer = store_factory()
    await writer.open()
    try:
        await writer.create_session("s")
        await writer.append(
            "s",
            [
                msg("plain"),
                msg('ünïcode ✓ "quoted" \n newline', meta={"nested": {"list": [1, 2.5, None]}}),
                msg("more", id="client-id-1"),
            ],
        )
        for batch in range(4):  # enough rows that order is the database's to keep
            await writer.append("s", [msg(f"b{batch}-{n}") for n in range(50)])
        from_memory = orjson.loads(await writer.read_json("s", 1, 500))
        expected = await writer.read("s", 1, 500)
    finally:
        await writer.close()
    reader = store_factory()  # another process: nothing cached, read from the database
    await reader.open()
    try:
        from_database = orjson.loads(await reader.read_json("s", 1, 500))
        assert orjson.loads(await reader.read_json("s", 203, 10)) == []
        with pytest.raises(SessionNotFound):
            await reader.read_json("nope", 0, 10)
    finally:
        await reader.close()
    assert len(expected) == 202
    for page in (from_memory, from_database):
        assert [entry_from_json(e) for e in page] == expected
        assert all(e["ts"].endswith("Z") for e in page)


def _state_values(turn: int) -> dict[str, Any]:
    """A framework agent's state entry: a few KB of JSON (the SQLite store keeps it
    compressed, PostgreSQL's TOAST too)."""
    return {f"channel-{i}": f"turn {turn}: value {i} of the agent's state, " * 3 for i in range(40)}


async def test_large_payloads_read_back_whole_and_keep_idempotency_and_turns(
    store_factory: StoreFactory,
) -> None:
    long_question = "why " * 1000  # an inbound message above the compression threshold
    writer = store_factory()
    await writer.open()
    try:
        await writer.create_session("s")
        await writer.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="o"))
        [asked] = await writer.append("s", [msg(long_question, id="q-1")])
        # The turn an output names is checked against the inbound entry it names.
        state = NewEntry(
            id="st-1", kind="state", payload={"turn": asked.seq, "values": _state_values(1)}
        )
        outputs = [msg("an answer", role="assistant", turn=asked.seq), state, ack(asked.seq)]
        await writer.append("s", outputs, owner_epoch=1)
        [again] = await writer.append("s", [state], owner_epoch=1)
        assert again.duplicate
        changed = NewEntry(
            id="st-1", kind="state", payload={"turn": asked.seq, "values": _state_values(2)}
        )
        with pytest.raises(IdempotencyConflict):
            await writer.append("s", [changed], owner_epoch=1)
        from_memory = orjson.loads(await writer.read_json("s"))
    finally:
        await writer.close()
    reader = store_factory()  # nothing cached: read from the database
    await reader.open()
    try:
        entries = await _read_all(reader, "s")
        from_database = orjson.loads(await reader.read_json("s"))
        followed = []
        async for entry in reader.follow("s"):
            followed.append(entry)
            if entry.seq == entries[-1].seq:
                break
    finally:
        await reader.close()
    assert [(e.kind, e.payload) for e in entries] == [
        ("control", entries[0].payload),
        ("message", {"role": "user", "content": long_question}),
        ("message", {"role": "assistant", "content": "an answer", "turn": asked.seq}),
        ("state", {"turn": asked.seq, "values": _state_values(1)}),
        ("ack", {"turn": asked.seq}),
    ]
    assert followed == entries
    for page in (from_memory, from_database):
        assert [entry_from_json(e) for e in page] == entries


async def test_follow_yields_the_backlog_then_new_entries_in_order(store: JournalStore) -> None:
    await store.create_session("s")
    await store.append("s", [msg("old-1"), msg("old-2")])
    seen: list[int] = []

    async def follower() -> None:
        async for entry in store.follow("s", after=1):
            seen.append(entry.seq)
            if entry.seq == 12:
                return

    task = asyncio.create_task(follower())
    for n in range(10):
        await store.append("s", [msg(f"new-{n}")])
    await asyncio.wait_for(task, timeout=10)
    assert seen == list(range(2, 13))


async def test_many_followers_see_concurrent_appends_without_gaps(store: JournalStore) -> None:
    await store.create_session("s")
    total = 200

    async def follower() -> list[int]:
        seqs = []
        async for entry in store.follow("s"):
            seqs.append(entry.seq)
            if len(seqs) == total:
                return seqs
        raise AssertionError("follow ended")

    tasks = [asyncio.create_task(follower()) for _ in range(3)]
    await asyncio.gather(*(store.append("s", [msg(str(n))]) for n in range(total)))
    for seqs in await asyncio.wait_for(asyncio.gather(*tasks), timeout=15):
        assert seqs == list(range(1, total + 1))


async def test_a_follower_on_another_handle_sees_commits_made_elsewhere(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    await store.create_session("s")
    other = store_factory()
    await other.open()
    try:
        received: list[str] = []

        async def follower() -> None:
            async for entry in other.follow("s"):
                received.append(entry.payload["content"])
                if len(received) == 3:
                    return

        task = asyncio.create_task(follower())
        await asyncio.sleep(0.05)
        for n in range(3):
            await store.append("s", [msg(f"m{n}")])
        await asyncio.wait_for(task, timeout=10)
        assert received == ["m0", "m1", "m2"]
    finally:
        await other.close()


# --- sessions ---------------------------------------------------------------------------


async def test_a_missing_session_is_a_clear_error_everywhere(store: JournalStore) -> None:
    calls = [
        store.append("ghost", [msg("x")]),
        store.append("ghost", []),
        store.read("ghost"),
        store.head("ghost"),
        store.get_session("ghost"),
        store.get_ownership("ghost"),
        store.compare_and_set_ownership("ghost", 0, Ownership(epoch=1)),
        store.acks("ghost"),
        store.put_snapshot("ghost", watermark=0, schema_version=3, document_json=b"{}"),
        store.list_snapshots("ghost"),
        store.delete_session("ghost"),
        store.apply_retention("ghost", keep_snapshots=1),
    ]
    for call in calls:
        with pytest.raises(SessionNotFound, match="'ghost' does not exist; create it first"):
            await call
    with pytest.raises(SessionNotFound):
        async for _ in store.follow("ghost"):
            pass


async def test_sessions_are_created_once_listed_and_deleted_with_all_they_own(
    store: JournalStore,
) -> None:
    created = await store.create_session("b", meta={"team": "billing"})
    await store.create_session("a")
    assert (created.session, created.head, created.meta) == ("b", 0, {"team": "billing"})
    with pytest.raises(SessionExists):
        await store.create_session("b")
    with pytest.raises(ValueError, match="invalid session id"):
        await store.create_session("Not/Valid")
    assert [s.session for s in await store.list_sessions()] == ["a", "b"]

    await store.append("b", [msg("x", id="x")])
    await store.put_snapshot("b", watermark=1, schema_version=3, document_json=b'{"k": 1}')
    await store.compare_and_set_ownership("b", 0, Ownership(epoch=1, owner="p"))
    await store.delete_session("b")
    assert [s.session for s in await store.list_sessions()] == ["a"]
    with pytest.raises(SessionNotFound):
        await store.read("b")

    await store.create_session("b")  # a new session of the same name starts afresh
    assert await store.head("b") == 0
    assert (await store.get_ownership("b")).epoch == 0
    assert await store.latest_snapshot("b") is None
    [again] = await store.append("b", [msg("x", id="x")])
    assert (again.seq, again.duplicate) == (1, False)


# --- ownership --------------------------------------------------------------------------


async def test_ownership_starts_unowned_and_changes_by_compare_and_set(store: JournalStore) -> None:
    await store.create_session("s")
    assert await store.get_ownership("s") == Ownership()
    await store.append("s", [msg("a"), msg("b")])

    owned = await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="pod-a"))
    assert (owned.epoch, owned.owner, owned.fence, owned.fence_seq) == (
        1,
        "pod-a",
        FenceState.OPEN,
        3,
    )
    assert owned.updated is not None
    [marker] = await store.read("s", 2, 10)
    assert (marker.seq, marker.kind, marker.epoch) == (3, "control", 1)
    assert marker.payload["event"] == "epoch"
    assert marker.payload["detail"] == {"previous_epoch": 0, "previous_owner": None}

    fenced = await store.compare_and_set_ownership(
        "s", 1, owned.model_copy(update={"fence": FenceState.FENCED})
    )
    assert (fenced.epoch, fenced.fence, fenced.fence_seq) == (1, FenceState.FENCED, 3)
    assert await store.head("s") == 3  # no epoch change, no marker
    assert await store.get_ownership("s") == fenced


async def test_compare_and_set_with_a_stale_epoch_fails_with_the_current_record(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="a"))
    with pytest.raises(EpochConflict) as caught:
        await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="b"))
    assert caught.value.current.owner == "a"
    assert (await store.get_ownership("s")).owner == "a"
    with pytest.raises(InvalidOwnership, match="never goes down"):
        await store.compare_and_set_ownership("s", 1, Ownership(epoch=0))


async def test_only_one_of_racing_epoch_bumps_wins(store: JournalStore) -> None:
    await store.create_session("s")
    outcomes = await asyncio.gather(
        *(
            store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner=f"p{n}"))
            for n in range(8)
        ),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if isinstance(o, Ownership)]
    assert len(winners) == 1
    assert all(isinstance(o, EpochConflict) for o in outcomes if o not in winners)
    assert [e.kind for e in await _read_all(store, "s")] == ["control"]


async def test_owner_acks_move_the_ack_watermark_of_their_epoch(store: JournalStore) -> None:
    await store.create_session("s")
    assert await store.acks("s") == {}
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="a"))
    [m1, m2] = await store.append("s", [msg("1"), msg("2")])
    await store.append("s", [ack(m1.seq)], owner_epoch=1)
    await store.append("s", [ack(m2.seq)], owner_epoch=1)
    await store.append("s", [ack(m1.seq)], owner_epoch=1)  # never moves backwards
    await store.append("s", [ack(m2.seq)])  # not an owner write: no watermark
    await store.compare_and_set_ownership("s", 1, Ownership(epoch=2, owner="b"))
    [m3] = await store.append("s", [msg("3")])
    await store.append("s", [ack(m3.seq)], owner_epoch=2)
    assert await store.acks("s") == {1: m2.seq, 2: m3.seq}


# --- snapshots and retention ------------------------------------------------------------


async def test_snapshots_are_stored_compressed_and_listed(store: JournalStore) -> None:
    await store.create_session("s")
    await store.append("s", [msg(str(n)) for n in range(5)])
    assert await store.latest_snapshot("s") is None
    # Stored as the text it was given (never re-encoded): what an owner sent reads back.
    document = b'{"schema_version": 3, "memory": {"notes": [%s]}}' % b", ".join(
        [b'"the same note"'] * 500
    )
    info = await store.put_snapshot("s", watermark=3, schema_version=3, document_json=document)
    await store.put_snapshot(
        "s", watermark=5, schema_version=3, document_json=b'{"schema_version":3,"v":5}'
    )
    assert info.size_bytes < len(document) / 10
    assert (await store.get_snapshot("s", 3)).document_json == document
    latest = await store.latest_snapshot("s")
    assert latest is not None and latest.info.watermark == 5
    assert orjson.loads(latest.document_json)["v"] == 5
    assert [(i.watermark, i.schema_version) for i in await store.list_snapshots("s")] == [
        (3, 3),
        (5, 3),
    ]
    with pytest.raises(SnapshotNotFound, match="no snapshot at seq 4"):
        await store.get_snapshot("s", 4)
    with pytest.raises(SnapshotBeyondHead, match="beyond the journal's head 5"):
        await store.put_snapshot("s", watermark=6, schema_version=3, document_json=b"{}")


async def test_a_snapshot_spooled_to_a_file_is_copied_in_and_fenced_like_any(
    store: JournalStore,
) -> None:
    """A large document arrives as a compressed file (``journal.spool``): the store
    copies it in a piece at a time, with the same epoch check in the same transaction."""
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="a"))
    await store.append("s", [msg(str(n)) for n in range(3)])
    noise = random.Random(4).randbytes(2 * 1024 * 1024).hex().encode()  # compresses ~2:1
    turns = b",".join(
        b'{"role":"user","content":"%s"}' % noise[n : n + 64] for n in range(0, len(noise), 64)
    )
    document = b'{"watermark":4,"transcript":[' + turns + b"]}"
    spool = SnapshotSpool()
    try:
        for start in range(0, len(document), 100_000):
            spool.feed(document[start : start + 100_000])
        compressed, watermark = spool.finish()
        assert compressed.size_bytes > 2 * COPY_PIECE_BYTES  # copied in several pieces
        assert watermark == 4
        with pytest.raises(Fenced):
            await store.put_snapshot(
                "s", watermark=4, schema_version=3, document_json=compressed, owner_epoch=2
            )
        assert await store.list_snapshots("s") == []
        info = await store.put_snapshot(
            "s", watermark=4, schema_version=3, document_json=compressed, owner_epoch=1, owner="a"
        )
    finally:
        spool.close()
    assert info.size_bytes == compressed.size_bytes
    assert (await store.get_snapshot("s", 4)).document_json == document
    assert [i.size_bytes for i in await store.list_snapshots("s")] == [compressed.size_bytes]


async def test_retention_truncates_what_the_oldest_kept_snapshot_covers(
    store: JournalStore,
) -> None:
    await store.create_session("s")
    await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="a"))  # seq 1
    for n in range(3):  # turns at seqs 2-4, 5-7, 8-10
        [inbound] = await store.append("s", [msg(f"m{n}")])
        await store.append(
            "s", [msg(f"r{n}", role="assistant", turn=inbound.seq), ack(inbound.seq)], owner_epoch=1
        )
    [pending] = await store.append("s", [msg("not yet processed")])  # seq 11
    for watermark in (4, 7, 11):
        await store.put_snapshot(
            "s", watermark=watermark, schema_version=3, document_json=b'{"w": %d}' % watermark
        )

    kept = await store.apply_retention("s", keep_snapshots=2)
    assert (kept.deleted_snapshots, kept.truncated_through, kept.deleted_entries) == (1, 7, 7)
    assert [i.watermark for i in await store.list_snapshots("s")] == [7, 11]
    with pytest.raises(JournalTruncated, match="load a snapshot") as caught:
        await store.read("s", 0)
    assert caught.value.through == 7
    assert [e.seq for e in await store.read("s", 7)] == [8, 9, 10, 11]
    assert (await store.get_session("s")).truncated_through == 7

    # The pending inbound at seq 11 is above the last acked turn (8): it must stay.
    again = await store.apply_retention("s", keep_snapshots=1)
    assert again.truncated_through == 8
    assert [e.seq for e in await store.read("s", 8)] == [9, 10, pending.seq]
    with pytest.raises(ValueError, match="keep_snapshots must be from 1"):
        await store.apply_retention("s", keep_snapshots=0)
