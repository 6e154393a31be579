"""The LangGraph example, run for real: a gateway with SQLite, the agent as processes,
the migration engine moving the live session while a user keeps talking.

- every message is answered once, by one version, and the graph's own history holds
  the whole conversation, in order, once;
- the side-effecting tool never runs twice — not even when the owner is killed
  between its effect and its result: the new owner turns the call into an error
  ``ToolMessage``; the idempotent one, finished, is answered from the journal;
- an interrupt (human in the loop) asked by one owner is answered through another;
- ``get_state_history`` reads the checkpoints back from the journal alone.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shadowpod.api.agent import AgentStatus
from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import JournalEntry
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.reducer import fold
from shadowpod.domain.state import SessionState
from shadowpod.engine.ports import InstanceSpec
from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.integrations.langgraph import ShadowpodSaver
from shadowpod.integrations.langgraph.saver import DEFAULT_KEEP
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import ImageMap

HERE = Path(__file__).parent
AGENT = HERE / "agent.py"
SESSION = "lg"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("langgraph_example_agent", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def images(workdir: Path, graph: str = "custom") -> ImageMap:
    """The example's images, their graph built as ``graph`` says (``$GRAPH``)."""
    env = {"TOOL_LOG": "{here}/tools.log", "SHADOWPOD_SNAPSHOT_EVERY": "0", "GRAPH": graph}

    def image(version: str, **extra: str) -> dict[str, Any]:
        return {
            "command": ["{python}", str(AGENT), "--version", version],
            "env": {**env, **extra},
            # Declared: a move then does not start the image once just to ask it its
            # schema (LangGraph's imports made that 8-17 s under load).
            "state_schema": 1,
        }

    return ImageMap.from_data(
        {
            "images": {
                "lg:v1": image("1"),
                "lg:v2": image("2"),
                "lg:v3": image("3"),
                # Its emails take 300 s: the owner is killed in the middle of one.
                "lg:v1-slow-email": image("1", EMAIL_DELAY_S="300"),
            }
        },
        here=workdir,
    )


async def read_journal(admin: GatewayClient) -> list[JournalEntry]:
    entries: list[JournalEntry] = []
    while True:
        page, head = await admin.journal(SESSION, after=entries[-1].seq if entries else 0)
        entries += page
        if not page or entries[-1].seq >= head:
            return entries


def replies(entries: list[JournalEntry]) -> dict[int, list[JournalEntry]]:
    by_turn: dict[int, list[JournalEntry]] = {}
    for entry in entries:
        if entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "assistant":
            by_turn.setdefault(int(entry.payload["turn"]), []).append(entry)
    return by_turn


async def answered(admin: GatewayClient, seqs: list[int]) -> list[JournalEntry]:
    deadline = time.monotonic() + 30
    while True:
        entries = await read_journal(admin)
        if set(seqs) <= replies(entries).keys():
            return entries
        assert time.monotonic() < deadline, f"no reply to some of {seqs}"
        await asyncio.sleep(0.05)


def said(entries: list[JournalEntry], seq: int) -> str:
    (reply,) = replies(entries)[seq]
    return str(reply.payload["content"])


async def agent_status(dep: LocalDeployment, name: str) -> AgentStatus:
    """An instance's own ``/v1/status``."""
    instance = dep.runtime.instance(name)
    assert instance is not None
    async with aiohttp.ClientSession() as http, http.get(instance.url + "/v1/status") as got:
        return AgentStatus.model_validate(await got.json())


async def say(client: GatewayClient, content: str) -> int:
    return (await client.post_message(SESSION, content)).seq


async def chatter(client: GatewayClient, stop: asyncio.Event, sent: list[tuple[int, str]]) -> None:
    """A user who keeps talking, 20 messages a second, until ``stop``."""
    n = 0
    while not stop.is_set():
        n += 1
        sent.append((await say(client, f"still here {n}"), f"still here {n}"))
        await asyncio.sleep(0.05)


def tool_runs(workdir: Path) -> list[str]:
    log = workdir / "tools.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.rsplit(" pid=", 1)[0] for line in lines]


async def move(dep: LocalDeployment, source: str, image: str, target: str) -> str:
    record = dep.plan(
        SESSION,
        source=InstanceRef(name=source, image=image),
        target_image=target,
        policy=MigrationPolicy(phase_timeout_s=30.0),
    )
    record = await dep.migrate(record)
    assert record.phase is Phase.SUCCEEDED, record.error
    return record.spec.target.name


def history(
    entries: list[JournalEntry], graph_kind: str = "custom"
) -> tuple[ShadowpodSaver, Any, Any]:
    """The graph over a saver reading the journal's folded state: no agent involved."""
    state = fold(SessionState(), entries)
    saver = ShadowpodSaver(values=state.agent.values)
    graph = _example().build_graph(saver, graph_kind)
    return saver, graph, {"configurable": {"thread_id": "main"}}


async def test_the_graph_moves_under_load_with_its_history_tools_and_interrupt(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="lg:v1", instance="v1")
        opening = ["hello", "lookup Oslo", "email bob hi", "both Rome ann"]
        seqs = [await say(client, text) for text in opening]
        entries = await answered(dep.admin, seqs)
        assert [said(entries, seq) for seq in seqs] == [
            "you said: hello (1 messages so far)",
            "lookup: sunny in Oslo",
            "send_email: sent to bob",
            "lookup: sunny in Rome; send_email: sent to ann",
        ]

        # Moved to v2 while the user keeps talking.
        stop, during = asyncio.Event(), list[tuple[int, str]]()
        talking = asyncio.create_task(chatter(client, stop, during))
        await asyncio.sleep(0.2)
        v2 = await move(dep, "v1", "lg:v1", "lg:v2")
        await asyncio.sleep(0.2)
        stop.set()
        await talking

        # An interrupt asked by v2 ...
        ask = await say(client, "approve launch")
        entries = await answered(dep.admin, [*(seq for seq, _ in during), ask])
        assert said(entries, ask) == "send 'launch'? answer yes or no"
        (question,) = replies(entries)[ask]
        assert question.payload["meta"]["interrupt"] is True
        # ... answered through v3.
        v3 = await move(dep, v2, "lg:v2", "lg:v3")
        yes = await say(client, "yes")
        last = await say(client, "how many?")
        entries = await answered(dep.admin, [yes, last])

    by_turn = replies(entries)
    assert said(entries, yes) == "approved: launch"
    assert by_turn[yes][0].payload["meta"]["version"] == "3"
    # The graph's own history: every message the user said, in order, once — the
    # answer to the interrupt is a resume, not a message.
    human = [*opening, *(text for _, text in during), "approve launch", "how many?"]
    assert said(entries, last) == f"you said: how many? ({len(human)} messages so far)"
    # Every message answered exactly once, by v1 until the move, then by v2, then v3.
    user_turns = sorted([*seqs, *(seq for seq, _ in during), ask, yes, last])
    assert sorted(by_turn) == user_turns
    assert all(len(by_turn[seq]) == 1 for seq in user_turns)
    versions = [by_turn[seq][0].payload["meta"]["version"] for seq in user_turns]
    assert versions == sorted(versions) and versions[0] == "1" and versions[-1] == "3"
    assert v3 != v2
    for seq, text in during:
        assert said(entries, seq).startswith(f"you said: {text} (")
    # Each tool ran once per call.
    assert sorted(tool_runs(tmp_path)) == sorted(
        ["lookup Oslo", "email bob hi", "lookup Rome", "email ann Rome"]
    )

    # The checkpoints, read back from the journal alone.
    _, graph, config = history(entries)
    snapshots = list(graph.get_state_history(config))
    latest = snapshots[0]
    assert [m.text for m in latest.values["messages"] if m.type == "human"] == human
    asked = [s for s in snapshots if s.interrupts]
    assert [s.interrupts[0].value for s in asked] == ["send 'launch'? answer yes or no"]
    assert asked[0].next == ("approval",)
    # More checkpoints than turns, up to what retention keeps (the newest DEFAULT_KEEP).
    assert len(snapshots) > min(len(user_turns), DEFAULT_KEEP)


async def test_the_new_owner_does_not_decode_the_conversation_its_shadow_warmed(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="lg:v1", instance="v1")
        before = await answered(dep.admin, [await say(client, f"hello {n}") for n in range(40)])
        v2 = await move(dep, "v1", "lg:v1", "lg:v2")
        status = await agent_status(dep, v2)
        first = await say(client, "how many?")
        entries = await answered(dep.admin, [first])

    # Its on_shadow_ready hook ran while it was a shadow: at a watermark before the
    # fence, with the whole conversation folded.
    assert status.promotion is not None
    assert before[-1].seq <= status.warmed < status.promotion.fence_seq
    # Nothing written by the warm-up: between the last turn and the fence, only the
    # migration's own control entries.
    moved = [e for e in entries if before[-1].seq < e.seq <= status.promotion.fence_seq]
    assert {e.kind for e in moved} == {EntryKind.CONTROL}
    # The new owner's first turn read the 80 messages of history without decoding
    # any of them: the shadow had.
    (reply,) = replies(entries)[first]
    assert said(entries, first) == "you said: how many? (41 messages so far)"
    assert reply.payload["meta"]["version"] == "2"
    assert reply.payload["meta"]["decoded"] == 0


@pytest.mark.parametrize("graph", ["custom", "toolnode", "react", "create_agent"])
async def test_an_email_cut_short_by_the_owners_death_is_never_sent_again(
    tmp_path: Path, graph: str
) -> None:
    """Whichever way the graph is built — ``tool_node``, LangGraph's plain ``ToolNode``,
    ``create_react_agent``, ``create_agent`` — with nothing but ``checkpointer=saver``
    and ``graph_handler``."""
    async with (
        LocalDeployment(tmp_path, images(tmp_path, graph)) as dep,
        dep.client() as client,
    ):
        await dep.create_session(SESSION, image="lg:v1-slow-email", instance="v1")
        first = await say(client, "hello")
        await answered(dep.admin, [first])
        # Two calls in one answer: the lookup finishes, the email is under way ...
        both = await say(client, "both Rome carol")
        deadline = time.monotonic() + 20
        while "email carol Rome" not in tool_runs(tmp_path):
            assert time.monotonic() < deadline, "the email never started"
            await asyncio.sleep(0.05)
        # ... when the owner dies. A new owner takes over at the next epoch.
        await dep.runtime.kill("v1")
        await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="v2"))
        await dep.runtime.start(
            InstanceSpec(name="v2", image="lg:v2", session=SESSION, mode="owner", epoch=2)
        )
        await dep.wait_serving("v2")
        entries = await answered(dep.admin, [both])
        after = await say(client, "still there?")
        entries = await answered(dep.admin, [after])

    # The turn was redone from the model's answer journaled with the calls: the same
    # call ids; the lookup answered from the journal, the email not sent again.
    reply = said(entries, both)
    assert reply.startswith("lookup: sunny in Rome; send_email: Not run again: "), reply
    assert sorted(tool_runs(tmp_path)) == ["email carol Rome", "lookup Rome"]
    assert said(entries, after) == "you said: still there? (3 messages so far)"
    # The graph's history is whole: each call has its ToolMessage, the email's an error.
    _, built, config = history(entries, graph)
    messages = built.get_state(config).values["messages"]
    calls = [c["id"] for m in messages if m.type == "ai" for c in m.tool_calls]
    results = {m.tool_call_id: m.status for m in messages if m.type == "tool"}
    assert len(calls) == 2 and results == {calls[0]: "success", calls[1]: "error"}


async def test_a_turn_redone_from_its_first_round_of_tools_saves_its_second_anew(
    tmp_path: Path,
) -> None:
    """The old owner saved the turn's first round (the email) and died in it; the new
    owner resumes there and saves the second round (the lookup) itself: its saves
    are its own, never taken for repeats of the old owner's."""
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="lg:v1-slow-email", instance="v1")
        chain = await say(client, "chain dave Oslo")
        deadline = time.monotonic() + 20
        while "email dave Oslo" not in tool_runs(tmp_path):
            assert time.monotonic() < deadline, "the email never started"
            await asyncio.sleep(0.05)
        await dep.runtime.kill("v1")
        await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="v2"))
        await dep.runtime.start(
            InstanceSpec(name="v2", image="lg:v2", session=SESSION, mode="owner", epoch=2)
        )
        await dep.wait_serving("v2")
        await answered(dep.admin, [chain])
        after = await say(client, "and now?")
        entries = await answered(dep.admin, [after])

    assert said(entries, chain).startswith("send_email: Not run again: ")
    assert said(entries, chain).endswith("; lookup: sunny in Oslo")
    assert sorted(tool_runs(tmp_path)) == ["email dave Oslo", "lookup Oslo"]
    assert said(entries, after) == "you said: and now? (2 messages so far)"
    state = fold(SessionState(), entries)
    assert state.extensions == []  # every delta applied: none was lost as a "repeat"
    _, graph, config = history(entries)
    kinds = [
        (m.type, getattr(m, "status", None)) for m in graph.get_state(config).values["messages"]
    ]
    assert kinds == [
        ("human", None),
        ("ai", None),
        ("tool", "error"),
        ("ai", None),
        ("tool", "success"),
        ("ai", None),
        ("human", None),
        ("ai", None),
    ]


async def on_langgraph_alone(workdir: Path, opening: str, answer: str) -> list[str]:
    """The tools' runs of the same conversation on LangGraph alone: its own
    ``ToolNode`` and ``InMemorySaver``, one process — the semantics to keep."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    await asyncio.to_thread(workdir.mkdir)
    graph = _example().build_graph(InMemorySaver())
    config: Any = {"configurable": {"thread_id": "main"}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOOL_LOG", str(workdir / "tools.log"))
        asked = await graph.ainvoke({"messages": [HumanMessage(opening, id="turn-1")]}, config)
        assert asked["__interrupt__"]
        await graph.ainvoke(Command(resume=answer), config)
    return tool_runs(workdir)


async def test_an_interrupt_inside_a_tool_is_answered_after_a_move_and_sends_once(
    tmp_path: Path,
) -> None:
    async with LocalDeployment(tmp_path, images(tmp_path)) as dep, dep.client() as client:
        await dep.create_session(SESSION, image="lg:v1", instance="v1")
        ask = await say(client, "confirm bob hi")
        entries = await answered(dep.admin, [ask])
        # v1's tool stopped to ask: the question is the turn's reply.
        assert said(entries, ask) == "email 'hi' to bob? answer yes or no"
        assert replies(entries)[ask][0].payload["meta"]["interrupt"] is True
        await move(dep, "v1", "lg:v1", "lg:v2")
        yes = await say(client, "yes")
        after = await say(client, "done?")
        entries = await answered(dep.admin, [yes, after])

    # v2 resumed the tool with the answer: the email went, once.
    assert said(entries, yes) == "send_confirmed_email: sent to bob"
    assert replies(entries)[yes][0].payload["meta"]["version"] == "2"
    assert said(entries, after) == "you said: done? (2 messages so far)"
    # The journal says the first run of the call stopped at an interrupt — not that
    # it failed, nor that its outcome is unknown.
    results = [e.payload["status"] for e in entries if e.kind == EntryKind.TOOL_RESULT]
    assert results == ["interrupted", "ok"]
    state = fold(SessionState(), entries)
    assert state.tools.uncertain() == []
    # The tool ran as LangGraph alone runs it: from its start again when resumed
    # (what comes before ``interrupt()`` twice), the side effect after it once.
    alone = await on_langgraph_alone(tmp_path / "alone", "confirm bob hi", "yes")
    assert tool_runs(tmp_path) == alone == ["ask bob hi", "ask bob hi", "email bob hi"]
    # The graph's history is whole: the call answered by its one ToolMessage.
    _, graph, config = history(entries)
    messages = graph.get_state(config).values["messages"]
    assert [(m.type, getattr(m, "status", None)) for m in messages] == [
        ("human", None),
        ("ai", None),
        ("tool", "success"),
        ("ai", None),
        ("human", None),
        ("ai", None),
    ]
