"""Journal entries: what is appended (``NewEntry``) and what is stored (``JournalEntry``).

DESIGN.md §3: ``seq`` (per session, gap-free from 1), ``id`` (idempotency key),
``kind``, ``epoch`` (owner generation that wrote it, 0 for inbound), ``ts`` (UTC) and
``payload`` (JSON). ``seq``, ``epoch`` and ``ts`` are assigned by the store, so callers
build ``NewEntry`` values and get ``JournalEntry`` values back.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)

from shadowpod.domain.bounds import EntrySeq, Epoch
from shadowpod.domain.payloads import (
    PAYLOAD_MODELS,
    EntryKind,
    Payload,
    Role,
    ScheduleOp,
    parse_payload,
)

SESSION_ID_PATTERN: Final = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$")
KIND_PATTERN: Final = r"^[a-z][a-z0-9_.]{0,63}$"
ENTRY_ID_MAX: Final = 200
INBOUND_EPOCH: Final = 0


def check_session_id(session: str) -> str:
    """Session ids are DNS-1123-like so they can name Kubernetes objects too."""
    if not SESSION_ID_PATTERN.fullmatch(session):
        raise ValueError(
            f"invalid session id {session!r}: use 1-128 lowercase letters, digits, '.', "
            "'_' or '-', starting and ending with a letter or digit"
        )
    return session


SessionId = Annotated[str, AfterValidator(check_session_id)]


def new_entry_id() -> str:
    """A unique id that sorts by creation time (like UUIDv7: 48-bit ms clock + 80 random bits).

    Time order keeps the store's id index appending at its right edge instead of
    touching a random page per entry.
    """
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


class NewEntry(BaseModel):
    """An entry to append. Payloads of known kinds are validated and normalised."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(default_factory=new_entry_id, min_length=1, max_length=ENTRY_ID_MAX)
    kind: str = Field(pattern=KIND_PATTERN)
    # validate_default: a known kind sent without a payload is checked like any other.
    payload: dict[str, JsonValue] = Field(default_factory=dict, validate_default=True)

    @field_validator("payload")
    @classmethod
    def _payload_matches_kind(
        cls, payload: dict[str, JsonValue], info: ValidationInfo
    ) -> dict[str, JsonValue]:
        kind = info.data.get("kind")
        model = PAYLOAD_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            return payload
        # Normalised: coerced values, only the fields given, so stored bytes stay small.
        typed = model.model_validate(payload)
        normalised: dict[str, JsonValue] = typed.model_dump(mode="json", exclude_unset=True)
        return normalised

    @classmethod
    def of(cls, payload: Payload, *, id: str | None = None) -> NewEntry:
        """Build an entry from a typed payload (the kind follows from its type).

        The payload was validated when it was built, so it is not validated again.
        """
        return cls.model_construct(
            id=new_entry_id() if id is None else id,
            kind=_KIND_OF_MODEL[type(payload)],
            payload=payload.model_dump(mode="json", exclude_unset=True),
        )


_KIND_OF_MODEL: Final[dict[type[Payload], str]] = {
    model: kind for kind, model in PAYLOAD_MODELS.items()
}


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A stored entry: a plain value, cheap to build (stores make millions of them).

    Stores construct it directly from rows they validated on append; data from outside
    (HTTP) goes through ``parse_journal_entry``, which checks every field.
    """

    seq: EntrySeq
    id: Annotated[str, Field(min_length=1, max_length=ENTRY_ID_MAX)]
    kind: Annotated[str, Field(pattern=KIND_PATTERN)]
    epoch: Epoch
    ts: AwareDatetime
    payload: dict[str, Any]

    def typed(self) -> Payload | None:
        return parse_payload(self.kind, self.payload)

    @property
    def turn(self) -> int | None:
        """The inbound seq this output belongs to, if it is a turn output."""
        turn = self.payload.get("turn") if self.kind != EntryKind.ACK else None
        return turn if isinstance(turn, int) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.id,
            "kind": self.kind,
            "epoch": self.epoch,
            "ts": format_ts(self.ts),
            "payload": self.payload,
        }


_ENTRY_ADAPTER: Final = TypeAdapter(JournalEntry)


def parse_journal_entry(data: Any) -> JournalEntry:
    """A ``JournalEntry`` from untrusted data (e.g. JSON), every field validated."""
    entry = _ENTRY_ADAPTER.validate_python(data)
    return replace(entry, ts=entry.ts.astimezone(UTC))


def entry_from_json(data: dict[str, Any]) -> JournalEntry:
    """A ``JournalEntry`` from the gateway's own JSON (``to_json``), without validation.

    For the catch-up path, which must replay tens of thousands of entries a second;
    anything from an untrusted source goes through ``parse_journal_entry``.
    """
    return JournalEntry(
        data["seq"],
        data["id"],
        data["kind"],
        data["epoch"],
        datetime.fromisoformat(data["ts"]),
        data["payload"],
    )


def format_ts(ts: datetime) -> str:
    """UTC ISO 8601 with microseconds and a ``Z`` suffix."""
    if ts.tzinfo is not UTC:
        ts = ts.astimezone(UTC)
    return ts.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


# Kinds whose payload names a turn: a turn's outputs and its ack.
TURN_KINDS: Final = frozenset(
    kind for kind, model in PAYLOAD_MODELS.items() if "turn" in model.model_fields
)


def named_turn(entry: NewEntry) -> int | None:
    """The turn an entry to append names: the seq of the inbound entry whose processing
    it belongs to (an output) or ends (an ack)."""
    if entry.kind not in TURN_KINDS:
        return None
    turn = entry.payload.get("turn")
    return turn if isinstance(turn, int) else None


def is_inbound(entry: JournalEntry) -> bool:
    """Inbound entries are what the gateway delivers to the owner, one turn each."""
    if entry.epoch != INBOUND_EPOCH:
        return False
    if entry.kind == EntryKind.MESSAGE:
        return entry.payload.get("role") in (Role.USER, Role.SYSTEM)
    if entry.kind == EntryKind.SCHEDULE:
        return entry.payload.get("op") == ScheduleOp.FIRE
    return False


def schedule_fire_id(schedule_id: str, set_seq: int, fire_no: int) -> str:
    """The idempotency key of the n-th fire: whoever fires it, it is journaled once.

    ``set_seq`` (the seq of the ``set`` entry) tells a schedule set again under the same
    id from the one before: its fires count from 1 again, and must not be taken for
    the earlier one's (they would be absorbed as duplicates, never journaled).
    """
    return f"schedule:{schedule_id}:{set_seq}:{fire_no}"
