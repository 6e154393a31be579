"""SQLite-only behaviour: durability settings, refusal of newer databases, group commit."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from shadowpod.domain.entries import JournalEntry, NewEntry, entry_from_json
from shadowpod.domain.errors import SchemaTooNew
from shadowpod.domain.ownership import Ownership
from shadowpod.journal.errors import SessionNotFound
from shadowpod.journal.factory import store_from_url
from shadowpod.journal.postgres.store import PostgresJournalStore
from shadowpod.journal.spool import SnapshotSpool
from shadowpod.journal.sqlite.sql import STORE_SCHEMA_VERSION
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.sqlite.writer import GroupCommitWriter, WriteTx
from shadowpod.journal.store import ForkPoint, Writer


async def test_the_database_is_in_wal_mode_with_full_sync(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store.create_session("s")
    conn = sqlite3.connect(tmp_path / "j.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


async def test_a_database_written_by_a_newer_shadowpod_is_refused(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db"):
        pass
    conn = sqlite3.connect(tmp_path / "j.db")
    conn.execute("UPDATE shadowpod_meta SET value = '9' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(
        SchemaTooNew, match=f"journal database has schema v9.*up to v{STORE_SCHEMA_VERSION}"
    ):
        await SQLiteJournalStore(tmp_path / "j.db").open()


async def test_the_directory_is_created(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "deep" / "er" / "j.db") as store:
        await store.create_session("s")
    assert (tmp_path / "deep" / "er" / "j.db").exists()


def test_an_in_memory_database_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="needs a file path"):
        SQLiteJournalStore(":memory:")


async def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = SQLiteJournalStore(tmp_path / "j.db")
    with pytest.raises(RuntimeError, match="not open"):
        await store.head("s")


async def test_one_failing_write_does_not_take_its_batch_down(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    committed: list[str] = []

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None, check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS t (v TEXT NOT NULL)")
        return conn

    def insert(value: str) -> object:
        def write(tx: WriteTx) -> str:
            tx.conn.execute("INSERT INTO t (v) VALUES (?)", (value,))
            return value

        return write

    def broken(tx: WriteTx) -> None:
        tx.conn.execute("INSERT INTO t (v) VALUES ('half-done')")
        raise RuntimeError("bug in a write")

    def missing(tx: WriteTx) -> None:
        raise SessionNotFound("x")  # an expected error, raised before writing

    writer = GroupCommitWriter(connect, loop, lambda session, entries: committed.append(session))
    writer.start()
    try:
        futures = [writer.submit("s", insert(f"v{n}")) for n in range(5)]  # type: ignore[arg-type]
        futures.insert(2, writer.submit("s", broken))
        futures.insert(4, writer.submit("s", missing))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await writer.stop()
    assert [type(o).__name__ if isinstance(o, Exception) else o for o in outcomes] == [
        "v0",
        "v1",
        "RuntimeError",
        "v2",
        "SessionNotFound",
        "v3",
        "v4",
    ]
    conn = sqlite3.connect(tmp_path / "w.db")
    assert [v for (v,) in conn.execute("SELECT v FROM t ORDER BY rowid")] == [
        f"v{n}" for n in range(5)
    ]
    conn.close()


async def test_a_caller_that_stops_waiting_does_not_undo_its_append(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store.create_session("s")
        task = asyncio.create_task(
            store.append(
                "s", [NewEntry(id="x", kind="message", payload={"role": "user", "content": "c"})]
            )
        )
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(100):
            if await store.head("s") == 1:
                break
            await asyncio.sleep(0.01)
        assert [e.id for e in await store.read("s")] == ["x"]


def test_store_urls() -> None:
    sqlite_store = store_from_url("sqlite:///var/lib/shadowpod/journal.db")
    assert isinstance(sqlite_store, SQLiteJournalStore)
    assert sqlite_store.path == Path("/var/lib/shadowpod/journal.db")
    relative = store_from_url("sqlite:data/j.db")
    assert isinstance(relative, SQLiteJournalStore) and relative.path == Path("data/j.db")
    pg = store_from_url("postgresql://db:5432/app?shadowpod_schema=agents&sslmode=require")
    assert isinstance(pg, PostgresJournalStore)
    assert (pg.dsn, pg.schema) == ("postgresql://db:5432/app?sslmode=require", "agents")
    with pytest.raises(ValueError, match="unsupported journal URL"):
        store_from_url("redis://localhost")
    with pytest.raises(ValueError, match="names no file"):
        store_from_url("sqlite://")


async def test_a_write_waits_for_another_process_lock_without_stopping_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (v TEXT NOT NULL)")

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def insert(tx: WriteTx) -> str:
        tx.conn.execute("INSERT INTO t (v) VALUES ('mine')")
        return "mine"

    writer = GroupCommitWriter(connect, asyncio.get_running_loop(), lambda *_: None)
    writer.start()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # e.g. a tool, in another process, holds the lock
    other.execute("INSERT INTO t (v) VALUES ('theirs')")
    release = threading.Timer(0.3, other.execute, args=("COMMIT",))
    try:
        written = writer.submit("s", insert)
        release.start()
        ticks = 0
        while not written.done():  # the event loop keeps running while the lock is held
            await asyncio.sleep(0.005)
            ticks += 1
        assert written.result() == "mine"
        assert ticks >= 10, f"the event loop ran only {ticks} times in 0.3 s"
    finally:
        release.join()
        await writer.stop()
        other.close()
    assert [v for (v,) in setup.execute("SELECT v FROM t ORDER BY rowid")] == ["theirs", "mine"]


async def test_a_failure_after_a_commit_does_not_stop_the_writer(tmp_path: Path) -> None:
    """What runs once a batch is durable (handing entries to followers) may fail for
    one session; every write of the batch is still answered, and later writes too."""
    loop = asyncio.get_running_loop()

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None, check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS t (v TEXT NOT NULL)")
        return conn

    def insert(value: str) -> Callable[[WriteTx], str]:
        def write(tx: WriteTx) -> str:
            tx.conn.execute("INSERT INTO t (v) VALUES (?)", (value,))
            tx.committed.append(JournalEntry(1, value, "note", 0, datetime.now(UTC), {}))
            return value

        return write

    def on_commit(session: str, entries: list[JournalEntry]) -> None:
        if session == "bad":
            raise RuntimeError("a follower of this session is broken")

    writer = GroupCommitWriter(connect, loop, on_commit)
    writer.start()
    try:
        async with asyncio.timeout(10):
            batch = await asyncio.gather(
                writer.submit("bad", insert("b1")),
                writer.submit("good", insert("g1")),
                writer.submit("good", insert("g2")),
            )
            later = await writer.submit("good", insert("g3"))
    finally:
        with contextlib.suppress(TimeoutError):  # a writer that stopped never gets idle
            await asyncio.wait_for(writer.stop(), 5)
    assert (batch, later) == (["b1", "g1", "g2"], "g3")


async def test_a_version_1_database_is_brought_up_with_its_ids_kept_per_writer(
    tmp_path: Path,
) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store.create_session("s")
        await store.append(
            "s", [NewEntry(id="m-1", kind="message", payload={"role": "user", "content": "hi"})]
        )
    conn = sqlite3.connect(tmp_path / "j.db")  # as version 1 left it: one id namespace
    conn.executescript(
        "DROP INDEX entries_by_scoped_id; ALTER TABLE entries DROP COLUMN scope;"
        "CREATE UNIQUE INDEX entries_by_id ON entries (id, sid);"
        "UPDATE shadowpod_meta SET value = '1' WHERE key = 'schema_version';"
    )
    conn.close()
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        message = NewEntry(id="m-1", kind="message", payload={"role": "user", "content": "hi"})
        [again] = await store.append("s", [message], writer=Writer.CLIENT)
        assert (again.seq, again.duplicate) == (1, True)
        [other] = await store.append(
            "s", [NewEntry(id="m-1", kind="message", payload={"role": "system", "content": "x"})]
        )
        assert not other.duplicate
    conn = sqlite3.connect(tmp_path / "j.db")
    version = conn.execute("SELECT value FROM shadowpod_meta WHERE key = 'schema_version'")
    assert version.fetchone()[0] == str(STORE_SCHEMA_VERSION)
    conn.close()


async def test_a_version_2_database_keeps_its_snapshots_and_takes_streamed_ones(
    tmp_path: Path,
) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store.create_session("s")
        await store.append(
            "s", [NewEntry(kind="message", payload={"role": "user", "content": "a"})]
        )
        await store.put_snapshot("s", watermark=1, schema_version=3, document_json=b'{"v":2}')
    conn = sqlite3.connect(tmp_path / "j.db")  # as version 2 left it: snapshots WITHOUT ROWID
    conn.executescript(
        "CREATE TABLE old (sid INTEGER NOT NULL, watermark INTEGER NOT NULL, "
        "schema_version INTEGER NOT NULL, created_us INTEGER NOT NULL, data BLOB NOT NULL, "
        "PRIMARY KEY (sid, watermark)) WITHOUT ROWID;"
        "INSERT INTO old SELECT sid, watermark, schema_version, created_us, data FROM snapshots;"
        "DROP TABLE snapshots; ALTER TABLE old RENAME TO snapshots;"
        "UPDATE shadowpod_meta SET value = '2' WHERE key = 'schema_version';"
    )
    conn.close()
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        assert (await store.get_snapshot("s", 1)).document_json == b'{"v":2}'
        spool = SnapshotSpool()
        try:
            spool.feed(b'{"watermark": 1, "v": 3}')
            compressed, _ = spool.finish()
            await store.put_snapshot("s", watermark=1, schema_version=3, document_json=compressed)
        finally:
            spool.close()
        assert (await store.get_snapshot("s", 1)).document_json == b'{"watermark": 1, "v": 3}'
    conn = sqlite3.connect(tmp_path / "j.db")
    version = conn.execute("SELECT value FROM shadowpod_meta WHERE key = 'schema_version'")
    assert version.fetchone()[0] == str(STORE_SCHEMA_VERSION)
    conn.close()


async def test_a_version_3_database_is_brought_up_and_forks(tmp_path: Path) -> None:
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        await store.create_session("s")
        await store.append(
            "s", [NewEntry(id="m-1", kind="message", payload={"role": "user", "content": "hi"})]
        )
    conn = sqlite3.connect(tmp_path / "j.db")  # as version 3 left it: no forks
    conn.executescript(
        "DROP TABLE forks; ALTER TABLE sessions DROP COLUMN parent_sid;"
        "ALTER TABLE sessions DROP COLUMN fork_seq;"
        "UPDATE shadowpod_meta SET value = '3' WHERE key = 'schema_version';"
    )
    conn.close()
    async with SQLiteJournalStore(tmp_path / "j.db") as store:
        fork = await store.create_session("f", fork=ForkPoint("s", 1))
        assert (fork.fork_of, fork.head) == ("s", 1)
        assert [e.id for e in await store.read("f")] == ["m-1"]
    conn = sqlite3.connect(tmp_path / "j.db")
    version = conn.execute("SELECT value FROM shadowpod_meta WHERE key = 'schema_version'")
    assert version.fetchone()[0] == str(STORE_SCHEMA_VERSION)
    conn.close()


def _agent_state(turn: int) -> dict[str, Any]:
    """A framework agent's state entry: ~3 KB of JSON (a LangGraph checkpoint's)."""
    return {f"channel-{i}": f"turn {turn}: value {i} of the agent's state, " * 2 for i in range(40)}


async def test_large_entries_take_a_fraction_of_their_json_in_the_journal_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    json_bytes = 0
    async with SQLiteJournalStore(path) as store:
        await store.create_session("s")
        await store.compare_and_set_ownership("s", 0, Ownership(epoch=1, owner="o"))
        for turn in range(200):
            [asked] = await store.append(
                "s", [NewEntry(kind="message", payload={"role": "user", "content": f"q{turn}"})]
            )
            state = {"turn": asked.seq, "values": _agent_state(turn)}
            json_bytes += len(orjson.dumps(state))
            await store.append(
                "s",
                [
                    NewEntry(kind="state", payload=state),
                    NewEntry(kind="ack", payload={"turn": asked.seq}),
                ],
                owner_epoch=1,
            )
        states = [e.payload for e in await store.read("s", 0, 10_000) if e.kind == "state"]
    assert states == [{"turn": 3 * t + 2, "values": _agent_state(t)} for t in range(200)]
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    # Stored as JSON, each state entry took a 4 KiB page of its own: more than the JSON.
    assert json_bytes > 500_000
    assert path.stat().st_size < json_bytes / 2


# A journal as the build before compressed payloads (main at d682d04, schema v4) wrote
# it: a session owned at epoch 1, a 1.8 KB inbound message, its turn's reply, a 3 KB
# state entry and ack, a snapshot (``SQLiteConnection.iterdump`` of the file).
_WRITTEN_BY_V4: Final = Path(__file__).parent / "data" / "journal-v4-written-by-d682d04.sql"


async def test_a_journal_written_by_the_build_before_compression_reads_and_grows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path)
    conn.executescript(_WRITTEN_BY_V4.read_text())
    as_written = [
        (seq, kind, orjson.loads(payload))
        for seq, kind, payload in conn.execute(
            "SELECT seq, kind, payload FROM entries ORDER BY seq"
        )
    ]
    conn.close()
    async with SQLiteJournalStore(path) as store:
        before = await store.read("s")
        assert [(e.seq, e.kind, e.payload) for e in before] == as_written
        assert [entry_from_json(e) for e in orjson.loads(await store.read_json("s"))] == before
        assert (await store.get_snapshot("s", 5)).document_json == b'{"watermark": 5, "v": "main"}'
        [asked] = await store.append(
            "s", [NewEntry(kind="message", payload={"role": "user", "content": "more " * 400})]
        )
        grown = {"turn": asked.seq, "values": _agent_state(2)}
        await store.append(
            "s",
            [
                NewEntry(kind="state", payload=grown),
                NewEntry(kind="ack", payload={"turn": asked.seq}),
            ],
            owner_epoch=1,
        )
        [old_state] = await store.append(
            "s", [NewEntry(id="st-1", kind="state", payload=as_written[3][2])], owner_epoch=1
        )
        assert (old_state.seq, old_state.duplicate) == (4, True)
    async with SQLiteJournalStore(path) as store:  # nothing cached
        after = await store.read("s")
        assert after[:5] == before
        assert [e.payload for e in after[5:]] == [
            {"role": "user", "content": "more " * 400},
            grown,
            {"turn": asked.seq},
        ]
        assert [entry_from_json(e) for e in orjson.loads(await store.read_json("s"))] == after
    conn = sqlite3.connect(path)
    version = conn.execute("SELECT value FROM shadowpod_meta WHERE key = 'schema_version'")
    assert version.fetchone()[0] == str(STORE_SCHEMA_VERSION)
    conn.close()
