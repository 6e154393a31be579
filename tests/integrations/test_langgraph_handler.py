"""``graph_handler`` as an agent developer uses it: its replies say the agent's version
(``meta.version``, what the CLI's checks count replies by) without being asked, and
``thread_id=thread_from_meta`` keeps several conversations in one session, each
moved with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph

from shadowpod.agent import Turn
from shadowpod.bench.inprocess import InProcessOwner
from shadowpod.domain.entries import NewEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.payloads import EntryKind, MessagePayload, Role
from shadowpod.domain.reducer import StateFolder, fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ShadowpodSaver, graph_handler, thread_from_meta
from shadowpod.journal.sqlite.store import SQLiteJournalStore

SESSION = "handler"


def counting_graph(saver: ShadowpodSaver) -> Any:
    def answer(state: MessagesState) -> dict[str, Any]:
        said = sum(m.type == "human" for m in state["messages"])
        return {"messages": [AIMessage(f"{state['messages'][-1].text} ({said})")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
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


async def turn_on(owner: InProcessOwner, content: str, thread: str | None) -> tuple[int, Turn]:
    meta = {} if thread is None else {"thread": thread}
    inbound = NewEntry.of(MessagePayload(role=Role.USER, content=content, meta=meta))
    (seq,) = await owner.append([inbound], None)
    state = owner.folder.peek()
    turn = Turn(
        tools={},
        state_schema=1,
        state=state,
        inbound=state.pending[seq],
        values=dict(state.agent.values),
        epoch=1,
        instance="test",
        append=lambda entries: owner.append(list(entries), 1),
        processes=None,  # type: ignore[arg-type]
        version="7",
    )
    return seq, turn


async def reply(owner: InProcessOwner, handler: Any, content: str, thread: str | None) -> Any:
    seq, turn = await turn_on(owner, content, thread)
    await handler(turn)
    await owner.close_turn(seq, turn)
    (entry,) = [
        e
        for e in await owner.store.read(SESSION, after=seq)
        if e.kind == EntryKind.MESSAGE and e.payload.get("turn") == seq
    ]
    return entry.payload


async def test_replies_carry_the_agents_version(owner: InProcessOwner) -> None:
    saver = ShadowpodSaver()
    said = await reply(owner, graph_handler(saver, counting_graph(saver)), "hi", None)
    assert said["content"] == "hi (1)"
    assert said["meta"]["version"] == "7"


async def test_several_threads_in_one_session_each_go_on_after_a_move(
    owner: InProcessOwner,
) -> None:
    saver = ShadowpodSaver()
    handler = graph_handler(saver, counting_graph(saver), thread_id=thread_from_meta)
    assert (await reply(owner, handler, "a1", "alice"))["content"] == "a1 (1)"
    assert (await reply(owner, handler, "b1", "bob"))["content"] == "b1 (1)"
    assert (await reply(owner, handler, "a2", "alice"))["content"] == "a2 (2)"
    assert (await reply(owner, handler, "m1", None))["content"] == "m1 (1)"

    entries: list[Any] = []
    while page := await owner.store.read(SESSION, after=entries[-1].seq if entries else 0):
        entries += page
    moved = InProcessOwner(owner.store, SESSION)
    moved.folder = StateFolder(fold(SessionState(), entries))
    fresh = ShadowpodSaver()
    handler = graph_handler(fresh, counting_graph(fresh), thread_id=thread_from_meta)
    assert (await reply(moved, handler, "b2", "bob"))["content"] == "b2 (2)"
    assert (await reply(moved, handler, "a3", "alice"))["content"] == "a3 (3)"
