"""A LangGraph thread forked at a checkpoint: the Shadowpod fork at the seq that
journaled it serves that checkpoint (the parent's, same id, same values) from the
parent's shared journal, and none of the parent's later ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shadowpod.bench.langgraph import SESSION, _build_graph, _Owner
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.ownership import Ownership
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.integrations.langgraph.forks import checkpoint_seq
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.journal.store import ForkPoint, JournalStore

THREAD: dict[str, Any] = {"configurable": {"thread_id": "main"}}


async def _journal(store: JournalStore, session: str) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    while page := await store.read(session, after=entries[-1].seq if entries else 0):
        entries += page
    return entries


def _graph(entries: list[JournalEntry]) -> Any:
    """The graph on a fresh saver over the folded journal, as a new owner has it."""
    return _build_graph()(ShadowpodSaver(values=fold(SessionState(), entries).agent.values))


async def test_a_fork_at_a_checkpoint_serves_the_thread_from_it(tmp_path: Path) -> None:
    store = SQLiteJournalStore(tmp_path / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="test"))
        saver = ShadowpodSaver()
        owner = _Owner(store, _build_graph()(saver), saver)
        for n in range(3):
            await owner.turn(f"message {n}")
        chosen = _graph(await _journal(store, SESSION)).get_state(THREAD)
        for n in range(3, 6):
            await owner.turn(f"message {n}")
        parent = await _journal(store, SESSION)
        checkpoint = chosen.config["configurable"]["checkpoint_id"]
        seq = checkpoint_seq(parent, checkpoint)
        assert seq is not None and seq < parent[-1].seq

        await store.create_session("fork", fork=ForkPoint(SESSION, seq))
        forked = await _journal(store, "fork")
    finally:
        await store.close()
    assert [e.seq for e in forked] == [e.seq for e in parent if e.seq <= seq]
    on_fork = _graph(forked).get_state(THREAD)
    assert on_fork.config["configurable"]["checkpoint_id"] == checkpoint
    assert [m.text for m in on_fork.values["messages"]] == [
        m.text for m in chosen.values["messages"]
    ]
    assert len(on_fork.values["messages"]) == 6  # three turns, not the parent's six
    # The parent's graph still has all six turns, and the checkpoint among its history.
    on_parent = _graph(parent)
    assert len(on_parent.get_state(THREAD).values["messages"]) == 12
    history = [
        s.config["configurable"]["checkpoint_id"] for s in on_parent.get_state_history(THREAD)
    ]
    assert checkpoint in history
