"""``kubectl shadowpod`` against the emulated API, with the operator running."""

from __future__ import annotations

import pytest

from tests.kube.operator_world import World, plugin, session_manifest

pytestmark = pytest.mark.timeout(240)


async def test_status_migrate_wait_and_history(world: World) -> None:
    await world.apply(session_manifest("k1"))
    await world.wait_running("k1", epoch=1)

    shown = await plugin(world, "status")
    assert shown.exit_code == 0, shown.output
    assert "k1" in shown.output and "Running" in shown.output and "refagent:v1" in shown.output

    moved = await plugin(
        world, "migrate", "k1", "--image", "refagent:v2", "--wait", "--timeout", "120"
    )
    assert moved.exit_code == 0, moved.output
    assert "Succeeded" in moved.output

    body = await world.wait_running("k1", epoch=2)
    assert body["status"]["image"] == "refagent:v2"
    history = await plugin(world, "history", "k1")
    assert history.exit_code == 0
    assert "Succeeded" in history.output and "refagent:v2" in history.output

    hints = await plugin(world, "logs", "k1")
    assert hints.exit_code == 0
    assert f"kubectl logs -n {world.namespace} {body['status']['ownerPod']}" in hints.output


async def test_unknown_names_exit_2_with_one_line(world: World) -> None:
    missing = await plugin(world, "migrate", "nope")
    assert missing.exit_code == 2
    assert "AgentSession 'nope' not found" in missing.output
    cancelled = await plugin(world, "cancel", "nope-m1")
    assert cancelled.exit_code == 2
    assert "not found" in cancelled.output
