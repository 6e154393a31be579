"""``shadowpod bench langgraph``: one LangGraph agent, two checkpointers, side by side.

The agent is the LangGraph example (``examples/03-langgraph``: a ``StateGraph`` with
a tool-calling chat model). Its conversation is driven to 10, 1,000 and 10,000 turns
with each checkpointer, and at each length the benchmark measures one more turn
(the median of a few) and the bytes stored:

- **LangGraph's ``AsyncSqliteSaver``** (``langgraph-checkpoint-sqlite``) in a SQLite
  file: a turn is the graph's run, its checkpoints written by the saver. It stores
  every new version of the ``messages`` channel whole, so each turn writes the whole
  conversation again: its cost grows with the conversation, its file quadratically.
- **Shadowpod's ``ShadowpodSaver``**: a turn is what an owner does — the graph's run,
  its checkpoints as deltas of the agent's state, and the turn's outputs (reply,
  state entry, ack) appended durably to a real SQLite journal store (the gateway's,
  in process: no HTTP), the journal folded as an owner folds it. Bytes: the journal
  file.

Tool-calling turns (``lookup <city>``: the model calls a tool, then answers) are
driven too, up to ``tool_max_turns``, on the graphs developers build most: LangGraph's
prebuilt ``create_react_agent`` (whose ``Send`` hands each tool call a copy of the
whole state), LangChain's ``create_agent``, the example's own graph — each with
``ShadowpodSaver`` — and the example's graph with its messages in LangGraph 1.2's
``DeltaChannel`` on LangGraph's own ``AsyncSqliteSaver`` (checkpoints store the
writes, not the list): ``tool_turns`` in the report.

A turn's time is measured from the graph's start to its outputs being durable; most
of it, at length, is LangGraph's own work on the whole conversation (``add_messages``
indexes every message each step), the same with either saver. So the checkpointer's
own share is measured apart: the time spent inside the saver's methods (for
Shadowpod: those, computing the turn's state entry, and the durable append of the
turn's outputs); LangGraph writes a step's task results concurrently, so this time
may overlap itself and exceed the turn's. Both run with ``durability="sync"``
(each checkpoint durable before the next step, as a migration needs). The figures
are the machine's (shared, 2 cores: see ``machine``); the SQLite saver is not
driven past ``sqlite_max_turns`` (its file at 10,000 turns would be ~100 times the
one at 1,000).
"""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from shadowpod.bench.inprocess import InProcessOwner
from shadowpod.bench.machine import LOOP_STEPS, MachineProbe
from shadowpod.domain.ownership import Ownership
from shadowpod.integrations.langgraph import ShadowpodSaver, graph_handler
from shadowpod.journal.sqlite.store import SQLiteJournalStore
from shadowpod.local.images import examples_dir

SESSION: Final = "bench"
EXAMPLE: Final = "03-langgraph/agent.py"
# The conversation's own messages: a plain turn (no tool): the model answers.
MESSAGE: Final = "tell me about turn {n}, please"
# A tool-calling turn: the model calls ``lookup``, then answers with its result.
TOOL_MESSAGE: Final = "lookup city{n}"
# The tool-calling columns: (report name, saver, the example's graph kind).
TOOL_COLUMNS: Final = (
    ("shadowpod_create_react_agent", "shadowpod", "react"),
    ("shadowpod_create_agent", "shadowpod", "create_agent"),
    ("shadowpod_custom_graph", "shadowpod", "custom"),
    ("langgraph_sqlite_delta_channel", "sqlite", "delta"),
)


@dataclass(frozen=True)
class LangGraphBenchConfig:
    lengths: tuple[int, ...] = (10, 1_000, 10_000)
    samples: int = 5  # turns measured at each length (the median is reported)
    sqlite_max_turns: int = 1_000
    tool_max_turns: int = 1_000  # tool-calling turns are driven up to this length
    tool_columns: tuple[str, ...] = tuple(name for name, _, _ in TOOL_COLUMNS)
    workdir: Path | None = None
    loop_steps: int = LOOP_STEPS


def _build_graph() -> Callable[..., Any]:
    path = examples_dir() / EXAMPLE
    spec = importlib.util.spec_from_file_location("shadowpod_bench_langgraph_agent", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the LangGraph example from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build: Callable[..., Any] = module.build_graph
    return build


def _file_bytes(path: Path) -> int:
    # Checkpoint first: the WAL is scratch space that is reused, not growth.
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


class _Stopwatch:
    """The seconds spent inside some of an object's coroutine methods."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, target: Any, *names: str) -> None:
        for name in names:
            method = getattr(target, name)

            async def timed(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await _method(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - started

            setattr(target, name, timed)

    def lap(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


SAVER_METHODS: Final = ("aget_tuple", "aput", "aput_writes")


class _Owner(InProcessOwner):
    """The LangGraph graph as an owner in process, timed: turns on the folded state,
    their outputs appended durably to the journal store, and folded back."""

    def __init__(self, store: SQLiteJournalStore, graph: Any, saver: ShadowpodSaver) -> None:
        super().__init__(store, SESSION, instance="bench")
        self.handler = graph_handler(saver, graph)
        self.saving = _Stopwatch()
        self.saving.wrap(saver, *SAVER_METHODS)

    async def turn(self, content: str) -> tuple[float, float]:
        """One turn: the seconds from the graph's start to its outputs being durable,
        and those of them spent saving its checkpoints."""
        seq, turn = await self.open_turn(content)
        started = time.perf_counter()
        await self.handler(turn)
        ended = time.perf_counter()
        await self.close_turn(seq, turn)
        now = time.perf_counter()
        return now - started, self.saving.lap() + (now - ended)


async def _shadowpod(
    config: LangGraphBenchConfig,
    workdir: Path,
    kind: str = "custom",
    message: str = MESSAGE,
    lengths: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    store = SQLiteJournalStore(workdir / "journal.db")
    await store.open()
    try:
        await store.create_session(SESSION)
        await store.compare_and_set_ownership(SESSION, 0, Ownership(epoch=1, owner="bench"))
        saver = ShadowpodSaver()
        owner = _Owner(store, _build_graph()(saver, kind), saver)
        return await _drive(
            config,
            config.lengths if lengths is None else lengths,
            owner.turn,
            lambda: _file_bytes(store.path),
            message,
        )
    finally:
        await store.close()


async def _sqlite(
    config: LangGraphBenchConfig,
    workdir: Path,
    kind: str = "custom",
    message: str = MESSAGE,
    lengths: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    # Plain turns stop at ``sqlite_max_turns`` (the file grows with their square);
    # tool-calling turns (``lengths`` given) at ``tool_max_turns``.
    most = config.sqlite_max_turns if lengths is None else config.tool_max_turns
    lengths = tuple(n for n in (config.lengths if lengths is None else lengths) if n <= most)
    async with AsyncSqliteSaver.from_conn_string(str(workdir / "checkpoints.db")) as saver:
        graph = _build_graph()(saver, kind)
        saving = _Stopwatch()
        saving.wrap(saver, *SAVER_METHODS)
        runs = {"configurable": {"thread_id": "main"}}

        async def turn(content: str) -> tuple[float, float]:
            started = time.perf_counter()
            # Durable before the next step, as Shadowpod's runs are (``run_graph``): the
            # time inside the saver is then its own, not overlapping the graph's.
            await graph.ainvoke(
                {"messages": [HumanMessage(content=content)]}, runs, durability="sync"
            )
            return time.perf_counter() - started, saving.lap()

        result = await _drive(
            config, lengths, turn, lambda: _file_bytes(workdir / "checkpoints.db"), message
        )
    skipped = [n for n in config.lengths if n > most]
    if skipped:
        result["not_run"] = {str(n): f"beyond the longest asked, {most} turns" for n in skipped}
    return result


async def _drive(
    config: LangGraphBenchConfig,
    lengths: tuple[int, ...],
    turn: Callable[[str], Awaitable[tuple[float, float]]],
    size: Callable[[], int],
    message: str = MESSAGE,
) -> dict[str, Any]:
    """Drive the conversation to each length; there, measure ``samples`` more turns."""
    done = 0
    by_length: dict[str, Any] = {}
    for length in sorted(lengths):
        started = time.perf_counter()
        while done < length:
            await turn(message.format(n=done))
            done += 1
        filled_s = time.perf_counter() - started
        stored = size()
        times, saving = [], []
        for _ in range(config.samples):
            took, saved = await turn(message.format(n=done))
            times.append(took)
            saving.append(saved)
            done += 1
        by_length[str(length)] = {
            "one_more_turn_ms_p50": round(statistics.median(times) * 1000, 2),
            "one_more_turn_ms_max": round(max(times) * 1000, 2),
            "checkpointer_ms_p50": round(statistics.median(saving) * 1000, 2),
            # What one more turn added to the file (its growth over the samples).
            "one_more_turn_bytes": round((size() - stored) / config.samples),
            "bytes_stored": stored,
            "seconds_to_reach": round(filled_s, 1),
        }
    return {"by_turns": by_length}


async def run_langgraph_bench(config: LangGraphBenchConfig) -> dict[str, Any]:
    machine = MachineProbe(loop_steps=config.loop_steps)
    machine.start()
    workdir = Path(tempfile.mkdtemp(prefix="shadowpod-bench-lg-", dir=config.workdir))
    try:
        (workdir / "sp").mkdir()
        (workdir / "lg").mkdir()
        shadowpod = await _shadowpod(config, workdir / "sp")
        sqlite = await _sqlite(config, workdir / "lg")
        tool_lengths = tuple(n for n in config.lengths if n <= config.tool_max_turns)
        tool_turns: dict[str, Any] = {}
        for name, saver, kind in TOOL_COLUMNS:
            if name not in config.tool_columns:
                continue
            (workdir / name).mkdir()
            run = _shadowpod if saver == "shadowpod" else _sqlite
            tool_turns[name] = await run(config, workdir / name, kind, TOOL_MESSAGE, tool_lengths)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report: dict[str, Any] = {
        "benchmark": "langgraph",
        "agent": f"examples/{EXAMPLE} (StateGraph, scripted tool-calling chat model)",
        "config": {
            "lengths": list(config.lengths),
            "samples": config.samples,
            "sqlite_max_turns": config.sqlite_max_turns,
            "tool_max_turns": config.tool_max_turns,
        },
        "savers": {"shadowpod": shadowpod, "langgraph_sqlite": sqlite},
        "ratios_sqlite_over_shadowpod": _ratios(sqlite, shadowpod),
        "tool_turns": tool_turns,
        "ratios_delta_channel_over_create_react_agent": _ratios(
            tool_turns["langgraph_sqlite_delta_channel"],
            tool_turns["shadowpod_create_react_agent"],
        )
        if {"langgraph_sqlite_delta_channel", "shadowpod_create_react_agent"} <= tool_turns.keys()
        else {},
        "machine": machine.report(),
    }
    report["targets"] = _targets(report)
    return report


# Shadowpod's write per turn is flat (within this factor from the shortest to the
# longest conversation) and at 1,000 turns at least this many times smaller than
# the SQLite saver's.
FLAT_WITHIN: Final = 1.5
CHEAPER_AT_1000: Final = 20.0
# SQLite files grow by whole pages (4 KiB by default): measured over ``samples`` turns,
# one more turn's bytes are known to a page divided by the samples, no finer. With the
# journal's large payloads compressed a turn writes less than a page, so flatness is
# judged to that resolution.
PAGE_BYTES: Final = 4096


def _targets(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    ours = report["savers"]["shadowpod"]["by_turns"]
    lengths = sorted(ours, key=int)
    first, last = ours[lengths[0]]["one_more_turn_bytes"], ours[lengths[-1]]["one_more_turn_bytes"]
    growth = round(last / max(first, 1), 2)
    resolution = round(PAGE_BYTES / report["config"]["samples"])
    at_1000 = report["ratios_sqlite_over_shadowpod"].get("1000", {}).get("one_more_turn_bytes")
    targets = {
        "shadowpod_turn_bytes_flat": {
            "target": FLAT_WITHIN,
            "measured": growth,
            "resolution_bytes": resolution,
            "met": last <= FLAT_WITHIN * first + resolution if len(lengths) > 1 else None,
        },
        "turn_bytes_cheaper_at_1000": {
            "target": CHEAPER_AT_1000,
            "measured": at_1000,
            "met": None if at_1000 is None else at_1000 >= CHEAPER_AT_1000,
        },
    }
    # create_react_agent's tool-calling turn on Shadowpod against the DeltaChannel
    # graph on LangGraph's SQLite saver, at the longest conversation both ran: the
    # ratio of their bytes per turn (theirs over ours: at least 1 to beat it).
    ratios = report.get("ratios_delta_channel_over_create_react_agent", {})
    if ratios:
        longest = max(ratios, key=int)
        measured = ratios[longest]["one_more_turn_bytes"]
        targets["tool_turn_bytes_vs_delta_channel"] = {
            "target": 1.0,
            "measured": measured,
            "at_turns": int(longest),
            "met": measured >= 1.0,
        }
    return targets


def _ratios(sqlite: dict[str, Any], shadowpod: dict[str, Any]) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    for length, theirs in sqlite["by_turns"].items():
        ours = shadowpod["by_turns"].get(length)
        if ours is None:
            continue
        ratios[length] = {
            "checkpointer_ms": round(
                theirs["checkpointer_ms_p50"] / max(ours["checkpointer_ms_p50"], 1e-9), 2
            ),
            "one_more_turn_ms": round(
                theirs["one_more_turn_ms_p50"] / max(ours["one_more_turn_ms_p50"], 1e-9), 2
            ),
            "one_more_turn_bytes": round(
                theirs["one_more_turn_bytes"] / max(ours["one_more_turn_bytes"], 1), 2
            ),
            "bytes_stored": round(theirs["bytes_stored"] / max(ours["bytes_stored"], 1), 2),
        }
    return ratios
