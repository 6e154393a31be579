"""Deltas of the agent's state: a turn's write is the size of its change, the fold
gives the state the owner had, and entries written whole (older agents) still fold."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.domain.deltas import apply_ops, diff
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.payloads import StateOp, StateOpKind, StatePayload
from shadowpod.domain.reducer import StateFolder, fold
from shadowpod.domain.schema import dump_state
from shadowpod.domain.state import SessionState
from shadowpod.journal.codec import load_state_json
from tests.domain.builders import JournalBuilder

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.floats(-1, 1) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4)
    ),
    max_leaves=12,
)
OBJECTS = st.dictionaries(st.text(max_size=2), JSON, max_size=4)


def _state_entry(j: JournalBuilder, turn: int, payload: StatePayload) -> None:
    entry = NewEntry.of(payload, id=f"t{turn}:state")
    j.add(entry.kind, entry.payload, epoch=1, id=entry.id)


def _turn(j: JournalBuilder, payload: StatePayload) -> int:
    turn = j.inbound("next")
    _state_entry(j, turn, payload.model_copy(update={"turn": turn}))
    j.ack(turn)
    return turn


@settings(max_examples=300, deadline=None)
@given(before=OBJECTS, after=OBJECTS)
def test_the_ops_of_a_diff_turn_before_into_after(before: Any, after: Any) -> None:
    ops = diff(before, after)
    assert ops is not None
    kept = copy.deepcopy(before)
    values = dict(before)
    assert apply_ops(values, ops, {}) is None
    # Equal as JSON (``True`` is not ``1``), whatever the order of keys.
    assert orjson.dumps(values, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        after, option=orjson.OPT_SORT_KEYS
    )
    assert before == kept  # copy-on-write: what the state shared is untouched


def test_a_list_that_grew_is_journaled_as_its_new_items_alone() -> None:
    old = [{"role": "user", "content": f"message {n}"} for n in range(1000)]
    new = [*old, {"role": "assistant", "content": "the reply"}]
    ops = diff({"messages": old, "count": 1}, {"messages": new, "count": 2})
    assert ops == [
        StateOp(op=StateOpKind.APPEND, path=["messages"], items=[new[-1]]),
        StateOp(op=StateOpKind.SET, path=["count"], value=2),
    ]


def test_nested_changes_are_set_at_their_path_and_removed_keys_deleted() -> None:
    before = {"graph": {"steps": [1, 2, 3], "node": "a"}, "gone": 1}
    after = {"graph": {"steps": [1, 9, 3], "node": "a"}}
    ops = diff(before, after)
    assert ops == [
        StateOp(op=StateOpKind.DELETE, path=["gone"]),
        StateOp(op=StateOpKind.SET, path=["graph", "steps", 1], value=9),
    ]


def test_a_session_written_by_deltas_folds_to_the_values_its_turns_built() -> None:
    j = JournalBuilder()
    messages: list[Any] = []
    for n in range(50):
        before = {"messages": list(messages), "n": n}
        messages.append({"content": f"m{n}"})
        ops = diff(before, {"messages": list(messages), "n": n + 1})
        assert ops is not None
        _turn(j, StatePayload(ops=ops, schema_version=1))
    state = fold(SessionState(), j.entries)
    assert state.agent.values == {"messages": messages, "n": 50}
    assert not state.extensions
    # Folding from a snapshot at any point (through its JSON form) gives the same.
    for cut in (1, 40, 101):
        snapshot = fold(SessionState(), j.entries[:cut])
        loaded = load_state_json(orjson.dumps(dump_state(snapshot)))
        assert fold(loaded, j.entries[cut:]) == state


def test_entries_written_whole_by_older_agents_still_fold_before_and_among_deltas() -> None:
    j = JournalBuilder()
    _turn(j, StatePayload(values={"messages": ["a"], "k": 1}, schema_version=1))
    _turn(j, StatePayload(ops=[StateOp(op=StateOpKind.APPEND, path=["messages"], items=["b"])]))
    _turn(j, StatePayload(values={"k": 2}))  # an old agent again: top-level keys whole
    _turn(j, StatePayload(values={"messages": ["x"]}, replace=True))
    _turn(j, StatePayload(ops=[StateOp(op=StateOpKind.APPEND, path=["messages"], items=["y"])]))
    assert fold(SessionState(), j.entries).agent.values == {"messages": ["x", "y"]}


def test_a_fold_never_changes_a_state_it_was_given_or_a_view_taken_between_batches() -> None:
    j = JournalBuilder()
    _turn(j, StatePayload(values={"messages": [1]}))
    append = StatePayload(ops=[StateOp(op=StateOpKind.APPEND, path=["messages"], items=[2])])
    _turn(j, append)
    first = fold(SessionState(), j.entries)
    folder = StateFolder(first)
    view = folder.view()
    _turn(j, append)
    folder.apply_all(j.entries)
    assert first.agent.values == {"messages": [1, 2]}
    assert view.agent.values == {"messages": [1, 2]}
    assert folder.peek().agent.values == {"messages": [1, 2, 2]}


def test_an_op_that_does_not_fit_is_skipped_and_kept_with_what_was_wrong() -> None:
    j = JournalBuilder()
    _turn(j, StatePayload(values={"count": 1, "messages": []}))
    _turn(
        j,
        StatePayload(
            ops=[
                StateOp(op=StateOpKind.APPEND, path=["count"], items=[1]),
                StateOp(op=StateOpKind.APPEND, path=["messages"], items=["kept"]),
                StateOp(op=StateOpKind.SET, path=["messages", 5], value="no such item"),
            ]
        ),
    )
    state = fold(SessionState(), j.entries)
    assert state.agent.values == {"count": 1, "messages": ["kept"]}
    (kept,) = state.extensions
    assert kept.error == "ops.0: values['count'] is not a list to append to"


def test_an_op_with_fields_of_another_op_is_refused_with_its_path() -> None:
    entry_payload = {"ops": [{"op": "delete", "path": ["k"], "items": [1]}], "turn": 1}
    with pytest.raises(ValueError, match=r"ops\.0[\s\S]*items are for an append"):
        NewEntry(kind="state", payload=entry_payload)


def test_the_bytes_of_a_turn_stay_those_of_its_change_as_the_state_grows() -> None:
    messages: list[Any] = []
    sizes = []
    for _ in range(2000):
        before = {"messages": messages}
        messages = [*messages, {"role": "user", "content": "x" * 100}]
        ops = diff(before, {"messages": messages})
        assert ops is not None
        sizes.append(len(orjson.dumps(StatePayload(ops=ops).model_dump(mode="json"))))
    assert sizes[-1] == sizes[0]
