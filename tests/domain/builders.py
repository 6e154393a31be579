"""Build journals for tests the way stores build them: validated, gap-free seqs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shadowpod.domain.entries import JournalEntry, NewEntry

START = datetime(2026, 1, 1, tzinfo=UTC)


class JournalBuilder:
    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def add(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        epoch: int = 0,
        id: str | None = None,
        **fields: Any,
    ) -> JournalEntry:
        """Append ``kind`` with ``payload`` (or the keyword ``fields``) at ``epoch``."""
        seq = len(self.entries) + 1
        new = NewEntry(id=id or f"e{seq}", kind=kind, payload={**(payload or {}), **fields})
        entry = JournalEntry(
            seq, new.id, new.kind, epoch, START + timedelta(seconds=seq), new.payload
        )
        self.entries.append(entry)
        return entry

    def inbound(self, content: str, role: str = "user") -> int:
        return self.add("message", role=role, content=content).seq

    def reply(self, content: str, turn: int, epoch: int = 1) -> int:
        return self.add("message", epoch=epoch, role="assistant", content=content, turn=turn).seq

    def ack(self, turn: int, epoch: int = 1) -> int:
        return self.add("ack", epoch=epoch, turn=turn).seq
