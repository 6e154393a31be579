"""An owner in process, for benchmarks and tests that need turns without an agent
process or a gateway: each turn runs on the folded state with the SDK's own ``Turn``,
its outputs (and its ack) appended durably to a journal store at epoch 1, and folded
back — what the agent runtime's owner does, minus the network."""

from __future__ import annotations

from datetime import UTC, datetime

from shadowpod.agent import Turn
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.payloads import AckPayload, MessagePayload, Role
from shadowpod.domain.reducer import StateFolder
from shadowpod.domain.state import SessionState
from shadowpod.journal.store import JournalStore

EPOCH = 1


class InProcessOwner:
    def __init__(self, store: JournalStore, session: str, *, instance: str = "in-process") -> None:
        self.store = store
        self.session = session
        self.instance = instance
        self.folder = StateFolder(SessionState())

    async def append(self, entries: list[NewEntry], epoch: int | None) -> list[int]:
        """``entries`` appended (at ``epoch``; ``None``: as a client) and folded."""
        appended = await self.store.append(self.session, entries, owner_epoch=epoch)
        now = datetime.now(UTC)
        self.folder.apply_all(
            JournalEntry(a.seq, e.id, e.kind, epoch or 0, now, e.payload)
            for a, e in zip(appended, entries, strict=True)
        )
        return [a.seq for a in appended]

    async def open_turn(self, content: str) -> tuple[int, Turn]:
        """A user message journaled, and the turn that answers it (not yet run)."""
        inbound = NewEntry.of(MessagePayload(role=Role.USER, content=content))
        (seq,) = await self.append([inbound], None)
        state = self.folder.peek()
        turn = Turn(
            tools={},
            state_schema=1,
            state=state,
            inbound=state.pending[seq],
            values=dict(state.agent.values),
            epoch=EPOCH,
            instance=self.instance,
            append=lambda entries: self.append(list(entries), EPOCH),
            processes=None,  # type: ignore[arg-type]  # nothing started in process
        )
        return seq, turn

    async def close_turn(self, seq: int, turn: Turn) -> None:
        """The turn's outputs, its state and its ack, journaled and folded."""
        outputs = turn.take_outputs()
        if (entry := turn.state_entry()) is not None:
            outputs.append(entry)
        outputs.append(NewEntry.of(AckPayload(turn=seq), id=f"ack:{seq}"))
        await self.append(outputs, EPOCH)
