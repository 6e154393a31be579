"""Session state: the seven surfaces of DESIGN.md §1 as one versioned document.

State is a pure fold of the journal (see ``shadowpod.domain.reducer``). Items inside
the surfaces are frozen; the containers are owned by whoever folds, which is what
lets a fold run in place without a copy per entry.

Items are plain frozen dataclasses, not pydantic models: a shadow catching up builds
several per turn, tens of thousands a second, and the reducer builds them only from
payloads it has already validated. Validation stays at the edges: a state loaded from
a document (``SessionState.model_validate``) checks every item field, and forbids
unknown ones, as before. JSON values inside items (``Json``) are not walked again: a
document is JSON when it is parsed, and a payload's values were checked as the
payload was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, JsonValue, SkipValidation

from shadowpod.domain.payloads import ProcessOp, Role, ToolStatus

CURRENT_SCHEMA_VERSION: Final = 4

Json: TypeAlias = SkipValidation[JsonValue]
_ITEM_CONFIG: Final = ConfigDict(extra="forbid")


def _json_object() -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptMessage:
    __pydantic_config__ = _ITEM_CONFIG

    seq: int
    role: Role
    content: str
    turn: int | None = None
    epoch: int = 0
    meta: dict[str, Json] = field(default_factory=_json_object)


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingInbound:
    """An inbound entry not yet acked: the owner (or the next one) must process it.

    ``started`` means its turn began (it is in the transcript) but did not finish —
    a new owner redoes such a turn, consulting the tool ledger for what already ran.
    """

    __pydantic_config__ = _ITEM_CONFIG

    seq: int
    id: str
    kind: str
    role: Role = Role.USER
    content: str = ""
    schedule_id: str | None = None
    meta: dict[str, Json] = field(default_factory=_json_object)
    started: bool = False


class CallStatus(StrEnum):
    PENDING = "pending"  # intent journaled, no result: an uncertain side effect
    OK = ToolStatus.OK.value
    ERROR = ToolStatus.ERROR.value
    ABANDONED = ToolStatus.ABANDONED.value
    INTERRUPTED = ToolStatus.INTERRUPTED.value


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    __pydantic_config__ = _ITEM_CONFIG
    call_id: str
    tool: str
    args: dict[str, Json] = field(default_factory=_json_object)
    idempotent: bool = False
    turn: int | None = None
    intent_seq: int | None = None
    status: CallStatus = CallStatus.PENDING
    result: Json = None
    error: str | None = None
    result_seq: int | None = None


class ToolLedger(BaseModel):
    """Which tools ran, with what, and what came back."""

    model_config = ConfigDict(extra="forbid")

    calls: dict[str, ToolCall] = Field(default_factory=dict)
    # Tool name -> declared idempotent (the latest declaration wins).
    declared: dict[str, bool] = Field(default_factory=dict)

    def uncertain(self) -> list[ToolCall]:
        """Calls whose intent is journaled but whose outcome is not."""
        return [call for call in self.calls.values() if call.status is CallStatus.PENDING]

    def is_idempotent(self, tool: str) -> bool:
        return self.declared.get(tool, False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    __pydantic_config__ = _ITEM_CONFIG
    schedule_id: str
    every_s: float
    content: str = ""
    anchor: datetime  # the ts of the entry that set it; fire n is due at anchor + n*every_s
    set_seq: int
    fired: int = 0  # the highest fire_no journaled
    last_fire_seq: int | None = None
    wake: bool = False  # a fire asks a suspended session to wake


@dataclass(frozen=True, slots=True, kw_only=True)
class CredentialBinding:
    """A credential the session needs, by name. Values never enter the state."""

    __pydantic_config__ = _ITEM_CONFIG

    name: str
    secret_ref: str | None = None


class ProcessStatus(StrEnum):
    RUNNING = "running"
    EXITED = ProcessOp.EXITED.value
    TERMINATED = ProcessOp.TERMINATED.value
    KILLED = ProcessOp.KILLED.value


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessRecord:
    __pydantic_config__ = _ITEM_CONFIG
    name: str
    command: list[str] = field(default_factory=list)
    pid: int | None = None
    status: ProcessStatus = ProcessStatus.RUNNING
    exit_code: int | None = None
    started_seq: int | None = None
    ended_seq: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    __pydantic_config__ = _ITEM_CONFIG
    fact_id: str
    text: str
    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StateParts:
    """The parts of a split ``state`` entry that have arrived so far, in order."""

    __pydantic_config__ = _ITEM_CONFIG

    turn: int | None = None
    count: int
    data: tuple[str, ...] = ()


class AgentState(BaseModel):
    """The agent's own structured state (``state`` entries), in the agent's schema."""

    model_config = ConfigDict(extra="forbid")

    values: dict[str, Json] = Field(default_factory=dict)
    schema_version: int = 1
    # Split state entries not complete yet, by group (see ``StatePart``): kept in the
    # state so that a snapshot taken between two parts folds on like the journal does.
    parts: dict[str, StateParts] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtensionEntry:
    """An entry of a kind this code does not know (or cannot parse): kept, never dropped."""

    __pydantic_config__ = _ITEM_CONFIG

    seq: int
    kind: str
    epoch: int
    payload: dict[str, Json] = field(default_factory=_json_object)
    error: str | None = None


class SessionState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = CURRENT_SCHEMA_VERSION
    watermark: int = Field(default=0, ge=0, description="Seq of the last entry folded in.")
    epoch: int = Field(default=0, ge=0, description="Owner epoch as of the watermark.")
    owner: str | None = Field(default=None, description="Owner named by the latest epoch.")
    acked_turn: int = Field(default=0, ge=0, description="Last inbound seq fully processed.")

    transcript: list[TranscriptMessage] = Field(default_factory=list)
    pending: dict[int, PendingInbound] = Field(default_factory=dict)
    tools: ToolLedger = Field(default_factory=ToolLedger)
    memory: dict[str, Json] = Field(default_factory=dict)
    schedules: dict[str, Schedule] = Field(default_factory=dict)
    credentials: dict[str, CredentialBinding] = Field(default_factory=dict)
    processes: dict[str, ProcessRecord] = Field(default_factory=dict)
    facts: dict[str, Fact] = Field(default_factory=dict)
    agent: AgentState = Field(default_factory=AgentState)
    extensions: list[ExtensionEntry] = Field(default_factory=list)

    def working_copy(self) -> SessionState:
        """A copy whose containers may be mutated without touching ``self``.

        Items are frozen and shared; only the containers are copied, so this is
        proportional to the number of items, not to their size.
        """
        return self.model_copy(
            update={
                "transcript": list(self.transcript),
                "pending": dict(self.pending),
                "tools": ToolLedger.model_construct(
                    calls=dict(self.tools.calls), declared=dict(self.tools.declared)
                ),
                "memory": dict(self.memory),
                "schedules": dict(self.schedules),
                "credentials": dict(self.credentials),
                "processes": dict(self.processes),
                "facts": dict(self.facts),
                "agent": AgentState.model_construct(
                    values=dict(self.agent.values),
                    schema_version=self.agent.schema_version,
                    parts=dict(self.agent.parts),
                ),
                "extensions": list(self.extensions),
            }
        )
