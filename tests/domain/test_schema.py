"""State schema versions: every stored version loads, steps are idempotent, newer is refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shadowpod.domain.errors import SchemaTooNew, StateDocumentInvalid
from shadowpod.domain.schema import MIGRATIONS, dump_state, load_state, migrate_document
from shadowpod.domain.state import CURRENT_SCHEMA_VERSION, CallStatus, SessionState

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _v1() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / "state_v1.json").read_text())
    return doc


def test_a_stored_v1_state_keeps_loading_with_every_surface() -> None:
    # This fixture was written by schema v1 and must load with every future version.
    state = load_state(_v1())
    assert state.schema_version == CURRENT_SCHEMA_VERSION
    assert state.watermark == 9
    assert [m.content for m in state.transcript][:2] == [
        "Remember that I live in Oslo.",
        "Noted: Oslo.",
    ]
    assert state.memory == {"city": "Oslo"}
    assert sorted(f.text for f in state.facts.values()) == [
        "never email before 8am",
        "user prefers metric units",
    ]
    assert sorted(state.credentials) == ["smtp", "weather-api"]
    assert state.schedules["morning"].every_s == 86400
    assert state.tools.calls["c1"].status is CallStatus.OK
    # v1 had no notion of a turn in progress: an unfinished call is an uncertain effect.
    assert [c.call_id for c in state.tools.uncertain()] == ["c2"]
    assert state.acked_turn == 5
    assert state.pending == {}


def test_the_chain_visits_every_step_in_order() -> None:
    assert sorted(MIGRATIONS) == list(range(1, CURRENT_SCHEMA_VERSION))
    v2 = migrate_document(_v1(), target=2)
    assert v2["schema_version"] == 2
    assert isinstance(v2["facts"], dict) and "tools" in v2 and "done" in v2["tools"]["calls"]["c1"]
    v3 = migrate_document(v2)
    assert v3 == migrate_document(_v1())


@pytest.mark.parametrize("version", sorted(MIGRATIONS))
def test_every_step_is_idempotent(version: int) -> None:
    doc = migrate_document(_v1(), target=version)
    step = MIGRATIONS[version]
    once = step(copy.deepcopy(doc))
    assert step(copy.deepcopy(once)) == once


def test_migration_does_not_touch_the_stored_document() -> None:
    doc = _v1()
    original = copy.deepcopy(doc)
    migrate_document(doc)
    assert doc == original


def test_a_current_document_round_trips_unchanged() -> None:
    state = load_state(_v1())
    assert load_state(dump_state(state)) == state


def test_a_newer_schema_is_refused_naming_both_versions() -> None:
    doc = dump_state(SessionState())
    doc["schema_version"] = CURRENT_SCHEMA_VERSION + 4
    with pytest.raises(SchemaTooNew) as caught:
        load_state(doc)
    message = str(caught.value)
    assert f"v{CURRENT_SCHEMA_VERSION + 4}" in message
    assert f"up to v{CURRENT_SCHEMA_VERSION}" in message
    assert caught.value.reason == "SchemaTooNew"


@pytest.mark.parametrize("version", [None, 0, "2", -1])
def test_a_document_without_a_valid_version_is_not_a_state(version: object) -> None:
    with pytest.raises(StateDocumentInvalid, match="schema_version"):
        migrate_document({"schema_version": version})


def test_a_gap_in_the_registry_is_reported() -> None:
    with pytest.raises(StateDocumentInvalid, match="no migration registered from state schema v1"):
        migrate_document(_v1(), migrations={2: MIGRATIONS[2]})


@pytest.mark.parametrize(
    ("surface", "item", "where"),
    [
        ("transcript", {"seq": 1, "role": "user", "content": "hi", "colour": "red"}, "colour"),
        ("transcript", {"seq": "one", "role": "user", "content": "hi"}, "seq"),
        ("schedules", {"schedule_id": "s", "every_s": 60, "set_seq": 1}, "anchor"),
        ("processes", {"name": "p", "status": "sleeping"}, "status"),
    ],
)
def test_a_stored_item_is_checked_field_by_field(
    surface: str, item: dict[str, Any], where: str
) -> None:
    # Items are built unchecked by the reducer (from payloads it validated); a document
    # from storage must still be checked item by item, unknown fields refused.
    doc = dump_state(SessionState())
    doc[surface] = [item] if surface == "transcript" else {"k": item}
    with pytest.raises(ValidationError) as caught:
        load_state(doc)
    assert caught.value.errors()[0]["loc"][-1] == where
