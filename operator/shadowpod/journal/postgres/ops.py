"""The statements of every store operation on PostgreSQL, each run inside a transaction."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from shadowpod.domain.entries import JournalEntry, NewEntry, named_turn
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.journal import codec, forks
from shadowpod.journal.errors import (
    EpochConflict,
    Fenced,
    IdempotencyConflict,
    InvalidOwnership,
    InvalidSnapshot,
    InvalidTurn,
    JournalTruncated,
    OwnerMismatch,
    SessionExists,
    SessionHasForks,
    SessionNotFound,
    SnapshotNotFound,
    SnapshotTooOld,
    check_writer,
)
from shadowpod.journal.ownership import epoch_marker, validate_transition
from shadowpod.journal.postgres.schema import (
    FENCED_CODE,
    IDEMPOTENCY_CONFLICT_CODE,
    OWNER_MISMATCH_CODE,
    OWNERSHIP_RULE_CODE,
    SESSION_NOT_FOUND_CODE,
    TURN_BEYOND_HEAD_CODE,
    TURN_NOT_INBOUND_CODE,
)
from shadowpod.journal.store import (
    MAX_SNAPSHOTS_PER_SESSION,
    Appended,
    CompressedDocument,
    ForkPoint,
    Retention,
    SessionInfo,
    SessionPosition,
    Snapshot,
    SnapshotInfo,
    Writer,
)

Conn = AsyncConnection[TupleRow]

_SESSION_COLUMNS: Final = (
    "sid, name, created, meta, head, truncated_through, epoch, owner, fence, fence_seq, "
    "ownership_updated, fork_seq, parent_sid"
)

# The bound of a span with no end (bigint's largest).
_NO_END: Final = 2**63 - 1

# Binary COPY's signature, flags and header extension (PostgreSQL's COPY, "Binary Format").
_COPY_HEADER: Final = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)


def _session_info(row: TupleRow, fork_of: str | None = None) -> SessionInfo:
    return SessionInfo(
        session=row[1],
        created=row[2],
        meta=row[3],
        head=row[4],
        truncated_through=row[5],
        fork_of=fork_of,
        fork_seq=row[11],
    )


def _ownership(row: TupleRow) -> Ownership:
    return Ownership(
        epoch=row[6], owner=row[7], fence=FenceState(row[8]), fence_seq=row[9], updated=row[10]
    )


def _entry(
    seq: int, entry_id: str, kind: str, epoch: int, ts: datetime, payload: Any
) -> JournalEntry:
    return JournalEntry(seq, entry_id, kind, epoch, ts, payload)


@dataclass(frozen=True, slots=True)
class PendingAppend:
    """One caller's ``append``, as the group commit queues it."""

    session: str
    entries: Sequence[NewEntry]
    owner_epoch: int | None
    owner: str | None
    scope: Writer

    @property
    def turns(self) -> list[int | None]:
        return [named_turn(entry) for entry in self.entries]


def append_refusal(
    pending: PendingAppend, sqlstate: str | None, message: str | None, detail: str | None
) -> ShadowpodError | None:
    """The store's error for what ``append_entries`` raised; ``None`` when it is none
    of the refusals the function raises on purpose."""
    session, owner_epoch = pending.session, pending.owner_epoch
    if sqlstate == SESSION_NOT_FOUND_CODE:
        return SessionNotFound(session)
    if sqlstate == FENCED_CODE:
        return Fenced(session, epoch=owner_epoch or 0, current=int(message or -1))
    if sqlstate == OWNER_MISMATCH_CODE:
        return OwnerMismatch(
            session,
            epoch=owner_epoch or 0,
            owner=pending.owner or "",
            current_owner=message or None,
        )
    if sqlstate == IDEMPOTENCY_CONFLICT_CODE:
        return IdempotencyConflict(
            session, entry_id=message or "", seq=int(detail) if detail else None
        )
    if sqlstate in (TURN_BEYOND_HEAD_CODE, TURN_NOT_INBOUND_CODE):
        turn = int(message or -1)
        kinds = [e.kind for e, t in zip(pending.entries, pending.turns, strict=True) if t == turn]
        return InvalidTurn(
            session,
            kind=kinds[0] if kinds else "",
            turn=turn,
            head=int(detail or -1),
            beyond=sqlstate == TURN_BEYOND_HEAD_CODE,
        )
    return None


def appended(
    pending: PendingAppend,
    rows: Sequence[tuple[int, bool, datetime | None]],
    committed: list[JournalEntry],
) -> list[Appended]:
    """The results of one append from its rows (seq, duplicate, ts), in entry order;
    the entries it journaled (not the repeats) are added to ``committed``."""
    results: list[Appended] = []
    epoch = 0 if pending.owner_epoch is None else pending.owner_epoch
    for entry, (seq, duplicate, ts) in zip(pending.entries, rows, strict=True):
        results.append(Appended(seq=seq, id=entry.id, duplicate=duplicate))
        if not duplicate:
            assert ts is not None
            committed.append(JournalEntry(seq, entry.id, entry.kind, epoch, ts, entry.payload))
    return results


class Statements:
    """SQL bound to one schema. Table names are interpolated from a checked schema name."""

    def __init__(self, schema: str, channel: str, token: str) -> None:
        self.s = schema
        self.channel = channel
        self.token = token

    async def _row(self, conn: Conn, session: str, *, lock: bool) -> TupleRow:
        query = f"SELECT {_SESSION_COLUMNS} FROM {self.s}.sessions WHERE name = %s"
        if lock:
            query += " FOR UPDATE"
        row = await (await conn.execute(query, (session,))).fetchone()
        if row is None:
            raise SessionNotFound(session)
        return row

    async def _notify(self, conn: Conn, session: str) -> None:
        await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, f"{self.token}:{session}"))

    # --- sessions ---------------------------------------------------------------------

    async def create_session(
        self, conn: Conn, session: str, meta: Jsonb, fork: ForkPoint | None = None
    ) -> SessionInfo:
        if fork is not None:
            return await self._create_fork(conn, session, meta, fork)
        row = await (
            await conn.execute(
                f"INSERT INTO {self.s}.sessions (name, meta) VALUES (%s, %s) "
                f"ON CONFLICT (name) DO NOTHING RETURNING {_SESSION_COLUMNS}",
                (session, meta),
            )
        ).fetchone()
        if row is None:
            raise SessionExists(session)
        return _session_info(row)

    async def _create_fork(
        self, conn: Conn, session: str, meta: Jsonb, fork: ForkPoint
    ) -> SessionInfo:
        # The parent locked: its retention cannot truncate what the fork is given.
        parent = await self._row(conn, fork.session, lock=True)
        parent_sid, head, truncated_through, epoch, parent_fork_seq = (
            parent[0],
            parent[4],
            parent[5],
            parent[6],
            parent[11],
        )
        forks.check_point(fork, head, truncated_through)
        ancestors = forks.inherited(
            parent_sid, parent_fork_seq, await self._segments(conn, parent_sid), fork.seq
        )
        row = await (
            await conn.execute(
                f"INSERT INTO {self.s}.sessions (name, meta, head, truncated_through, epoch, "
                "parent_sid, fork_seq) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (name) DO NOTHING RETURNING {_SESSION_COLUMNS}",
                (session, meta, fork.seq, truncated_through, epoch, parent_sid, fork.seq),
            )
        ).fetchone()
        if row is None:
            raise SessionExists(session)
        sid = row[0]
        async with conn.cursor() as cursor:
            await cursor.executemany(
                f"INSERT INTO {self.s}.forks (sid, ancestor, after_seq, through_seq) "
                "VALUES (%s, %s, %s, %s)",
                [(sid, a.sid, a.after, a.through) for a in ancestors],
            )
        acked = await self._acked_at(conn, ancestors, fork.seq, truncated_through)
        if acked is not None:
            await conn.execute(
                f"INSERT INTO {self.s}.acks (sid, epoch, seq) VALUES (%s, %s, %s)",
                (sid, *acked),
            )
        # The newest snapshot at or below the fork point, so the fork's first owner
        # restores from it rather than replaying the parent's journal from its start.
        await conn.execute(
            f"INSERT INTO {self.s}.snapshots (sid, watermark, schema_version, created, data) "
            f"SELECT %s, watermark, schema_version, created, data FROM {self.s}.snapshots "
            "WHERE sid = %s AND watermark <= %s ORDER BY watermark DESC LIMIT 1",
            (sid, parent_sid, fork.seq),
        )
        return _session_info(row, fork.session)

    async def _segments(self, conn: Conn, sid: int) -> list[forks.Segment]:
        rows = await (
            await conn.execute(
                f"SELECT ancestor, after_seq, through_seq FROM {self.s}.forks WHERE sid = %s "
                "ORDER BY after_seq",
                (sid,),
            )
        ).fetchall()
        return [forks.Segment(*row) for row in rows]

    async def _acked_at(
        self, conn: Conn, ancestors: Sequence[forks.Segment], at: int, truncated_through: int
    ) -> tuple[int, int] | None:
        """(epoch, turn) of the last ack journaled at or below ``at``: the watermark a
        fork inherits (an ack retention removed is at least the truncation point)."""
        for segment in sorted(ancestors, key=lambda s: s.after, reverse=True):
            row = await (
                await conn.execute(
                    f"SELECT epoch, (payload ->> 'turn')::bigint FROM {self.s}.entries "
                    "WHERE sid = %s AND seq > %s AND seq <= %s AND kind = 'ack' "
                    "ORDER BY seq DESC LIMIT 1",
                    (segment.sid, segment.after, min(at, segment.through or at)),
                )
            ).fetchone()
            if row is not None:
                return int(row[0]), int(row[1])
        return (0, truncated_through) if truncated_through else None

    async def _fork_of(self, conn: Conn, row: TupleRow) -> str | None:
        if row[12] is None:
            return None
        found = await (
            await conn.execute(f"SELECT name FROM {self.s}.sessions WHERE sid = %s", (row[12],))
        ).fetchone()
        return None if found is None else str(found[0])

    async def update_meta(self, conn: Conn, session: str, changes: Jsonb) -> SessionInfo:
        row = await (
            await conn.execute(
                f"UPDATE {self.s}.sessions SET meta = meta || %s WHERE name = %s "
                f"RETURNING {_SESSION_COLUMNS}",
                (changes, session),
            )
        ).fetchone()
        if row is None:
            raise SessionNotFound(session)
        return _session_info(row, await self._fork_of(conn, row))

    async def get_session(self, conn: Conn, session: str) -> SessionInfo:
        row = await self._row(conn, session, lock=False)
        return _session_info(row, await self._fork_of(conn, row))

    async def list_sessions(self, conn: Conn) -> list[SessionInfo]:
        cursor = await conn.execute(
            f"SELECT {_SESSION_COLUMNS}, "
            f"(SELECT p.name FROM {self.s}.sessions p WHERE p.sid = s.parent_sid) "
            f"FROM {self.s}.sessions s ORDER BY s.name"
        )
        return [_session_info(row, row[13]) for row in await cursor.fetchall()]

    async def positions(self, conn: Conn) -> list[SessionPosition]:
        cursor = await conn.execute(
            f"SELECT s.name, s.head, coalesce((SELECT max(a.seq) FROM {self.s}.acks a "
            f"WHERE a.sid = s.sid), 0), s.epoch, s.fence FROM {self.s}.sessions s ORDER BY s.name"
        )
        return [
            SessionPosition(r[0], r[1], min(r[1], r[2]), r[3], r[4])
            for r in await cursor.fetchall()
        ]

    async def delete_session(self, conn: Conn, session: str) -> None:
        sid = (await self._row(conn, session, lock=True))[0]
        readers = [
            str(name)
            for (name,) in await (
                await conn.execute(
                    f"SELECT s.name FROM {self.s}.forks f JOIN {self.s}.sessions s "
                    "ON s.sid = f.sid WHERE f.ancestor = %s "
                    "AND s.truncated_through < f.through_seq ORDER BY s.name",
                    (sid,),
                )
            ).fetchall()
        ]
        if readers:
            raise SessionHasForks(session, readers)
        for table in ("entries", "acks", "snapshots", "sessions", "forks"):
            await conn.execute(f"DELETE FROM {self.s}.{table} WHERE sid = %s", (sid,))
        await conn.execute(f"DELETE FROM {self.s}.forks WHERE ancestor = %s", (sid,))
        await self._notify(conn, session)

    # --- journal ----------------------------------------------------------------------

    async def append(
        self,
        conn: Conn,
        session: str,
        entries: Sequence[NewEntry],
        owner_epoch: int | None,
        committed: list[JournalEntry],
        *,
        owner: str | None = None,
        writer: Writer = Writer.GATEWAY,
    ) -> list[Appended]:
        turns = [named_turn(entry) for entry in entries]
        scope = Writer.OWNER if owner_epoch is not None else writer
        try:
            rows = await (
                await conn.execute(
                    f"SELECT o_seq, o_duplicate, o_ts FROM {self.s}.append_entries"
                    "(%s, %s, %s, %s::smallint, %s, %s, %s, %s, %s, %s)",
                    (
                        session,
                        owner_epoch,
                        owner,
                        int(scope),
                        [entry.id for entry in entries],
                        [entry.kind for entry in entries],
                        [Jsonb(entry.payload) for entry in entries],
                        turns,
                        self.channel,
                        f"{self.token}:{session}",
                    ),
                )
            ).fetchall()
        except psycopg.Error as exc:
            refused = append_refusal(
                PendingAppend(session, entries, owner_epoch, owner, scope),
                exc.sqlstate,
                exc.diag.message_primary,
                exc.diag.message_detail,
            )
            if refused is None:
                raise
            raise refused from None
        return appended(PendingAppend(session, entries, owner_epoch, owner, scope), rows, committed)

    async def append_batch(
        self, conn: Conn, batch: Sequence[PendingAppend]
    ) -> list[list[tuple[int, bool, datetime | None]] | tuple[str, str | None, str | None]]:
        """Every append of ``batch`` in one statement (``append_batch``, one
        transaction): per append, its rows (seq, duplicate, ts), or what refused it
        (sqlstate, message, detail) — nothing of a refused append is journaled, and the
        others are. The caller orders ``batch`` by session (see the SQL function)."""
        cursor = await conn.execute(
            f"SELECT o_append, o_seq, o_duplicate, o_ts, o_code, o_message, o_detail "
            f"FROM {self.s}.append_batch(%s::text[], %s::bigint[], %s::text[], "
            "%s::smallint[], %s::integer[], %s::text[], %s::text[], %s::jsonb[], "
            "%s::bigint[], %s, %s)",
            (
                [p.session for p in batch],
                [p.owner_epoch for p in batch],
                [p.owner for p in batch],
                [int(p.scope) for p in batch],
                [len(p.entries) for p in batch],
                [e.id for p in batch for e in p.entries],
                [e.kind for p in batch for e in p.entries],
                [Jsonb(e.payload) for p in batch for e in p.entries],
                [t for p in batch for t in p.turns],
                self.channel,
                self.token,
            ),
        )
        outcomes: list[
            list[tuple[int, bool, datetime | None]] | tuple[str, str | None, str | None]
        ] = [[] for _ in batch]
        for index, seq, duplicate, ts, code, message, detail in await cursor.fetchall():
            outcome = outcomes[index - 1]
            if code is not None:
                outcomes[index - 1] = (code, message, detail)
            else:
                assert isinstance(outcome, list)
                outcome.append((seq, duplicate, ts))
        return outcomes

    async def _read_fork(
        self, conn: Conn, sid: int, fork_seq: int, after: int, limit: int
    ) -> list[JournalEntry]:
        """A fork's entries after ``after`` (below its fork point): its ancestors', then
        its own. An ancestor's entries up to a fork point never change while the fork
        reads them (its retention keeps them), so the statements need no one snapshot."""
        spans = forks.spans(await self._segments(conn, sid), sid, fork_seq, after)
        entries: list[JournalEntry] = []
        for span in spans:
            rows = await (
                await conn.execute(
                    f"SELECT seq, id, kind, epoch, ts, payload FROM {self.s}.entries "
                    "WHERE sid = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
                    (span.sid, span.after, span.through or _NO_END, limit - len(entries)),
                )
            ).fetchall()
            entries += [_entry(*row) for row in rows]
            if len(entries) >= limit:
                break
        return entries

    async def read(self, conn: Conn, session: str, after: int, limit: int) -> list[JournalEntry]:
        # One statement, one snapshot: the truncation point and the entries agree.
        rows = await (
            await conn.execute(
                f"SELECT s.truncated_through, s.sid, s.fork_seq, "
                "e.seq, e.id, e.kind, e.epoch, e.ts, e.payload "
                f"FROM {self.s}.sessions s LEFT JOIN LATERAL ("
                f"  SELECT seq, id, kind, epoch, ts, payload FROM {self.s}.entries"
                "   WHERE sid = s.sid AND seq > %s ORDER BY seq LIMIT %s"
                ") e ON true WHERE s.name = %s",
                (after, limit, session),
            )
        ).fetchall()
        if not rows:
            raise SessionNotFound(session)
        truncated_through, sid, fork_seq = rows[0][:3]
        if after < truncated_through:
            raise JournalTruncated(session, after=after, through=truncated_through)
        if fork_seq is not None and after < fork_seq:
            return await self._read_fork(conn, sid, fork_seq, after, limit)
        return [_entry(*row[3:]) for row in rows if row[3] is not None]

    async def read_json(self, conn: Conn, session: str, after: int, limit: int) -> bytes:
        """``read``'s page as one JSON array, built by the server (json_agg)."""
        row = await (
            await conn.execute(
                f"SELECT s.truncated_through, s.sid, s.fork_seq, ("
                "  SELECT coalesce(json_agg(json_build_object("
                "    'seq', seq, 'id', id, 'kind', kind, 'epoch', epoch,"
                "    'ts', to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
                "    'payload', payload) ORDER BY seq), '[]')::text"
                f"  FROM (SELECT seq, id, kind, epoch, ts, payload FROM {self.s}.entries"
                "        WHERE sid = s.sid AND seq > %s ORDER BY seq LIMIT %s) e"
                f") FROM {self.s}.sessions s WHERE s.name = %s",
                (after, limit, session),
            )
        ).fetchone()
        if row is None:
            raise SessionNotFound(session)
        truncated_through, sid, fork_seq, array = row
        if after < truncated_through:
            raise JournalTruncated(session, after=after, through=truncated_through)
        if fork_seq is not None and after < fork_seq:
            return codec.entries_json(await self._read_fork(conn, sid, fork_seq, after, limit))
        return str(array).encode()

    # --- ownership --------------------------------------------------------------------

    async def get_ownership(self, conn: Conn, session: str) -> Ownership:
        return _ownership(await self._row(conn, session, lock=False))

    async def compare_and_set_ownership(
        self,
        conn: Conn,
        session: str,
        expect_epoch: int,
        new: Ownership,
        committed: list[JournalEntry],
        check_lease: Callable[[Conn, str], Awaitable[None]] | None = None,
    ) -> Ownership:
        row = await self._row(conn, session, lock=True)
        if check_lease is not None:  # under the session's lock, in this transaction
            await check_lease(conn, session)
        current = _ownership(row)
        if current.epoch != expect_epoch:
            raise EpochConflict(session, expected=expect_epoch, current=current)
        validate_transition(session, current, new)
        sid, head, fence_seq = row[0], row[4], current.fence_seq
        if new.epoch != current.epoch:
            marker = epoch_marker(current, new)
            head += 1
            ts_row = await (
                await conn.execute(
                    f"INSERT INTO {self.s}.entries (sid, seq, id, kind, epoch, ts, payload, scope)"
                    " VALUES (%s, %s, %s, %s, %s, clock_timestamp(), %s, %s) RETURNING ts",
                    (
                        sid,
                        head,
                        marker.id,
                        marker.kind,
                        new.epoch,
                        Jsonb(marker.payload),
                        int(Writer.GATEWAY),
                    ),
                )
            ).fetchone()
            assert ts_row is not None
            committed.append(
                _entry(head, marker.id, marker.kind, new.epoch, ts_row[0], marker.payload)
            )
            fence_seq = head
            await self._notify(conn, session)
        try:
            updated = await (
                await conn.execute(
                    f"UPDATE {self.s}.sessions SET epoch = %s, owner = %s, fence = %s, "
                    "fence_seq = %s, head = %s, ownership_updated = clock_timestamp() "
                    f"WHERE sid = %s RETURNING {_SESSION_COLUMNS}",
                    (new.epoch, new.owner, new.fence.value, fence_seq, head, sid),
                )
            ).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate != OWNERSHIP_RULE_CODE:
                raise
            # The whole transaction (the epoch marker too) is rolled back.
            raise InvalidOwnership(f"session {session!r}: {exc.diag.message_primary}") from None
        assert updated is not None
        return _ownership(updated)

    async def acks(self, conn: Conn, session: str) -> dict[int, int]:
        sid = (await self._row(conn, session, lock=False))[0]
        rows = await (
            await conn.execute(
                f"SELECT epoch, seq FROM {self.s}.acks WHERE sid = %s ORDER BY epoch", (sid,)
            )
        ).fetchall()
        return dict(rows)

    # --- snapshots --------------------------------------------------------------------

    async def put_snapshot(
        self,
        conn: Conn,
        session: str,
        watermark: int,
        schema_version: int,
        blob: bytes | CompressedDocument,
        owner_epoch: int | None = None,
        owner: str | None = None,
    ) -> SnapshotInfo:
        """``blob``: the compressed document, or a file of it, streamed to the server
        (binary COPY into a table of this transaction) before the session is locked."""
        if isinstance(blob, CompressedDocument):
            await self._copy_in(conn, blob)
        row = await self._row(conn, session, lock=True)
        sid = row[0]
        check_writer(session, row[6], row[7], owner_epoch, owner)
        if not 0 <= watermark <= row[4]:
            raise InvalidSnapshot(
                f"session {session!r}: snapshot watermark {watermark} is outside the journal "
                f"(head is {row[4]}); a snapshot must reflect entries that exist"
            )
        newer = await (
            await conn.execute(
                f"SELECT count(*) FROM {self.s}.snapshots WHERE sid = %s AND watermark > %s",
                (sid, watermark),
            )
        ).fetchone()
        if newer is not None and newer[0] >= MAX_SNAPSHOTS_PER_SESSION:
            raise SnapshotTooOld(session, watermark=watermark, kept=MAX_SNAPSHOTS_PER_SESSION)
        streamed = isinstance(blob, CompressedDocument)
        data = "(SELECT data FROM pg_temp.snapshot_upload)" if streamed else "%s"
        created = await (
            await conn.execute(
                f"INSERT INTO {self.s}.snapshots (sid, watermark, schema_version, created, data) "
                f"VALUES (%s, %s, %s, clock_timestamp(), {data}) "
                "ON CONFLICT (sid, watermark) DO UPDATE "
                "SET schema_version = excluded.schema_version, created = excluded.created, "
                "data = excluded.data RETURNING created",
                (sid, watermark, schema_version) + (() if streamed else (blob,)),
            )
        ).fetchone()
        assert created is not None
        await conn.execute(
            f"DELETE FROM {self.s}.snapshots WHERE sid = %s AND watermark NOT IN "
            f"(SELECT watermark FROM {self.s}.snapshots WHERE sid = %s "
            "ORDER BY watermark DESC LIMIT %s)",
            (sid, sid, MAX_SNAPSHOTS_PER_SESSION),
        )
        return SnapshotInfo(
            session=session,
            watermark=watermark,
            schema_version=schema_version,
            size_bytes=blob.size_bytes if isinstance(blob, CompressedDocument) else len(blob),
            created=created[0],
        )

    async def _copy_in(self, conn: Conn, document: CompressedDocument) -> None:
        """``document`` into ``pg_temp.snapshot_upload`` (dropped at the transaction's
        end), a piece at a time: binary COPY takes a value's length up front and its
        bytes as they come, where a bound parameter would be the whole value."""
        await conn.execute("CREATE TEMP TABLE snapshot_upload (data bytea) ON COMMIT DROP")
        cursor = conn.cursor()
        async with cursor.copy("COPY snapshot_upload (data) FROM STDIN (FORMAT BINARY)") as copy:
            await copy.write(_COPY_HEADER + struct.pack(">hi", 1, document.size_bytes))
            for piece in document.pieces():
                await copy.write(piece)
            await copy.write(struct.pack(">h", -1))

    async def get_snapshot(self, conn: Conn, session: str, watermark: int | None) -> Snapshot:
        sid = (await self._row(conn, session, lock=False))[0]
        where = "" if watermark is None else " AND watermark = %s"
        params: tuple[Any, ...] = (sid,) if watermark is None else (sid, watermark)
        row = await (
            await conn.execute(
                f"SELECT watermark, schema_version, created, data FROM {self.s}.snapshots "
                f"WHERE sid = %s{where} ORDER BY watermark DESC LIMIT 1",
                params,
            )
        ).fetchone()
        if row is None:
            raise SnapshotNotFound(session, watermark)
        data = bytes(row[3])
        info = SnapshotInfo(
            session=session,
            watermark=row[0],
            schema_version=row[1],
            size_bytes=len(data),
            created=row[2],
        )
        # Off the event loop: documents run to megabytes (zlib releases the GIL).
        document_json = await asyncio.to_thread(codec.decompress_document, data)
        return Snapshot(info=info, document_json=document_json)

    async def list_snapshots(self, conn: Conn, session: str) -> list[SnapshotInfo]:
        sid = (await self._row(conn, session, lock=False))[0]
        rows = await (
            await conn.execute(
                f"SELECT watermark, schema_version, created, octet_length(data) "
                f"FROM {self.s}.snapshots WHERE sid = %s ORDER BY watermark",
                (sid,),
            )
        ).fetchall()
        return [
            SnapshotInfo(session=session, watermark=w, schema_version=v, created=c, size_bytes=size)
            for w, v, c, size in rows
        ]

    async def apply_retention(self, conn: Conn, session: str, keep_snapshots: int) -> Retention:
        row = await self._row(conn, session, lock=True)
        sid, truncated_through = row[0], row[5]
        watermarks = [
            w
            for (w,) in await (
                await conn.execute(
                    f"SELECT watermark FROM {self.s}.snapshots WHERE sid = %s "
                    "ORDER BY watermark DESC",
                    (sid,),
                )
            ).fetchall()
        ]
        kept, dropped = watermarks[:keep_snapshots], watermarks[keep_snapshots:]
        if dropped:
            await conn.execute(
                f"DELETE FROM {self.s}.snapshots WHERE sid = %s AND watermark <= %s",
                (sid, dropped[0]),
            )
        deleted_entries = 0
        if kept:
            acked_row = await (
                await conn.execute(f"SELECT max(seq) FROM {self.s}.acks WHERE sid = %s", (sid,))
            ).fetchone()
            acked = acked_row[0] if acked_row and acked_row[0] is not None else 0
            through = min(kept[-1], acked)
            # A fork reads this session's entries up to its fork point until its own
            # retention truncates past it: those stay.
            needed = await (
                await conn.execute(
                    f"SELECT min(greatest(f.after_seq, s.truncated_through)) FROM {self.s}.forks f "
                    f"JOIN {self.s}.sessions s ON s.sid = f.sid WHERE f.ancestor = %s "
                    "AND s.truncated_through < f.through_seq",
                    (sid,),
                )
            ).fetchone()
            if needed is not None and needed[0] is not None:
                through = min(through, needed[0])
            if through > truncated_through:
                cursor = await conn.execute(
                    f"DELETE FROM {self.s}.entries WHERE sid = %s AND seq <= %s",
                    (sid, through),
                )
                deleted_entries = cursor.rowcount
                await conn.execute(
                    f"UPDATE {self.s}.sessions SET truncated_through = %s WHERE sid = %s",
                    (through, sid),
                )
                truncated_through = through
        return Retention(
            deleted_snapshots=len(dropped),
            deleted_entries=deleted_entries,
            truncated_through=truncated_through,
        )
