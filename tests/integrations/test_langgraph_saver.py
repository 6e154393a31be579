"""The LangGraph checkpointer over a real journal store: a history longer than a log
chunk reads back from the journal alone (a fresh saver on the folded state, as a new
owner has), and each turn journals the same bytes however long the history is."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from shadowpod.bench.langgraph import SESSION, _build_graph, _Owner
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.integrations.langgraph.saver import CHUNK
from shadowpod.journal.sqlite.store import SQLiteJournalStore

TURNS = 150  # 300 messages: more than one chunk of the messages log
TOOL_TURNS = 80  # 320 messages: more than one chunk too


async def test_a_long_history_reads_back_from_the_journal_alone(tmp_path: Path) -> None:
    assert 2 * TURNS > CHUNK
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        saver = ShadowpodSaver(keep=None)  # every checkpoint: the whole history
        owner = _Owner(store, _build_graph()(saver), saver)
        for n in range(TURNS):
            await owner.turn(f"message {n:03d}")
        entries: list[JournalEntry] = []
        while page := await store.read(SESSION, after=entries[-1].seq if entries else 0):
            entries += page
    finally:
        await store.close()

    state = fold(SessionState(), entries)
    assert state.extensions == []
    fresh = ShadowpodSaver(values=state.agent.values, keep=None)
    graph = _build_graph()(fresh)
    config = {"configurable": {"thread_id": "main"}}
    messages = graph.get_state(config).values["messages"]
    assert [m.text for m in messages[::2]] == [f"message {n:03d}" for n in range(TURNS)]
    assert messages[-1].text == f"you said: message {TURNS - 1:03d} ({TURNS} messages so far)"
    assert len(list(graph.get_state_history(config))) == 3 * TURNS

    # Each turn's state entry is the same size, whatever the length of the history:
    # early ones are larger only by the buckets they open (an empty object each).
    sizes = [len(orjson.dumps(e.payload)) for e in entries if e.kind == EntryKind.STATE]
    assert len(sizes) == TURNS
    assert max(sizes[-50:]) <= max(sizes[:50])
    # A turn that opens no bucket: the same bytes in the middle and at the end.
    middle, last = min(sizes[50:100]), min(sizes[-50:])
    assert abs(last - middle) <= 16, (middle, last)


@pytest.mark.parametrize("graph", ["react", "create_agent", "toolnode"])
async def test_a_tool_calling_turn_writes_the_same_bytes_however_long_the_history(
    tmp_path: Path, graph: str
) -> None:
    """``create_react_agent`` hands each tool call a ``Send`` with a copy of the whole
    state: journaled as it is, a turn's write grew with the conversation (1.9 MB a
    turn at 1,000 turns). Stored as a reference to the messages' log, it stays flat."""
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        saver = ShadowpodSaver()
        owner = _Owner(store, _build_graph()(saver, graph), saver)
        for n in range(TOOL_TURNS):
            await owner.turn(f"lookup city{n:03d}")
        entries: list[JournalEntry] = []
        while page := await store.read(SESSION, after=entries[-1].seq if entries else 0):
            entries += page
    finally:
        await store.close()

    by_turn: dict[int, int] = {}
    for entry in entries:
        if entry.kind in (EntryKind.STATE, EntryKind.TOOL_CALL, EntryKind.TOOL_RESULT):
            turn = int(entry.payload["turn"])
            by_turn[turn] = by_turn.get(turn, 0) + len(orjson.dumps(entry.payload))
    sizes = [by_turn[turn] for turn in sorted(by_turn)]
    assert len(sizes) == TOOL_TURNS
    # Turns 20-30 against the last ten: the same bytes but for buckets a turn opens.
    middle, last = min(sizes[20:30]), min(sizes[-10:])
    assert last - middle <= 64, (graph, middle, last)
    # And the history reads back whole from the journal alone.
    state = fold(SessionState(), entries)
    fresh = ShadowpodSaver(values=state.agent.values)
    config = {"configurable": {"thread_id": "main"}}
    messages = _build_graph()(fresh, graph).get_state(config).values["messages"]
    assert [m.text for m in messages if m.type == "human"] == [
        f"lookup city{n:03d}" for n in range(TOOL_TURNS)
    ]
    assert messages[-1].text == f"lookup: sunny in city{TOOL_TURNS - 1:03d}"
