"""A session's history: what happened to it (not what was said in it), from the journal.

Every change of owner, fence, suspension, wake and resume is a ``control`` entry the
store journaled in the transaction that made it; snapshots are listed by the store.
The history is those, in seq order — read from the journal, so it is exactly as
durable as the session itself and needs no record of its own — and the forks: a
fork's ``forked`` (from its parent, at the fork point) and a parent's ``fork`` (each
fork made from it, at its point), from the sessions' own records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from shadowpod.domain.entries import INBOUND_EPOCH, JournalEntry
from shadowpod.domain.payloads import ControlEvent, EntryKind
from shadowpod.journal.store import JournalStore

# Entries one history call reads at most: a longer journal is read in several calls.
SCAN_LIMIT: Final = 50_000
PAGE: Final = 5_000
# What the history leaves out: requests, not things that happened.
UNTOLD: Final = frozenset({ControlEvent.SNAPSHOT_REQUEST})
# How far back an activity check looks for the latest client message.
RECENT_ENTRIES: Final = 500


@dataclass(frozen=True)
class HistoryItem:
    seq: int
    at: datetime
    event: str
    epoch: int | None = None
    owner: str | None = None
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


async def history(
    store: JournalStore, session: str, *, after: int = 0, limit: int = SCAN_LIMIT
) -> tuple[list[HistoryItem], int]:
    """The events after ``after`` among the next ``limit`` entries, with the snapshots
    whose watermark falls in that range; and the last seq read."""
    items: list[HistoryItem] = []
    info = await store.get_session(session)
    # What retention truncated is gone; the snapshots that replaced it are listed.
    start = cursor = max(after, info.truncated_through)
    ended = False
    while cursor - start < limit:
        page = await store.read(session, cursor, min(PAGE, limit - (cursor - start)))
        if not page:
            ended = True
            break
        items += (item for entry in page if (item := _told(entry)) is not None)
        cursor = page[-1].seq
    for snapshot in await store.list_snapshots(session):
        if after < snapshot.watermark and (ended or snapshot.watermark <= cursor):
            items.append(
                HistoryItem(
                    seq=snapshot.watermark,
                    at=snapshot.created,
                    event="snapshot",
                    detail={
                        "schema_version": snapshot.schema_version,
                        "size_bytes": snapshot.size_bytes,
                    },
                )
            )

    def read(seq: int) -> bool:
        return after < seq and (ended or seq <= cursor)

    # Forks: where this session came from, and the forks made from it (one listing of
    # the sessions: a history is asked for by a person, not on a hot path).
    if info.fork_of is not None and info.fork_seq is not None and read(info.fork_seq):
        items.append(
            HistoryItem(
                seq=info.fork_seq, at=info.created, event="forked", detail={"from": info.fork_of}
            )
        )
    for other in await store.list_sessions():
        if other.fork_of == session and other.fork_seq is not None and read(other.fork_seq):
            items.append(
                HistoryItem(
                    seq=other.fork_seq,
                    at=other.created,
                    event="fork",
                    detail={"fork": other.session},
                )
            )
    items.sort(key=lambda item: (item.seq, item.at))
    return items, max(cursor, after)


def _told(entry: JournalEntry) -> HistoryItem | None:
    if entry.kind != EntryKind.CONTROL:
        return None
    payload = entry.payload
    event = payload.get("event")
    if event is None or event in UNTOLD:
        return None
    detail = payload.get("detail")
    return HistoryItem(
        seq=entry.seq,
        at=entry.ts,
        event=str(event),
        epoch=payload.get("epoch"),
        owner=payload.get("owner"),
        reason=payload.get("reason"),
        detail=detail if isinstance(detail, dict) else {},
    )


@dataclass(frozen=True)
class Activity:
    last_message_seq: int | None
    last_message_at: datetime | None
    quiet_since: datetime


async def activity(store: JournalStore, session: str) -> Activity:
    """When a client last wrote to the session, from the journal's recent entries:
    a schedule's fire or the agent's own output is not a client's activity. A resume
    starts the quiet over: the session serves again, give it its time."""
    info = await store.get_session(session)
    start = max(info.truncated_through, info.head - RECENT_ENTRIES)
    recent = await store.read(session, start, RECENT_ENTRIES)
    quiet: datetime | None = None
    for entry in reversed(recent):
        if entry.kind == EntryKind.MESSAGE and entry.epoch == INBOUND_EPOCH:
            return Activity(entry.seq, entry.ts, max(entry.ts, quiet or entry.ts))
        if quiet is None and _resumed(entry):
            quiet = entry.ts
    if quiet is None:  # nothing among them: quiet at least since the oldest (or the start)
        quiet = recent[0].ts if recent and start > 0 else info.created
    return Activity(None, None, quiet)


def _resumed(entry: JournalEntry) -> bool:
    return entry.kind == EntryKind.CONTROL and entry.payload.get("event") == ControlEvent.RESUME
