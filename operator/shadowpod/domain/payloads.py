"""Typed payloads of the journal entry kinds (DESIGN.md §3).

Every known kind has one payload model. Payloads forbid unknown fields so that a typo
is rejected at the gateway with its field path instead of being journaled and
silently ignored forever; free-form data goes into the explicit ``meta``/``args``/
``value`` fields. Kinds this code does not know are accepted as plain JSON (a newer
agent may write them) and kept by the reducer in the ``extensions`` bucket.

Owner outputs carry ``turn``: the seq of the inbound entry whose processing produced
them. That is how the journal records processing order, not only arrival order.
"""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Annotated, Any, Final, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, JsonValue, Strict, create_model, model_validator

from shadowpod.domain.bounds import (
    INT32_MAX,
    INT64_MAX,
    Boolean,
    EntrySeq,
    Epoch,
    Integer,
    SchemaVersion,
)

# A schedule's period. The shortest is a second: each fire is a turn of the agent (an
# LLM call, seconds long), the firer's clock ticks once a second, and with at most
# ``MAX_SCHEDULES_PER_SESSION`` schedules a session then adds at most that many
# entries a second. The longest is a leap year: "once a year" fits, and a longer one
# is almost always a unit mistake (milliseconds given as seconds).
MIN_SCHEDULE_PERIOD_S: Final = 1.0
MAX_SCHEDULE_PERIOD_S: Final = 366 * 86_400.0
SchedulePeriod = Annotated[
    float, Strict(), Field(ge=MIN_SCHEDULE_PERIOD_S, le=MAX_SCHEDULE_PERIOD_S, allow_inf_nan=False)
]
# Schedules one session may have at once (the reducer keeps no more).
MAX_SCHEDULES_PER_SESSION: Final = 32
# A schedule's content is copied into every fire: a prompt, not a document (16 KiB,
# as an AgentSession's schedule message).
MAX_SCHEDULE_CONTENT: Final = 16_384
FireNo = Annotated[Integer, Field(ge=1, le=INT64_MAX)]
# pid_t is a signed 32-bit integer, and 0 is no process.
Pid = Annotated[Integer, Field(ge=1, le=INT32_MAX)]
# POSIX statuses (0-255), Python's negative signal numbers, Windows' 32-bit codes.
ExitCode = Annotated[Integer, Field(ge=-(2**31), le=2**32 - 1)]
# Names an owner (a pod, an instance): a Kubernetes object name at most.
OwnerName = Annotated[str, Field(min_length=1, max_length=253)]


class EntryKind(StrEnum):
    MESSAGE = "message"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    MEMORY = "memory"
    FACT = "fact"
    SCHEDULE = "schedule"
    PROCESS = "process"
    CREDENTIAL = "credential"
    STATE = "state"
    ACK = "ack"
    CONTROL = "control"


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TurnScoped(Payload):
    turn: EntrySeq | None = Field(
        default=None, description="Seq of the inbound entry this output belongs to."
    )


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class MessagePayload(TurnScoped):
    role: Role
    content: str = Field(max_length=1_000_000)
    meta: dict[str, JsonValue] = Field(default_factory=dict)


class ToolCallPayload(TurnScoped):
    """The intent, journaled *before* the tool runs."""

    call_id: str = Field(min_length=1, max_length=200)
    tool: str = Field(min_length=1, max_length=200)
    args: dict[str, JsonValue] = Field(default_factory=dict)
    idempotent: Boolean = Field(
        default=False, description="Safe to repeat when its outcome is unknown."
    )


class ToolStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    # The new owner found an intent without a result and chose not to repeat it.
    ABANDONED = "abandoned"
    # The call stopped to ask (a framework's interrupt: human in the loop) before it
    # finished: no outcome, no side effect owed; the framework runs it again when the
    # answer resumes it.
    INTERRUPTED = "interrupted"


class ToolResultPayload(TurnScoped):
    call_id: str = Field(min_length=1, max_length=200)
    status: ToolStatus = ToolStatus.OK
    result: JsonValue = None
    error: str | None = None


class MemoryOp(StrEnum):
    SET = "set"
    DELETE = "delete"


class MemoryPayload(TurnScoped):
    key: str = Field(min_length=1, max_length=500)
    op: MemoryOp = MemoryOp.SET
    value: JsonValue = None


class FactOp(StrEnum):
    ADD = "add"
    RETRACT = "retract"


class FactPayload(TurnScoped):
    """A durable fact: a correction or learned rule that must survive compaction."""

    fact_id: str = Field(min_length=1, max_length=200)
    op: FactOp = FactOp.ADD
    text: str = Field(default="", max_length=100_000)


class ScheduleOp(StrEnum):
    SET = "set"
    CANCEL = "cancel"
    FIRE = "fire"


class SchedulePayload(TurnScoped):
    """Schedules belong to the session id; the gateway journals each ``fire``.

    A fire is an inbound entry (epoch 0) whose id is derived from
    ``(schedule_id, set_seq, fire_no)``, so journal idempotency makes it exactly-once
    whoever fires it.
    """

    # Short enough that the fire id ``schedule:<id>:<set_seq>:<n>`` stays a valid entry id.
    schedule_id: str = Field(min_length=1, max_length=150)
    op: ScheduleOp
    every_s: SchedulePeriod | None = None
    content: str = Field(default="", max_length=MAX_SCHEDULE_CONTENT)
    fire_no: FireNo | None = None
    # A ``set`` whose fires wake the session while it is suspended (absent: they wait).
    wake: Annotated[bool, Strict()] = False

    @classmethod
    def setting(
        cls,
        schedule_id: str,
        *,
        every_s: float,
        content: str = "",
        wake: bool = False,
        turn: int | None = None,
    ) -> SchedulePayload:
        """A ``set``. ``wake`` is written only when true: the entries of a schedule that
        does not wake stay the ones a gateway without the field reads (``extra`` is
        forbidden)."""
        fields: dict[str, object] = {
            "schedule_id": schedule_id,
            "op": ScheduleOp.SET,
            "every_s": every_s,
            "content": content,
        }
        if turn is not None:
            fields["turn"] = turn
        if wake:
            fields["wake"] = True
        return cls.model_validate(fields)


class ProcessOp(StrEnum):
    STARTED = "started"
    EXITED = "exited"
    TERMINATED = "terminated"
    KILLED = "killed"


class ProcessPayload(TurnScoped):
    name: str = Field(min_length=1, max_length=200)
    op: ProcessOp
    command: list[str] = Field(default_factory=list)
    pid: Pid | None = None
    exit_code: ExitCode | None = None


class CredentialOp(StrEnum):
    BIND = "bind"
    UNBIND = "unbind"


class CredentialPayload(Payload):
    """A credential *binding*: its name and where it comes from, never its value.

    ``extra="forbid"`` is what keeps a secret value out of the journal: an entry that
    tries to carry one is rejected.
    """

    name: str = Field(min_length=1, max_length=200)
    op: CredentialOp = CredentialOp.BIND
    secret_ref: str | None = Field(default=None, max_length=500)


# A split state entry has at most this many parts (of up to a gateway's body each).
MAX_STATE_PARTS: Final = 100_000


class StatePart(Payload):
    """One of ``count`` parts of a ``state`` entry too large for one append.

    ``data`` is a slice of the base64 text of the whole payload's JSON (base64: a slice
    of JSON text would be escaped again inside its part, to a size nobody can tell in
    advance). Parts of one ``group`` are journaled in order; the reducer applies the
    whole entry when the last one arrives, and nothing of it before.
    """

    group: str = Field(min_length=1, max_length=200)
    index: Integer = Field(ge=0, le=MAX_STATE_PARTS - 1)
    count: Integer = Field(ge=1, le=MAX_STATE_PARTS)
    data: str = Field(min_length=1)


# How deep a delta may reach into the agent's state, and how many one entry carries.
MAX_STATE_PATH: Final = 64
MAX_STATE_OPS: Final = 10_000
StateKey = str | Annotated[Integer, Field(ge=0, le=INT64_MAX)]


class StateOpKind(StrEnum):
    SET = "set"  # ``value`` at ``path`` (a key of an object, or an index of a list)
    DELETE = "delete"  # the key (or list item) at ``path``
    APPEND = "append"  # ``items`` at the end of the list at ``path`` (made if missing)


class StateOp(Payload):
    """One change of the agent's state: O(change) bytes, whatever the state's size.

    ``path`` names where, from the top of the values: object keys as strings, list
    indexes as integers (``["messages"]``, ``["graph", "steps", 3]``).
    """

    op: StateOpKind
    path: list[StateKey] = Field(min_length=1, max_length=MAX_STATE_PATH)
    value: JsonValue = None
    items: list[JsonValue] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fields_of_the_op(self) -> StateOp:
        if self.op is not StateOpKind.APPEND and self.items:
            raise ValueError(f"items are for an append; a {self.op.value} takes none")
        if self.op is not StateOpKind.SET and self.value is not None:
            raise ValueError(f"value is for a set; a {self.op.value} takes none")
        if not isinstance(self.path[0], str):
            raise ValueError("a path starts with a key of the values (a string)")
        return self


class StatePayload(TurnScoped):
    """The agent's own structured state, journaled so that state stays a pure fold.

    ``values`` (top-level keys set whole, or all values with ``replace``) is what
    every version writes for a migrated state and what older agents write each turn;
    ``ops`` are deltas applied after them, in order (see ``shadowpod.domain.deltas``).
    """

    values: dict[str, JsonValue] = Field(default_factory=dict)
    replace: Boolean = False
    ops: list[StateOp] = Field(default_factory=list, max_length=MAX_STATE_OPS)
    schema_version: SchemaVersion = 1
    part: StatePart | None = Field(
        default=None, description="Set on the parts of an entry too large for one append."
    )

    @model_validator(mode="after")
    def _a_part_carries_only_its_part(self) -> StatePayload:
        if self.part is not None and (self.values or self.replace or self.ops):
            raise ValueError("a state part carries no values of its own: they are in its data")
        return self


class AckPayload(Payload):
    """The end of a turn: the owner has processed inbound entry ``turn``."""

    turn: EntrySeq


class ControlEvent(StrEnum):
    SESSION_CREATED = "session_created"
    FENCE = "fence"
    UNFENCE = "unfence"
    EPOCH = "epoch"
    # Asks the owner for a snapshot taken at (or after) this entry, while it serves.
    SNAPSHOT_REQUEST = "snapshot_request"
    # A fenced owner reports that it stopped and what background work it ended.
    DRAINED = "drained"
    MIGRATION = "migration"
    # Session lifecycle: fenced to an owner that is not started; a message asked for
    # one; the owner started and delivery opened again.
    SUSPEND = "suspend"
    WAKE = "wake"
    RESUME = "resume"


class ControlPayload(Payload):
    event: ControlEvent
    epoch: Epoch | None = None
    owner: OwnerName | None = None
    reason: str | None = Field(default=None, max_length=1000)
    detail: dict[str, JsonValue] = Field(default_factory=dict)


PAYLOAD_MODELS: Final[dict[str, type[Payload]]] = {
    EntryKind.MESSAGE: MessagePayload,
    EntryKind.TOOL_CALL: ToolCallPayload,
    EntryKind.TOOL_RESULT: ToolResultPayload,
    EntryKind.MEMORY: MemoryPayload,
    EntryKind.FACT: FactPayload,
    EntryKind.SCHEDULE: SchedulePayload,
    EntryKind.PROCESS: ProcessPayload,
    EntryKind.CREDENTIAL: CredentialPayload,
    EntryKind.STATE: StatePayload,
    EntryKind.ACK: AckPayload,
    EntryKind.CONTROL: ControlPayload,
}


def parse_payload(kind: str, payload: dict[str, Any]) -> Payload | None:
    """The typed payload of a known kind, or ``None`` for a kind this code doesn't know."""
    model = PAYLOAD_MODELS.get(kind)
    return None if model is None else model.model_validate(payload)


def read_back_model(model: type[Payload]) -> type[Payload]:
    """``model`` for payloads read back from the journal: a subclass whose free-form
    JSON values (``meta``, ``args``, ``value``, ...) are taken as they are.

    What the journal holds is JSON — parsed from JSON text, or checked when it was
    appended — and pydantic checks a ``JsonValue`` with a Python call per value: for
    a reply's ``meta`` that was 40% of validating it, and a shadow validates every
    payload it folds. Everything else is checked as before (a wrong role or a missing
    field still fails), and the result is still an instance of ``model``.
    """
    overrides: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = _json_values_as_they_are(field.annotation)
        if annotation is not field.annotation:
            taken = copy.copy(field)
            taken.annotation = annotation
            overrides[name] = (annotation, taken)
    if not overrides:
        return model
    derived: type[Payload] = create_model(
        f"{model.__name__}ReadBack", __base__=model, __module__=model.__module__, **overrides
    )
    return derived


def _json_values_as_they_are(annotation: Any) -> Any:
    if annotation is JsonValue:
        return Any
    if get_origin(annotation) is dict:
        key, value = get_args(annotation)
        unchecked = _json_values_as_they_are(value)
        return annotation if unchecked is value else dict.__class_getitem__((key, unchecked))
    return annotation
