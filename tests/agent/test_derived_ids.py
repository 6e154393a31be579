"""Ids an owner derives (so that a retried write is absorbed) embed names others
chose — a tool call's id, an instance's name — and must still fit the journal's
id limit, or the write could never succeed."""

from __future__ import annotations

from shadowpod.agent import Agent
from shadowpod.agent.adoption import adoption_entries
from shadowpod.agent.processes import ProcessRegistry
from shadowpod.agent.turn import OwnerContext
from shadowpod.domain.entries import ENTRY_ID_MAX, NewEntry
from shadowpod.domain.payloads import ToolCallPayload
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from tests.domain.builders import JournalBuilder


def _valid(entry: NewEntry) -> NewEntry:
    """As the gateway checks it."""
    return NewEntry.model_validate({"id": entry.id, "kind": entry.kind, "payload": entry.payload})


def test_an_uncertain_call_with_the_longest_id_is_still_decided_in_the_journal() -> None:
    j = JournalBuilder()
    turn = j.inbound("book it")
    for call_id in ("c" * 200, "d" * 200):  # the longest call ids a writer may journal
        call = ToolCallPayload(call_id=call_id, tool="book", turn=turn)
        j.add("tool_call", call.model_dump(exclude_unset=True), epoch=1)
    entries = adoption_entries(Agent("a", version="1"), fold(SessionState(), j.entries), epoch=2)
    ids = [_valid(entry).id for entry in entries]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(len(i) <= ENTRY_ID_MAX for i in ids)
    # Derived, not random: adopting again (a retried append) writes the same ids.
    again = adoption_entries(Agent("a", version="1"), fold(SessionState(), j.entries), epoch=2)
    assert [e.id for e in again] == ids


def test_what_an_owner_writes_outside_a_turn_fits_whatever_its_instance_is_called() -> None:
    instance = "agent-" + "x" * 247  # a Kubernetes pod name can be 253 characters long
    context = OwnerContext(
        state=SessionState(),
        epoch=3,
        instance=instance,
        append=_never,
        processes=ProcessRegistry(),
    )
    context.schedule("digest", every_s=60)
    context.schedule("backup", every_s=3600)
    ids = [_valid(entry).id for entry in context.take_outputs()]
    assert len(set(ids)) == 2 and all(len(i) <= ENTRY_ID_MAX for i in ids)


async def _never(_: object) -> list[int]:
    raise AssertionError("nothing is appended here")
