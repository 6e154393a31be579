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


async def earliest_recordable_seq(client: GatewayClient, session: str) -> int:
    """The first ``from_seq`` a golden of ``session`` can start at: 1 while its journal
    is whole, else one past the oldest snapshot at or after what retention removed
    (the state before ``from_seq`` must come from somewhere)."""
    removed = (await client.status(session)).truncated_through
    if removed == 0:
        return 1
    kept = [s.watermark for s in await client.snapshots(session) if s.watermark >= removed]
    if not kept:
        raise GoldenError(
            f"the journal of {session} was truncated through seq {removed} and no snapshot "
            "at or after it is kept: no golden can be recorded from it"
        )
    return min(kept) + 1


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
            earliest = await earliest_recordable_seq(client, session)
            raise GoldenError(
                f"the journal of {session} was truncated by retention before seq "
                f"{from_seq}: record from seq {earliest} or later (--from)"
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
