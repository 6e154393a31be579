"""Delivery gates: what the gateway releases to each session's owner, and when.

The owner receives the whole journal from its watermark (its state stays a fold of
it), together with a *release watermark*: the highest inbound seq it may process.
The gate moves that watermark over new inbound entries only while the session is not
fenced, and only a few ahead of the owner's acks (``window``). So during an
ExchangeFence the owner keeps seeing its own outputs and the markers but starts no
new turn, while new inbound keeps being journaled — the journal is the buffer — and a
fence never waits for more than ``window`` turns, however long the backlog.

A gate lives in the memory of the gateway process that streams to the owner; delivery
for a session is therefore sticky to one gateway process (the journal itself is
shared). After a gateway restart, a gate assumes conservatively that every inbound
entry not yet acked may have been delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from shadowpod.domain.entries import JournalEntry, is_inbound
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.journal.errors import StoreUnavailable
from shadowpod.journal.store import JournalStore


class Superseded(Exception):
    """The owner this stream serves is no longer the owner."""

    def __init__(self, epoch: int, current: int) -> None:
        self.epoch = epoch
        self.current = current
        super().__init__(f"epoch {epoch} was superseded by epoch {current}")


class GateClosed(StoreUnavailable):
    """This gateway process no longer serves the session (another replica holds its
    lease, ``journal/leases.py``): nothing more is released or changed through its gate."""

    reason = "LeaseLost"

    def __init__(self, session: str) -> None:
        super().__init__(
            f"this gateway replica no longer serves session {session!r} (its lease expired "
            "or was taken over): nothing more is delivered or changed here; retry, the "
            "request then reaches the replica that serves it"
        )
        self.session = session


@dataclass(frozen=True)
class PauseTarget:
    """The first inbound entry a fence held back; its wait ends when its turn starts.

    ``held_since`` is when the fence began holding it: its arrival, or the start of the
    fence if it was already queued behind a busy owner (that earlier wait is the
    owner's backlog, not the fence's doing, and clients see it in their latency).
    """

    epoch: int
    seq: int
    held_since: datetime


PauseObserver = Callable[[float], None]


# Inbound entries released ahead of the acks: enough to keep a busy owner fed, few
# enough that a fence waits for a handful of turns at most.
DEFAULT_WINDOW: Final = 4


class SessionGate:
    def __init__(
        self,
        session: str,
        ownership: Ownership,
        outstanding: Iterable[int],
        on_pause: PauseObserver | None = None,
        window: int = DEFAULT_WINDOW,
        acked_through: int = 0,
    ) -> None:
        """``acked_through``: the owner's ack watermark, below which nothing is released
        again (with nothing ``outstanding``, the next inbound entry after it is next)."""
        self.session = session
        self.epoch = ownership.epoch
        # A suspended session releases nothing either, until it resumes.
        self.fenced = ownership.fence is not FenceState.OPEN
        self.window = window
        # Inbound seqs released (or held from before) and not yet acked, in order.
        self._outstanding: deque[int] = deque(sorted(outstanding))
        self.released_count = 0
        # Highest inbound seq the current owner may be working on.
        self.released_through = max(
            self._outstanding[-1] if self._outstanding else 0, acked_through
        )
        # Entries up to here were examined for release (so none is examined twice).
        self.scanned_through = self.released_through
        self.lock = asyncio.Lock()  # one ExchangeFence at a time per session
        # Another replica serves the session now: this gate releases nothing more.
        self.closed = False
        self._early_epoch = 0
        self.last_fence_pause_s: float | None = None
        self._on_pause = on_pause
        self._changed = asyncio.Event()
        self._pause: PauseTarget | None = None
        # Outputs of the new epoch seen before its pause target was known (turn -> time).
        self._early: dict[int, float] | None = None

    def release(self, entries: Iterable[JournalEntry], epoch: int) -> int:
        """Release what the gate allows of ``entries`` (in seq order) to the owner at
        ``epoch``; returns the release watermark. Raises ``Superseded`` when ``epoch``
        is no longer the session's epoch, ``GateClosed`` when the gate was closed."""
        if self.closed:
            raise GateClosed(self.session)
        if self.epoch != epoch:
            raise Superseded(epoch, self.epoch)
        for entry in entries:
            if entry.seq <= self.scanned_through:
                continue
            if entry.seq > self.scanned_through + 1:
                break  # not contiguous with what was examined: ask again from there
            if is_inbound(entry):
                if self.fenced or len(self._outstanding) >= self.window:
                    break
                self._outstanding.append(entry.seq)
                self.released_through = entry.seq
                self.released_count += 1
            self.scanned_through = entry.seq
        return self.released_through

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def acked(self, turns: Iterable[int]) -> None:
        """The owner acked these turns: the window moves on."""
        last = max(turns, default=0)
        if self._outstanding and self._outstanding[0] <= last:
            while self._outstanding and self._outstanding[0] <= last:
                self._outstanding.popleft()
            self._notify()

    async def changed(self) -> None:
        """Until the gate changes next (no timeout)."""
        await self._changed.wait()

    async def wait_changed(self, timeout_s: float = 1.0) -> None:
        """Until the gate changes (re-checked at least every ``timeout_s``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """Release nothing more, and wake whoever waits on the gate (a long-poll, a
        fence): they end instead of serving a session this process no longer holds."""
        self.closed = True
        self._notify()

    async def fence(self) -> None:
        self.fenced = True
        self._notify()

    async def unfence(self) -> None:
        self.fenced = False
        self._notify()

    async def advance(self, ownership: Ownership, outstanding: Iterable[int]) -> None:
        """The epoch moved on: the old owner is refused, the new owner may start.

        ``outstanding``: every inbound entry not yet acked — the new owner works on
        them from its state, so a later fence must wait for them.
        """
        self.epoch = ownership.epoch
        # A suspended session releases nothing either, until it resumes.
        self.fenced = ownership.fence is not FenceState.OPEN
        self._outstanding = deque(sorted(outstanding))
        if self._outstanding:
            self.released_through = max(self.released_through, self._outstanding[-1])
        self.scanned_through = max(self.scanned_through, self.released_through)
        self._notify()

    @property
    def pause_pending(self) -> bool:
        """A fence held an entry back whose turn has not started yet."""
        return self._pause is not None or self._early is not None

    def watch_pause(self, epoch: int) -> None:
        """Start noting the new owner's first outputs: its pause target is not known yet."""
        self._pause = None
        self._early = {}
        self._early_epoch = epoch
        self.last_fence_pause_s = None

    def expect_pause(self, target: PauseTarget | None) -> None:
        """The entry the fence held back first (``None``: nothing was held back)."""
        early, self._early = self._early, None
        if target is None:
            return
        if early is not None and target.seq in early:
            self._record_pause(target, early[target.seq])
        else:
            self._pause = target

    def observe_outputs(self, epoch: int, turns: Iterable[int]) -> None:
        """The owner journaled outputs of these turns: a held-back entry may be served."""
        now = time.time()
        if self._early is not None and epoch == self._early_epoch and len(self._early) < 10_000:
            for turn in turns:
                self._early.setdefault(turn, now)
            return
        target = self._pause
        if target is not None and epoch == target.epoch and target.seq in turns:
            self._record_pause(target, now)

    def _record_pause(self, target: PauseTarget, started_at: float) -> None:
        self._pause = None
        self.last_fence_pause_s = max(0.0, started_at - target.held_since.timestamp())
        if self._on_pause is not None:
            self._on_pause(self.last_fence_pause_s)


class SessionGates:
    """The gates of the sessions this gateway delivers, created on first use."""

    def __init__(
        self,
        store: JournalStore,
        on_pause: PauseObserver | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self._store = store
        self._on_pause = on_pause
        self._window = window
        self._gates: dict[str, SessionGate] = {}
        self._creating: dict[str, asyncio.Lock] = {}

    def known(self, session: str) -> SessionGate | None:
        return self._gates.get(session)

    async def get(self, session: str) -> SessionGate:
        gate = self._gates.get(session)
        if gate is not None:
            return gate
        lock = self._creating.setdefault(session, asyncio.Lock())
        async with lock:
            gate = self._gates.get(session)
            if gate is None:
                gate = await self._create(session)
                self._gates[session] = gate
        self._creating.pop(session, None)
        return gate

    def forget(self, session: str) -> None:
        """Drop the session's gate and close it: whoever still holds it stops there."""
        gate = self._gates.pop(session, None)
        if gate is not None:
            gate.close()

    async def epoch_changed(self, gate: SessionGate, ownership: Ownership) -> None:
        await gate.advance(ownership, await self.unacked_inbound(gate.session))

    async def catch_up(self, gate: SessionGate) -> None:
        """Bring the gate up to the store's epoch.

        An epoch change is recorded in the gate just after its marker commits; a new
        owner that saw the marker can ask in between, and must find the gate current
        rather than be told it was superseded.
        """
        ownership = await self._store.get_ownership(gate.session)
        if ownership.epoch > gate.epoch:
            await self.epoch_changed(gate, ownership)

    async def _create(self, session: str) -> SessionGate:
        ownership = await self._store.get_ownership(session)
        if ownership.fence is FenceState.FENCED:
            # A fence is only held while an ExchangeFence runs in the gateway that set
            # it. Finding one at start means that gateway died mid-fence: lift it, so
            # the owner is not starved (the migration engine retries its fence).
            ownership = await self._store.compare_and_set_ownership(
                session, ownership.epoch, ownership.model_copy(update={"fence": FenceState.OPEN})
            )
        # Conservatively, the owner may hold every inbound entry not yet acked; what it
        # acked is never released again (it is past it: it would never ack it again).
        acked = await self._acked(session)
        outstanding = await self._inbound_after(session, acked)
        return SessionGate(
            session, ownership, outstanding, self._on_pause, self._window, acked_through=acked
        )

    async def unacked_inbound(self, session: str) -> list[int]:
        """The seqs of the inbound entries not yet acked."""
        return await self._inbound_after(session, await self._acked(session))

    async def _acked(self, session: str) -> int:
        return max((await self._store.acks(session)).values(), default=0)

    async def _inbound_after(self, session: str, acked: int) -> list[int]:
        seqs: list[int] = []
        after = acked
        while True:
            page = await self._store.read(session, after, 5_000)
            if not page:
                return seqs
            seqs += (e.seq for e in page if is_inbound(e))
            after = page[-1].seq
