"""Live migrations with real processes and real HTTP, judged from the client's side."""

from __future__ import annotations

import asyncio

from shadowpod.domain.ownership import FenceState
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.local.scenario import SESSION, LiveScenario, ScenarioReport
from tests.engine.conftest import Hook, hooked_engine


def _failed_checks(report: ScenarioReport) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]


async def test_a_session_moves_to_a_new_version_under_load_with_every_invariant(
    scenario: LiveScenario,
) -> None:
    await asyncio.sleep(1.0)
    outcome = await scenario.migrate("refagent:v2")
    await asyncio.sleep(1.0)
    report = await scenario.finish()
    record = outcome.record
    assert record.phase is Phase.SUCCEEDED, record.error
    assert _failed_checks(report) == []
    assert report.verdict.versions.keys() == {"1", "2"}
    assert outcome.state_matches is True
    assert record.fence is not None and record.fence.epoch == 2
    assert list(record.timings) == [
        "Pending", "Preflight", "Snapshotting", "Restoring", "CatchingUp",
        "Fencing", "Committed", "Draining", "Succeeded",
    ]  # fmt: skip
    ownership = await scenario.deployment.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner) == (2, record.spec.target.name)
    # the source left: it exited after being superseded
    assert not (await scenario.deployment.runtime.status(record.spec.source.name)).alive


async def test_the_restart_baseline_also_loses_nothing(scenario: LiveScenario) -> None:
    await asyncio.sleep(0.5)
    outcome = await scenario.migrate("refagent:v2", strategy="restart")
    report = await scenario.finish()
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    assert _failed_checks(report) == []
    assert list(outcome.record.timings)[:6] == [
        "Pending", "Preflight", "Snapshotting", "Stopping", "Committed", "Restoring",
    ]  # fmt: skip


async def test_a_shadow_killed_during_catch_up_rolls_back_and_the_source_keeps_serving(
    scenario: LiveScenario,
) -> None:
    runtime = scenario.deployment.runtime

    async def kill_shadow(record: MigrationRecord) -> None:
        await runtime.kill(record.spec.target.name)

    engine = hooked_engine(scenario, {Phase.CATCHING_UP: kill_shadow})
    await asyncio.sleep(0.5)
    outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
    record = outcome.record
    assert record.phase is Phase.ROLLED_BACK
    assert record.failed_phase is Phase.CATCHING_UP
    assert record.error is not None and "not running" in record.error
    ownership = await scenario.deployment.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (1, "demo-v1", FenceState.OPEN)
    await asyncio.sleep(1.0)  # the source keeps answering
    report = await scenario.finish()
    assert report.verdict.lost == 0 and report.verdict.duplicated == 0
    assert report.verdict.reordered == 0
    assert report.verdict.versions.keys() == {"1"}


async def test_a_source_mid_turn_longer_than_the_fence_timeout_is_unfenced_and_retried(
    scenario: LiveScenario,
) -> None:
    client = scenario.client
    assert client is not None
    slow_ids: list[int] = []

    async def long_turn(record: MigrationRecord) -> None:
        # 2.5 s of work released to the source just before the fence (timeout 1 s).
        accepted = await client.post_message(SESSION, "sleep 2.5", id="slow-turn")
        slow_ids.append(accepted.seq)
        await asyncio.sleep(0.3)

    engine = hooked_engine(scenario, {Phase.CATCHING_UP: long_turn})
    await asyncio.sleep(0.5)
    outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
    record = outcome.record
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.fence_attempts >= 2
    assert any("timed out" in note for note in record.notes)
    report = await scenario.finish()
    assert _failed_checks(report) == []
    assert scenario.load is not None
    [slow_reply] = await _replies_to(scenario, slow_ids[0])
    assert slow_reply.startswith("[v1]") and "slept 2.5s" in slow_reply


def _source_killer(scenario: LiveScenario) -> Hook:
    """A hook that kills the migration's source, as a crash would."""

    async def kill_source(record: MigrationRecord) -> None:
        await scenario.deployment.runtime.kill(record.spec.source.name)

    return kill_source


async def test_a_source_killed_after_the_epoch_bump_does_not_stop_the_new_owner(
    scenario: LiveScenario,
) -> None:
    engine = hooked_engine(scenario, {Phase.COMMITTED: _source_killer(scenario)})
    await asyncio.sleep(0.5)
    outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    await asyncio.sleep(1.0)
    report = await scenario.finish()
    assert _failed_checks(report) == []
    assert report.verdict.versions.get("2", 0) > 0
    # Killed, the source could not report its drain: the runtime did, for it — unless
    # it saw the bump and drained in the moment before the kill (then it said so).
    killed = [n for n in outcome.record.notes if n.startswith("the source left running")]
    if killed:
        assert len(killed) == 1 and "indexer (pid " in killed[0], outcome.record.notes
    else:
        [drained] = [c.detail for c in report.checks if c.name == "sources drained"]
        assert drained.startswith("1 of 1 replaced owners reported their drain"), drained


async def test_a_source_that_dies_before_its_snapshot_is_replaced_by_the_target_at_once(
    scenario: LiveScenario,
) -> None:
    """Not after the phase timeout (20 s here), as a snapshot that never comes would;
    and not by a rollback to the dead source: the target starts from the journal."""
    engine = hooked_engine(scenario, {Phase.SNAPSHOTTING: _source_killer(scenario)})
    await asyncio.sleep(0.5)
    outcome = await scenario.run_migration(scenario.plan("refagent:v2"), engine)
    record = outcome.record
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.source_lost is not None and record.source_lost.phase is Phase.SNAPSHOTTING
    assert "killed by SIGKILL" in record.source_lost.how
    timing = record.timings[Phase.SNAPSHOTTING].seconds
    assert timing is not None and timing < 10.0, timing
    report = await scenario.finish()
    assert (report.verdict.lost, report.verdict.duplicated, report.verdict.reordered) == (0, 0, 0)


async def test_the_gateway_killed_and_restarted_under_load_loses_and_doubles_nothing(
    scenario: LiveScenario,
) -> None:
    gateway = scenario.deployment.gateway
    await asyncio.sleep(1.0)
    await gateway.stop(kill=True)  # SIGKILL: no goodbye to anyone
    await asyncio.sleep(0.5)  # clients and the agent retry into the void meanwhile
    await gateway.start()  # same port, same journal
    await asyncio.sleep(1.5)
    outcome = await scenario.migrate("refagent:v2")  # and it still migrates
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    report = await scenario.finish()
    assert _failed_checks(report) == []
    assert report.verdict.accepted == report.verdict.sent


async def _replies_to(scenario: LiveScenario, seq: int) -> list[str]:
    assert scenario.load is not None
    for _ in range(100):
        if seq in scenario.load.replies:
            break
        await asyncio.sleep(0.05)
    return [reply.content for reply in scenario.load.replies.get(seq, [])]
