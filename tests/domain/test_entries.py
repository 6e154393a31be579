"""Entries are validated on the way in, with the field path of what is wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from shadowpod.domain.entries import (
    JournalEntry,
    NewEntry,
    check_session_id,
    is_inbound,
    parse_journal_entry,
    schedule_fire_id,
)
from shadowpod.domain.payloads import MessagePayload, Role, ToolCallPayload


def _locs(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in err["loc"]) for err in exc.errors()]


def test_a_malformed_payload_is_rejected_with_its_field_path() -> None:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind="message", payload={"role": "robot", "content": 7})
    assert _locs(caught.value) == ["payload.role", "payload.content"]


def test_a_missing_payload_field_is_named() -> None:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind="tool_call", payload={"tool": "search"})
    assert _locs(caught.value) == ["payload.call_id"]


def test_unknown_fields_of_known_kinds_are_rejected_so_typos_do_not_vanish() -> None:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind="memory", payload={"key": "k", "vlaue": 1})
    assert _locs(caught.value) == ["payload.vlaue"]


def test_a_credential_entry_cannot_carry_a_secret_value() -> None:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind="credential", payload={"name": "openai", "value": "sk-123"})
    assert _locs(caught.value) == ["payload.value"]


def test_unknown_kinds_are_accepted_as_plain_json_for_newer_agents() -> None:
    entry = NewEntry(kind="x.custom_note", payload={"anything": [1, 2]})
    assert entry.payload == {"anything": [1, 2]}


@pytest.mark.parametrize("kind", ["", "Message", "has space", "9lives"])
def test_a_bad_kind_name_is_rejected(kind: str) -> None:
    with pytest.raises(ValidationError) as caught:
        NewEntry(kind=kind)
    assert _locs(caught.value) == ["kind"]


def test_payloads_are_normalised_to_the_fields_given() -> None:
    entry = NewEntry(kind="message", payload={"role": "user", "content": "hi", "turn": 3})
    assert entry.payload == {"role": "user", "content": "hi", "turn": 3}  # no defaults added
    with pytest.raises(ValidationError):  # integers are strict: "3" is not the seq 3
        NewEntry(kind="message", payload={"role": "user", "content": "hi", "turn": "3"})


def test_entries_get_a_fresh_id_when_none_is_given() -> None:
    first, second = (
        NewEntry(kind="message", payload={"role": "user", "content": "a"}),
        NewEntry(kind="message", payload={"role": "user", "content": "a"}),
    )
    assert first.id != second.id


def test_an_entry_built_from_a_typed_payload_has_the_matching_kind() -> None:
    entry = NewEntry.of(ToolCallPayload(call_id="c1", tool="search", turn=4), id="x")
    assert (entry.id, entry.kind, entry.payload) == (
        "x",
        "tool_call",
        {"call_id": "c1", "tool": "search", "turn": 4},
    )


def _entry(kind: str, epoch: int, **payload: object) -> JournalEntry:
    return JournalEntry(1, "id", kind, epoch, datetime.now(UTC), dict(payload))


def test_inbound_is_what_the_gateway_delivers_to_the_owner() -> None:
    assert is_inbound(_entry("message", 0, role="user", content="hi"))
    assert is_inbound(_entry("schedule", 0, schedule_id="s", op="fire", fire_no=1))
    assert not is_inbound(_entry("message", 2, role="assistant", content="hi", turn=1))
    assert not is_inbound(_entry("schedule", 0, schedule_id="s", op="set", every_s=5))
    assert not is_inbound(_entry("control", 0, event="fence"))


def test_journal_entries_from_outside_are_validated_and_kept_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    entry = parse_journal_entry(
        {
            "seq": 3,
            "id": "a",
            "kind": "message",
            "epoch": 0,
            "ts": datetime(2026, 1, 1, 12, tzinfo=plus_two).isoformat(),
            "payload": {"role": "user", "content": "hi"},
        }
    )
    assert entry.ts == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert entry.to_json()["ts"] == "2026-01-01T10:00:00.000000Z"
    with pytest.raises(ValidationError):
        parse_journal_entry({**entry.to_json(), "seq": 0})
    with pytest.raises(ValidationError):
        parse_journal_entry({**entry.to_json(), "ts": "2026-01-01T10:00:00"})  # no zone


def test_typed_payload_and_turn_of_a_stored_entry() -> None:
    entry = _entry("message", 1, role="assistant", content="r", turn=10)
    assert entry.typed() == MessagePayload(role=Role.ASSISTANT, content="r", turn=10)
    assert entry.turn == 10
    assert _entry("ack", 1, turn=10).turn is None  # an ack ends a turn, it is not output
    assert _entry("x.unknown", 1).typed() is None


@pytest.mark.parametrize("session", ["a", "agent-7", "team.bot_1"])
def test_session_ids_that_can_name_kubernetes_objects_are_accepted(session: str) -> None:
    assert check_session_id(session) == session


@pytest.mark.parametrize("session", ["", "-a", "A", "a/b", "x" * 200, "a-"])
def test_session_ids_that_cannot_are_rejected_with_the_rule(session: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters, digits"):
        check_session_id(session)


def test_schedule_fire_ids_stay_valid_entry_ids() -> None:
    entry = NewEntry(
        id=schedule_fire_id("s" * 150, 2**63 - 1, 2**63 - 1),
        kind="schedule",
        payload={"schedule_id": "s" * 150, "op": "fire", "fire_no": 2**63 - 1},
    )
    assert entry.id.startswith("schedule:")
