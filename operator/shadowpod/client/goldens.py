"""Recording a golden session through the gateway's read API (``shadowpod golden
record``, and shadow compare's window of live turns)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.gates.golden import GoldenFile, cut_golden
from shadowpod.journal.codec import load_state_json

PAGE: Final = 5000


class GoldenError(ShadowpodError):
    """A golden session could not be recorded or replayed; says why and what to do."""

    reason = "GoldenReplayFailed"


async def record_golden(
    client: GatewayClient,
    session: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    secrets: Iterable[str] = (),
    note: str = "",
) -> GoldenFile:
    """Cut ``from_seq``..``to_seq`` of ``session``'s journal, read through the gateway,
    into a golden file. The state before ``from_seq`` comes from the journal itself,
    or from the latest snapshot below it where the journal was truncated."""
    base = SessionState()
    after = 0
    if from_seq > 1:
        # The newest snapshot below from_seq (a later one may exist: retention keeps N).
        below = [s.watermark for s in await client.snapshots(session) if s.watermark < from_seq]
        document = await client.snapshot_document(session, max(below)) if below else None
        if document is not None:
            base = load_state_json(document.document_json)
            after = document.watermark
    entries: list[JournalEntry] = []
    while True:
        try:
            page, head = await client.journal(session, after=after, limit=PAGE)
        except GatewayError as exc:
            if exc.reason != "JournalTruncated":
                raise
            kept = (await client.status(session)).truncated_through + 1
            raise GoldenError(
                f"the journal of {session} holds no entries before {kept} (truncated by "
                f"retention): record from seq {kept} or later (--from)"
            ) from None
        if page and page[0].seq != after + 1:
            raise GoldenError(
                f"the journal of {session} holds no entries from {after + 1} to "
                f"{page[0].seq - 1} (truncated by retention): record from seq "
                f"{page[0].seq} or later (--from)"
            )
        entries += page
        if not page or page[-1].seq >= head or (to_seq is not None and page[-1].seq > to_seq):
            break
        after = page[-1].seq
    before = [e for e in entries if e.seq < from_seq]
    if before:
        base = fold(base.working_copy(), before)
    return cut_golden(
        base,
        [e for e in entries if e.seq >= from_seq],
        session=session,
        from_seq=from_seq,
        to_seq=to_seq,
        secrets=secrets,
        note=note,
    )
