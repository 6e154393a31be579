"""Quick consecutive turns, journaled together in one append.

An owner journals a turn's outputs and ack durably before the journal shows it the
state for the next turn, so one session takes at most one turn per append round
trip. When messages queue up (a burst, or the backlog a fence held back) and turns
are quick, that round trip is most of each turn. A group takes the queued turns one
after another and journals all their outputs in one append.

Every turn after the first must see the state the journal will hold after the
earlier turns: their outputs are folded, ahead of the journal, into a private copy
of the state (with provisional seqs above its watermark). The journal gets the same
outputs in the same order, contiguous in one append; an inbound entry that arrives
meanwhile lands before them, but it only joins ``pending`` (a message enters the
transcript when its turn starts, not when it arrives), exactly as a message arriving
during a single turn does today. The owner's own state is never touched: it is
still folded from the journal as the append comes back.

A group ends at a slow turn (its reply must not wait for others), at a turn that
journaled something itself (a tool call's intent and result), or at a size limit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from shadowpod.agent.turn import Append
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState

MAX_TURNS: Final = 32
# Turns are grouped only while they are this quick: a model call ends its group, so
# no reply waits behind another turn's thinking.
MAX_SECONDS: Final = 0.004


class TurnGroup:
    def __init__(self, state: SessionState, epoch: int, append: Append) -> None:
        self._state = state
        self._ahead: StateFolder | None = None  # the copy the later turns read
        self._epoch = epoch
        self._append = append
        self._buffered: list[NewEntry] = []
        self._started = time.monotonic()
        self.turns = 0
        self.appends = 0  # by the turns themselves (tool calls), not by ``flush``

    @property
    def state(self) -> SessionState:
        """The state the next turn sees."""
        return self._state

    async def append(self, entries: Sequence[NewEntry]) -> list[int]:
        """For a turn journaling mid-turn: what the group holds goes first, in order."""
        self.appends += 1
        taken, self._buffered = [*self._buffered, *entries], []
        return await self._append(taken)

    def hold(self, entries: Sequence[NewEntry]) -> SessionState:
        """Entries written outside any turn (adopting the session), to go first; the
        state after them, for the turns."""
        self._buffered.extend(entries)
        return self.fold_ahead(entries)

    def ended(self, outputs: Sequence[NewEntry]) -> None:
        """A turn ended with ``outputs`` (its ack last): held for the group's append."""
        self.turns += 1
        self._buffered.extend(outputs)

    def can_take_more(self) -> bool:
        return (
            self.appends == 0
            and self.turns < MAX_TURNS
            and time.monotonic() - self._started < MAX_SECONDS
        )

    def fold_ahead(self, outputs: Sequence[NewEntry]) -> SessionState:
        """The state after ``outputs``, for the next turn of the group."""
        if self._ahead is None:
            self._ahead = StateFolder(self._state)  # containers copied once per group
        seq = self._ahead.watermark
        now = datetime.now(UTC)
        self._ahead.apply_all(
            JournalEntry(seq + n, e.id, e.kind, self._epoch, now, e.payload)
            for n, e in enumerate(outputs, start=1)
        )
        self._state = self._ahead.peek()
        return self._state

    async def flush(self) -> None:
        if self._buffered:
            taken, self._buffered = self._buffered, []
            await self._append(taken)
