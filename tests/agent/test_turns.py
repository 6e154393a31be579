"""The agent runtime in owner mode, run for real: a gateway subprocess, agent
subprocesses, HTTP and WebSockets in between. What is asserted is what a user (or an
operator reading the journal) would notice."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from shadowpod.agent.identity import Identity
from shadowpod.api.agent import AgentStatus, BackgroundProcess
from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import entry_from_json
from shadowpod.domain.payloads import EntryKind, Role
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.domain.state import CallStatus, ProcessStatus
from shadowpod.engine.ports import InstanceSpec
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.gateway_process import GatewayProcess, free_port
from tests.agent.support import (
    SESSION,
    acked,
    agent_get,
    alive,
    folded,
    lines_of,
    of_kind,
    post,
    read_journal,
    replies,
    replies_to,
    wait_answered,
    wait_for,
)

OWNER = "owner-1"


async def start(dep: LocalDeployment, image: str = "surfaces:1") -> None:
    await dep.create_session(SESSION, image=image, instance=OWNER)


async def test_replies_carry_their_turn_and_come_in_processing_order(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    # Posted back to back, without waiting for any reply.
    seqs = [await post(client, f"hello {n}") for n in range(6)]
    await wait_answered(dep.admin, seqs)

    # What the user sees on the client event route: one reply per message, in order,
    # each naming the inbound seq of its turn.
    page = await client.events(SESSION, kinds=["message"])
    answers = replies(entry_from_json(event) for event in page.events)
    assert [a.payload["turn"] for a in answers] == seqs
    assert [a.payload["content"] for a in answers] == [f"heard: hello {n}" for n in range(6)]
    assert {(a.epoch, a.payload["meta"]["instance"]) for a in answers} == {(1, OWNER)}

    # The transcript folded from the journal is message, reply, message, reply, ...
    state = folded(await read_journal(dep.admin))
    pairs = [(m.role, m.content, m.turn) for m in state.transcript]
    expected = []
    for n, seq in enumerate(seqs):
        expected += [(Role.USER, f"hello {n}", seq), (Role.ASSISTANT, f"heard: hello {n}", seq)]
    assert pairs == expected
    assert state.pending == {}
    assert state.acked_turn == seqs[-1]


async def test_every_surface_a_turn_writes_is_journaled_and_in_the_owner_state(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    commands = [
        "remember city Oslo",
        "learn no-friday never deploy on friday",
        "count",
        "count",
        "schedule digest 3600",
        "spawn worker obedient",
    ]
    seqs = [await post(client, command) for command in commands]
    entries = await wait_answered(dep.admin, seqs)
    turn_of = dict(zip(commands, seqs, strict=True))

    # Each surface is written by an entry of its kind, tagged with the turn that wrote it.
    def written(kind: str) -> list[int | None]:
        return [e.turn for e in of_kind(entries, kind) if e.epoch == 1]

    assert written(EntryKind.MEMORY) == [turn_of["remember city Oslo"]]
    assert written(EntryKind.FACT) == [turn_of["learn no-friday never deploy on friday"]]
    assert written(EntryKind.STATE) == seqs[2:4]
    assert written(EntryKind.SCHEDULE) == [turn_of["schedule digest 3600"]]
    assert written(EntryKind.PROCESS) == [turn_of["spawn worker obedient"]]
    (spawned,) = replies_to(entries, turn_of["spawn worker obedient"])
    pid = spawned.payload["meta"]["pid"]
    assert isinstance(pid, int) and alive(pid)

    state = folded(entries)
    assert state.memory == {"city": "Oslo"}
    assert {k: f.text for k, f in state.facts.items()} == {"no-friday": "never deploy on friday"}
    assert state.agent.values == {"count": 2}
    assert state.schedules["digest"].every_s == 3600
    assert state.schedules["digest"].content == "tick digest"
    worker = state.processes["worker"]
    assert (worker.status, worker.pid) == (ProcessStatus.RUNNING, pid)

    # The owner's own view (GET /v1/state) is exactly the fold of the journal up to
    # its watermark: nothing lives only in the agent's memory.
    owner_state = load_state(await agent_get(dep, OWNER, "/v1/state"))
    assert owner_state.watermark >= max(seqs)
    upto = [e for e in entries if e.seq <= owner_state.watermark]
    if owner_state.watermark > entries[-1].seq:  # the journal moved on since we read it
        upto = [e for e in await read_journal(dep.admin) if e.seq <= owner_state.watermark]
    assert dump_state(owner_state) == dump_state(folded(upto))
    assert owner_state.memory == {"city": "Oslo"}
    assert owner_state.processes["worker"].pid == pid

    raw = await agent_get(dep, OWNER, "/v1/status")
    # Every field the agent reports is in the model its readers parse it with.
    assert set(raw) == set(AgentStatus.model_fields)
    status = AgentStatus.model_validate(raw)
    assert (status.mode, status.epoch, status.ready, status.serving) == ("owner", 1, True, True)
    assert status.turns == len(commands)
    assert status.processes == [BackgroundProcess(name="worker", pid=pid, running=True)]
    # As the engine sees it, through the runtime.
    seen = await dep.runtime.status(OWNER)
    assert (seen.alive, seen.mode, seen.epoch, seen.serving) == (True, "owner", 1, True)
    assert seen.watermark >= max(seqs)


async def test_a_tool_call_journals_its_intent_before_its_result(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    seq = await post(client, "echo ping")
    entries = await wait_answered(dep.admin, [seq])

    (intent,) = of_kind(entries, EntryKind.TOOL_CALL)
    (result,) = of_kind(entries, EntryKind.TOOL_RESULT)
    (reply,) = replies_to(entries, seq)
    (ack,) = [e for e in of_kind(entries, EntryKind.ACK) if e.payload["turn"] == seq]
    call_id = f"{seq}:1"
    assert intent.payload["call_id"] == result.payload["call_id"] == call_id
    assert intent.payload["tool"] == "echo" and intent.payload["args"] == {"text": "ping"}
    assert intent.payload["idempotent"] is True
    assert result.payload["status"] == "ok" and result.payload["result"] == {"echoed": "ping"}
    # Intent, then result, then the turn's reply and ack.
    assert intent.seq < result.seq < reply.seq < ack.seq
    assert reply.payload["content"] == "tool said {'echoed': 'ping'}"

    call = folded(entries).tools.calls[call_id]
    assert call.status is CallStatus.OK
    assert (call.intent_seq, call.result_seq) == (intent.seq, result.seq)


async def test_a_handler_that_raises_still_ends_its_turn(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    boom = await post(client, "boom")
    after = await post(client, "still there?")
    entries = await wait_answered(dep.admin, [boom, after])

    (error_reply,) = replies_to(entries, boom)
    assert error_reply.payload["content"] == "error while handling this message: RuntimeError"
    assert error_reply.payload["meta"]["error"] == "boom as requested"
    assert boom in acked(entries)
    (next_reply,) = replies_to(entries, after)
    assert next_reply.payload["content"] == "heard: still there?"
    assert "error" not in next_reply.payload["meta"]
    assert next_reply.seq > error_reply.seq
    status = await agent_get(dep, OWNER, "/v1/status")
    assert (status["mode"], status["turns"], status["error"]) == ("owner", 2, None)


async def test_a_superseded_owner_stops_drains_its_processes_and_exits_cleanly(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    await start(dep)
    seqs = [
        await post(client, "spawn polite obedient"),
        await post(client, "spawn stubborn stubborn"),  # ignores SIGTERM
    ]
    entries = await wait_answered(dep.admin, seqs)
    pids = {
        name: replies_to(entries, seq)[0].payload["meta"]["pid"]
        for name, seq in zip(("polite", "stubborn"), seqs, strict=True)
    }

    async def both_up() -> bool | None:
        return all(lines_of(tmp_path / f"{name}.up") == ["up"] for name in pids) or None

    await wait_for(both_up, "the background processes to be set up")
    assert all(alive(pid) for pid in pids.values())

    # Another owner takes the session over: epoch 2.
    await dep.admin.set_ownership(
        SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="someone-else")
    )
    late = await post(client, "anyone?")
    owner = dep.runtime.instance(OWNER)
    assert owner is not None
    assert await asyncio.wait_for(owner.process.wait(), timeout=10) == 0
    assert not any(alive(pid) for pid in pids.values())

    entries = await read_journal(dep.admin)
    (marker,) = [
        e
        for e in of_kind(entries, EntryKind.CONTROL)
        if e.payload["event"] == "epoch" and e.payload["epoch"] == 2
    ]
    # It took no turn after the epoch moved on: the late message is still pending.
    assert not any(e.epoch == 1 and e.seq > marker.seq for e in entries)
    assert replies_to(entries, late) == []
    assert late in folded(entries).pending
    # The drain is on the record: what happened to each process, and who drained.
    drained = {
        e.payload["name"]: (e.payload["op"], e.payload["pid"])
        for e in of_kind(entries, EntryKind.PROCESS)
        if e.seq > marker.seq
    }
    assert drained == {
        "polite": ("terminated", pids["polite"]),
        "stubborn": ("killed", pids["stubborn"]),
    }
    (report,) = [e for e in of_kind(entries, EntryKind.CONTROL) if e.payload["event"] == "drained"]
    assert report.payload["owner"] == OWNER and report.payload["epoch"] == 1
    assert report.payload["detail"] == {"processes": 2}
    processes = folded(entries).processes
    assert processes["polite"].status is ProcessStatus.TERMINATED
    assert processes["stubborn"].status is ProcessStatus.KILLED


async def test_a_drain_report_does_not_end_the_next_owners_process_of_the_same_name(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    await dep.create_session(SESSION, image="surfaces:slow-drain", instance=OWNER)
    spawned = await post(client, "spawn worker stubborn")  # its drain takes the 8 s grace
    await wait_answered(dep.admin, [spawned])

    async def worker_up() -> bool | None:
        return lines_of(tmp_path / "worker.up") == ["up"] or None

    await wait_for(worker_up, "the worker to be set up")
    await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="next"))
    await dep.runtime.start(
        InstanceSpec(name="next", image="surfaces:1", session=SESSION, mode="owner", epoch=2)
    )
    await dep.wait_serving("next")
    again = await post(client, "spawn worker obedient")
    (reply,) = replies_to(await wait_answered(dep.admin, [again]), again)
    pid = reply.payload["meta"]["pid"]
    first = dep.runtime.instance(OWNER)
    assert first is not None
    assert (
        await asyncio.wait_for(first.process.wait(), timeout=20) == 0
    )  # drained (8 s grace), reported

    entries = await read_journal(dep.admin)
    (started,) = [e for e in of_kind(entries, EntryKind.PROCESS) if e.payload["pid"] == pid]
    (ended,) = [e for e in of_kind(entries, EntryKind.PROCESS) if e.payload["op"] == "killed"]
    # What triggers it: the old owner's report lands after the new owner's start.
    assert started.seq < ended.seq, "the drain report came first this time"
    assert alive(pid)
    worker = folded(entries).processes["worker"]
    assert (worker.status, worker.pid) == (ProcessStatus.RUNNING, pid)


async def test_the_owner_reconnects_after_a_gateway_crash_and_keeps_answering(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    first = await post(client, "before the crash")
    await wait_answered(dep.admin, [first])

    await dep.gateway.stop(kill=True)
    await asyncio.sleep(0.3)  # the agent notices and starts retrying
    await dep.gateway.start()  # same port, same database

    second = await post(client, "after the crash")
    entries = await wait_answered(dep.admin, [second])
    (reply,) = replies_to(entries, second)
    assert reply.payload["content"] == "heard: after the crash"
    assert (reply.epoch, reply.payload["meta"]["instance"]) == (1, OWNER)
    assert [len(replies_to(entries, turn)) for turn in (first, second)] == [1, 1]
    owner = dep.runtime.instance(OWNER)
    assert owner is not None and owner.process.returncode is None


async def test_identity_files_are_reread_on_reconnect(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    """Like a process restored into a new pod: the gateway moved to another address and
    the token the agent started with was revoked; only the rewritten identity files
    tell it where and who it is now."""
    created = await dep.admin.create_session(CreateSession(session=SESSION))
    old = dep.gateway
    # It starts with the gateway's control token (accepted on agent routes too) ...
    dep.runtime.register_session(SESSION, old.control_token)
    await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=0, epoch=1, owner=OWNER))
    spec = InstanceSpec(name=OWNER, image="surfaces:1", session=SESSION, mode="owner", epoch=1)
    await dep.runtime.start(spec)
    await dep.wait_serving(OWNER)
    first = await post(client, "hello from the old place")
    await wait_answered(dep.admin, [first])

    # ... then the gateway dies and comes back elsewhere (same database) with a new
    # control token: the old address is dead and the old token is refused.
    await old.stop(kill=True)
    moved = GatewayProcess(old.workdir, port=free_port())
    assert moved.control_token != old.control_token
    Identity.write(
        dep.workdir / "instances" / OWNER / "identity",
        session=SESSION,
        instance=OWNER,
        gateway=moved.url,
        token=created.agent_token,
    )
    await moved.start()
    try:
        async with (
            GatewayClient(moved.url, moved.control_token) as admin,
            GatewayClient(moved.url, old.control_token) as revoked,
            GatewayClient(moved.url) as user,
        ):
            with pytest.raises(GatewayError) as refused:
                await revoked.journal(SESSION, after=0)  # an agent route
            assert refused.value.status == 401
            second = await post(user, "hello from the new place")
            entries = await wait_answered(admin, [second])
            (reply,) = replies_to(entries, second)
            assert reply.payload["content"] == "heard: hello from the new place"
            assert (reply.epoch, reply.payload["meta"]["instance"]) == (1, OWNER)
            assert [len(replies_to(entries, turn)) for turn in (first, second)] == [1, 1]
            status = await agent_get(dep, OWNER, "/v1/status")
            assert (status["mode"], status["epoch"], status["error"]) == ("owner", 1, None)
            await dep.runtime.stop(OWNER, grace_s=5)  # while its gateway is still there
    finally:
        await moved.stop()


async def test_turns_queued_behind_each_other_each_see_the_last_and_share_one_append(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    """A backlog (here: messages that arrived while the owner was frozen) is worked off
    in groups of quick turns journaled together, and every turn still sees the state
    the turn before it left."""
    await start(dep)
    instance = dep.runtime.instance(OWNER)
    assert instance is not None
    os.kill(instance.process.pid, signal.SIGSTOP)
    try:
        seqs = [await post(client, "count") for _ in range(4)]
        await asyncio.sleep(0.2)  # the gateway pushes the deliveries into the socket
    finally:
        os.kill(instance.process.pid, signal.SIGCONT)
    entries = await wait_answered(dep.admin, seqs)

    # Each turn counted on from the one before: none saw a stale state.
    answers = [replies_to(entries, seq)[0].payload["content"] for seq in seqs]
    assert answers == ["count 1", "count 2", "count 3", "count 4"]
    assert folded(entries).agent.values == {"count": 4}

    # Their outputs were journaled by fewer appends than turns: entries written in
    # one commit share its timestamp, and they are contiguous.
    outputs = [e for e in entries if e.epoch == 1 and e.seq > seqs[-1]]
    commits = {e.ts for e in outputs}
    assert len(commits) < len(seqs)
    assert [e.seq for e in outputs] == list(range(seqs[-1] + 1, seqs[-1] + 1 + len(outputs)))


async def test_a_tool_call_in_a_backlog_is_journaled_after_the_turns_before_it(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await start(dep)
    instance = dep.runtime.instance(OWNER)
    assert instance is not None
    os.kill(instance.process.pid, signal.SIGSTOP)
    try:
        seqs = [await post(client, text) for text in ("count", "echo hi", "count")]
        await asyncio.sleep(0.2)
    finally:
        os.kill(instance.process.pid, signal.SIGCONT)
    entries = await wait_answered(dep.admin, seqs)

    answers = [replies_to(entries, seq)[0].payload["content"] for seq in seqs]
    assert answers == ["count 1", "tool said {'echoed': 'hi'}", "count 2"]
    # The intent is journaled before the tool runs, and after everything the earlier
    # turn wrote: a new owner reading the journal sees them in the order they happened.
    (intent,) = of_kind(entries, EntryKind.TOOL_CALL)
    acks = {int(e.payload["turn"]): e.seq for e in of_kind(entries, EntryKind.ACK)}
    assert list(acks) == seqs
    assert acks[seqs[0]] < intent.seq < acks[seqs[1]]
