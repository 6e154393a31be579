"""The ``JournalStore`` protocol and the values it trades in.

Guarantees every backend gives (checked by the shared contract suite in
``tests/journal/``):

- ``append`` assigns gap-free seqs from 1 per session; an entry whose ``id`` was
  appended before by the same ``Writer`` with the same kind and payload returns the
  original seq and appends nothing; with other content it is ``IdempotencyConflict``
  and nothing of the append is journaled — except for an owner redoing a turn an
  older epoch's owner journaled (its entry is absorbed: what was journaled stands).
  With ``owner_epoch`` (and ``owner``, the instance) the epoch check and the write
  happen in one transaction (``Fenced`` otherwise); the entries are durable before
  ``append`` returns.
- An appended ``ack`` entry written by an owner moves that epoch's ack watermark in
  the same transaction.
- A compare-and-set that changes the epoch journals a ``control``/``epoch`` entry in
  the same transaction and records its seq as ``fence_seq``: from that seq on, the
  old owner can write nothing. An epoch never goes down, and a new owner always comes
  with a new, larger epoch (``journal/ownership.py``).
- The turn an output or an ack names is an inbound entry at or below the head.
- A session keeps at most ``MAX_SNAPSHOTS_PER_SESSION`` snapshots, the newest.
- A fork (``create_session(fork=...)``) reads its parent's entries up to the fork
  point as its own, in every read, id lookup and turn check; nothing is copied.
- Integers from callers out of their column's range are an ``InvalidArgument``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import BinaryIO, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.ownership import Ownership

# Snapshots a session keeps (the newest; older ones are deleted as newer ones come).
# Each may be as large as the gateway's snapshot limit, and they share one disk with
# every other session: an owner putting one at every watermark used to fill it.
MAX_SNAPSHOTS_PER_SESSION: Final = 16
# How much of a compressed document a store copies at a time.
COPY_PIECE_BYTES: Final = 1024 * 1024


class Writer(IntEnum):
    """Who journals an entry. Idempotency keys are scoped by it: a key one writer
    chose never suppresses another's (a client posting the id an agent derives for its
    next output, ``t<seq>:<n>``, its ack ``ack:<seq>``, or a schedule fire's
    ``schedule:...``, must not make the real write come back as a repeat)."""

    OWNER = 0  # the session's owner, at its epoch (``owner_epoch``)
    CLIENT = 1  # clients' posts
    GATEWAY = 2  # what the gateway journals itself: markers, fires, bindings, drains


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    id: str
    duplicate: bool = False


class SessionInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    session: str
    created: datetime
    head: int = 0
    truncated_through: int = 0
    meta: dict[str, str] = Field(default_factory=dict)
    fork_of: str | None = Field(
        default=None, description="The session this one was forked from (None: not a fork)."
    )
    fork_seq: int | None = Field(
        default=None,
        description="The parent's seq the fork was made at: entries up to it are the"
        " parent's, read from the parent's journal (shared, not copied).",
    )


@dataclass(frozen=True, slots=True)
class SessionPosition:
    """Where a session stands, for one read of every session at once (``positions``):
    what an operator shows and compares, without a read per session."""

    session: str
    head: int
    acked: int  # the latest inbound turn acked, by any epoch (0: none)
    epoch: int
    fence: str  # the ownership record's fence state


class SnapshotInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    session: str
    watermark: int
    schema_version: int
    size_bytes: int = Field(description="Compressed size as stored.")
    created: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Full session state at ``watermark``: the JSON document of its schema version, as
    the text it was stored as.

    Stores keep the document as text and never parse it: a long session's state runs to
    megabytes, and parsing it into objects holds the process's GIL for tens of
    milliseconds, which a gateway serving other sessions must not spend.
    """

    info: SnapshotInfo
    document_json: bytes


@dataclass(frozen=True, slots=True)
class CompressedDocument:
    """A state document already compressed as stores keep it (``codec``), in a file:
    what a snapshot streamed in becomes. A store copies it into its database a piece
    at a time, so a document of hundreds of megabytes never sits in memory whole."""

    file: BinaryIO
    size_bytes: int

    def pieces(self, size: int = COPY_PIECE_BYTES) -> Iterator[bytes]:
        self.file.seek(0)
        while piece := self.file.read(size):
            yield piece


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """Where a fork starts: the state of ``session`` at ``seq`` (its journal up to and
    including ``seq``). The fork journals its own entries from ``seq + 1`` on and reads
    the ones up to ``seq`` from its parent's journal, which is shared, never copied."""

    session: str
    seq: int


class Retention(BaseModel):
    model_config = ConfigDict(frozen=True)

    deleted_snapshots: int
    deleted_entries: int
    truncated_through: int


class JournalStore(Protocol):
    """Per-session journal, snapshots and ownership record."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    # sessions
    async def create_session(
        self,
        session: str,
        *,
        meta: Mapping[str, str] | None = None,
        fork: ForkPoint | None = None,
    ) -> SessionInfo:
        """With ``fork``: a session whose journal is ``fork.session``'s up to
        ``fork.seq`` (read from the parent, not copied), with the parent's newest
        snapshot at or below that seq, the ack watermark the parent had there, and the
        parent's epoch (no owner): its first owner comes at a larger epoch, and redoes
        a turn the parent left open at the fork point as any new owner does. The
        parent's retention keeps what a fork still reads (``apply_retention``); a
        parent with forks that read its journal cannot be deleted (``SessionHasForks``).
        """
        ...

    async def get_session(self, session: str) -> SessionInfo: ...

    async def update_meta(self, session: str, changes: Mapping[str, str]) -> SessionInfo:
        """Set the ``changes`` keys of the session's meta (the others stay)."""
        ...

    async def list_sessions(self) -> list[SessionInfo]: ...

    async def positions(self) -> list[SessionPosition]:
        """Every session's position, in one read (one statement)."""
        ...

    async def delete_session(self, session: str) -> None: ...

    # journal
    async def append(
        self,
        session: str,
        entries: Sequence[NewEntry],
        owner_epoch: int | None = None,
        *,
        owner: str | None = None,
        writer: Writer = Writer.GATEWAY,
    ) -> list[Appended]:
        """With ``owner_epoch``: an owner write (``writer`` is then ``OWNER``), refused
        (``Fenced``) unless the session's epoch is ``owner_epoch`` and, when ``owner``
        is given, the instance named owner at it is ``owner``."""
        ...

    async def read(self, session: str, after: int = 0, limit: int = 1000) -> list[JournalEntry]: ...

    async def read_json(self, session: str, after: int = 0, limit: int = 1000) -> bytes:
        """What ``read`` returns, as a JSON array of entries (their fields, timestamps
        in UTC with a ``Z``): for pages sent on as they are, which a store may have its
        database encode without building an object per entry."""
        ...

    def follow(self, session: str, after: int = 0) -> AsyncIterator[JournalEntry]: ...

    def follow_batches(
        self, session: str, after: int = 0
    ) -> AsyncGenerator[Sequence[JournalEntry], None]:
        """``follow``, in the batches entries were committed in (never empty)."""
        ...

    def follow_runs(
        self, session: str, after: int = 0
    ) -> AsyncGenerator[list[Sequence[JournalEntry]], None]:
        """``follow_batches``, every batch there is to take at once (a follower that
        woke late takes several commits in one run; never empty)."""
        ...

    async def head(self, session: str) -> int: ...

    # ownership
    async def get_ownership(self, session: str) -> Ownership: ...

    async def compare_and_set_ownership(
        self, session: str, expect_epoch: int, new: Ownership
    ) -> Ownership: ...

    async def acks(self, session: str) -> dict[int, int]:
        """Ack watermark (last processed inbound seq) per owner epoch."""
        ...

    # snapshots
    async def put_snapshot(
        self,
        session: str,
        *,
        watermark: int,
        schema_version: int,
        document_json: bytes | CompressedDocument,
        owner_epoch: int | None = None,
        owner: str | None = None,
    ) -> SnapshotInfo:
        """Store ``document_json`` (the state document as JSON text, stored as it is:
        the caller checks it is a JSON object; or that text already compressed, in a
        file, copied in a piece at a time) as the snapshot at ``watermark``, and
        delete what falls out of the ``MAX_SNAPSHOTS_PER_SESSION`` newest. With
        ``owner_epoch`` (and ``owner``), an owner's write: refused (``Fenced``) in the
        write's transaction unless the session is at that epoch (and that owner), as
        ``append`` does — a fenced-out owner cannot replace what the next one restores."""
        ...

    async def get_snapshot(self, session: str, watermark: int) -> Snapshot: ...

    async def latest_snapshot(self, session: str) -> Snapshot | None: ...

    async def list_snapshots(self, session: str) -> list[SnapshotInfo]: ...

    async def apply_retention(self, session: str, *, keep_snapshots: int) -> Retention:
        """Keep the newest ``keep_snapshots`` snapshots; truncate the journal they cover.

        Entries are removed up to the oldest kept snapshot's watermark, but never past
        the last acked turn: inbound entries still waiting for an owner stay; nor
        entries a fork of the session still reads as its own (its fork point above its
        own truncation point).
        """
        ...
