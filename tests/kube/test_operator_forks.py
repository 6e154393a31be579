"""Forks, end to end: ``kubectl shadowpod fork`` makes an AgentSession with
``spec.forkFrom``, the operator starts its owner from the parent's state at the fork
point, and the parent serves on under client load, untouched."""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from shadowpod.client.gateway import GatewayClient
from tests.kube.operator_world import Load, World, plugin, reply_counts, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(240)
# The README's block this file carries out on the emulator (tests/docs/test_blocks.py
# reads these two names).
README = "README.md"
SECTION = "### Fork"


async def _answer(client: GatewayClient, session: str, content: str, id: str) -> str:
    """Post ``content``; the reply to it, once there is one."""
    posted = await client.post_message(session, content, id=id)

    async def replied() -> str | None:
        events = (await client.events(session, after=posted.seq, kinds=["message"])).events
        for event in events:
            payload: dict[str, Any] = event["payload"]
            if payload.get("turn") == posted.seq and payload.get("role") == "assistant":
                return str(payload["content"])
        return None

    answer: str = await eventually(replied, timeout=60, every=0.2)
    return answer


async def test_a_fork_answers_from_the_parents_state_and_the_parent_serves_on(
    world: World,
) -> None:
    await world.apply(session_manifest("p1"))
    await world.wait_running("p1", epoch=1)
    parent = world.gateway_session("p1")
    async with world.client() as client:
        await _answer(client, parent, "my name is Grace", id="grace")
        fork_seq = (await client.status(parent)).head
        await _answer(client, parent, "my name is Linus", id="linus")
        before = [e["seq"] for e in (await client.events(parent, after=0)).events]

        async with Load(world, "p1", rate=5) as load:  # renames it Ada, then asks on
            await asyncio.sleep(1)
            result = await plugin(world, "fork", "p1", "f1", "--seq", str(fork_seq))
            assert result.exit_code == 0, result.output
            assert f"fork of p1 at seq {fork_seq}" in result.output
            body = await world.wait_running("f1", timeout=90)
            fork = world.gateway_session("f1")
            said = await _answer(client, fork, "what is my name?", id="ask-fork")
            assert "Grace" in said
            await asyncio.sleep(1)
            assert await load.stop(answered_within=60)
        verdict = load.load.verdict()
        assert verdict.sent == verdict.accepted > 5
        assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict
        assert "Ada" in await _answer(client, parent, "what is my name?", id="ask-parent")

        # The parent: its own owner, its journal up to the fork as it was, nothing of
        # the fork's in it; the fork: its own owner, a journal of its own after the point.
        assert (await world.session("p1"))["status"]["epoch"] == 1
        after = [e["seq"] for e in (await client.events(parent, after=0)).events]
        assert after[: len(before)] == before
        counts = await reply_counts(client, fork)
        assert max(counts) > fork_seq and all(n == 1 for n in counts.values())
    assert body["spec"]["forkFrom"] == {"session": "p1", "seq": fork_seq}
    assert body["status"]["ownerPod"] not in {p["metadata"]["name"] for p in await world.pods("p1")}


async def test_a_fork_of_a_missing_session_says_so_and_waits(world: World) -> None:
    await world.apply(session_manifest("f2", forkFrom={"session": "nobody", "seq": 3}))

    async def degraded() -> dict[str, Any] | None:
        status = (await world.session("f2")).get("status") or {}
        found = [c for c in status.get("conditions", []) if c.get("reason") == "ForkRefused"]
        return found[0] if found else None

    condition = await eventually(degraded, timeout=30, every=0.2)
    assert "nobody" in condition["message"] and "spec.forkFrom" in condition["message"]
    assert (await world.session("f2"))["status"]["phase"] == "Pending"
    assert await world.pods("f2") == []
    reasons = [r for _, r, _ in await world.events("f2")]
    assert reasons.count("ForkRefused") == 1


def _readme_block() -> list[list[str]]:
    """The commands of the README's "Fork" block, as a shell splits them."""
    text = (Path(__file__).resolve().parents[2] / README).read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n#", 1)[0]
    [block] = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    return [c for line in block.splitlines() if (c := shlex.split(line, comments=True))]


async def test_the_readmes_fork_block_does_what_it_says(world: World) -> None:
    """Each line carried out as kubectl would (the plugin as kubectl runs it; a wait
    through the API): a line of another shape fails the test."""
    await world.apply(session_manifest("support-ada"))
    await world.wait_running("support-ada", epoch=1)
    async with world.client() as client:
        parent = world.gateway_session("support-ada")
        await _answer(client, parent, "my name is Ada", id="first")  # seqs 2-4
        await _answer(client, parent, "my name is Bob", id="second")
        for command in _readme_block():
            match command:
                case ["kubectl", "shadowpod", "fork", *args]:
                    result = await plugin(world, "fork", *args)
                    assert result.exit_code == 0, result.output
                case ["kubectl", "wait", "--for=condition=Ready", target, timeout]:
                    kind, _, name = target.partition("/")
                    assert kind == "agentsession" and timeout.startswith("--timeout=")
                    seconds = float(timeout.removeprefix("--timeout=").removesuffix("s"))
                    await world.wait_running(name, timeout=seconds)
                case _:
                    raise AssertionError(f"README: a command this test does not run: {command}")
        fork = world.gateway_session("support-ada-try")
        assert "Ada" in await _answer(client, fork, "what is my name?", id="ask")
    body = await world.session("support-ada-try")
    assert body["spec"]["forkFrom"] == {"session": "support-ada", "seq": 4}
