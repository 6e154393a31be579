"""Golden sessions: a slice of a real session's journal, kept as a test of behaviour.

A golden file is JSON Lines, versioned by its first line::

    {"golden": 1, "session": "s1", "from_seq": 12, "to_seq": 40, ...}   header
    {"base": {...state document...}}                                     the state before from_seq
    {"entry": {"seq": 12, "kind": "message", "payload": {...}, ...}}     one per journal entry

Replaying one answers each inbound message of the slice again, from the state the
session had when its turn started, and compares the answers with those recorded.

Secrets are never written: the journal holds none by design (credentials are Secret
references mounted into pods, DESIGN.md §1), and the recorder also drops the surfaces
where an operational string could carry one (process command lines, credential
bindings, control entries) and replaces, in every string it keeps, each match of a
known secret shape (API keys, bearer tokens, JWTs, private keys) and each exact value
it is given (the token it read with, ``--secret``) by ``[redacted]``. The header
counts what was redacted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shadowpod.domain.entries import JournalEntry, parse_journal_entry
from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.domain.state import SessionState

GOLDEN_FORMAT: Final = 1
REDACTED: Final = "[redacted]"
# Kinds a golden slice keeps: what the agent saw, said, did and learnt.
KEPT_KINDS: Final = frozenset(
    {"message", "tool_call", "tool_result", "memory", "fact", "schedule", "state", "ack"}
)
SECRET_SHAPES: Final[tuple[str, ...]] = (
    r"\bsk-[A-Za-z0-9_-]{16,}",  # OpenAI-style API keys
    r"\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\b[Bb]earer\s+[A-Za-z0-9._~+/=-]{8,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+",  # JWTs
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
)


class GoldenInvalid(ShadowpodError):
    """A golden file that cannot be read: says which line and what is wrong."""


class GoldenHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    golden: int = Field(GOLDEN_FORMAT, description="Format version of the file.")
    session: str
    from_seq: int = Field(ge=1)
    to_seq: int = Field(ge=0)
    recorded_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    redacted: int = Field(0, ge=0, description="Secrets replaced by [redacted].")
    note: str = ""


class GoldenFile(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    header: GoldenHeader
    base: SessionState
    entries: list[JournalEntry]

    def dumps(self) -> str:
        lines = [
            self.header.model_dump(mode="json"),
            {"base": dump_state(self.base)},
            *({"entry": entry.to_json()} for entry in self.entries),
        ]
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)

    def write(self, path: Path) -> None:
        path.write_text(self.dumps())

    @classmethod
    def read(cls, path: Path) -> GoldenFile:
        try:
            text = path.read_text()
        except OSError as exc:
            raise GoldenInvalid(f"cannot read golden file {path}: {exc}") from exc
        return cls.loads(text, name=str(path))

    @classmethod
    def loads(cls, text: str, *, name: str = "golden file") -> GoldenFile:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise GoldenInvalid(
                f"{name}: expected a header line and a base line, found {len(lines)} line(s)"
            )
        raw = [_json_line(name, n, line) for n, line in enumerate(lines, start=1)]
        version = raw[0].get("golden")
        if version != GOLDEN_FORMAT:
            raise GoldenInvalid(
                f"{name}: golden format {version!r} is not one this version reads "
                f"({GOLDEN_FORMAT}); record it again with this shadowpod"
            )
        try:
            header = GoldenHeader.model_validate(raw[0])
            if "base" not in raw[1]:
                raise GoldenInvalid(f'{name}, line 2: expected {{"base": state document}}')
            base = load_state(raw[1]["base"])
            entries = []
            for n, item in enumerate(raw[2:], start=3):
                if "entry" not in item:
                    raise GoldenInvalid(f'{name}, line {n}: expected {{"entry": ...}}')
                entries.append(parse_journal_entry(item["entry"]))
        except (ValidationError, ShadowpodError) as exc:
            if isinstance(exc, GoldenInvalid):
                raise
            raise GoldenInvalid(f"{name}: {exc}") from exc
        return cls(header=header, base=base, entries=entries)


def _json_line(name: str, n: int, line: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise GoldenInvalid(f"{name}, line {n}: not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise GoldenInvalid(f"{name}, line {n}: expected a JSON object")
    return value


class Redactor:
    """Replaces secrets in every string of a JSON value, and counts them."""

    def __init__(
        self, secrets: Iterable[str] = (), patterns: Sequence[str] = SECRET_SHAPES
    ) -> None:
        exact = sorted({s for s in secrets if s}, key=len, reverse=True)
        alternatives = [re.escape(s) for s in exact] + [f"(?:{p})" for p in patterns]
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None
        self.count = 0

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text
        scrubbed, found = self._pattern.subn(REDACTED, text)
        self.count += found
        return scrubbed

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {
                self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()
            }
        return value


def cut_golden(
    base: SessionState,
    entries: Sequence[JournalEntry],
    *,
    session: str,
    from_seq: int,
    to_seq: int | None = None,
    secrets: Iterable[str] = (),
    note: str = "",
) -> GoldenFile:
    """A golden file of ``entries`` from ``from_seq`` to ``to_seq`` (the end when
    ``None``) over ``base``, the state at ``from_seq - 1``. The slice is widened to the
    end of the last turn it starts, so every turn in it is whole."""
    if base.watermark >= from_seq:
        raise ValueError(f"the base state is at seq {base.watermark}, past from_seq {from_seq}")
    inside = [e for e in entries if e.seq >= from_seq and (to_seq is None or e.seq <= to_seq)]
    inbound = {e.seq for e in inside if e.epoch == 0 and e.kind in ("message", "schedule")}
    tail = [e for e in entries if to_seq is not None and e.seq > to_seq and _turn_of(e) in inbound]
    kept = [e for e in (*inside, *tail) if e.kind in KEPT_KINDS]
    redactor = Redactor(secrets)
    scrubbed_base = _scrub_state(base, redactor)
    scrubbed = [
        JournalEntry(e.seq, e.id, e.kind, e.epoch, e.ts, redactor.value(e.payload)) for e in kept
    ]
    last = max((e.seq for e in inside + tail), default=from_seq - 1)
    header = GoldenHeader(
        session=session, from_seq=from_seq, to_seq=last, redacted=redactor.count, note=note
    )
    return GoldenFile(header=header, base=scrubbed_base, entries=scrubbed)


def _scrub_state(state: SessionState, redactor: Redactor) -> SessionState:
    document = dump_state(state)
    document["credentials"] = {}
    document["processes"] = {}
    document["extensions"] = []
    return load_state(redactor.value(document))


def _turn_of(entry: JournalEntry) -> int | None:
    turn = entry.payload.get("turn")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else None
