"""A check fails only when its property fails: runs in which nothing was lost, but a
measure could not be taken, must not be reported as broken invariants."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from shadowpod.client.gateway import GatewayClient
from shadowpod.engine.record import MigrationPolicy, MigrationRecord, Phase
from shadowpod.local.runtime import LocalRuntime
from shadowpod.local.scenario import SESSION, LiveScenario, ScenarioReport
from tests.agent.support import wait_for
from tests.engine.conftest import hooked_engine


def _failed(report: ScenarioReport) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]


def _check(report: ScenarioReport, name: str) -> str:
    [found] = [c for c in report.checks if c.name == name]
    return found.detail


async def _crash(runtime: LocalRuntime, name: str) -> None:
    """The instance and its children die at once. Frozen first: a promoted shadow
    starts its background process just now, and one started between the runtime's
    look for children and its SIGKILL would outlive it (an orphan, not what we test)."""
    instance = runtime.instance(name)
    assert instance is not None
    os.kill(instance.process.pid, signal.SIGSTOP)
    await runtime.kill(name)


async def _until_nothing_outstanding(client: GatewayClient) -> None:
    """Until the owner has acked every message the gateway released to it."""

    async def acked_all() -> bool | None:
        return (await client.status(SESSION)).outstanding == 0 or None

    await wait_for(acked_all, "the owner's acks of every message released to it", 10.0)


async def test_a_shadow_killed_after_the_epoch_bump_is_a_recovery_not_a_broken_invariant(
    scenario: LiveScenario,
) -> None:
    runtime = scenario.deployment.runtime

    async def kill_new_owner(record: MigrationRecord) -> None:
        await _crash(runtime, record.spec.target.name)

    engine = hooked_engine(scenario, {Phase.COMMITTED: kill_new_owner})
    await asyncio.sleep(0.5)
    outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    assert outcome.record.recoveries == 1
    await asyncio.sleep(1.0)
    report = await scenario.finish()
    assert report.verdict.lost == 0 and report.verdict.duplicated == 0
    assert _failed(report) == []
    assert report.ok
    # ... and it says why the state could not be compared, rather than passing silently.
    detail = _check(report, "state at fence_seq equals the source's")
    assert "restarted" in detail, detail


async def test_a_source_killed_before_it_could_drain_breaks_no_invariant(
    tmp_path: Path,
) -> None:
    policy = MigrationPolicy(fence_timeout_s=1.0, max_fence_attempts=5, phase_timeout_s=20.0)
    # No schedule: a fire released to the source once it is frozen would be a message in
    # its hands, which the fence waits for (and rolls back after, rightly: a stopped
    # process is a slow source, not a dead one).
    async with LiveScenario(
        tmp_path, rate=50, policy=policy, heartbeat_s=0.0, schedules=()
    ) as scenario:
        runtime = scenario.deployment.runtime
        await asyncio.sleep(0.5)
        # Quiet first, so that the frozen source has nothing in hand the fence would wait for.
        await scenario.stop_load()
        assert await scenario.load.wait_answered(10.0)
        # Answered is not yet acked (an owner acks after its reply is journaled): the
        # frozen source would leave that ack owed and every fence attempt wait for it.
        assert scenario.client is not None
        await _until_nothing_outstanding(scenario.client)

        async def freeze_source(record: MigrationRecord) -> None:
            # It must not see the epoch move and drain before it is killed.
            instance = runtime.instance(record.spec.source.name)
            assert instance is not None
            os.kill(instance.process.pid, signal.SIGSTOP)

        async def kill_source(record: MigrationRecord) -> None:
            await runtime.kill(record.spec.source.name)

        hooks = {Phase.FENCING: freeze_source, Phase.COMMITTED: kill_source}
        engine = hooked_engine(scenario, hooks)
        outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
        assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
        report = await scenario.finish()
    # Killed, it could not report a drain: the runtime journaled it on its behalf
    # (its background work died with it).
    assert _failed(report) == []
    assert "1 of 1 replaced owners reported their drain" in _check(report, "sources drained")


async def test_a_backlog_still_being_answered_is_slow_not_lost(scenario: LiveScenario) -> None:
    # Turns of 0.4 s each, with the load queued behind them: answering it all takes
    # longer than the drain timeout, but a reply comes every 0.4 s — nothing is lost.
    client = scenario.client
    assert client is not None
    for n in range(6):
        await client.post_message(SESSION, "sleep 0.4", id=f"slow-{n}")
    await asyncio.sleep(0.3)
    report = await scenario.finish(drain_timeout_s=1.5)
    assert report.verdict.lost == 0, _check(report, "lost")
    assert _failed(report) == []
