"""The SQLite schema and the statements of every store operation.

Functions here are synchronous and run on one connection at a time: writes inside the
group-commit writer's batch transaction (see ``writer.py``), reads on the reader
threads (inside a read transaction, for a consistent view). Snapshots and retention
are in ``snapshot_sql.py``.

Write functions *check, then write*: every ``ShadowpodError`` they raise is raised
before they change anything, because they share their transaction with the other
writes of the batch (see ``writer.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Final

from shadowpod.domain.entries import JournalEntry, NewEntry, named_turn
from shadowpod.domain.errors import SchemaTooNew
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.journal import codec, forks
from shadowpod.journal.errors import (
    EpochConflict,
    Fenced,
    IdempotencyConflict,
    InvalidOwnership,
    InvalidTurn,
    JournalTruncated,
    OwnerMismatch,
    SessionExists,
    SessionHasForks,
    SessionNotFound,
)
from shadowpod.journal.ownership import TRIGGER_MESSAGE, epoch_marker, validate_transition
from shadowpod.journal.sqlite.writer import WriteTx
from shadowpod.journal.store import Appended, ForkPoint, SessionInfo, SessionPosition, Writer

STORE_SCHEMA_VERSION: Final = 5

# The SQL function that reads a stored payload as its JSON text (``codec.payload_text``:
# large payloads are stored compressed since version 5), on every connection of the
# store (``add_functions``).
_PAYLOAD_TEXT: Final = "shadowpod_payload_text"

_DDL: Final = """
CREATE TABLE IF NOT EXISTS shadowpod_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    sid INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_us INTEGER NOT NULL,
    meta BLOB NOT NULL,
    head INTEGER NOT NULL DEFAULT 0,
    truncated_through INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    fence TEXT NOT NULL DEFAULT 'open',
    fence_seq INTEGER,
    ownership_us INTEGER,
    parent_sid INTEGER,
    fork_seq INTEGER
);
CREATE TABLE IF NOT EXISTS entries (
    pos INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    ts_us INTEGER NOT NULL,
    payload BLOB NOT NULL,
    scope INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_seq ON entries (sid, seq);
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_scoped_id ON entries (id, sid, scope);
CREATE TABLE IF NOT EXISTS acks (
    sid INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (sid, epoch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS forks (
    sid INTEGER NOT NULL,
    ancestor INTEGER NOT NULL,
    after_seq INTEGER NOT NULL,
    through_seq INTEGER NOT NULL,
    PRIMARY KEY (sid, ancestor)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS forks_by_ancestor ON forks (ancestor);
CREATE TABLE IF NOT EXISTS snapshots (
    rid INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    watermark INTEGER NOT NULL,
    schema_version INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (sid, watermark)
);
"""

# The fence guarantee, kept by the database for every update of the ownership record
# (the stores check it first, with a clearer error: see ``journal/ownership.py``).
_OWNERSHIP_TRIGGER: Final = f"""
CREATE TRIGGER IF NOT EXISTS sessions_ownership_fence
BEFORE UPDATE OF epoch, owner ON sessions
WHEN NEW.epoch < OLD.epoch OR (NEW.owner IS NOT OLD.owner AND NEW.epoch <= OLD.epoch)
BEGIN
    SELECT RAISE(ABORT, '{TRIGGER_MESSAGE}');
END
"""

# An inbound entry, as ``domain.entries.is_inbound`` says, in SQL: the turns that
# outputs and acks name are checked against it inside the append's transaction.
# Ids looked up per statement (SQLite allows 32766 variables).
_IN_BATCH: Final = 500

_INBOUND_AT: Final = f"""
SELECT seq FROM entries
WHERE sid = ? AND seq = ? AND epoch = 0 AND (
    (kind = 'message' AND json_extract({_PAYLOAD_TEXT}(payload), '$.role') IN ('user', 'system'))
    OR (kind = 'schedule' AND json_extract({_PAYLOAD_TEXT}(payload), '$.op') = 'fire')
)
"""


# Version 1 to 2: idempotency keys scoped by writer (``store.Writer``). Entries
# journaled before are given the scope their writer had: inbound messages were the
# clients', other inbound entries and the epoch markers the gateway's.
_TO_V2: Final = (
    "ALTER TABLE entries ADD COLUMN scope INTEGER NOT NULL DEFAULT 0",
    "UPDATE entries SET scope = CASE WHEN epoch = 0 AND kind = 'message' THEN 1 "
    "WHEN epoch = 0 OR (kind = 'control' AND id LIKE 'epoch:%') THEN 2 ELSE 0 END",
    "DROP INDEX IF EXISTS entries_by_id",
)


# Version 2 to 3: snapshots get a rowid, so that a large one is written into its row a
# piece at a time (incremental blob I/O needs one) instead of bound whole.
_TO_V3: Final = (
    """CREATE TABLE snapshots_v3 (
    rid INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    watermark INTEGER NOT NULL,
    schema_version INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (sid, watermark)
)""",
    "INSERT INTO snapshots_v3 (sid, watermark, schema_version, created_us, data) "
    "SELECT sid, watermark, schema_version, created_us, data FROM snapshots",
    "DROP TABLE snapshots",
    "ALTER TABLE snapshots_v3 RENAME TO snapshots",
)


# Version 3 to 4: forks (``journal/forks.py``): a session may read its parent's journal
# up to the seq it was forked at (the ``forks`` table is made by the DDL).
_TO_V4: Final = (
    ("parent_sid", "ALTER TABLE sessions ADD COLUMN parent_sid INTEGER"),
    ("fork_seq", "ALTER TABLE sessions ADD COLUMN fork_seq INTEGER"),
)


# Version 4 to 5: large payloads stored compressed (``codec.stored_payload``). Nothing
# to change: a row stored as before reads as before. The version says that a build
# older than this one cannot read the journal (it would take a compressed payload for
# JSON), so it refuses it with ``SchemaTooNew`` instead.


def add_functions(conn: sqlite3.Connection) -> None:
    """The SQL functions the statements here use, on a new connection."""
    conn.create_function(_PAYLOAD_TEXT, 1, codec.payload_text, deterministic=True)


def init_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, or check that an existing database is one we can read (and
    bring one of an older version up to this one)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='shadowpod_meta'"
        ).fetchone()
        if exists:
            row = conn.execute(
                "SELECT value FROM shadowpod_meta WHERE key='schema_version'"
            ).fetchone()
            found = int(row[0]) if row else 0
            if found > STORE_SCHEMA_VERSION:
                raise SchemaTooNew(
                    found=found, supported=STORE_SCHEMA_VERSION, what="journal database"
                )
            if found < 2:
                for statement in _TO_V2:
                    conn.execute(statement)
            if found < 3:
                for statement in _TO_V3:
                    conn.execute(statement)
            if found < 4:
                columns = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
                for column, statement in _TO_V4:
                    if column not in columns:
                        conn.execute(statement)
            if found < STORE_SCHEMA_VERSION:
                conn.execute(
                    "UPDATE shadowpod_meta SET value = ? WHERE key = 'schema_version'",
                    (str(STORE_SCHEMA_VERSION),),
                )
        for statement in _DDL.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(_OWNERSHIP_TRIGGER)
        conn.execute(
            "INSERT OR IGNORE INTO shadowpod_meta (key, value) VALUES ('schema_version', ?)",
            (str(STORE_SCHEMA_VERSION),),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# --- sessions -----------------------------------------------------------------------------


_SESSION_COLUMNS: Final = (
    "sid, name, created_us, meta, head, truncated_through, epoch, owner, fence, fence_seq, "
    "ownership_us, fork_seq, "
    "(SELECT p.name FROM sessions p WHERE p.sid = sessions.parent_sid) AS fork_of"
)


def session_row(conn: sqlite3.Connection, session: str) -> sqlite3.Row:
    row: sqlite3.Row | None = conn.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE name = ?", (session,)
    ).fetchone()
    if row is None:
        raise SessionNotFound(session)
    return row


def _session_info(row: sqlite3.Row) -> SessionInfo:
    return SessionInfo(
        session=row["name"],
        created=codec.from_us(row["created_us"]),
        head=row["head"],
        truncated_through=row["truncated_through"],
        meta=codec.decode_payload(row["meta"]),
        fork_of=row["fork_of"],
        fork_seq=row["fork_seq"],
    )


def _ownership(row: sqlite3.Row) -> Ownership:
    updated = row["ownership_us"]
    return Ownership(
        epoch=row["epoch"],
        owner=row["owner"],
        fence=FenceState(row["fence"]),
        fence_seq=row["fence_seq"],
        updated=None if updated is None else codec.from_us(updated),
    )


def create_session(
    tx: WriteTx, session: str, meta: Mapping[str, str], fork: ForkPoint | None = None
) -> SessionInfo:
    conn = tx.conn
    exists = conn.execute("SELECT 1 FROM sessions WHERE name = ?", (session,)).fetchone()
    if exists:
        raise SessionExists(session)
    if fork is None:
        conn.execute(
            "INSERT INTO sessions (name, created_us, meta) VALUES (?, ?, ?)",
            (session, tx.now_us, codec.encode_payload(dict(meta))),
        )
        return _session_info(session_row(conn, session))
    parent = session_row(conn, fork.session)
    forks.check_point(fork, parent["head"], parent["truncated_through"])
    ancestors = forks.inherited(
        parent["sid"], parent["fork_seq"], segments(conn, parent["sid"]), fork.seq
    )
    cursor = conn.execute(
        "INSERT INTO sessions (name, created_us, meta, head, truncated_through, epoch, "
        "parent_sid, fork_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            session,
            tx.now_us,
            codec.encode_payload(dict(meta)),
            fork.seq,
            parent["truncated_through"],
            parent["epoch"],
            parent["sid"],
            fork.seq,
        ),
    )
    sid = cursor.lastrowid
    conn.executemany(
        "INSERT INTO forks (sid, ancestor, after_seq, through_seq) VALUES (?, ?, ?, ?)",
        [(sid, s.sid, s.after, s.through) for s in ancestors],
    )
    acked = _acked_at(conn, ancestors, fork.seq, parent["truncated_through"])
    if acked is not None:
        conn.execute("INSERT INTO acks (sid, epoch, seq) VALUES (?, ?, ?)", (sid, *acked))
    # The newest snapshot at or below the fork point, so the fork's first owner
    # restores from it rather than replaying the parent's journal from its start.
    conn.execute(
        "INSERT INTO snapshots (sid, watermark, schema_version, created_us, data) "
        "SELECT ?, watermark, schema_version, created_us, data FROM snapshots "
        "WHERE sid = ? AND watermark <= ? ORDER BY watermark DESC LIMIT 1",
        (sid, parent["sid"], fork.seq),
    )
    return _session_info(session_row(conn, session))


def segments(conn: sqlite3.Connection, sid: int) -> list[forks.Segment]:
    """The ancestor segments of session ``sid`` (none: not a fork)."""
    return [
        forks.Segment(ancestor, after, through)
        for ancestor, after, through in conn.execute(
            "SELECT ancestor, after_seq, through_seq FROM forks WHERE sid = ? ORDER BY after_seq",
            (sid,),
        )
    ]


def _acked_at(
    conn: sqlite3.Connection, ancestors: Sequence[forks.Segment], at: int, truncated_through: int
) -> tuple[int, int] | None:
    """(epoch, turn) of the last ack journaled at or below ``at``: the watermark a fork
    inherits. Retention truncates acked turns only, so an ack removed with the entries
    is at least the truncation point."""
    for segment in sorted(ancestors, key=lambda s: s.after, reverse=True):
        row = conn.execute(
            "SELECT epoch, payload FROM entries WHERE sid = ? AND seq > ? AND seq <= ? "
            "AND kind = 'ack' ORDER BY seq DESC LIMIT 1",
            (segment.sid, segment.after, min(at, segment.through or at)),
        ).fetchone()
        if row is not None:
            return int(row[0]), int(codec.decode_payload(row[1])["turn"])
    return (0, truncated_through) if truncated_through else None


def update_meta(tx: WriteTx, session: str, changes: Mapping[str, str]) -> SessionInfo:
    row = session_row(tx.conn, session)
    meta = {**codec.decode_payload(row["meta"]), **changes}
    tx.conn.execute(
        "UPDATE sessions SET meta = ? WHERE sid = ?", (codec.encode_payload(meta), row["sid"])
    )
    return _session_info(session_row(tx.conn, session))


def get_session(conn: sqlite3.Connection, session: str) -> SessionInfo:
    return _session_info(session_row(conn, session))


def list_sessions(conn: sqlite3.Connection) -> list[SessionInfo]:
    rows = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY name").fetchall()
    return [_session_info(row) for row in rows]


def positions(conn: sqlite3.Connection) -> list[SessionPosition]:
    rows = conn.execute(
        "SELECT s.name, s.head, coalesce((SELECT max(a.seq) FROM acks a WHERE a.sid = s.sid), 0),"
        " s.epoch, s.fence FROM sessions s ORDER BY s.name"
    ).fetchall()
    return [SessionPosition(r[0], r[1], min(r[1], r[2]), r[3], r[4]) for r in rows]


def delete_session(tx: WriteTx, session: str) -> None:
    sid = session_row(tx.conn, session)["sid"]
    readers = [
        name
        for (name,) in tx.conn.execute(
            "SELECT s.name FROM forks f JOIN sessions s ON s.sid = f.sid "
            "WHERE f.ancestor = ? AND s.truncated_through < f.through_seq ORDER BY s.name",
            (sid,),
        )
    ]
    if readers:
        raise SessionHasForks(session, readers)
    for table in ("entries", "acks", "snapshots", "sessions", "forks"):
        tx.conn.execute(f"DELETE FROM {table} WHERE sid = ?", (sid,))
    tx.conn.execute("DELETE FROM forks WHERE ancestor = ?", (sid,))


# --- journal ------------------------------------------------------------------------------


def append(
    tx: WriteTx,
    session: str,
    entries: Sequence[NewEntry],
    owner_epoch: int | None,
    owner: str | None = None,
    writer: Writer = Writer.GATEWAY,
) -> list[Appended]:
    conn = tx.conn
    row = conn.execute(
        "SELECT sid, head, epoch, owner, truncated_through, fork_seq FROM sessions WHERE name = ?",
        (session,),
    ).fetchone()
    if row is None:
        raise SessionNotFound(session)
    sid, head, current_epoch, current_owner, truncated_through, fork_seq = row
    ancestors = segments(conn, sid) if fork_seq is not None else []
    if owner_epoch is not None:
        if owner_epoch != current_epoch:
            raise Fenced(session, epoch=owner_epoch, current=current_epoch)
        if owner is not None and owner != current_owner:
            raise OwnerMismatch(
                session, epoch=owner_epoch, owner=owner, current_owner=current_owner
            )
        writer = Writer.OWNER
    _check_turns(conn, session, sid, head, truncated_through, entries, ancestors)
    epoch = 0 if owner_epoch is None else owner_epoch
    known = _journaled(conn, session, sid, int(writer), entries, epoch, ancestors)
    start = head
    results: list[Appended] = []
    for entry in entries:
        if entry.id in known:
            results.append(Appended(seq=known[entry.id], id=entry.id, duplicate=True))
            continue
        head += 1
        conn.execute(
            "INSERT INTO entries (sid, seq, id, kind, epoch, ts_us, payload, scope) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sid,
                head,
                entry.id,
                entry.kind,
                epoch,
                tx.now_us,
                codec.stored_payload(entry.payload),
                int(writer),
            ),
        )
        known[entry.id] = head
        results.append(Appended(seq=head, id=entry.id))
        tx.committed.append(JournalEntry(head, entry.id, entry.kind, epoch, tx.now, entry.payload))
        if entry.kind == EntryKind.ACK and owner_epoch is not None:
            conn.execute(
                "INSERT INTO acks (sid, epoch, seq) VALUES (?, ?, ?) "
                "ON CONFLICT (sid, epoch) DO UPDATE SET seq = max(seq, excluded.seq)",
                (sid, epoch, entry.payload["turn"]),
            )
    if head != start:
        conn.execute("UPDATE sessions SET head = ? WHERE sid = ?", (head, sid))
    return results


def _journaled(
    conn: sqlite3.Connection,
    session: str,
    sid: int,
    scope: int,
    entries: Sequence[NewEntry],
    epoch: int,
    ancestors: Sequence[forks.Segment] = (),
) -> dict[str, int]:
    """The seqs of the ids of ``entries`` journaled before in ``scope``; an
    ``IdempotencyConflict`` (before anything is written: check, then write) for an id
    journaled with other content — unless it is an owner's entry from an older epoch,
    which a new owner redoing that turn re-derives and yields to. A fork's entries
    include its ancestors' up to the fork point (``ancestors``)."""
    ids = list(dict.fromkeys(entry.id for entry in entries))
    found: dict[str, tuple[int, str, int, bytes]] = {}
    for segment in [forks.Segment(sid, 0, None), *ancestors]:
        missing = [i for i in ids if i not in found]
        for at in range(0, len(missing), _IN_BATCH):
            chunk = missing[at : at + _IN_BATCH]
            marks = ",".join("?" * len(chunk))
            for entry_id, seq, kind, entry_epoch, payload in conn.execute(
                "SELECT id, seq, kind, epoch, payload FROM entries "
                f"WHERE sid = ? AND scope = ? AND id IN ({marks}) AND seq > ? AND seq <= ?",
                (segment.sid, scope, *chunk, segment.after, segment.through or _NO_END),
            ):
                found[entry_id] = (seq, kind, entry_epoch, payload)
    first: dict[str, NewEntry] = {}
    for entry in entries:
        if (prior := found.get(entry.id)) is not None:
            seq, kind, entry_epoch, payload = prior
            redone = scope == Writer.OWNER and entry_epoch < epoch
            same = kind == entry.kind and codec.decode_payload(payload) == entry.payload
            if not (same or redone):
                raise IdempotencyConflict(session, entry_id=entry.id, seq=seq)
        elif (earlier := first.setdefault(entry.id, entry)) is not entry and (
            earlier.kind != entry.kind or earlier.payload != entry.payload
        ):
            raise IdempotencyConflict(session, entry_id=entry.id, seq=None)
    return {entry_id: prior[0] for entry_id, prior in found.items()}


def _check_turns(
    conn: sqlite3.Connection,
    session: str,
    sid: int,
    head: int,
    truncated_through: int,
    entries: Sequence[NewEntry],
    ancestors: Sequence[forks.Segment] = (),
) -> None:
    """Every turn named is an inbound entry already journaled (or removed by retention,
    which removes acked turns only)."""
    checked: set[int] = set()
    for entry in entries:
        turn = named_turn(entry)
        if turn is None or turn in checked:
            continue
        if turn > head:
            raise InvalidTurn(session, kind=entry.kind, turn=turn, head=head, beyond=True)
        segment = forks.holding(ancestors, turn)
        at = sid if segment is None else segment.sid
        if turn > truncated_through and conn.execute(_INBOUND_AT, (at, turn)).fetchone() is None:
            raise InvalidTurn(session, kind=entry.kind, turn=turn, head=head, beyond=False)
        checked.add(turn)


def read(conn: sqlite3.Connection, session: str, after: int, limit: int) -> list[JournalEntry]:
    row = session_row(conn, session)
    _check_not_truncated(session, row["truncated_through"], after)
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: this is the bulk path of replay
    rows: list[tuple[int, str, str, int, int, bytes]] = []
    for span in _spans(conn, row, after):
        rows += cursor.execute(
            "SELECT seq, id, kind, epoch, ts_us, payload FROM entries "
            "WHERE sid = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (span.sid, span.after, span.through or _NO_END, limit - len(rows)),
        ).fetchall()
        if len(rows) >= limit:
            break
    return [codec.entry_from_row(*r) for r in rows]


# The bound of a span with no end (SQLite's largest integer).
_NO_END: Final = 2**63 - 1


def _spans(conn: sqlite3.Connection, row: sqlite3.Row, after: int) -> list[forks.Segment]:
    """Where the session's entries after ``after`` are: its own rows, or for a fork
    read below its fork point, its ancestors' too."""
    fork_seq = row["fork_seq"]
    if fork_seq is None or after >= fork_seq:
        return [forks.Segment(row["sid"], after, None)]
    return forks.spans(segments(conn, row["sid"]), row["sid"], fork_seq, after)


# The page as one JSON array, built by SQLite's JSON functions: no Python object per
# entry, and the reading thread gives up the GIL for the whole page. Same fields as
# ``JournalEntry``; the timestamp with microseconds and a "Z", as orjson writes it.
# The rows reach the aggregate in seq order: a subquery with a LIMIT is not flattened
# into its aggregate but runs as a co-routine, in its ORDER BY (SQLite < 3.44 has no
# ORDER BY inside json_group_array to say so; the contract test checks the order).
# A payload stored compressed is inflated by a Python function (zlib gives up the GIL
# while it works); one stored as JSON text is read by SQLite alone.
_READ_JSON: Final = f"""
SELECT json_group_array(json_object(
    'seq', seq, 'id', id, 'kind', kind, 'epoch', epoch,
    'ts', strftime('%Y-%m-%dT%H:%M:%S', ts_us / 1000000, 'unixepoch')
          || printf('.%06dZ', ts_us % 1000000),
    'payload', json(CASE WHEN substr(payload, 1, 1) = X'00'
                    THEN {_PAYLOAD_TEXT}(payload) ELSE CAST(payload AS TEXT) END)
)) FROM (
    SELECT seq, id, kind, epoch, ts_us, payload FROM entries
    WHERE sid = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?
)
"""


def read_json(conn: sqlite3.Connection, session: str, after: int, limit: int) -> bytes:
    row = session_row(conn, session)
    _check_not_truncated(session, row["truncated_through"], after)
    spans = _spans(conn, row, after)
    if len(spans) == 1:
        (array,) = conn.execute(_READ_JSON, (row["sid"], after, _NO_END, limit)).fetchone()
        return str(array).encode()
    pieces: list[str] = []
    left = limit
    for span in spans:
        (count,) = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM entries WHERE sid = ? AND seq > ? AND seq <= ? "
            "LIMIT ?)",
            (span.sid, span.after, span.through or _NO_END, left),
        ).fetchone()
        if count:
            (array,) = conn.execute(
                _READ_JSON, (span.sid, span.after, span.through or _NO_END, left)
            ).fetchone()
            pieces.append(str(array)[1:-1])
            left -= count
        if left <= 0:
            break
    return ("[" + ",".join(pieces) + "]").encode()


def _check_not_truncated(session: str, truncated_through: int, after: int) -> None:
    if after < truncated_through:
        raise JournalTruncated(session, after=after, through=truncated_through)


def head(conn: sqlite3.Connection, session: str) -> int:
    value: int = session_row(conn, session)["head"]
    return value


# --- ownership ----------------------------------------------------------------------------


def get_ownership(conn: sqlite3.Connection, session: str) -> Ownership:
    return _ownership(session_row(conn, session))


def compare_and_set_ownership(
    tx: WriteTx, session: str, expect_epoch: int, new: Ownership
) -> Ownership:
    conn = tx.conn
    row = session_row(conn, session)
    current = _ownership(row)
    if current.epoch != expect_epoch:
        raise EpochConflict(session, expected=expect_epoch, current=current)
    validate_transition(session, current, new)
    marker = epoch_marker(current, new) if new.epoch != current.epoch else None
    head = row["head"] + (marker is not None)
    fence_seq = current.fence_seq if marker is None else head
    try:
        # The record first: the database's own check of the rule (its trigger) then
        # refuses before anything is written (check, then write: see writer.py).
        conn.execute(
            "UPDATE sessions SET epoch = ?, owner = ?, fence = ?, fence_seq = ?, head = ?, "
            "ownership_us = ? WHERE sid = ?",
            (new.epoch, new.owner, new.fence.value, fence_seq, head, tx.now_us, row["sid"]),
        )
    except sqlite3.IntegrityError as exc:
        if TRIGGER_MESSAGE not in str(exc):
            raise
        raise InvalidOwnership(f"session {session!r}: {exc}") from None
    if marker is not None:
        conn.execute(
            "INSERT INTO entries (sid, seq, id, kind, epoch, ts_us, payload, scope) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row["sid"],
                head,
                marker.id,
                marker.kind,
                new.epoch,
                tx.now_us,
                codec.stored_payload(marker.payload),
                int(Writer.GATEWAY),
            ),
        )
        tx.committed.append(
            JournalEntry(head, marker.id, marker.kind, new.epoch, tx.now, marker.payload)
        )
    return _ownership(session_row(conn, session))


def acks(conn: sqlite3.Connection, session: str) -> dict[int, int]:
    sid = session_row(conn, session)["sid"]
    rows = conn.execute("SELECT epoch, seq FROM acks WHERE sid = ? ORDER BY epoch", (sid,))
    return dict(rows)
