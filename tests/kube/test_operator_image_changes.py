"""An image change's AgentMigration is made at once, and a session's pass reads its
owner pod from the operator's pod watch (issue 28: image bump → AgentMigration p99
≤ 1 s with thousands of sessions; under load, a bump's move used to wait behind the
whole pass its spec change started — a dozen requests to the API and the gateway).

On the emulator, with the kubelet stand-in's "no process" pods (Running and Ready at
once, nothing in them): the moves made here fail at their shadow, which is not what is
looked at."""

from __future__ import annotations

import asyncio
import os
import signal

import kmock
import pytest

from shadowpod.kube import names
from tests.kube.emulator import ApiServerEmulator
from tests.kube.operator_world import World, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def world(processless_world: World) -> World:
    return processless_world


async def _steady(world: World, name: str) -> dict[str, object]:
    await world.wait_running(name, timeout=120)

    async def steady() -> dict[str, object] | None:
        body = await world.session(name)
        status = body.get("status") or {}
        done = status.get("observedGeneration") == body["metadata"]["generation"]
        return body if done and not status.get("activeMigration") else None

    return await eventually(steady, timeout=60, every=0.3)


async def test_an_image_change_gets_its_migration_while_the_gateway_does_not_answer(
    world: World,
) -> None:
    """The move is made from what the watches show: a gateway that does not answer
    (the pass that follows waits for it) does not hold the AgentMigration back."""
    await world.apply(session_manifest("bumped"))
    await _steady(world, "bumped")
    process = world.gateway.process  # type: ignore[attr-defined]
    assert process is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        body = await world.raw.patch(
            world.path("agentsessions", "bumped"), {"spec": {"image": "refagent:v2"}}
        )
        assert body is not None
        wanted = names.image_migration("bumped", body["metadata"]["generation"])
        made = await eventually(lambda: world.migration(wanted), timeout=15, every=0.2)
        assert made["spec"]["target"]["image"] == "refagent:v2"
        assert made["spec"]["reason"] == "ImageChange"
    finally:
        os.kill(process.pid, signal.SIGCONT)
    # The pass that waited for the gateway goes on, and finds the move made.
    assert ("Normal", "MigrationCreated", f"ImageChange: AgentMigration {wanted}") in (
        await world.events("bumped")
    )


async def test_a_pass_reads_its_owner_pod_from_the_watch(
    world: World, emulator: ApiServerEmulator
) -> None:
    await world.apply(session_manifest("watched"))
    body = await _steady(world, "watched")
    owner = body["status"]["ownerPod"]  # type: ignore[index]

    def owner_reads() -> int:
        return sum(
            1
            for request in list(emulator)
            if request.method == kmock.method.GET
            and request.resource is not None
            and request.resource.plural == "pods"
            and request.name == owner
        )

    before = owner_reads()
    # A spec change that moves nothing: one full pass (Secret, gateway, budget, owner).
    patched = await world.raw.patch(
        world.path("agentsessions", "watched"), {"spec": {"checkpoint": {"retainSnapshots": 4}}}
    )
    assert patched is not None

    async def passed() -> bool | None:
        status = (await world.session("watched")).get("status") or {}
        return status.get("observedGeneration") == patched["metadata"]["generation"] or None

    await eventually(passed, timeout=60, every=0.3)
    await asyncio.sleep(1.0)
    assert owner_reads() == before
