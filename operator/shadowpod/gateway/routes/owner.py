"""The owner: gated deliveries (long-poll), appends at its epoch, acks, drain reports.

Deliveries are the journal from the owner's watermark with inbound entries released
only while the session is not fenced (``shadowpod.sessions.gates``). An owner that is
busy never waits for them separately: its append carries ``after`` and the answer
brings back every released entry up to the head — one round trip per turn.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from shadowpod.api.models import (
    AckRequest,
    AppendedOut,
    AppendRequest,
    AppendResponse,
    DrainReport,
    FieldError,
)
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.payloads import (
    AckPayload,
    ControlEvent,
    ControlPayload,
    EntryKind,
    ProcessOp,
    ProcessPayload,
)
from shadowpod.gateway.context import (
    Gateway,
    float_query,
    gateway,
    int_query,
    json_response,
    required_int_query,
    session_of,
)
from shadowpod.gateway.errors import ApiError, read_body
from shadowpod.journal.errors import Fenced, InvalidTurn, OwnerMismatch
from shadowpod.journal.store import Appended
from shadowpod.sessions.gates import SessionGate, Superseded

routes = web.RouteTableDef()
# Entries examined per delivery to find inbound entries the window allows.
RELEASE_SCAN = 128


async def deliver(
    gw: Gateway, gate: SessionGate, session: str, epoch: int, after: int, limit: int
) -> tuple[list[JournalEntry], int]:
    """The journal after ``after`` and the release watermark for the owner at ``epoch``."""
    if epoch != gate.epoch:
        await gw.gates.catch_up(gate)
    page = await gw.store.read(session, after, limit)
    # Releases continue from where the gate last looked, not from what the owner asks
    # for: it may already hold (unreleased) entries past the release watermark.
    scanned = gate.scanned_through
    if page and page[0].seq <= scanned + 1:
        candidates = page
    else:
        candidates = await gw.store.read(session, scanned, RELEASE_SCAN)
    before = gate.released_count
    released = gate.release(candidates, epoch)  # raises Superseded when the epoch moved on
    gw.metrics.deliveries.inc(gate.released_count - before)
    return page, released


def _delivery(page: list[JournalEntry], released: int) -> dict[str, object]:
    return {"entries": [e.to_json() for e in page], "released": released}


@routes.get("/v1/sessions/{session}/owner/entries", name="owner_entries")
async def owner_entries(request: web.Request) -> web.Response:
    """Deliveries to the owner at ``epoch``: the journal after ``after`` and ``released``,
    the highest inbound seq it may process. Waits up to ``wait`` seconds until there is
    something new: entries, or a release watermark above the ``released`` it knows.

    409 ``Fenced`` when ``epoch`` is no longer the session's: the caller must stop.
    """
    gw = gateway(request)
    session = session_of(request)
    owner = await gw.auth.owner(request, session)
    epoch = required_int_query(request, "epoch", minimum=1)
    after = int_query(request, "after", 0)
    known = int_query(request, "released", 0)
    if owner is not None:  # the epoch alone is checked by the gate, as it streams
        await check_owner(gw, session, epoch, owner)
    limit = min(int_query(request, "limit", 1000, minimum=1), gw.config.max_page)
    wait_s = float_query(request, "wait", 0.0, maximum=gw.config.max_wait_s)
    gate = await gw.gates.get(session)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            page, released = await deliver(gw, gate, session, epoch, after, limit)
            remaining = deadline - time.monotonic()
            if page or released > known or remaining <= 0:
                return json_response(_delivery(page, released))
            await something_new(gw, gate, session, after, min(remaining, 1.0))
    except Superseded as exc:
        raise Fenced(session, epoch=exc.epoch, current=exc.current) from None


async def something_new(
    gw: Gateway, gate: SessionGate, session: str, after: int, timeout_s: float
) -> None:
    """Until a commit after ``after`` or a change of the gate (unfenced, acked, new epoch)."""
    batches = gw.store.follow_batches(session, after)
    waiters = {
        asyncio.ensure_future(anext(batches)),
        asyncio.ensure_future(gate.wait_changed(timeout_s)),
    }
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await batches.aclose()


async def check_owner(gw: Gateway, session: str, epoch: int, owner: str | None) -> None:
    """``epoch`` is the session's, and ``owner`` (when the session has owner
    credentials) the instance named owner at it: deliveries go to it and no other."""
    current = await gw.store.get_ownership(session)
    if current.epoch != epoch:
        raise Fenced(session, epoch=epoch, current=current.epoch)
    if owner is not None and current.owner != owner:
        raise OwnerMismatch(session, epoch=epoch, owner=owner, current_owner=current.owner)


def _appended_out(results: list[Appended]) -> list[AppendedOut]:
    return [AppendedOut(seq=r.seq, id=r.id, duplicate=r.duplicate) for r in results]


async def owner_append(
    gw: Gateway, session: str, entries: list[NewEntry], epoch: int, owner: str | None
) -> list[Appended]:
    if len(entries) > gw.config.max_entries_per_append:
        raise ApiError(
            413,
            "TooManyEntries",
            f"{len(entries)} entries in one append; at most {gw.config.max_entries_per_append}",
        )
    try:
        results = await gw.store.append(session, entries, owner_epoch=epoch, owner=owner)
    except Fenced:
        gw.metrics.fenced_writes.inc()
        raise
    duplicates = sum(r.duplicate for r in results)
    gw.metrics.appends.labels(source="owner").inc(len(results) - duplicates)
    if duplicates:
        gw.metrics.duplicates.labels(source="owner").inc(duplicates)
    gate = gw.gates.known(session)
    if gate is not None:
        turns = {t for e in entries if isinstance(t := e.payload.get("turn"), int)}
        gate.observe_outputs(epoch, turns)
        gate.acked(
            t
            for e in entries
            if e.kind == EntryKind.ACK and isinstance(t := e.payload.get("turn"), int)
        )
    if any(e.kind == EntryKind.SCHEDULE for e in entries):
        gw.firer.touch(session)
    return results


@routes.post("/v1/sessions/{session}/journal", name="append_journal")
async def append_journal(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    owner = await gw.auth.owner(request, session)
    body = await read_body(request, AppendRequest)
    results = await owner_append(gw, session, body.entries, body.epoch, owner)
    # Every turn passes here: the answer is built as plain data (see AppendResponse).
    answer: dict[str, object] = {
        "appended": [{"seq": r.seq, "id": r.id, "duplicate": r.duplicate} for r in results]
    }
    if body.after is not None:
        gate = await gw.gates.get(session)
        try:
            page, released = await deliver(
                gw, gate, session, body.epoch, body.after, gw.config.max_page
            )
            answer.update(_delivery(page, released))
        except Superseded:
            pass  # the appends stand; the owner learns it was replaced on its next call
    return json_response(answer)


@routes.post("/v1/sessions/{session}/acks", name="post_ack")
async def post_ack(request: web.Request) -> web.Response:
    gw = gateway(request)
    session = session_of(request)
    owner = await gw.auth.owner(request, session)
    body = await read_body(request, AckRequest)
    ack = NewEntry.of(AckPayload(turn=body.turn))
    try:
        results = await owner_append(gw, session, [ack], body.epoch, owner)
    except InvalidTurn as exc:  # beyond the head, or not an inbound entry: nothing acked
        problem = f"{body.turn} is not an inbound entry at or below the head ({exc.head})"
        raise ApiError(409, exc.reason, str(exc), [FieldError(loc="turn", msg=problem)]) from None
    return json_response(AppendResponse(appended=_appended_out(results)))


@routes.post("/v1/sessions/{session}/drained", name="post_drained")
async def post_drained(request: web.Request) -> web.Response:
    """A fenced owner reports the background work it stopped; journaled for the record.

    Only of its own epoch: a report names the instance and the epoch it owned, and is
    refused for an epoch not yet reached or for the current epoch of another owner
    (an owner fenced out must not mark its successor's processes ended); with owner
    credentials, only that instance reports (or the control plane on its behalf).
    """
    gw = gateway(request)
    session = session_of(request)
    reporter = await gw.auth.owner(request, session)
    report = await read_body(request, DrainReport)
    if reporter is not None and reporter != report.instance:
        raise ApiError(
            409,
            "Fenced",
            f"instance {reporter!r} reports its own drain, not {report.instance!r}'s",
            [FieldError(loc="instance", msg=f"must be {reporter!r}, the instance reporting")],
        )
    current = await gw.store.get_ownership(session)
    if report.epoch > current.epoch or (
        report.epoch == current.epoch and report.instance != current.owner
    ):
        raise ApiError(
            409,
            "Fenced",
            f"session {session!r} is at epoch {current.epoch}, owned by {current.owner!r}: "
            f"{report.instance!r} did not own epoch {report.epoch}; a drain report is an "
            "owner's, of the epoch it owned",
            [FieldError(loc="epoch", msg=f"not an epoch {report.instance!r} owned")],
        )
    entries = [
        NewEntry.of(
            ProcessPayload(name=p.name, op=ProcessOp(p.outcome), pid=p.pid, exit_code=p.exit_code),
            id=f"drained:{report.instance}:{report.epoch}:{p.name}",
        )
        for p in report.processes
    ]
    entries.append(
        NewEntry.of(
            ControlPayload(
                event=ControlEvent.DRAINED,
                epoch=report.epoch,
                owner=report.instance,
                detail={"processes": len(report.processes)},
            ),
            id=f"drained:{report.instance}:{report.epoch}",
        )
    )
    results = await gw.store.append(session, entries)
    gw.metrics.appends.labels(source="control").inc(sum(not r.duplicate for r in results))
    return json_response(AppendResponse(appended=_appended_out(results)))
