"""A migration: what was asked (``MigrationSpec``) and where it stands (``MigrationRecord``).

The record is saved every time the phase changes, before the new phase acts; a
restarted engine continues from the saved record.
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

# Re-exported: the engine's users name the phases from here.
from shadowpod.domain.phases import TERMINAL as TERMINAL
from shadowpod.domain.phases import Phase as Phase
from shadowpod.gates.persona import PersonaCheck, PersonaPolicy
from shadowpod.gates.policy import GatePolicy

# The phases a shadow migration that succeeds goes through, in order (after Pending).
SHADOW_PHASES: Final = (
    Phase.PREFLIGHT,
    Phase.SNAPSHOTTING,
    Phase.RESTORING,
    Phase.CATCHING_UP,
    Phase.FENCING,
    Phase.COMMITTED,
    Phase.DRAINING,
)
# Phases after which the new epoch may exist: from here on there is no rolling back.
COMMITTED_PHASES: Final = frozenset({Phase.COMMITTED, Phase.DRAINING, Phase.SUCCEEDED})

# ``criu``: the shadow is the source process itself, checkpointed while it serves and
# restored elsewhere (same image only); then as ``shadow`` from CatchingUp on.
Strategy = Literal["shadow", "restart", "criu"]


class ValidationPolicy(BaseModel):
    """Shadow compare: before the fence, the target image answers the live turns the
    source answers in the meantime, in a sandbox, and a judge compares the answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turns: int = Field(default=5, ge=0, description="Live turns to compare (0: goldens only).")
    timeout_s: float = Field(
        default=60.0, gt=0, description="How long to wait for them; then judge what came."
    )
    gate: GatePolicy = Field(default_factory=GatePolicy)
    goldens: list[str] = Field(
        default_factory=list,
        description="Golden sessions the target must also pass (files, on the local runtime).",
    )


class ValidationSummary(BaseModel):
    """What shadow compare found: kept in the record (and the migration's status)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: str
    compared: int
    agreed: int
    agreement: float
    threshold: float
    passed: bool
    from_seq: int = Field(
        default=0, description="Turns whose inbound came after this seq were compared."
    )
    to_seq: int = 0
    golden: str | None = Field(default=None, description="The golden session, if one.")
    worst: list[str] = Field(
        default_factory=list, description="The worst disagreements: turn, score, reason."
    )
    message: str = ""


class MigrationPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fence_timeout_s: float = Field(default=2.0, gt=0)
    max_fence_attempts: int = Field(default=3, ge=1)
    catchup_lag_threshold: int = Field(default=50, ge=0, description="Entries behind the head.")
    max_duration_s: float = Field(default=120.0, gt=0)
    phase_timeout_s: float = Field(default=30.0, gt=0)
    drain_grace_s: float = Field(default=5.0, ge=0)
    rollback_on_failure: bool = True
    validation: ValidationPolicy | None = Field(
        default=None, description="An upgrade gate before the fence (shadow compare)."
    )
    persona: PersonaPolicy | None = Field(
        default=None,
        description="Probe the shadow's identity after its restore and the new owner's "
        "after its promotion (shadowpod.gates.persona).",
    )


class InstanceRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    image: str


class MigrationSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    session: str
    source: InstanceRef
    target: InstanceRef
    strategy: Strategy = "shadow"
    fallback: bool = Field(
        default=False,
        description="criu only: where the checkpoint or its restore turns out unsupported"
        " (``CheckpointRestoreUnsupported``), go on with the shadow strategy instead of"
        " rolling back (``strategy: Auto``).",
    )
    credentials: list[str] = Field(default_factory=list)
    policy: MigrationPolicy = Field(default_factory=MigrationPolicy)
    reason: str = "upgrade"


class PhaseTiming(BaseModel):
    model_config = ConfigDict(extra="forbid")

    started: float
    ended: float | None = None

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


class FenceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int
    fence_seq: int
    waited_ms: float
    attempts: int


class SourceLoss(BaseModel):
    """The source seen dead before the epoch bump: the decision to finish forward,
    recorded before anything acts on it, so that a resumed engine keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase = Field(description="The phase in which the engine saw it.")
    seen: float = Field(description="When (the engine's clock).")
    how: str = Field(description="What its runtime said of its end.")


class MigrationRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: MigrationSpec
    phase: Phase = Phase.PENDING
    started: float = Field(default_factory=time.time)
    ended: float | None = None
    timings: dict[str, PhaseTiming] = Field(default_factory=dict)
    source_epoch: int | None = None
    snapshot_request_seq: int | None = None
    snapshot_watermark: int | None = None
    checkpoint: str | None = Field(
        default=None, description="The runtime's reference of the CRIU checkpoint (criu)."
    )
    checkpoint_ms: float | None = Field(default=None, description="How long the dump took.")
    strategy_note: str | None = Field(
        default=None, description="Why this strategy: the choice made, or a fallback taken."
    )
    checkpoint_bytes: int | None = Field(default=None, description="The checkpoint's size.")
    fence_attempts: int = 0
    fence: FenceInfo | None = None
    fence_pause_ms: float | None = None
    catchup_entries: int | None = None
    catchup_entries_per_s: float | None = None
    validation_from: int | None = None
    validation: ValidationSummary | None = None
    golden_validations: list[ValidationSummary] = Field(default_factory=list)
    persona_checks: list[PersonaCheck] = Field(default_factory=list)
    recoveries: int = 0
    source_lost: SourceLoss | None = Field(
        default=None,
        description="The source died before the epoch bump: the shadow takes over, or the"
        " rollback starts a new owner of the source's image (``replacement``).",
    )
    replacement: InstanceRef | None = Field(
        default=None,
        description="The new owner, of the source's image, that a rollback started in"
        " place of a dead source: chosen (and saved) before it is started.",
    )
    failed_phase: Phase | None = None
    reason: str | None = Field(
        default=None, description="Why it failed or rolled back: one CamelCase word."
    )
    error: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL

    @property
    def total_s(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    def enter(self, phase: Phase, *, now: float | None = None, **changes: Any) -> MigrationRecord:
        """A copy in ``phase``, with the previous phase's timing closed."""
        now = time.time() if now is None else now
        timings = {name: timing.model_copy() for name, timing in self.timings.items()}
        if self.phase not in timings:  # the first phase, timed from the record's creation
            timings[self.phase] = PhaseTiming(started=self.started)
        if timings[self.phase].ended is None:
            timings[self.phase].ended = now
        if phase not in timings or phase is self.phase:
            timings.setdefault(phase, PhaseTiming(started=now))
        else:  # re-entered (a fence retry goes back to CatchingUp): time from now on
            timings[phase] = PhaseTiming(started=now)
        update: dict[str, Any] = {"phase": phase, "timings": timings, **changes}
        if phase in TERMINAL:
            update["ended"] = now
            timings[phase].ended = now
        return self.model_copy(update=update)

    def phase_seconds(self) -> dict[str, float]:
        return {
            name: round(seconds, 6)
            for name, timing in self.timings.items()
            if (seconds := timing.seconds) is not None and name not in TERMINAL
        }
