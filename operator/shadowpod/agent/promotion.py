"""What a shadow reports of its way to ownership: its catch-up and its promotion."""

from __future__ import annotations

from dataclasses import dataclass

from shadowpod.agent.snapshots import state_digest
from shadowpod.domain.state import SessionState


@dataclass(frozen=True)
class CatchUp:
    entries: int
    seconds: float

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Promotion:
    """The moment this instance became owner, with its state as of ``fence_seq``.

    The state is kept as a working copy (containers copied, frozen items shared: cheap)
    and fingerprinted only when asked — hashing megabytes of transcript at the instant
    of promotion would add to the fence pause every client waits through.
    """

    epoch: int
    fence_seq: int
    state: SessionState
    at: float
    # The first turn this owner took (a message the fence held back, most often) and
    # when it started (Unix time): what the fence pause spent before the agent's turn.
    first_turn: int | None = None
    first_turn_at: float | None = None
    _digest: str | None = None

    def state_digest(self) -> str:
        if self._digest is None:
            self._digest = state_digest(self.state)
        return self._digest
