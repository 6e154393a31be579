"""The ExchangeFence: the cutover of a session from one owner to the next (DESIGN §4.5).

1. Fence: the fence is recorded and its marker journaled (one commit), then the gate
   stops releasing inbound entries to the current owner — in a gap between its turns
   if one comes soon (``IDLE_WAIT_S``): the owner's last turns are then served as
   usual rather than held messages waiting them out. Inbound keeps being journaled;
   the journal is the buffer.
2. Wait until the owner has acked every inbound entry it was given (no turn in
   progress), or the timeout passes — then unfence: delivery to the same owner
   resumes and nothing was lost.
3. Bump the epoch with a compare-and-set. The store journals the ``epoch`` marker in
   the same transaction and records its seq as ``fence_seq``; from that instant the
   old owner can write nothing.

The new owner (the shadow that has been tailing the journal) sees the marker naming
it, becomes owner, and receives the buffered inbound entries.

The fence pause is the wait of the first inbound entry the fence held back: from its
arrival (or from the fence, if it was already queued behind a busy owner) until the
new owner journals the first output of its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from shadowpod.domain.entries import JournalEntry, NewEntry, is_inbound
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.domain.payloads import ControlEvent, ControlPayload
from shadowpod.journal.errors import EpochConflict
from shadowpod.journal.store import JournalStore
from shadowpod.sessions.gates import PauseTarget, SessionGate, SessionGates

logger = logging.getLogger(__name__)
# How long a fence waits for a gap between the owner's turns to close the gate in.
IDLE_WAIT_S: Final = 0.05


class FenceTimeout(ShadowpodError):
    reason = "FenceTimeout"

    def __init__(self, session: str, *, waited_s: float, released: int, acked: int) -> None:
        self.waited_s = waited_s
        self.released = released
        self.acked = acked
        super().__init__(
            f"session {session!r}: the owner did not finish its turn within "
            f"{waited_s:.3f}s (acked {acked}, needs {released}); the fence was lifted and "
            "delivery resumed — retry when the owner is idle, or raise the fence timeout"
        )


@dataclass(frozen=True)
class FenceOutcome:
    epoch: int
    fence_seq: int
    waited_s: float
    released_through: int
    acked: int


async def _until_idle(gate: SessionGate, timeout_s: float) -> None:
    """Until the owner has acked everything released to it, or ``timeout_s`` passes.

    Returns in the same turn of the event loop as the check: nothing is released in
    between, so a fence closed right after finds the owner idle.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while gate.outstanding:
                await gate.changed()


def _marker(event: ControlEvent, epoch: int, reason: str, **detail: str | int) -> NewEntry:
    return NewEntry.of(ControlPayload(event=event, epoch=epoch, reason=reason, detail=dict(detail)))


class ExchangeFence:
    def __init__(
        self, store: JournalStore, gates: SessionGates, *, idle_wait_s: float = IDLE_WAIT_S
    ) -> None:
        self._store = store
        self._gates = gates
        self._idle_wait_s = idle_wait_s

    async def exchange(
        self,
        session: str,
        *,
        expect_epoch: int,
        new_owner: str,
        timeout_s: float,
        then: FenceState = FenceState.OPEN,
    ) -> FenceOutcome:
        """``then``: the new epoch's fence state — ``SUSPENDED`` hands the session to an
        owner that is not started (a suspend): no pause is measured, it would be the
        length of the suspension."""
        gate = await self._gates.get(session)
        async with gate.lock:
            current = await self._store.get_ownership(session)
            if current.epoch != expect_epoch:
                raise EpochConflict(session, expected=expect_epoch, current=current)
            fenced = await self._fence_and_mark(session, current, new_owner)
            committed = False
            try:
                # Only now does the gate hold inbound back: the two commits above are
                # not part of the pause of the messages it holds (they were still
                # delivered). And it closes between two turns if one comes soon: what
                # the owner was given is then all acked, so the held messages do not
                # also wait out its last turns (the wait for quiescence below finds
                # nothing to wait for).
                await _until_idle(gate, min(self._idle_wait_s, timeout_s / 2))
                await gate.fence()
                started = time.monotonic()
                fenced_at = datetime.now(UTC)
                target = gate.released_through
                acked = await self._wait_quiescent(session, gate, target, timeout_s)
                quiet = time.monotonic()
                waited = time.monotonic() - started
                if acked < target:
                    raise FenceTimeout(session, waited_s=waited, released=target, acked=acked)
                measured = then is FenceState.OPEN
                if measured:
                    gate.watch_pause(expect_epoch + 1)
                bumped = await self._store.compare_and_set_ownership(
                    session,
                    expect_epoch,
                    Ownership(epoch=expect_epoch + 1, owner=new_owner, fence=then),
                )
                committed = True
                assert bumped.fence_seq is not None
                await self._gates.epoch_changed(gate, bumped)
                if measured:
                    # Everything inbound after what was released, up to the bump, was
                    # held back.
                    held = await self._first_held_back(session, target, bumped.fence_seq)
                    gate.expect_pause(
                        None
                        if held is None
                        else PauseTarget(bumped.epoch, held.seq, max(held.ts, fenced_at))
                    )
                logger.info(
                    "fence exchanged",
                    extra={
                        "session": session,
                        "epoch": bumped.epoch,
                        "fence_seq": bumped.fence_seq,
                        "quiesce_ms": round((quiet - started) * 1000, 1),
                        "bump_ms": round((time.monotonic() - quiet) * 1000, 1),
                        "released_through": target,
                    },
                )
                return FenceOutcome(
                    epoch=bumped.epoch,
                    fence_seq=bumped.fence_seq,
                    waited_s=waited,
                    released_through=target,
                    acked=acked,
                )
            finally:
                if not committed:
                    await self._lift(session, gate, fenced, reason="exchange-aborted")

    async def _fence_and_mark(self, session: str, current: Ownership, new_owner: str) -> Ownership:
        """Record the fence and journal its marker, together: submitted at once, they
        share one commit of a group-committing store."""
        epoch = current.epoch
        marker = _marker(ControlEvent.FENCE, epoch, "exchange", new_owner=new_owner)
        fencing = self._store.compare_and_set_ownership(
            session, epoch, current.model_copy(update={"fence": FenceState.FENCED})
        )
        fenced, marked = await asyncio.gather(
            fencing, self._store.append(session, [marker]), return_exceptions=True
        )
        if isinstance(fenced, BaseException):
            if not isinstance(marked, BaseException):  # say in the journal it came to nothing
                with contextlib.suppress(Exception):
                    await self._store.append(
                        session, [_marker(ControlEvent.UNFENCE, epoch, "exchange-aborted")]
                    )
            raise fenced
        if isinstance(marked, BaseException):
            await self._lift(session, await self._gates.get(session), fenced, "exchange-aborted")
            raise marked
        return fenced

    async def unfence(self, session: str, *, expect_epoch: int) -> Ownership:
        """Lift a fence left by an exchange that did not finish (e.g. its caller died)."""
        gate = await self._gates.get(session)
        async with gate.lock:
            current = await self._store.get_ownership(session)
            if current.epoch != expect_epoch:
                raise EpochConflict(session, expected=expect_epoch, current=current)
            if current.fence is FenceState.OPEN and not gate.fenced:
                return current
            return await self._lift(session, gate, current, reason="requested")

    async def _lift(
        self, session: str, gate: SessionGate, fenced: Ownership, reason: str
    ) -> Ownership:
        opened = await self._store.compare_and_set_ownership(
            session, fenced.epoch, fenced.model_copy(update={"fence": FenceState.OPEN})
        )
        await gate.unfence()
        await self._store.append(session, [_marker(ControlEvent.UNFENCE, fenced.epoch, reason)])
        return opened

    async def _first_held_back(
        self, session: str, after: int, fence_seq: int
    ) -> JournalEntry | None:
        """The first inbound entry journaled while the fence held delivery back."""
        for entry in await self._store.read(session, after, max(1, fence_seq - after)):
            if is_inbound(entry):
                return entry
        return None

    async def _wait_quiescent(
        self, session: str, gate: SessionGate, target: int, timeout_s: float
    ) -> int:
        """The ack watermark once the owner has acked every turn it was given (the gate
        sees each ack as it is journaled), or when the timeout passes."""
        try:
            async with asyncio.timeout(timeout_s):
                while gate.outstanding:
                    await gate.changed()
            return target
        except TimeoutError:
            return max((await self._store.acks(session)).values(), default=0)
