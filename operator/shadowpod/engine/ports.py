"""The engine's ports: what it needs from the world, as protocols, and the errors an
adapter raises through them.

- ``Runtime`` starts and stops agent instances of an image and tells their status
  (local processes, or pods through the Kubernetes API).
- ``SessionControl`` is the gateway's control API: snapshots, the fence, ownership.
- ``RecordStore`` keeps the migration record (a file, or the ``AgentMigration``
  status).
- ``Checkpointer`` (optional, the ``criu`` strategy) checkpoints a serving instance
  and restores the checkpoint as another instance, where the runtime can (CRIU).

Errors: an adapter raises a ``ShadowpodError`` for anything it cannot do —
``Unavailable`` (``RuntimeUnavailable``, ``GatewayUnavailable``) when it cannot
reach what it drives right now, which the engine retries for up to a phase's
timeout; anything else (``RuntimeFailure``, ``ImageNotFound``, the gateway's own
answers) fails the step, and the migration rolls back if it still can. Every action
may be asked again after such an error, or after a crash: adapters make each one
idempotent.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import Ownership
from shadowpod.engine.record import MigrationRecord, ValidationSummary
from shadowpod.gates.persona import PersonaCheck, PersonaPolicy, Stage
from shadowpod.gates.policy import GatePolicy


class ImageInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    image: str
    state_schema: int = Field(ge=1, description="The agent state schema this image writes.")
    reads_state_schemas: list[int]


class InstanceSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    image: str
    session: str
    mode: Literal["owner", "shadow"]
    epoch: int | None = None
    snapshot: int | None = None


class InstanceStatus(BaseModel):
    """What an instance reports (``alive``), or how it ended (not ``alive``).

    ``mode``, alive: ``starting``, ``shadow``, ``owner``, ``draining``, ``stopped``, or
    ``failed`` — stopped for good, ``error`` says why (an owner whose writes the gateway
    refuses stays up in it). Not alive: ``failed`` (it exited on an error of its own),
    ``stopped`` (it exited cleanly), ``crashed`` (a signal or the machine ended it: a
    new instance recovers) or ``unknown`` (never started by this runtime).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    alive: bool
    ready: bool = False
    mode: str = "unknown"
    epoch: int = 0
    watermark: int = 0
    catchup_entries: int | None = None
    catchup_entries_per_s: float | None = None
    promoted_fence_seq: int | None = None
    serving: bool = Field(
        default=False,
        description="Owner at ``epoch``, with its adoption of the session journaled there.",
    )
    error: str | None = None
    reason: str | None = Field(
        default=None,
        description="Why it cannot run, when the runtime knows (``ImagePullFailed``,"
        " ``NodeNotFound``): the migration's failure reason, rather than a timeout.",
    )
    left_behind: list[str] = Field(
        default_factory=list,
        description="What the instance left running when it died, killed by the runtime.",
    )


class FenceOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    epoch: int
    fence_seq: int
    waited_ms: float


class FencePause(BaseModel):
    model_config = ConfigDict(frozen=True)

    ms: float | None = None
    pending: bool = Field(default=False, description="Held back, not yet served: ask again.")


class ImageNotFound(ShadowpodError):
    reason = "ImageNotFound"


class Unavailable(ShadowpodError):
    """What the adapter drives cannot be reached now; asking again later may work."""

    reason = "Unavailable"


class RuntimeUnavailable(Unavailable):
    reason = "RuntimeUnavailable"


class GatewayUnavailable(Unavailable):
    reason = "GatewayUnavailable"


class RuntimeFailure(ShadowpodError):
    """The runtime cannot do what was asked (an instance it cannot start, say)."""

    reason = "RuntimeFailure"


class FenceTimedOut(ShadowpodError):
    """The owner did not go idle within the fence timeout; the fence was lifted."""

    reason = "FenceTimeout"


class FenceOutcomeUnknown(ShadowpodError):
    """The fence call got no answer (timeout, connection lost): the epoch may or may
    not have been bumped. Re-read the ownership before doing anything else."""

    reason = "FenceOutcomeUnknown"


class ValidationUnavailable(ShadowpodError):
    """The comparison could not be made (the judge's model or endpoint, a golden that
    cannot be read, a shadow whose agent API does not answer): the migration rolls
    back saying so, it does not guess."""

    reason = "ValidationUnavailable"


class CompareWindowLost(ValidationUnavailable):
    """The shadow has no compare window from that seq any more (it was restarted):
    its answers to the window's turns are gone. Open another window."""

    reason = "CompareWindowLost"


class CheckpointRestoreUnsupported(ShadowpodError):
    """This runtime cannot checkpoint or restore an agent process (no CRIU here, or a
    CRIU that cannot); the app-level state path can still move the session."""

    reason = "CheckpointRestoreUnsupported"


class Checkpoint(BaseModel):
    """A checkpoint of an instance: the runtime's reference, and the watermark of the
    state the checkpointed process holds (where its catch-up starts)."""

    model_config = ConfigDict(frozen=True)

    ref: str
    watermark: int = Field(ge=0)
    dump_ms: float = Field(ge=0, description="How long taking the checkpoint took.")
    bytes: int = Field(default=0, ge=0, description="Its size: every memory page of the agent.")


class Runtime(Protocol):
    """Raises ``RuntimeUnavailable`` or ``RuntimeFailure`` (see the module's docstring)."""

    async def describe(self, image: str) -> ImageInfo:
        """What the image declares; ``ImageNotFound`` if it cannot be resolved."""
        ...

    async def missing_credentials(self, image: str, names: list[str]) -> list[str]:
        """Which of ``names`` an instance of ``image`` would not have mounted."""
        ...

    async def start(self, spec: InstanceSpec) -> None:
        """Start the instance; one already running under that name is left alone."""
        ...

    async def status(self, name: str) -> InstanceStatus: ...

    async def stop(self, name: str, *, grace_s: float) -> None:
        """SIGTERM, up to ``grace_s``, then SIGKILL. Stopping a gone instance is fine."""
        ...


class SessionControl(Protocol):
    """Raises ``GatewayUnavailable`` when the gateway cannot be reached, or the
    gateway's own answer as a ``ShadowpodError`` with its ``reason``."""

    async def head(self, session: str) -> int: ...

    async def ownership(self, session: str) -> Ownership: ...

    async def request_snapshot(self, session: str) -> int:
        """Journal a snapshot request; returns its seq."""
        ...

    async def latest_snapshot(self, session: str) -> int | None:
        """The watermark of the latest snapshot, if any."""
        ...

    async def fence(
        self, session: str, *, expect_epoch: int, new_owner: str, timeout_s: float
    ) -> FenceOutcome:
        """Run the ExchangeFence; ``FenceTimedOut`` when the owner stayed busy."""
        ...

    async def unfence(self, session: str, *, expect_epoch: int) -> None: ...

    async def set_owner(
        self, session: str, *, expect_epoch: int, epoch: int, owner: str
    ) -> Ownership: ...

    async def fence_pause(self, session: str) -> FencePause:
        """The wait of the first message the last fence held back, once measured."""
        ...


class Checkpointer(Protocol):
    """Raises ``CheckpointRestoreUnsupported``, ``RuntimeUnavailable`` or
    ``RuntimeFailure``. A checkpoint holds every memory page of the agent, its
    secrets too: an implementation keeps it root-only and deletes it once restored or
    discarded."""

    async def checkpoint(self, source: str, target: str) -> Checkpoint:
        """Checkpoint instance ``source`` while it serves, to become ``target``."""
        ...

    async def restore(self, checkpoint: str, spec: InstanceSpec) -> None:
        """Start ``spec`` (a shadow) from the checkpoint ``checkpoint``; one already
        running under that name is left alone."""
        ...

    async def discard(self, checkpoint: str) -> None:
        """Delete a checkpoint that will not be restored. A gone one is fine."""
        ...


class RecordStore(Protocol):
    async def save(self, record: MigrationRecord) -> None: ...

    async def load(self, migration_id: str) -> MigrationRecord | None: ...


class Validator(Protocol):
    """Shadow compare: judges the shadow's answers to a session's live turns.

    ``instance`` is the shadow's instance name: the validator asks that instance (its
    agent API) to answer in its sandbox. Raises ``ValidationUnavailable`` when a
    comparison cannot be made.
    """

    async def open_window(
        self, session: str, *, instance: str, after_seq: int, turns: int | None = None
    ) -> int:
        """Have the shadow answer, in its sandbox, the live turns whose inbound comes
        after ``after_seq`` (the first ``turns`` of them) as it follows the journal.
        Returns where the window starts: ``after_seq``, or later when the shadow
        already followed past it (a shadow restarted since the window was first
        opened). Asked again with the same seq, the open window is kept."""
        ...

    async def completed_turns(
        self, session: str, *, instance: str, after_seq: int, up_to: int | None = None
    ) -> tuple[int, int]:
        """How many turns whose inbound came after ``after_seq`` the owner finished
        (counting at most ``up_to``), and the seq of the last one counted's ack
        (``after_seq`` when none)."""
        ...

    async def compare(
        self,
        session: str,
        image: str,
        *,
        instance: str,
        after_seq: int,
        to_seq: int,
        gate: GatePolicy,
    ) -> ValidationSummary:
        """The shadow's answers (of ``image``) to the window's turns acked at or below
        ``to_seq``, judged against the owner's; ``CompareWindowLost`` when the shadow
        has lost the window opened ``after_seq``."""
        ...

    async def replay_golden(
        self, golden: str, image: str, *, instance: str, gate: GatePolicy
    ) -> ValidationSummary:
        """The shadow answers a golden session in a sandbox; the gate's judge compares."""
        ...

    async def persona(
        self,
        policy: PersonaPolicy,
        *,
        stage: Stage,
        instance: str,
        source: str,
        baseline: str | None = None,
    ) -> PersonaCheck:
        """Probe ``instance`` with ``policy.probe`` in its sandbox and judge its answer
        against ``baseline``, or, when there is none yet, against the answer of
        ``source`` (probed the same way)."""
        ...

    async def reanchor(self, instance: str) -> None:
        """Have ``instance`` call its agent's re-anchor hook with the session's
        identity; ``ValidationUnavailable`` when it has none."""
        ...
