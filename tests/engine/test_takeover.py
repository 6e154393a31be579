"""``Succeeded`` means the new owner was seen serving — its adoption of the session
journaled at the new epoch — not only started. Run for real: a gateway, the test
agents as processes, the engine through the local runtime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.ports import InstanceStatus
from shadowpod.engine.record import InstanceRef, MigrationPolicy, MigrationRecord, Phase
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import SESSION, agent_get, agent_images, post, replies_to, wait_answered
from tests.engine.conftest import HookedRecords

OWNER = "owner-1"
POLICY = MigrationPolicy(phase_timeout_s=20.0, drain_grace_s=1.0)


@pytest.fixture
async def dep(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    async with LocalDeployment(tmp_path, agent_images(tmp_path)) as deployment:
        await deployment.create_session(SESSION, image="surfaces:1", instance=OWNER)
        yield deployment


def _plan(dep: LocalDeployment, target: str) -> MigrationRecord:
    return dep.plan(
        SESSION,
        source=InstanceRef(name=OWNER, image="surfaces:1"),
        target_image=target,
        policy=POLICY,
    )


async def test_a_takeover_entry_larger_than_an_append_is_journaled_and_the_new_owner_serves(
    dep: LocalDeployment,
) -> None:
    """Three values of ~0.6 MB each journal fine one by one; the new owner migrates
    them all in one entry (1.8 MB) as it takes over."""
    async with dep.client() as client:
        for key in "abc":  # one by one: one append each
            await wait_answered(dep.admin, [await post(client, f"grow {key} 300000")])
        record = _plan(dep, "surfaces:2")
        done = await dep.migrate(record)
        assert done.phase is Phase.SUCCEEDED, done.error
        target = done.spec.target.name
        asked = await post(client, "sizes")
        (reply,) = replies_to(await wait_answered(dep.admin, [asked]), asked)
        status = await dep.runtime.status(target)
        assert (status.mode, status.serving, status.epoch) == ("owner", True, 2)
    assert reply.epoch == 2 and reply.payload["meta"]["instance"] == target
    assert reply.payload["meta"]["sizes"] == {"a": 300000, "b": 300000, "c": 300000}
    state = await agent_get(dep, target, "/v1/state")
    assert state["agent"]["schema_version"] == 2 and state["agent"]["parts"] == {}


async def test_a_new_owner_that_fails_to_take_over_fails_the_migration_with_its_error(
    dep: LocalDeployment,
) -> None:
    """The state turns unreadable for the target after its shadow restored (checked
    then) and before the cutover: the promoted shadow cannot adopt it and stops. The
    migration must not be reported ``Succeeded``, nor retried for a phase timeout."""
    async with dep.client() as client:
        await wait_answered(dep.admin, [await post(client, "count")])

        async def poison(_: MigrationRecord) -> None:
            await wait_answered(dep.admin, [await post(client, "poison")])

        engine = MigrationEngine(
            dep.runtime, dep.control, HookedRecords(dep.records, {Phase.CATCHING_UP: poison})
        )
        done = await engine.run(_plan(dep, "surfaces:2"))

    assert done.phase is Phase.FAILED
    assert done.recoveries == 0  # an instance that failed is not restarted into failing again
    assert done.failed_phase is Phase.COMMITTED
    assert done.error is not None, done
    # Its own error, whether the engine saw it exited (its termination message) or
    # still up in mode failed (its status): both carry what the agent said.
    assert "did not take over epoch 2" in done.error, done.error
    assert "this state is poisoned" in done.error, done.error
    # It stops for good: seen exited, however long its shutdown takes on a busy machine
    # (in between it is alive but no longer answers its status).
    status = await _ended(dep, done.spec.target.name, within_s=15.0)
    assert (status.alive, status.mode, status.serving) == (False, "failed", False)


async def _ended(dep: LocalDeployment, name: str, *, within_s: float) -> InstanceStatus:
    deadline = asyncio.get_running_loop().time() + within_s
    status = await dep.runtime.status(name)
    while status.alive and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
        status = await dep.runtime.status(name)
    return status
