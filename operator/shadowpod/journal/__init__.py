"""The session journal: an append-only, gap-free, per-session log with snapshots and
the ownership record (DESIGN.md §3). One protocol (``JournalStore``), two backends:
SQLite (embedded default) and PostgreSQL (several gateway replicas).
"""

from shadowpod.journal.errors import (
    EpochConflict,
    Fenced,
    IdempotencyConflict,
    InvalidOwnership,
    InvalidSnapshot,
    JournalTruncated,
    SessionExists,
    SessionNotFound,
    SnapshotBeyondHead,
    SnapshotNotFound,
    StoreUnavailable,
)
from shadowpod.journal.store import (
    Appended,
    JournalStore,
    Retention,
    SessionInfo,
    Snapshot,
    SnapshotInfo,
    Writer,
)

__all__ = [
    "Appended",
    "EpochConflict",
    "Fenced",
    "IdempotencyConflict",
    "InvalidOwnership",
    "InvalidSnapshot",
    "JournalStore",
    "JournalTruncated",
    "Retention",
    "SessionExists",
    "SessionInfo",
    "SessionNotFound",
    "Snapshot",
    "SnapshotBeyondHead",
    "SnapshotInfo",
    "SnapshotNotFound",
    "StoreUnavailable",
    "Writer",
]
