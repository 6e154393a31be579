"""Request and response bodies of the gateway's HTTP API (``/v1``).

Shared by the gateway (server) and its clients (agent runtime, engine adapters, load
generators). Transport-free: no aiohttp here. ``openapi.yaml`` documents the same.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, Strict, model_validator

from shadowpod.domain.bounds import INT64_MAX, Boolean, EntrySeq, Epoch, Integer, OwnerEpoch, Seq
from shadowpod.domain.entries import ENTRY_ID_MAX, NewEntry, SessionId
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.domain.payloads import (
    MAX_SCHEDULE_CONTENT,
    MAX_SCHEDULES_PER_SESSION,
    ExitCode,
    OwnerName,
    Pid,
    SchedulePeriod,
)

API_PREFIX: Final = "/v1"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------


class FieldError(_Body):
    loc: str
    msg: str


class ErrorBody(_Body):
    """Every 4xx/5xx answer: ``reason`` is one CamelCase word to branch on."""

    reason: str
    message: str
    errors: list[FieldError] = Field(default_factory=list)


# --- clients --------------------------------------------------------------------------


class PostMessage(_Body):
    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=ENTRY_ID_MAX,
        description="Idempotency key: posting the same id again returns the first seq.",
    )
    content: str = Field(max_length=1_000_000)
    role: Literal["user", "system"] = "user"
    meta: dict[str, JsonValue] = Field(default_factory=dict)


class Accepted(_Body):
    session: str
    seq: int
    id: str
    duplicate: bool
    waking: bool = Field(
        default=False,
        description="The session was suspended: the message is journaled and will be"
        " answered once its owner is up (a Retry-After header says when to look).",
    )


class EventsPage(_Body):
    events: list[dict[str, JsonValue]]
    head: int = Field(description="The journal's head when the page was read.")
    next_after: int = Field(
        description="The last seq this page covers (filtered-out entries included): "
        "read the next page with after=next_after."
    )


# --- owners and shadows ---------------------------------------------------------------


class AppendRequest(_Body):
    epoch: OwnerEpoch = Field(description="The owner epoch the writer was given.")
    entries: list[NewEntry]
    after: Seq | None = Field(
        default=None,
        description="Also answer with the entries released to the owner after this seq.",
    )


class AppendedOut(_Body):
    seq: int
    id: str
    duplicate: bool


class AppendResponse(_Body):
    appended: list[AppendedOut]
    entries: list[dict[str, JsonValue]] = Field(
        default_factory=list, description="With ``after``: the journal since."
    )
    released: int | None = Field(
        default=None, description="With ``after``: the highest inbound seq the owner may process."
    )


class Deliveries(_Body):
    entries: list[dict[str, JsonValue]]
    released: int = Field(description="The highest inbound seq the owner may process.")


class AckRequest(_Body):
    epoch: OwnerEpoch
    turn: EntrySeq = Field(description="An inbound entry at or below the journal's head.")


class JournalPage(_Body):
    entries: list[dict[str, JsonValue]]
    head: int


class ProcessReport(_Body):
    # The bounds of the ``process`` entry it is journaled as (``ProcessPayload``).
    name: str = Field(min_length=1, max_length=200)
    pid: Pid | None = None
    outcome: Literal["exited", "terminated", "killed"]
    exit_code: ExitCode | None = None


class DrainReport(_Body):
    """What a fenced owner reports as it leaves: the background work it stopped."""

    instance: OwnerName
    epoch: OwnerEpoch
    processes: list[ProcessReport] = Field(default_factory=list)


# --- snapshots ------------------------------------------------------------------------


# The headers of a bare snapshot document (``GET .../snapshots/{watermark}/document``):
# what a loader needs besides the document's text.
SNAPSHOT_WATERMARK_HEADER: Final = "Shadowpod-Snapshot-Watermark"
SNAPSHOT_SCHEMA_VERSION_HEADER: Final = "Shadowpod-Snapshot-Schema-Version"


class SnapshotInfoOut(_Body):
    watermark: int
    schema_version: int
    size_bytes: int
    created: str


class SnapshotOut(_Body):
    info: SnapshotInfoOut
    document: dict[str, Any]


class SnapshotRequest(_Body):
    """The body of a snapshot request, if any: an empty object (it has no fields yet)."""


class SnapshotRequested(_Body):
    seq: int = Field(description="The control entry asking the owner for a snapshot.")


# --- control --------------------------------------------------------------------------


class CredentialSpec(_Body):
    name: str = Field(min_length=1, max_length=200)
    secret_ref: str | None = Field(default=None, max_length=500)


class ScheduleSpec(_Body):
    """The bounds are the journal's own (``SchedulePayload``, where they are explained)."""

    schedule_id: str = Field(min_length=1, max_length=150)
    every_s: SchedulePeriod
    content: str = Field(default="", max_length=MAX_SCHEDULE_CONTENT)
    wake: Annotated[bool, Strict()] = Field(
        default=False, description="A fire wakes the session while it is suspended."
    )


class ForkFrom(_Body):
    """Where a fork starts: ``session``'s state at ``seq``, or at its snapshot
    ``snapshot`` (a watermark), one of the two."""

    session: SessionId
    seq: Seq | None = Field(default=None, description="The parent's seq to fork at.")
    snapshot: Seq | None = Field(
        default=None, description="The watermark of one of the parent's snapshots to fork at."
    )

    @model_validator(mode="after")
    def _one_point(self) -> ForkFrom:
        if (self.seq is None) == (self.snapshot is None):
            raise ValueError("give exactly one of seq and snapshot: where the fork starts")
        return self


class CreateSession(_Body):
    session: SessionId
    meta: dict[str, str] = Field(default_factory=dict)
    credentials: list[CredentialSpec] = Field(default_factory=list)
    schedules: list[ScheduleSpec] = Field(
        default_factory=list, max_length=MAX_SCHEDULES_PER_SESSION
    )
    agent_token_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The SHA-256 (hex) of an agent token the caller made and keeps (the"
        " operator writes it to a Secret first, so a crash between the two loses nothing);"
        " unset: the gateway makes the token and returns it once.",
    )
    owner_key: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description="The session's owner key (hex), made and kept by the caller, who"
        " then derives each instance's owner credential itself (sessions.tokens."
        "owner_credential) and needs no gateway to start one; implies owner_credentials.",
    )
    owner_credentials: Boolean = Field(
        default=False,
        description="true: owner writes need the credential of the instance the"
        " ownership record names at the epoch (minted by POST .../owner-credentials for"
        " each instance started), so an owner fenced out cannot write at a later epoch"
        " with the session's agent token. false: the epoch alone is checked.",
    )
    fork_from: ForkFrom | None = Field(
        default=None,
        description="Make the session a fork: the parent's state at that point (its"
        " journal up to it, shared, not copied), its own journal from there on; the parent"
        " is untouched.",
    )


class RetentionPolicy(_Body):
    keep_snapshots: int = Field(
        ge=1,
        le=100,
        description="Snapshots kept, the newest; the journal behind the oldest kept is"
        " truncated (never past the last processed message, nor what a fork reads).",
    )


class RetentionApplied(_Body):
    keep_snapshots: int
    deleted_snapshots: int
    deleted_entries: int
    truncated_through: int


class OwnerCredentialRequest(_Body):
    instance: OwnerName = Field(description="The instance (pod) the credential is for.")


class OwnerCredential(_Body):
    instance: str
    credential: str = Field(
        description="What the instance presents on the owner routes (header"
        " Shadowpod-Owner-Credential, with its name in Shadowpod-Instance): it writes only"
        " at the epochs the ownership record names it owner at."
    )


class SessionCreated(_Body):
    session: str
    agent_token: str | None = Field(
        default=None,
        description="Shown once; the owner and shadows present it. Unset when the caller"
        " gave agent_token_sha256: it holds the token already.",
    )
    fork_of: str | None = Field(default=None, description="The parent of a fork.")
    fork_seq: int | None = Field(default=None, description="The parent's seq a fork starts at.")


class SessionSummary(_Body):
    session: str
    head: int
    created: str
    deleted_at: str | None = Field(
        default=None, description="Deleted then, and kept until ``delete_after`` (None: live)."
    )
    delete_after: str | None = Field(
        default=None,
        description="The gateway deletes it from then on (a parent once its forks are gone).",
    )


class RestoreSession(_Body):
    """Who the restored session's agents are now: a new AgentSession of the name comes
    with a Secret of its own (the deleted one's went with it)."""

    agent_token_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The SHA-256 (hex) of the agent token from now on (unset: unchanged).",
    )
    owner_key: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description="The owner key from now on (unset: unchanged).",
    )


class SessionRestored(_Body):
    session: str
    was_deleted: bool = Field(description="Whether the session was marked deleted.")


class SessionPosition(_Body):
    session: str
    head: int
    acked: int = Field(description="Last inbound seq processed, by any epoch (0: none).")
    epoch: int
    fence: FenceState


class SessionPositions(_Body):
    """Every session's position, in one answer: what an operator shows and compares
    without a request per session."""

    sessions: list[SessionPosition]


class SessionStatus(_Body):
    session: str
    head: int
    truncated_through: int
    ownership: Ownership
    acks: dict[int, int]
    acked: int = Field(description="Last inbound seq processed, by any epoch.")
    delivered_through: int = Field(description="Last inbound seq released to the owner.")
    outstanding: int = Field(default=0, description="Inbound entries released and not yet acked.")
    last_fence_pause_ms: float | None = None
    fence_pause_pending: bool = Field(
        default=False, description="The last fence held a message back whose turn has not started."
    )
    latest_snapshot: int | None = None
    journal_entries: int = Field(
        default=0,
        description="Entries the session's own journal holds (head less what retention"
        " removed and, for a fork, less its parent's entries it shares).",
    )
    fork_of: str | None = Field(default=None, description="The session this one was forked from.")
    fork_seq: int | None = Field(default=None, description="The parent's seq it was forked at.")


class OwnershipChange(_Body):
    expect_epoch: Epoch
    epoch: OwnerEpoch
    owner: OwnerName


class FenceRequest(_Body):
    # The fence hands the session to epoch expect_epoch + 1, which must be an epoch too.
    expect_epoch: Integer = Field(
        ge=1,
        le=INT64_MAX - 1,
        description="The epoch of the owner to fence (below 2^63-1: the fence moves to the next).",
    )
    new_owner: OwnerName
    timeout_s: Annotated[float, Strict()] = Field(default=5.0, gt=0, le=300, allow_inf_nan=False)


class FenceResult(_Body):
    epoch: int
    fence_seq: int
    waited_ms: float
    delivered_through: int
    acked: int


class UnfenceRequest(_Body):
    expect_epoch: Epoch


# --- lifecycle: suspend, wake, resume, history ------------------------------------------


class SuspendRequest(_Body):
    expect_epoch: Integer = Field(ge=1, le=INT64_MAX - 1)
    next_owner: OwnerName = Field(
        description="The instance that will own the session when it resumes (not started)."
    )
    timeout_s: Annotated[float, Strict()] = Field(
        default=5.0,
        gt=0,
        le=300,
        allow_inf_nan=False,
        description="How long the owner may take to end its turn.",
    )
    reason: Literal["Requested", "Idle"] = "Requested"


class SuspendResult(_Body):
    epoch: int = Field(description="The suspended epoch: the old owner's writes are refused.")
    fence_seq: int
    suspend_seq: int = Field(description="The control/suspend entry.")
    waited_ms: float


class ResumeRequest(_Body):
    expect_epoch: OwnerEpoch


class WakeOut(_Body):
    cursor: int
    session: str
    epoch: int
    seq: int = Field(description="The control/wake entry.")
    at: str


class WakesPage(_Body):
    wakes: list[WakeOut]
    cursor: int = Field(description="Ask again with after=cursor.")


class SessionActivity(_Body):
    session: str
    delivery: str = Field(description="open, fenced, suspended or waking.")
    last_message_seq: int | None = Field(
        default=None, description="The latest client message among the recent entries."
    )
    last_message_at: str | None = None
    quiet_since: str = Field(
        description="No client message since then: the latest one's time or the latest"
        " resume's, whichever is later (when neither is among the recent entries, the oldest"
        " of those entries' time, or the session's creation)."
    )


class HistoryEvent(_Body):
    seq: int = Field(description="The control entry's seq, or a snapshot's watermark.")
    at: str
    event: str = Field(
        description="snapshot, epoch, fence, unfence, suspend, wake, resume, migration,"
        " drained, session_created; forked (this session from detail.from, at seq) and fork"
        " (a fork, detail.fork, made from this session at seq)."
    )
    epoch: int | None = None
    owner: str | None = None
    reason: str | None = None
    detail: dict[str, JsonValue] = Field(default_factory=dict)


class SessionHistory(_Body):
    session: str
    head: int
    events: list[HistoryEvent]
    next_after: int = Field(description="The last seq read: ask again with after=next_after.")
