"""A state entry journaled in parts (too large for one append) folds as the whole
entry would, and only once it is whole; the fold stays a pure function of the journal
(a snapshot between two parts folds on to the same state)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.agent.appends import state_parts
from shadowpod.domain.entries import JournalEntry, NewEntry
from shadowpod.domain.payloads import StatePayload
from shadowpod.domain.reducer import fold
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.domain.state import SessionState
from shadowpod.journal.codec import load_state_json
from tests.domain.builders import JournalBuilder

WHOLE = {"history": ['"quoted"', "back\\slash", "é" * 40, {"n": list(range(30))}], "k": 1}


def _whole(turn: int | None, values: dict[str, object] | None = None) -> NewEntry:
    payload = StatePayload.model_validate(
        {"values": values or WHOLE, "replace": True, "schema_version": 2, "turn": turn}
    )
    return NewEntry.of(payload, id=f"t{turn}:state" if turn else "state-migration:2")


def _add(j: JournalBuilder, entry: NewEntry, epoch: int = 1) -> JournalEntry:
    return j.add(entry.kind, entry.payload, epoch=epoch, id=entry.id)


def _through_a_snapshot(state: SessionState) -> SessionState:
    return load_state_json(orjson.dumps(dump_state(state)))


def test_parts_apply_the_whole_entry_once_the_last_is_in_and_nothing_before() -> None:
    j = JournalBuilder()
    turn = j.inbound("grow")
    j.add("state", epoch=1, values={"k": 0, "gone": True}, turn=turn)
    parts = state_parts(_whole(turn), part_bytes=64)
    assert len(parts) > 5
    for part in parts[:-1]:
        _add(j, part)
        assert fold(SessionState(), j.entries).agent.values == {"k": 0, "gone": True}
    _add(j, parts[-1])
    state = fold(SessionState(), j.entries)
    assert state.agent.values == WHOLE  # replaced, as the whole entry says
    assert (state.agent.schema_version, state.agent.parts) == (2, {})
    j.ack(turn)
    whole = JournalBuilder()
    whole.inbound("grow")
    whole.add("state", epoch=1, values={"k": 0, "gone": True}, turn=turn)
    _add(whole, _whole(turn))
    whole.ack(turn)
    assert fold(SessionState(), j.entries).agent == fold(SessionState(), whole.entries).agent


def test_a_snapshot_between_two_parts_folds_on_to_the_same_state() -> None:
    j = JournalBuilder()
    turn = j.inbound("grow")
    for part in state_parts(_whole(turn), part_bytes=64):
        _add(j, part)
    j.ack(turn)
    straight = fold(SessionState(), j.entries)
    for cut in range(1, len(j.entries)):
        snapshot = _through_a_snapshot(fold(SessionState(), j.entries[:cut]))
        assert fold(snapshot, j.entries[cut:]) == straight, cut


def test_parts_of_a_turn_that_ended_without_them_are_dropped_with_its_ack() -> None:
    """The owner died after two parts; the turn redone wrote other values, whole."""
    j = JournalBuilder()
    turn = j.inbound("grow")
    for part in state_parts(_whole(turn), part_bytes=64)[:2]:
        _add(j, part)
    assert fold(SessionState(), j.entries).agent.parts != {}
    j.add("state", epoch=2, values={"redone": True}, turn=turn, id="t2:state-redone")
    j.ack(turn, epoch=2)
    state = fold(SessionState(), j.entries)
    assert (state.agent.values, state.agent.parts) == ({"redone": True}, {})


def test_parts_written_while_taking_over_are_dropped_at_the_next_epoch() -> None:
    j = JournalBuilder()
    j.add("control", {"event": "epoch", "epoch": 2, "owner": "b"})
    for part in state_parts(_whole(None), part_bytes=64)[:3]:
        _add(j, part, epoch=2)
    assert len(fold(SessionState(), j.entries).agent.parts) == 1
    j.add("control", {"event": "epoch", "epoch": 3, "owner": "c"})
    assert fold(SessionState(), j.entries).agent.parts == {}


def test_the_same_turn_redone_with_the_same_values_completes_the_same_parts() -> None:
    """Ids derive from the content: a redone turn's repeats are the journal's
    duplicates (absorbed there); here only the missing parts follow."""
    j = JournalBuilder()
    turn = j.inbound("grow")
    first = state_parts(_whole(turn), part_bytes=64)
    again = state_parts(_whole(turn), part_bytes=64)
    assert [p.id for p in first] == [p.id for p in again]
    for part in first[:3]:
        _add(j, part)
    for part in again[3:]:
        _add(j, part, epoch=2)
    assert fold(SessionState(), j.entries).agent.values == WHOLE
    other = state_parts(_whole(turn, {"other": 1}), part_bytes=64)
    assert {p.payload["part"]["group"] for p in other} != {
        p.payload["part"]["group"] for p in first
    }


def test_parts_that_do_not_make_a_state_entry_are_kept_as_an_extension() -> None:
    j = JournalBuilder()
    turn = j.inbound("grow")
    group = {"group": "g", "count": 2}
    j.add("state", epoch=1, turn=turn, part={**group, "index": 0, "data": "bm90IGpz"})
    j.add("state", epoch=1, turn=turn, part={**group, "index": 1, "data": "b24="})
    state = fold(SessionState(), j.entries)
    assert state.agent.values == {} and state.agent.parts == {}
    (kept,) = state.extensions
    assert kept.seq == 3 and kept.error is not None and "state parts of g" in kept.error


def test_a_part_may_carry_nothing_but_its_part() -> None:
    part = {"group": "g", "index": 0, "count": 2, "data": "e30="}
    with pytest.raises(ValueError, match="a state part carries no values"):
        JournalBuilder().add("state", epoch=1, values={"a": 1}, part=part)


def test_a_v3_document_loads_with_no_parts_under_way() -> None:
    document = dump_state(SessionState())
    document["schema_version"] = 3
    del document["agent"]["parts"]
    assert load_state(document).agent.parts == {}


@settings(max_examples=60, deadline=None)
@given(
    values=st.dictionaries(st.text(max_size=5), st.text(max_size=200), min_size=1, max_size=4),
    part_bytes=st.integers(8, 120),
    cut=st.integers(0, 1000),
)
def test_any_split_and_any_snapshot_fold_to_the_whole_entry(
    values: dict[str, str], part_bytes: int, cut: int
) -> None:
    j = JournalBuilder()
    turn = j.inbound("grow")
    for part in state_parts(_whole(turn, dict(values)), part_bytes=part_bytes):
        _add(j, part)
        j.inbound("arrived meanwhile")
    j.ack(turn)
    cut %= len(j.entries) + 1
    snapshot = _through_a_snapshot(fold(SessionState(), j.entries[:cut]))
    state = fold(snapshot, j.entries[cut:])
    assert state == fold(SessionState(), j.entries)
    assert state.agent.values == values and state.agent.parts == {}
