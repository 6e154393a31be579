"""How an instance gets the session's state before it serves: a snapshot, then the
journal since it (DESIGN.md §3.5: state is a fold of the journal; a snapshot is only
a shortcut).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from typing import Final

from shadowpod.agent.declaration import AgentDeclaration
from shadowpod.agent.promotion import CatchUp
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.errors import StateDocumentInvalid
from shadowpod.domain.state import SessionState
from shadowpod.journal.codec import load_state_json

PAGE: Final = 10_000
# The first page is small: nothing is folded while it is fetched, and the pages after
# it are fetched while the one before is folded.
FIRST_PAGE: Final = 1_000


async def restore(
    client: GatewayClient, session: str, agent: AgentDeclaration, watermark: int | None
) -> SessionState:
    """The state of the snapshot at ``watermark`` (the latest when ``None``; an empty
    state when there is none yet), checked readable by ``agent``."""
    snapshot = await client.snapshot_document(session, watermark)
    state = SessionState() if snapshot is None else load_state_json(snapshot.document_json)
    if snapshot is not None and state.watermark != snapshot.watermark:
        # A document labelled with another watermark than the one it was folded to (a
        # relabelled older state): the journal after the label would be skipped.
        raise StateDocumentInvalid(
            f"session {session!r}: the snapshot stored at watermark {snapshot.watermark} "
            f"is the state at watermark {state.watermark}; refusing to restore it (delete "
            "it, or restore from an older snapshot: the journal has what followed)"
        )
    if state.agent.values:
        # Fail now, before claiming readiness, if we cannot read the agent's state.
        agent.migrate_state(dict(state.agent.values), state.agent.schema_version)
    # The restored state is most of what this process holds, for as long as it lives:
    # moved out of the collector's sight now (after one collection, so no garbage goes
    # with it), later full collections skip it. Otherwise the first one (20-60 ms for a
    # long session) came during the catch-up, just before the fence, on the cores every
    # session shares.
    gc.collect()
    gc.freeze()
    return state


async def catch_up(
    client: GatewayClient,
    session: str,
    after: int,
    apply: Callable[[Sequence[JournalEntry]], None],
) -> CatchUp:
    """Replay the journal after ``after`` in large pages through ``apply`` (recorded
    outputs are applied, never re-executed). The next page is fetched while this one
    is folded."""
    started, applied = time.monotonic(), 0
    fetch = asyncio.create_task(client.journal(session, after=after, limit=FIRST_PAGE))
    while True:
        entries, head = await fetch
        if not entries:
            break
        after = entries[-1].seq
        more = after < head
        if more:
            fetch = asyncio.create_task(client.journal(session, after=after, limit=PAGE))
        apply(entries)
        applied += len(entries)
        if not more:
            break
    return CatchUp(applied, time.monotonic() - started)
