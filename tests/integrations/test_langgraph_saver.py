"""The LangGraph checkpointer over a real journal store: a history longer than a log
chunk reads back from the journal alone (a fresh saver on the folded state, as a new
owner has), and each turn journals the same bytes however long the history is."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from shadowpod.bench.langgraph import SESSION, _build_graph, _Owner
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations import langgraph as integration
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.integrations.langgraph.saver import CHUNK, NotInATurn
from shadowpod.journal.sqlite.store import SQLiteJournalStore

DATA = Path(__file__).parent / "data"
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
    entries, sizes = await _tool_turns(tmp_path, graph, TOOL_TURNS)
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


LONG_TOOL_TURNS = 200  # pruning (keep=256, 4 checkpoints a turn) from turn ~72 on
WINDOW = 16  # two pruning rounds (one every 32 checkpoints: 8 tool turns)
# What pruning adds to a turn once it runs: the deletes of 4 checkpoints' headers and
# pending writes (~90 bytes a path each), and of a __start__ value per turn.
PRUNING_BYTES = 1_200


async def test_a_tool_turn_costs_the_same_at_turn_200_as_at_turn_10(tmp_path: Path) -> None:
    """Bytes a ``create_react_agent`` tool turn journals, in windows of turns: late in a
    long conversation no more than early plus what pruning deletes, and the same in
    two windows once pruning runs — flat, whatever the history's length."""
    _, sizes = await _tool_turns(tmp_path, "react", LONG_TOOL_TURNS)

    def window(start: int) -> float:
        return sum(sizes[start : start + WINDOW]) / WINDOW

    early, middle, late = window(10), window(100), window(LONG_TOOL_TURNS - WINDOW)
    assert late <= early + PRUNING_BYTES, (early, late)
    assert abs(late - middle) <= 64, (middle, late)
    # What a tool turn costs at all (a create_react_agent turn: 5 checkpoints, 4
    # messages, a Send): 12-15.5 KB before the pending writes referred to the log,
    # ~7.9 KB before headers were written as changes from their parent's (~6.6 now).
    assert late <= 7_000, late


async def test_a_state_written_before_27_nov_reads_back_and_goes_on() -> None:
    """Checkpoints journaled by the saver as it was (pending writes with their task id,
    channel versions only in the channels' maps, no held values in headers), as an
    image of then left them in a snapshot: read whole by this one, which goes on."""
    values = orjson.loads((DATA / "langgraph-react-state-before-27nov.json").read_bytes())
    saver = ShadowpodSaver(values=values)
    graph = _build_graph()(saver, "react")
    config = {"configurable": {"thread_id": "main"}}
    messages = graph.get_state(config).values["messages"]
    assert [m.text for m in messages if m.type == "human"] == [f"lookup city{n}" for n in range(3)]
    assert [m.text for m in messages if m.type == "tool"] == [f"sunny in city{n}" for n in range(3)]
    history = list(graph.get_state_history(config))
    assert len(history) == 3 * 5  # input, agent, tools, agent, and the turn's start
    sent = [w for h in history for w in h.tasks if w.name == "tools"]
    assert sent, "the Send's pending writes read back"
    await graph.ainvoke({"messages": [HumanMessage(content="lookup city3", id="turn-3")]}, config)
    again = _build_graph()(ShadowpodSaver(values=saver.values), "react")
    messages = again.get_state(config).values["messages"]
    assert [m.text for m in messages if m.type == "human"] == [f"lookup city{n}" for n in range(4)]
    assert messages[-1].text == "lookup: sunny in city3"
    assert len(list(again.get_state_history(config))) == 4 * 5


async def _tool_turns(
    tmp_path: Path, graph: str, turns: int
) -> tuple[list[JournalEntry], list[int]]:
    """``turns`` tool-calling turns of ``graph`` journaled: the whole journal, and the
    bytes each turn wrote (its state, tool call and tool result entries)."""
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        saver = ShadowpodSaver()
        owner = _Owner(store, _build_graph()(saver, graph), saver)
        for n in range(turns):
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
    assert len(sizes) == turns
    return entries, sizes


async def test_outside_a_turn_the_saver_says_what_exists_to_use_and_that_works() -> None:
    graph = _build_graph()(ShadowpodSaver(), "custom")
    config = {"configurable": {"thread_id": "admin"}}
    with pytest.raises(NotInATurn) as refused:
        await graph.ainvoke({"messages": [HumanMessage(content="hi")]}, config)
    said = str(refused.value)
    # Everything it names is there to be used (it once named a saver.ainvoke).
    for name in ("graph_handler", "run_graph"):
        assert name in said and hasattr(integration, name)
    assert "saver.bound(turn)" in said and hasattr(ShadowpodSaver, "bound")
    assert "ShadowpodSaver(values={})" in said
    # As it says: a saver on a state in memory serves a test or an admin's update_state.
    saver = ShadowpodSaver(values={})
    graph = _build_graph()(saver, "custom")
    await graph.ainvoke({"messages": [HumanMessage(content="hi")]}, config)
    await graph.aupdate_state(config, {"messages": [AIMessage(content="an admin's note")]})
    messages = (await graph.aget_state(config)).values["messages"]
    assert messages[0].content == "hi"
    assert messages[-1].content == "an admin's note"
    assert saver.values["langgraph"]
