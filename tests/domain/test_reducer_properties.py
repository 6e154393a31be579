"""Properties of the fold: a snapshot is only a shortcut (DESIGN.md §3 rule 5)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.reducer import StateFolder, apply, fold
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.domain.state import SessionState
from tests.domain.builders import JournalBuilder

_text = st.text(max_size=12)
_key = st.sampled_from(["a", "b", "c"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_key, inner, max_size=3),
    max_leaves=6,
)

# Each op is (kind of step, parameters); ``turn`` parameters pick among earlier inbound.
_op = st.one_of(
    st.tuples(st.just("inbound"), _text),
    st.tuples(st.just("fire"), _key, st.integers(1, 4)),
    st.tuples(st.just("reply"), st.integers(0, 50), _text),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("tool_call"), st.integers(0, 50), _key, st.booleans()),
    st.tuples(st.just("tool_result"), _key, st.sampled_from(["ok", "error", "abandoned"]), _json),
    st.tuples(st.just("memory"), _key, _json, st.booleans()),
    st.tuples(st.just("fact"), _key, _text, st.booleans()),
    st.tuples(st.just("schedule"), _key, st.sampled_from(["set", "cancel"]), st.integers(1, 90)),
    st.tuples(st.just("process"), _key, st.sampled_from(["started", "exited", "killed"])),
    st.tuples(st.just("credential"), _key, st.booleans()),
    st.tuples(st.just("state"), st.dictionaries(_key, _json, max_size=2), st.booleans()),
    st.tuples(st.just("epoch"), st.integers(1, 9)),
    st.tuples(st.just("unknown"), _json),
)


def _journal(ops: list[tuple[Any, ...]]) -> list[JournalEntry]:
    j = JournalBuilder()
    inbound: list[int] = []

    def turn(pick: int) -> int | None:
        return inbound[pick % len(inbound)] if inbound else None

    for op in ops:
        name, *args = op
        if name == "inbound":
            inbound.append(j.inbound(args[0]))
        elif name == "fire":
            inbound.append(
                j.add(
                    "schedule", schedule_id=args[0], op="fire", fire_no=args[1], content="tick"
                ).seq
            )
        elif name == "reply":
            j.add("message", epoch=1, role="assistant", content=args[1], turn=turn(args[0]))
        elif name == "ack":
            if inbound:
                j.ack(turn(args[0]) or 1)
        elif name == "tool_call":
            j.add(
                "tool_call",
                epoch=1,
                call_id=args[1],
                tool=f"t{args[1]}",
                idempotent=args[2],
                turn=turn(args[0]),
            )
        elif name == "tool_result":
            j.add("tool_result", epoch=1, call_id=args[0], status=args[1], result=args[2])
        elif name == "memory":
            j.add("memory", epoch=1, key=args[0], value=args[1], op="delete" if args[2] else "set")
        elif name == "fact":
            j.add(
                "fact", epoch=1, fact_id=args[0], text=args[1], op="retract" if args[2] else "add"
            )
        elif name == "schedule":
            j.add("schedule", epoch=1, schedule_id=args[0], op=args[1], every_s=args[2])
        elif name == "process":
            j.add("process", epoch=1, name=args[0], op=args[1], pid=7)
        elif name == "credential":
            j.add("credential", name=args[0], op="unbind" if args[1] else "bind", secret_ref="s/k")
        elif name == "state":
            j.add("state", epoch=1, values=args[0], replace=args[1])
        elif name == "epoch":
            j.add("control", {"event": "epoch", "epoch": args[0], "owner": "p"}, epoch=args[0])
        else:
            j.add("x.future_kind", {"data": args[0]}, epoch=1)
    return j.entries


def _stored(state: SessionState) -> SessionState:
    """What a snapshot gives back: the state through JSON bytes and the schema loader."""
    return load_state(orjson.loads(orjson.dumps(dump_state(state))))


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_op, max_size=40), cut=st.integers(0, 40))
def test_folding_from_a_snapshot_equals_folding_from_the_beginning(
    ops: list[tuple[Any, ...]], cut: int
) -> None:
    entries = _journal(ops)
    cut = min(cut, len(entries))
    snapshot = _stored(fold(SessionState(), entries[:cut]))
    assert fold(snapshot, entries[cut:]) == fold(SessionState(), entries)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, max_size=30))
def test_apply_one_at_a_time_equals_fold_and_leaves_inputs_alone(
    ops: list[tuple[Any, ...]],
) -> None:
    entries = _journal(ops)
    state = SessionState()
    history = []
    for entry in entries:
        before = state.model_dump()
        following = apply(state, entry)
        assert state.model_dump() == before
        history.append(following)
        state = following
    assert state == fold(SessionState(), entries)
    assert state.watermark == len(entries)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(_op, max_size=30), overlap=st.integers(0, 10))
def test_replaying_entries_already_reflected_changes_nothing(
    ops: list[tuple[Any, ...]], overlap: int
) -> None:
    entries = _journal(ops)
    folder = StateFolder(SessionState())
    folder.apply_all(entries)
    once = folder.view()
    folder.apply_all(entries[max(0, len(entries) - overlap) :])
    assert folder.view() == once


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(_op, max_size=30))
def test_every_state_survives_its_stored_form(ops: list[tuple[Any, ...]]) -> None:
    state = fold(SessionState(), _journal(ops))
    assert _stored(state) == state
