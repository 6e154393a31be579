"""The SQLite statements of snapshots and retention (schema: ``sql.py``).

Same rules as ``sql.py``: synchronous, one connection at a time, and write functions
check before they write.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from shadowpod.journal import codec
from shadowpod.journal.errors import (
    InvalidSnapshot,
    SnapshotNotFound,
    SnapshotTooOld,
    check_writer,
)
from shadowpod.journal.sqlite.sql import session_row
from shadowpod.journal.sqlite.writer import WriteTx
from shadowpod.journal.store import (
    MAX_SNAPSHOTS_PER_SESSION,
    CompressedDocument,
    Retention,
    Snapshot,
    SnapshotInfo,
)


def put_snapshot(
    tx: WriteTx,
    session: str,
    watermark: int,
    schema_version: int,
    blob: bytes | CompressedDocument,
    owner_epoch: int | None = None,
    owner: str | None = None,
) -> SnapshotInfo:
    """``blob``: the compressed document, or a file of it, written into the row a
    piece at a time (run such a write off the event loop: ``alone``)."""
    row = session_row(tx.conn, session)
    sid = row["sid"]
    check_writer(session, row["epoch"], row["owner"], owner_epoch, owner)
    if not 0 <= watermark <= row["head"]:
        raise InvalidSnapshot(
            f"session {session!r}: snapshot watermark {watermark} is outside the journal "
            f"(head is {row['head']}); a snapshot must reflect entries that exist"
        )
    (newer,) = tx.conn.execute(
        "SELECT count(*) FROM snapshots WHERE sid = ? AND watermark > ?", (sid, watermark)
    ).fetchone()
    if newer >= MAX_SNAPSHOTS_PER_SESSION:
        raise SnapshotTooOld(session, watermark=watermark, kept=MAX_SNAPSHOTS_PER_SESSION)
    if isinstance(blob, bytes):
        data: bytes | int = blob
        size = len(blob)
    else:
        data = size = blob.size_bytes
    cursor = tx.conn.execute(
        "INSERT OR REPLACE INTO snapshots (sid, watermark, schema_version, created_us, data) "
        f"VALUES (?, ?, ?, ?, {'?' if isinstance(data, bytes) else 'zeroblob(?)'})",
        (sid, watermark, schema_version, tx.now_us, data),
    )
    if isinstance(blob, CompressedDocument):
        assert cursor.lastrowid is not None
        with tx.conn.blobopen("snapshots", "data", cursor.lastrowid) as stored:
            for piece in blob.pieces():
                stored.write(piece)
    tx.conn.execute(
        "DELETE FROM snapshots WHERE sid = ? AND watermark NOT IN "
        "(SELECT watermark FROM snapshots WHERE sid = ? ORDER BY watermark DESC LIMIT ?)",
        (sid, sid, MAX_SNAPSHOTS_PER_SESSION),
    )
    return SnapshotInfo(
        session=session,
        watermark=watermark,
        schema_version=schema_version,
        size_bytes=size,
        created=tx.now,
    )


_SNAPSHOT_COLUMNS: Final = "watermark, schema_version, created_us, length(data) AS size"


def _snapshot_info(session: str, row: sqlite3.Row) -> SnapshotInfo:
    return SnapshotInfo(
        session=session,
        watermark=row["watermark"],
        schema_version=row["schema_version"],
        size_bytes=row["size"],
        created=codec.from_us(row["created_us"]),
    )


def get_snapshot(conn: sqlite3.Connection, session: str, watermark: int | None) -> Snapshot:
    sid = session_row(conn, session)["sid"]
    if watermark is None:
        row = conn.execute(
            f"SELECT {_SNAPSHOT_COLUMNS}, data FROM snapshots WHERE sid = ? "
            "ORDER BY watermark DESC LIMIT 1",
            (sid,),
        ).fetchone()
    else:
        row = conn.execute(
            f"SELECT {_SNAPSHOT_COLUMNS}, data FROM snapshots WHERE sid = ? AND watermark = ?",
            (sid, watermark),
        ).fetchone()
    if row is None:
        raise SnapshotNotFound(session, watermark)
    return Snapshot(
        info=_snapshot_info(session, row), document_json=codec.decompress_document(row["data"])
    )


def list_snapshots(conn: sqlite3.Connection, session: str) -> list[SnapshotInfo]:
    sid = session_row(conn, session)["sid"]
    rows = conn.execute(
        f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE sid = ? ORDER BY watermark", (sid,)
    ).fetchall()
    return [_snapshot_info(session, row) for row in rows]


def apply_retention(tx: WriteTx, session: str, keep_snapshots: int) -> Retention:
    conn = tx.conn
    row = session_row(conn, session)
    sid, truncated_through = row["sid"], row["truncated_through"]
    watermarks = [
        w
        for (w,) in conn.execute(
            "SELECT watermark FROM snapshots WHERE sid = ? ORDER BY watermark DESC", (sid,)
        )
    ]
    kept, dropped = watermarks[:keep_snapshots], watermarks[keep_snapshots:]
    if dropped:
        conn.execute("DELETE FROM snapshots WHERE sid = ? AND watermark <= ?", (sid, dropped[0]))
    deleted_entries = 0
    if kept:
        acked = conn.execute("SELECT max(seq) FROM acks WHERE sid = ?", (sid,)).fetchone()[0]
        through = min(kept[-1], acked or 0)
        # A fork reads this session's entries up to its fork point until its own
        # retention truncates past it: those stay.
        (needed,) = conn.execute(
            "SELECT min(max(f.after_seq, s.truncated_through)) FROM forks f "
            "JOIN sessions s ON s.sid = f.sid WHERE f.ancestor = ? "
            "AND s.truncated_through < f.through_seq",
            (sid,),
        ).fetchone()
        if needed is not None:
            through = min(through, needed)
        if through > truncated_through:
            cursor = conn.execute("DELETE FROM entries WHERE sid = ? AND seq <= ?", (sid, through))
            deleted_entries = cursor.rowcount
            conn.execute("UPDATE sessions SET truncated_through = ? WHERE sid = ?", (through, sid))
            truncated_through = through
    return Retention(
        deleted_snapshots=len(dropped),
        deleted_entries=deleted_entries,
        truncated_through=truncated_through,
    )
