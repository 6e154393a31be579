"""What a live scenario keeps of one migration: the engine's record, the client's
view of it, and what the checks compare at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shadowpod.engine.record import MigrationRecord, Phase


@dataclass
class MigrationOutcome:
    record: MigrationRecord
    started: float  # monotonic
    ended: float
    # The worst reply latency of the messages sent while it ran; ``None`` when no
    # message was sent then (a window with no traffic shows no pause, not a zero one).
    client_max_latency_ms: float | None = None
    # (fence_seq, digest) the new owner reported for its state at the cutover ...
    promoted: tuple[int, str] | None = None
    # ... and whether it equals a fold of the journal up to there (checked by finish()).
    state_matches: bool | None = None
    # How the source process ended (its exit code; negative: the signal that killed
    # it), seen at the end of the run; ``None`` while it runs or if it is not local.
    source_exit: int | None = None

    @property
    def moved(self) -> bool:
        """The epoch moved — to the target (even if the migration then failed), or to
        the new owner that replaced a dead source: the session changed owner."""
        return self.record.fence is not None or self.record.replacement is not None

    @property
    def succeeded(self) -> bool:
        return self.record.phase is Phase.SUCCEEDED

    def summary(self) -> dict[str, Any]:
        r = self.record
        return {
            "id": r.spec.id,
            "session": r.spec.session,
            "strategy": r.spec.strategy,
            "source": r.spec.source.image,
            "target": r.spec.target.image,
            "result": r.phase.value,
            "error": r.error,
            "total_s": None if r.total_s is None else round(r.total_s, 4),
            "phases_s": {str(k): v for k, v in r.phase_seconds().items()},
            "fence_pause_ms": r.fence_pause_ms,
            "fence_wait_ms": None if r.fence is None else r.fence.waited_ms,
            "fence_attempts": r.fence_attempts,
            "recoveries": r.recoveries,
            "source_lost": None if r.source_lost is None else r.source_lost.model_dump(mode="json"),
            "replacement": None if r.replacement is None else r.replacement.name,
            "catchup_entries": r.catchup_entries,
            "catchup_entries_per_s": r.catchup_entries_per_s,
            "client_max_latency_ms": None
            if self.client_max_latency_ms is None
            else round(self.client_max_latency_ms, 2),
            "state_at_fence_matches": self.state_matches,
            "notes": r.notes,
        }
