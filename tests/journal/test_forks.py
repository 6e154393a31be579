"""Forks in the JournalStore contract, on every backend (SQLite and PostgreSQL): a fork
reads its parent's journal up to the fork point as its own, shares it (nothing copied),
and the parent is untouched."""

from __future__ import annotations

import orjson
import pytest

from shadowpod.domain.ownership import Ownership
from shadowpod.journal import JournalStore, JournalTruncated, SessionNotFound
from shadowpod.journal.errors import InvalidForkPoint, InvalidTurn, SessionHasForks
from shadowpod.journal.store import ForkPoint
from tests.journal.test_contract import ack, msg


async def _turns(store: JournalStore, session: str, epoch: int, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        [inbound] = await store.append(session, [msg(f"m{i}", id=f"c{i}")])
        await store.append(
            session,
            [
                msg(f"r{i}", id=f"t{inbound.seq}:0", role="assistant", turn=inbound.seq),
                ack(inbound.seq).model_copy(update={"id": f"ack:{inbound.seq}"}),
            ],
            owner_epoch=epoch,
        )


async def _parent(store: JournalStore) -> None:
    await store.create_session("p")
    await store.compare_and_set_ownership("p", 0, Ownership(epoch=1, owner="a"))  # seq 1
    await _turns(store, "p", 1, 3)  # turns at 2-4, 5-7, 8-10


async def _contents(store: JournalStore, session: str, after: int = 0) -> list[tuple[int, str]]:
    return [(e.seq, e.id) for e in await store.read(session, after, 1_000_000)]


async def test_a_fork_reads_the_parent_up_to_the_fork_point_then_its_own(
    store: JournalStore,
) -> None:
    await _parent(store)
    parent_before = await _contents(store, "p")
    info = await store.create_session("f", fork=ForkPoint("p", 7))
    assert (info.head, info.fork_of, info.fork_seq) == (7, "p", 7)
    assert await _contents(store, "f") == parent_before[:7]

    await store.compare_and_set_ownership("f", 1, Ownership(epoch=2, owner="b"))  # f's seq 8
    [own] = await store.append("f", [msg("fork only", id="x")])
    assert own.seq == 9
    await _turns(store, "p", 1, 1, start=10)  # the parent goes on: its 11-13
    fork = await _contents(store, "f")
    assert fork[:7] == parent_before[:7]
    assert [seq for seq, _ in fork] == list(range(1, 10))
    assert fork[-1] == (9, "x")
    assert await _contents(store, "p") == [
        *parent_before,
        (11, "c10"),
        (12, "t11:0"),
        (13, "ack:11"),
    ]
    assert (await store.get_session("p")).fork_of is None

    # Pages across the fork point, in both encodings.
    assert [e.seq for e in await store.read("f", 5, 3)] == [6, 7, 8]
    page = orjson.loads(await store.read_json("f", 5, 3))
    assert [e["seq"] for e in page] == [6, 7, 8]
    whole = orjson.loads(await store.read_json("f", 0, 100))
    assert [(e["seq"], e["id"]) for e in whole] == fork


async def test_a_fork_inherits_the_ack_the_epoch_and_the_snapshot_at_its_point(
    store: JournalStore,
) -> None:
    await _parent(store)
    await store.put_snapshot("p", watermark=4, schema_version=3, document_json=b'{"w": 4}')
    await store.put_snapshot("p", watermark=10, schema_version=3, document_json=b'{"w": 10}')
    await store.create_session("f", fork=ForkPoint("p", 8))  # seq 8: m2 arrived, not acked
    assert max((await store.acks("f")).values()) == 5
    ownership = await store.get_ownership("f")
    assert (ownership.epoch, ownership.owner) == (1, None)
    snapshot = await store.latest_snapshot("f")
    assert snapshot is not None and snapshot.info.watermark == 4
    assert snapshot.document_json == b'{"w": 4}'
    assert [i.watermark for i in await store.list_snapshots("p")] == [4, 10]


async def test_a_new_owner_of_the_fork_redoes_the_open_turn_as_the_parent_wrote_it(
    store: JournalStore,
) -> None:
    await _parent(store)
    [inbound] = await store.append("p", [msg("m3", id="c3")])  # 11
    await store.append(
        "p", [msg("half", id="t11:0", role="assistant", turn=11)], owner_epoch=1
    )  # 12, the turn still open
    await store.create_session("f", fork=ForkPoint("p", 12))
    await store.compare_and_set_ownership("f", 1, Ownership(epoch=2, owner="b"))  # 13
    # The redone turn's first output is the one the parent's owner journaled: absorbed.
    redone = await store.append(
        "f",
        [msg("other words", id="t11:0", role="assistant", turn=11), ack(11)],
        owner_epoch=2,
    )
    assert [(a.seq, a.duplicate) for a in redone] == [(12, True), (14, False)]
    # A client's repeat of a message the parent journaled before the fork is a repeat.
    [again] = await store.append("f", [msg("m3", id="c3")])
    assert (again.seq, again.duplicate) == (inbound.seq, True)
    # Turns named in the fork may be the parent's inbound entries below the fork point.
    with pytest.raises(InvalidTurn):
        await store.append("f", [ack(12)], owner_epoch=2)  # 12 is an output, not inbound
    assert max((await store.acks("f")).values()) == 11
    assert max((await store.acks("p")).values()) == 8


async def test_a_fork_of_a_fork_reads_three_journals(store: JournalStore) -> None:
    await _parent(store)
    await store.create_session("f", fork=ForkPoint("p", 7))
    await _turns(store, "f", 1, 1, start=20)  # f: 8-10
    await store.create_session("g", fork=ForkPoint("f", 9))
    await store.append("g", [msg("g only", id="y")])
    assert await _contents(store, "g") == [
        *(await _contents(store, "p"))[:7],
        (8, "c20"),
        (9, "t8:0"),
        (10, "y"),
    ]
    shallow = await store.create_session("h", fork=ForkPoint("f", 3))
    assert shallow.fork_seq == 3
    assert await _contents(store, "h") == (await _contents(store, "p"))[:3]


async def test_a_bad_fork_point_is_refused_with_what_to_do(store: JournalStore) -> None:
    await _parent(store)
    with pytest.raises(InvalidForkPoint, match="head is 10"):
        await store.create_session("f", fork=ForkPoint("p", 11))
    with pytest.raises(SessionNotFound):
        await store.create_session("f", fork=ForkPoint("ghost", 1))
    for watermark in (4, 7):
        await store.put_snapshot(
            "p", watermark=watermark, schema_version=3, document_json=b'{"w": %d}' % watermark
        )
    await store.apply_retention("p", keep_snapshots=1)  # truncated through 7
    with pytest.raises(InvalidForkPoint, match="fork at seq 7 or later"):
        await store.create_session("f", fork=ForkPoint("p", 5))
    late = await store.create_session("f", fork=ForkPoint("p", 9))
    assert late.truncated_through == 7
    with pytest.raises(JournalTruncated):
        await store.read("f", 0)
    assert [e.seq for e in await store.read("f", 7)] == [8, 9]


async def test_the_parent_keeps_what_a_fork_reads_until_the_fork_no_longer_needs_it(
    store: JournalStore,
) -> None:
    await _parent(store)
    await store.create_session("f", fork=ForkPoint("p", 7))
    for watermark in (4, 10):
        await store.put_snapshot(
            "p", watermark=watermark, schema_version=3, document_json=b'{"w": %d}' % watermark
        )
    kept = await store.apply_retention("p", keep_snapshots=1)
    assert kept.truncated_through == 0  # the fork reads 1..7 from the parent
    assert len(await store.read("f", 0)) == 7
    with pytest.raises(SessionHasForks, match="'f'"):
        await store.delete_session("p")

    # The fork's own retention past its fork point frees the parent's entries.
    await store.compare_and_set_ownership("f", 1, Ownership(epoch=2, owner="b"))  # 8
    await _turns(store, "f", 2, 1, start=30)  # 9-11
    await store.put_snapshot("f", watermark=11, schema_version=3, document_json=b'{"w": 11}')
    await store.apply_retention("f", keep_snapshots=1)
    assert (await store.get_session("f")).truncated_through == 9  # its last acked turn
    freed = await store.apply_retention("p", keep_snapshots=1)
    assert freed.truncated_through == 8  # the parent's own last acked turn
    assert [e.seq for e in await store.read("f", 9)] == [10, 11]
    await store.delete_session("p")
    assert [e.seq for e in await store.read("f", 9)] == [10, 11]
    await store.delete_session("f")
