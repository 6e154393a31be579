"""Suspend, resume and wake on a message, end to end: the operator in its Kopf thread,
the emulated API with the kubelet fixture running the reference agent's pods as
processes (or a real cluster: ``make cluster-kube-test``), a real gateway, and
clients posting all along."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.kube.operator_world import Load, World, plugin, reply_counts, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(240)
# The README's block this file carries out on the emulator (tests/docs/test_blocks.py
# reads these two names).
README = "README.md"
SECTION = "### Suspend and wake"


async def _phase(world: World, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        body = await world.session(name)
        return body if (body.get("status") or {}).get("phase") == phase else None

    result: dict[str, Any] = await eventually(reached, timeout=timeout, every=0.2)
    return result


async def _mode(world: World, name: str, mode: str) -> None:
    await world.raw.patch(world.path("agentsessions", name), {"spec": {"operatingMode": mode}})


async def test_a_suspended_session_keeps_every_message_and_answers_each_once_on_resume(
    world: World,
) -> None:
    await world.nodes.add_node("node-2")
    await world.apply(session_manifest("z1"))
    body = await world.wait_running("z1", epoch=1)
    first, here = body["status"]["ownerPod"], body["status"]["nodeName"]
    there = "node-2" if here == "node-1" else "node-1"
    node = f"/api/v1/nodes/{here}"
    try:
        async with Load(world, "z1", rate=5) as load:
            await asyncio.sleep(1.5)
            await _mode(world, "z1", "Suspended")
            body = await _phase(world, "z1", "Suspended")
            status = body["status"]
            assert status["suspension"]["reason"] == "Requested" and status["epoch"] == 2
            assert "ownerPod" not in status
            await eventually(lambda: _no_pods(world, "z1"), timeout=60)
            # No owner on purpose: counted as Suspended, not as a session without owner.
            registry = world.metrics.registry
            assert registry.get_sample_value("shadowpod_sessions", {"phase": "Suspended"}) == 1
            assert registry.get_sample_value("shadowpod_sessions_without_ready_owner") == 0
            # Suspended, on a node that is then cordoned: the messages keep coming.
            await world.raw.patch(node, {"spec": {"unschedulable": True}})
            before = load.load.verdict().accepted
            await asyncio.sleep(2)
            assert load.load.verdict().accepted >= before + 5  # accepted while suspended
            await _mode(world, "z1", "Running")
            body = await world.wait_running("z1", epoch=2, timeout=120)
            await asyncio.sleep(1)
            assert await load.stop(answered_within=60)
    finally:  # on a real cluster the node is everyone's
        await world.raw.patch(node, {"spec": {"unschedulable": False}})
    verdict = load.load.verdict()
    assert verdict.sent == verdict.accepted > 20
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict
    assert "suspension" not in body["status"]
    pods = await world.pods("z1")
    assert [p["metadata"]["name"] for p in pods] == [body["status"]["ownerPod"]]
    assert body["status"]["ownerPod"] != first
    assert pods[0]["spec"]["nodeName"] == there  # resumed on another node
    reasons = [r for _, r, _ in await world.events("z1")]
    assert {"Suspended", "Resuming", "Resumed"} <= set(reasons)

    async with world.client() as client:
        history = await client.history(world.gateway_session("z1"))
    told = [e.event for e in history.events if e.event in ("suspend", "resume", "snapshot")]
    assert told[-2:] == ["suspend", "resume"] and "snapshot" in told  # the final snapshot
    result = await plugin(world, "history", "z1", "--gateway", world.gateway.url)
    assert result.exit_code == 0, result.output
    assert "suspend" in result.output and "resume" in result.output


async def test_an_idle_session_suspends_and_a_message_wakes_it_answered_once(
    world: World,
) -> None:
    await world.apply(session_manifest("z2", idleSuspendAfter="3s"))
    await world.wait_running("z2", epoch=1)
    sid = world.gateway_session("z2")
    async with world.client() as client:
        hello = await client.post_message(sid, "my name is Ada", id="hello")

        async def answered(seq: int) -> dict[int, int] | None:
            counts = await reply_counts(client, sid)
            return counts if seq in counts else None

        await eventually(lambda: answered(hello.seq), timeout=30)
        body = await _phase(world, "z2", "Suspended", timeout=30)
        assert body["status"]["suspension"]["reason"] == "Idle"
        await eventually(lambda: _no_pods(world, "z2"), timeout=30)
        await asyncio.sleep(1)  # idle and suspended: it stays so
        assert (await world.session("z2"))["status"]["phase"] == "Suspended"

        # The first message wakes it, and is answered once the owner is up.
        woke = await client.post_message(sid, "what is my name?", id="wake", wait_s=30)
        assert not woke.waking
        counts = await eventually(lambda: answered(woke.seq), timeout=60)
        await asyncio.sleep(1)
        counts = await reply_counts(client, sid)
        assert counts[woke.seq] == 1 and counts[hello.seq] == 1
        events = (await client.events(sid, after=woke.seq, kinds=["message"])).events
        reply = next(e for e in events if e["payload"].get("turn") == woke.seq)
        assert "Ada" in reply["payload"]["content"]  # its memory came back with it
    reasons = [r for _, r, _ in await world.events("z2")]
    assert "Resumed" in reasons


async def test_a_schedule_declared_to_wake_wakes_an_idle_session_and_another_waits(
    world: World,
) -> None:
    """``spec.schedules[].wake``: both sessions sleep for being idle; the fire of the
    schedule declared with ``wake`` brings its owner back and is answered once, the
    other's fires are journaled and wait (its session stays suspended)."""
    every = 8
    for name, wake in (("z5", True), ("z6", False)):
        schedule = {"name": "nudge", "everySeconds": every, "message": "anything new?"}
        await world.apply(
            session_manifest(name, idleSuspendAfter="2s", schedules=[{**schedule, "wake": wake}])
        )
    for name in ("z5", "z6"):
        await world.wait_running(name, epoch=1)
    async with world.client() as client:

        async def fires(name: str, after: int = 0) -> list[int]:
            page = await client.events(
                world.gateway_session(name), after=after, kinds=["schedule"], limit=1000
            )
            return [e["seq"] for e in page.events if e["payload"]["op"] == "fire"]

        suspended: dict[str, int] = {}
        for name in ("z5", "z6"):
            body = await _phase(world, name, "Suspended", timeout=60)
            assert body["status"]["suspension"]["reason"] == "Idle"
            suspended[name] = (await client.status(world.gateway_session(name))).head

        # The waking schedule's next fire brings an owner back, which answers it once.
        async def woke_by_a_fire() -> int | None:
            after = await fires("z5", suspended["z5"])
            counts = await reply_counts(client, world.gateway_session("z5"))
            return next((seq for seq in after if counts.get(seq) == 1), None)

        fire = await eventually(woke_by_a_fire, timeout=90, every=0.5)
        history = await client.history(world.gateway_session("z5"))
        wakes = [e for e in history.events if e.event == "wake" and e.seq > suspended["z5"]]
        assert wakes and wakes[0].reason == "schedule", history.events
        await asyncio.sleep(1)
        assert (await reply_counts(client, world.gateway_session("z5")))[fire] == 1

        # The other's fires came too, and wait unanswered with its session asleep.
        async def fired_while_asleep() -> list[int] | None:
            return await fires("z6", suspended["z6"]) or None

        waiting = await eventually(fired_while_asleep, timeout=30)
        counts = await reply_counts(client, world.gateway_session("z6"))
        assert all(seq not in counts for seq in waiting), (waiting, counts)
        assert (await world.session("z6"))["status"]["phase"] == "Suspended"
        assert await _no_pods(world, "z6")


def _readme_block() -> list[list[str]]:
    """The commands of the README's "Suspend and wake" block, as a shell splits them."""
    text = (Path(__file__).resolve().parents[2] / README).read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n#", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    return [c for line in block.splitlines() if (c := shlex.split(line, comments=True))]


async def test_the_readmes_suspend_and_wake_block_does_what_it_says(world: World) -> None:
    """Each line carried out through the API as kubectl would (no kubectl binary speaks
    to the emulator): a line of another shape fails the test, so the block cannot grow
    a command this does not run."""
    await world.apply(session_manifest("support-ada"))
    await world.wait_running("support-ada", epoch=1)
    for command in _readme_block():
        match command:
            case ["kubectl", "patch", "ags", name, "--type", "merge", "-p", patch]:
                await world.raw.patch(world.path("agentsessions", name), json.loads(patch))
            case ["kubectl", "wait", wanted, target, timeout] if wanted.startswith("--for="):
                kind, _, name = target.partition("/")
                assert kind in ("ags", "agentsession") and timeout.startswith("--timeout=")
                seconds = float(timeout.removeprefix("--timeout=").removesuffix("s"))
                condition = wanted.removeprefix("--for=")
                if condition == "condition=Ready":
                    await world.wait_running(name, timeout=seconds)
                else:
                    phase = condition.removeprefix("jsonpath={.status.phase}=")
                    assert phase != condition, f"README: cannot carry out {command}"
                    await _phase(world, name, phase, timeout=seconds)
            case _:
                raise AssertionError(f"README: a command this test does not run: {command}")
    body = await world.session("support-ada")
    assert body["spec"]["idleSuspendAfter"] == "15m" and body["status"]["epoch"] == 2


async def _no_pods(world: World, name: str) -> bool:
    return not [p for p in await world.pods(name) if not p["metadata"].get("deletionTimestamp")]


async def test_a_session_created_suspended_starts_no_pod_and_answers_once_resumed(
    world: World,
) -> None:
    """Sessions made ahead (one per user, say) and left suspended cost no pod: none is
    started for a session created ``Suspended``; its first owner starts on resume and
    answers what waited."""
    await world.apply(session_manifest("z4", operatingMode="Suspended"))
    pods_seen: list[str] = []

    async def suspended() -> dict[str, Any] | None:
        pods_seen.extend(p["metadata"]["name"] for p in await world.pods("z4"))
        body = await world.session("z4")
        return body if (body.get("status") or {}).get("phase") == "Suspended" else None

    body = await eventually(suspended, timeout=60, every=0.2)
    assert body["status"]["suspension"]["reason"] == "Requested"
    await asyncio.sleep(2)  # and it stays so, with no pod
    assert (await world.session("z4"))["status"]["phase"] == "Suspended"
    pods_seen.extend(p["metadata"]["name"] for p in await world.pods("z4"))
    assert pods_seen == []
    sid = world.gateway_session("z4")
    async with world.client() as client:
        hello = await client.post_message(sid, "my name is Ada", id="hello")
        await _mode(world, "z4", "Running")
        await world.wait_running("z4", timeout=120)

        async def answered() -> dict[int, int] | None:
            counts = await reply_counts(client, sid)
            return counts if hello.seq in counts else None

        await eventually(answered, timeout=60)
        await asyncio.sleep(1)
        assert (await reply_counts(client, sid))[hello.seq] == 1
    assert len(await world.pods("z4")) == 1
