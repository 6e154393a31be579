"""A value changed in place — inside the graph's state or in ``turn.values`` — is
journaled: what the live owner holds is what a new owner folds from the journal. Run
on a real SQLite journal store, an owner in process (the SDK's own ``Turn``), and a
"move" = a new owner starting from the journal alone."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from shadowpod.agent import Turn
from shadowpod.bench.inprocess import InProcessOwner
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import StateFolder, fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ShadowpodSaver, graph_handler
from shadowpod.journal.sqlite.store import SQLiteJournalStore

SESSION = "in-place"
TURNS = 40


class Counted(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    counters: Annotated[list[dict[str, Any]], operator.add]


def counting_graph(saver: ShadowpodSaver) -> Any:
    """A node that counts its turns in a dict inside a list channel, in place."""

    def count(state: Counted) -> dict[str, Any]:
        if not state["counters"]:
            return {"counters": [{"n": 1}], "messages": [AIMessage("n=1")]}
        state["counters"][0]["n"] += 1  # in place, as developers write it
        return {"messages": [AIMessage(f"n={state['counters'][0]['n']}")]}

    builder = StateGraph(Counted)
    builder.add_node("count", count)
    builder.add_edge(START, "count")
    return builder.compile(checkpointer=saver)


@pytest.fixture
async def owner(tmp_path: Path) -> AsyncIterator[InProcessOwner]:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        yield InProcessOwner(store, SESSION)
    finally:
        await store.close()


async def reply_of(owner: InProcessOwner, handler: Any, content: str) -> str:
    """The reply journaled to one more message."""
    seq, turn = await owner.open_turn(content)
    await handler(turn)
    await owner.close_turn(seq, turn)
    (reply,) = [
        e
        for e in await owner.store.read(SESSION, after=seq)
        if e.kind == EntryKind.MESSAGE and e.payload.get("turn") == seq
    ]
    return str(reply.payload["content"])


async def journal(owner: InProcessOwner) -> SessionState:
    entries: list[Any] = []
    while page := await owner.store.read(SESSION, after=entries[-1].seq if entries else 0):
        entries += page
    return fold(SessionState(), entries)


async def test_a_count_kept_in_place_in_the_graphs_state_survives_a_move(
    owner: InProcessOwner,
) -> None:
    saver = ShadowpodSaver()
    handler = graph_handler(saver, counting_graph(saver))
    said = [await reply_of(owner, handler, f"turn {n}") for n in range(TURNS)]
    assert said[-1] == f"n={TURNS}"

    # A new owner, from the journal alone: the count goes on.
    moved = InProcessOwner(owner.store, SESSION)
    moved.folder = StateFolder(await journal(owner))
    fresh = ShadowpodSaver()
    assert await reply_of(moved, graph_handler(fresh, counting_graph(fresh)), "again") == (
        f"n={TURNS + 1}"
    )
    # And read back by a saver on the folded state, outside any agent.
    reader = ShadowpodSaver(values=(await journal(moved)).agent.values)
    config: Any = {"configurable": {"thread_id": "main"}}
    assert counting_graph(reader).get_state(config).values["counters"] == [{"n": TURNS + 1}]


async def test_a_count_kept_in_place_in_turn_values_is_journaled(owner: InProcessOwner) -> None:
    async def handler(turn: Turn) -> None:
        if "memo" not in turn.values:
            turn.set("memo", {"n": 0, "seen": []})
        memo = turn.values["memo"]
        memo["n"] += 1  # in place
        memo["seen"].append(turn.content)  # in place too
        await turn.reply(f"n={memo['n']}")

    said = [await reply_of(owner, handler, f"turn {n}") for n in range(TURNS)]
    assert said[-1] == f"n={TURNS}"
    live = owner.folder.peek().agent.values["memo"]
    folded = (await journal(owner)).agent.values["memo"]
    assert live == folded == {"n": TURNS, "seen": [f"turn {n}" for n in range(TURNS)]}
