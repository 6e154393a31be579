"""State schema versions and the migration steps between them.

A snapshot stores the state document with its ``schema_version``. Loading one runs
every registered step from its version up to ``CURRENT_SCHEMA_VERSION``. Steps work
on the JSON document (not on models), so a document from any past version can be
read by today's code, and each step is idempotent: it checks the shape it converts,
so running it on an already-converted document changes nothing.

History:

- v1: facts as a list of strings; credentials as a list of names; schedules with
  ``interval_s``; tool calls with a ``done`` flag; inbound messages entered the
  transcript when they arrived.
- v2: facts carry an id and the seq that stated them; credential bindings carry their
  Secret reference; schedules use ``every_s`` and record their anchor.
- v3: processing order (pending inbound, ``acked_turn``, turn of each message); tool
  calls have a ``status`` (``pending`` is an uncertain side effect) and the ledger
  records which tools are declared idempotent; the agent's own state and schema.
- v4: the parts of a split agent-state entry that have arrived so far
  (``agent.parts``); a v3 document has none.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from shadowpod.domain.errors import SchemaTooNew, StateDocumentInvalid
from shadowpod.domain.state import CURRENT_SCHEMA_VERSION, SessionState

Document = dict[str, Any]
MigrationStep = Callable[[Document], Document]

# The anchor given to schedules that predate v2 (which did not record one): fires are
# then due immediately, which is the safe side for a schedule that was already live.
_UNKNOWN_ANCHOR: Final = datetime(1970, 1, 1, tzinfo=UTC).isoformat()


def _v1_to_v2(doc: Document) -> Document:
    facts = doc.get("facts", [])
    if isinstance(facts, list):
        doc["facts"] = {
            f"v1-{index}": {"fact_id": f"v1-{index}", "text": str(text), "seq": 0}
            for index, text in enumerate(facts)
        }
    credentials = doc.get("credentials", [])
    if isinstance(credentials, list):
        doc["credentials"] = {
            str(name): {"name": str(name), "secret_ref": None} for name in credentials
        }
    schedules = doc.get("schedules", {})
    for schedule_id, schedule in schedules.items():
        if "interval_s" in schedule:
            schedule["every_s"] = schedule.pop("interval_s")
        schedule.setdefault("schedule_id", schedule_id)
        schedule.setdefault("anchor", _UNKNOWN_ANCHOR)
        schedule.setdefault("set_seq", 0)
    return doc


def _v2_to_v3(doc: Document) -> Document:
    tools = doc.setdefault("tools", {})
    calls = tools.setdefault("calls", {})
    declared = tools.setdefault("declared", {})
    for call in calls.values():
        if "done" in call:
            call["status"] = "ok" if call.pop("done") else "pending"
        declared.setdefault(call.get("tool", ""), bool(call.get("idempotent", False)))
    declared.pop("", None)
    # v2 put inbound messages into the transcript on arrival and had no notion of a
    # turn in progress, so everything it holds has been processed.
    transcript = doc.setdefault("transcript", [])
    for message in transcript:
        message.setdefault("turn", message["seq"] if message.get("role") == "user" else None)
        message.setdefault("epoch", 0)
    doc.setdefault("pending", {})
    if "acked_turn" not in doc:
        user_seqs = [m["seq"] for m in transcript if m.get("role") == "user"]
        doc["acked_turn"] = max(user_seqs, default=0)
    doc.setdefault("agent", {"values": {}, "schema_version": 1})
    return doc


def _v3_to_v4(doc: Document) -> Document:
    agent = doc.setdefault("agent", {"values": {}, "schema_version": 1})
    agent.setdefault("parts", {})
    return doc


# MIGRATIONS[n] turns a version-n document into a version-(n+1) document.
MIGRATIONS: Final[Mapping[int, MigrationStep]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
}


def migrate_document(
    doc: Mapping[str, Any],
    *,
    target: int = CURRENT_SCHEMA_VERSION,
    migrations: Mapping[int, MigrationStep] = MIGRATIONS,
) -> Document:
    """A copy of ``doc`` brought up to ``target`` through the registered steps."""
    version = doc.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise StateDocumentInvalid(
            f"not a Shadowpod session state: schema_version is {version!r}, "
            "expected a positive integer"
        )
    if version > target:
        raise SchemaTooNew(found=version, supported=target)
    if version == target:
        return dict(doc)  # nothing to change: no copy of what may be megabytes
    migrated: Document = copy.deepcopy(dict(doc))
    for step_from in range(version, target):
        step = migrations.get(step_from)
        if step is None:
            raise StateDocumentInvalid(
                f"no migration registered from state schema v{step_from} to v{step_from + 1}"
            )
        migrated = step(migrated)
        migrated["schema_version"] = step_from + 1
    return migrated


def load_state(doc: Mapping[str, Any]) -> SessionState:
    """A ``SessionState`` from a stored document of any known schema version."""
    return SessionState.model_validate(migrate_document(doc))


def dump_state(state: SessionState) -> Document:
    document: Document = state.model_dump(mode="json")
    return document
