"""Checkpoint headers written as a change from their parent's (``headers``): whatever
the sequence of puts, pending writes, forks and pruning, every checkpoint reads back
as LangGraph's own ``InMemorySaver`` reads it — from the live state, and from a
snapshot taken anywhere in between plus the journal's ops after it (a restore, as a
new owner makes one). A journal written before the change restores and goes on, and
a header costs what changed, not every channel's version again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from shadowpod.agent import DetachedState
from shadowpod.bench.langgraph import _build_graph
from shadowpod.domain.deltas import apply_ops
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import StateOp
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.integrations.langgraph import ROOT, ShadowpodSaver
from shadowpod.integrations.langgraph.headers import DELTA, FULL_EVERY
from shadowpod.integrations.langgraph.retention import headers_of

DATA = Path(__file__).parent / "data"
CHANNELS = ("messages", "count", "note", "blob")
NODES = ("agent", "tools", "__start__")


class RecordedState(DetachedState):
    """A state in memory that keeps the ops written to it, as a journal does (each
    through JSON, as it is stored)."""

    def __init__(self) -> None:
        super().__init__({})
        self.ops: list[dict[str, Any]] = []

    def _change(self, op: StateOp) -> None:
        super()._change(op)
        self.ops.append(orjson.loads(orjson.dumps(op.model_dump(mode="json"))))


def _value(channel: str, n: int, parent: Any) -> Any:
    if channel == "messages":  # a list that grows from the parent's (or, forked, anew)
        return [*(parent or []), f"m{n}"]
    if channel == "count":
        return n
    if channel == "note":
        return "x" * (n % 3 * 40)  # short, and longer than a header holds
    return {"n": n, "pad": "y" * 600}  # a value too large for the headers


step = st.tuples(
    st.sampled_from(["put", "put", "put", "writes", "fork", "prune"]),
    st.sets(st.sampled_from(CHANNELS), min_size=0, max_size=4),
    st.sampled_from(NODES),
    st.integers(min_value=0, max_value=1_000),
)


def _run(steps: list[tuple[str, set[str], str, int]], keep: int | None, cut: int) -> dict[str, Any]:
    """Run ``steps`` on the saver and on LangGraph's ``InMemorySaver``; check what each
    reads, live and restored; the state the saver left."""
    state = RecordedState()
    saver = ShadowpodSaver(keep=keep)
    saver._detached = state  # the recorded state: its ops are the journal
    plain = InMemorySaver()
    made: list[tuple[str, dict[str, Any]]] = []  # checkpoint id, (versions, seen, values)
    snapshot: dict[str, Any] | None = None
    ops_before = 0
    for n, (kind, channels, node, pick) in enumerate(steps):
        if n == cut:
            snapshot = orjson.loads(orjson.dumps(state.values))
            ops_before = len(state.ops)
        thread = "a" if pick % 5 else "b"
        if kind == "writes" and made:
            cid, _ = made[pick % len(made)]
            config = _config(thread_of[cid], cid)
            writes = [("messages", f"w{n}"), ("count", n)]
            saver.put_writes(config, writes, f"task-{pick % 3}")
            plain.put_writes(config, writes, f"task-{pick % 3}")
            continue
        if kind == "prune":
            if pick % 4 == 0:
                saver.prune(["a"])  # the plain saver keeps them: what is kept reads the same
                made[:] = [m for m in made if thread_of[m[0]] != "a" or m[0] == _latest(saver, "a")]
            continue
        parent_id = None
        parent_state: dict[str, Any] = {"versions": {}, "seen": {}, "values": {}}
        # A fork starts from a checkpoint still stored (LangGraph reads it first).
        same_thread = [
            m
            for m in made
            if thread_of[m[0]] == thread
            and (kind != "fork" or saver.get_tuple(_config(thread, m[0])))
        ]
        if same_thread:
            parent_id, parent_state = (
                same_thread[pick % len(same_thread)] if kind == "fork" else same_thread[-1]
            )
        versions = dict(parent_state["versions"])
        values = dict(parent_state["values"])
        seen = {k: dict(v) for k, v in parent_state["seen"].items()}
        new_versions = {}
        for channel in sorted(channels):
            version = saver.get_next_version(versions.get(channel), None)
            versions[channel] = new_versions[channel] = version
            values[channel] = _value(channel, n, values.get(channel))
        if versions:
            seen.setdefault(node, {})[sorted(versions)[pick % len(versions)]] = versions[
                sorted(versions)[pick % len(versions)]
            ]
        cid = f"1f000000-0000-6000-8000-{n:012d}"
        thread_of[cid] = thread
        checkpoint: Checkpoint = {
            "v": 4,
            "id": cid,
            "ts": f"2026-11-27T15:00:{n % 60:02d}+00:00",
            "channel_values": values,
            "channel_versions": versions,
            "versions_seen": seen,
            "updated_channels": sorted(channels),
        }
        config = _config(thread, parent_id)
        metadata = {"source": "loop", "step": n, "parents": {}, "run_id": f"r{pick % 4}"}
        saver.put(config, checkpoint, metadata, new_versions)  # type: ignore[arg-type]
        plain.put(config, checkpoint, metadata, new_versions)  # type: ignore[arg-type]
        made.append((cid, {"versions": versions, "seen": seen, "values": values}))

    live = [_read(saver, thread_of[cid], cid) for cid, _ in made]
    kept = [r for r in live if r is not None]
    assert kept or not made, "the latest checkpoint of each thread is always kept"
    for (cid, _), ours in zip(made, live, strict=True):
        if ours is not None:
            assert ours == _read(plain, thread_of[cid], cid), cid
    if keep is None:
        assert all(r is not None for r in live)
    # Restored: the snapshot, then the journal's ops after it, folded.
    restored = snapshot if snapshot is not None else {}
    ops = [StateOp.model_validate(op) for op in state.ops[ops_before if snapshot else 0 :]]
    assert apply_ops(restored, ops, {}) is None
    again = ShadowpodSaver(values=restored, keep=keep)
    assert [_read(again, thread_of[cid], cid) for cid, _ in made] == live
    for thread in ("a", "b"):
        for header_chain in _chains(restored, thread):
            assert header_chain < FULL_EVERY
    return restored


thread_of: dict[str, str] = {}


def _latest(saver: ShadowpodSaver, thread: str) -> str | None:
    found = saver.get_tuple(_config(thread, None))
    return None if found is None else found.config["configurable"]["checkpoint_id"]


def _config(thread: str, checkpoint_id: str | None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _read(saver: Any, thread: str, cid: str) -> Any:
    found = saver.get_tuple(_config(thread, cid))
    if found is None:
        return None
    c = found.checkpoint
    return (
        c["channel_values"],
        c["channel_versions"],
        c["versions_seen"],
        c.get("updated_channels"),
        dict(found.metadata),
        None if found.parent_config is None else found.parent_config["configurable"],
        sorted(found.pending_writes or []),
    )


def _chains(values: dict[str, Any], thread: str) -> list[int]:
    """How many headers each stored header is built from (its chain)."""
    data = values.get(ROOT, {}).get(thread, {}).get("")
    if not data:
        return []
    headers = headers_of(data)
    lengths = []
    for cid in headers:
        length, at = 0, headers[cid]
        while DELTA in at:
            length += 1
            at = headers[at["parent"]]
        lengths.append(length)
    return lengths


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=60), cut=st.integers(0, 60))
def test_every_checkpoint_reads_as_a_plain_saver_reads_it_live_and_restored(
    steps: list[tuple[str, set[str], str, int]], cut: int
) -> None:
    thread_of.clear()
    _run(steps, None, cut)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=20, max_size=80), cut=st.integers(0, 80))
def test_pruned_to_a_few_what_is_kept_reads_as_a_plain_saver_reads_it(
    steps: list[tuple[str, set[str], str, int]], cut: int
) -> None:
    thread_of.clear()
    _run(steps, 3, cut)


def test_a_long_chain_is_cut_by_a_header_written_whole() -> None:
    """More puts than ``FULL_EVERY`` in a row, each changing one channel of four: no
    header is built from more than ``FULL_EVERY - 1`` others, and one written as a
    change is much smaller than one written whole (before: every one whole)."""
    thread_of.clear()
    steps = [("put", set(CHANNELS), "agent", 7)]
    steps += [("put", {"messages"}, "agent", 7) for _ in range(3 * FULL_EVERY - 1)]
    values = _run(steps, None, FULL_EVERY)
    headers = headers_of(values[ROOT]["a"][""])
    changes = [len(orjson.dumps(h)) for h in headers.values() if DELTA in h]
    wholes = [len(orjson.dumps(h)) for h in headers.values() if DELTA not in h]
    assert len(wholes) == 3 and len(changes) == 3 * (FULL_EVERY - 1), (len(wholes), len(changes))
    assert max(changes) < 0.75 * min(wholes), (changes, wholes)


async def test_a_journal_written_before_headers_were_changes_restores_and_goes_on() -> None:
    """A ``create_react_agent`` conversation journaled by the saver as it was (every
    header whole, pending writes in the namespace's map; 4 turns, ``keep=8``): folded
    from the journal alone, it reads whole, and goes on with headers as changes."""
    rows = orjson.loads((DATA / "langgraph-react-journal-before-header-changes.json").read_bytes())
    entries = [JournalEntry(**row) for row in rows]
    state = fold(SessionState(), entries)
    assert state.extensions == []
    saver = ShadowpodSaver(values=state.agent.values, keep=8)
    graph = _build_graph()(saver, "react")
    config = {"configurable": {"thread_id": "main"}}
    before = list(graph.get_state_history(config))
    messages = before[0].values["messages"]
    assert [m.text for m in messages if m.type == "human"] == [f"lookup city{n}" for n in range(4)]
    assert messages[-1].text == "lookup: sunny in city3"
    assert any(DELTA not in h for h in headers_of(state.agent.values[ROOT]["main"][""]).values())
    for turn in range(4, 8):
        await graph.ainvoke(
            {"messages": [HumanMessage(content=f"lookup city{turn}", id=f"turn-{turn}")]}, config
        )
    again = _build_graph()(ShadowpodSaver(values=saver.values, keep=8), "react")
    history = list(again.get_state_history(config))
    messages = history[0].values["messages"]
    assert [m.text for m in messages if m.type == "human"] == [f"lookup city{n}" for n in range(8)]
    assert [m.text for m in messages if m.type == "tool"] == [f"sunny in city{n}" for n in range(8)]
    headers = headers_of(saver.values[ROOT]["main"][""])
    assert any(DELTA in h for h in headers.values()), "new headers are written as changes"
    for snapshot in history:
        assert [m.id for m in snapshot.values.get("messages", [])] == [
            m.id for m in messages[: len(snapshot.values.get("messages", []))]
        ]
