"""A source killed mid-migration, for real: a gateway on SQLite, the reference agent's
processes, client load, and ``kill -9`` of the source in the middle of a turn at each
phase before the epoch bump — at the phase's boundary (the engine held there by a hook
on its record, before the phase acts), or while the fence waits for that turn (seen in
the gateway's persisted fence state). A source that dies mid-turn never acks what it
was given: before the fix, every fence timed out and the rollback gave the session
back to the dead process. The session must not be left with a
dead owner: nothing lost, doubled or reordered, and every accepted message answered
within ``ANSWER_BOUND_S``.

The bound: a message that arrives as the source dies waits for the shadow to be ready
(Restoring: an interpreter start and a restore, 1-3 s on this busy 2-core machine),
for the engine to see the source dead (at the latest one fence timeout, 1 s here), the
takeover (one epoch bump) and the backlog's turns — a few seconds. 15 s leaves room
for a loaded machine; before the fix such messages were never answered.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Final

import pytest

from shadowpod.domain.ownership import FenceState
from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import MigrationPolicy, MigrationRecord, Phase, ValidationPolicy
from shadowpod.gates.policy import GatePolicy
from shadowpod.local.scenario import SESSION, LiveScenario, ScenarioReport
from tests.engine.conftest import Hook, HookedRecords

pytestmark = pytest.mark.timeout(240)

POLICY: Final = MigrationPolicy(fence_timeout_s=1.0, max_fence_attempts=5, phase_timeout_s=20.0)
ANSWER_BOUND_S: Final = 15.0
BEFORE_THE_BUMP: Final = [
    Phase.PREFLIGHT,
    Phase.SNAPSHOTTING,
    Phase.RESTORING,
    Phase.CATCHING_UP,
    Phase.FENCING,
]


@pytest.fixture
async def scenario(tmp_path: Path) -> AsyncIterator[LiveScenario]:
    async with LiveScenario(tmp_path, rate=40, policy=POLICY) as live:
        await _replies(live, 10)  # the session serves under load before anything is killed
        yield live


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if await check():
                return
            await asyncio.sleep(0.005)


async def _replies(scenario: LiveScenario, count: int) -> None:
    async def answered() -> bool:
        return len(scenario.load.replies) >= count

    await _until(answered)


def _engine(scenario: LiveScenario, hooks: dict[Phase, Hook]) -> MigrationEngine:
    dep = scenario.deployment
    return MigrationEngine(
        dep.runtime, dep.control, HookedRecords(dep.records, hooks), validator=dep.validator
    )


class MidTurnKiller:
    """A hook that kills the migration's source in the middle of a turn: a long one
    (``sleep 1``) is posted and released to the source — so the source holds an inbound
    entry it will never ack, as when a crash comes mid-turn — then ``kill -9``."""

    def __init__(self, scenario: LiveScenario) -> None:
        self.scenario = scenario
        self.long_turns: list[int] = []

    async def __call__(self, record: MigrationRecord) -> None:
        dep, client = self.scenario.deployment, self.scenario.client
        assert client is not None
        accepted = await client.post_message(
            SESSION, "sleep 1", id=f"long-turn-{len(self.long_turns)}"
        )
        self.long_turns.append(accepted.seq)

        async def released() -> bool:
            return (await dep.admin.status(SESSION)).delivered_through >= accepted.seq

        await _until(released)
        await dep.runtime.kill(record.spec.source.name)

    def answered_once(self, version: str) -> None:
        """Each long turn the source died in was answered once, by ``version``."""
        for seq in self.long_turns:
            replies = self.scenario.load.replies.get(seq, [])
            assert len(replies) == 1 and "slept 1s" in replies[0].content, replies
            assert replies[0].version == version


async def _served_within_bound(
    scenario: LiveScenario, *, rolled_back: bool = False
) -> ScenarioReport:
    report = await scenario.finish()
    verdict = report.verdict
    assert (verdict.lost, verdict.duplicated, verdict.reordered) == (0, 0, 0), verdict
    assert verdict.accepted > 0
    assert verdict.latency_ms["max"] <= ANSWER_BOUND_S * 1000, verdict.latency_ms
    expected = {"migrations succeeded"} if rolled_back else set()
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok and c.name not in expected]
    assert failed == []
    return report


@pytest.mark.parametrize("phase", BEFORE_THE_BUMP, ids=[p.value for p in BEFORE_THE_BUMP])
async def test_a_source_killed_at_a_phase_boundary_is_taken_over_by_the_target(
    scenario: LiveScenario, phase: Phase
) -> None:
    dep = scenario.deployment
    record = scenario.plan("refagent:v2")
    killer = MidTurnKiller(scenario)
    outcome = await scenario.run_migration(record, _engine(scenario, {phase: killer}))
    done = outcome.record
    assert done.phase is Phase.SUCCEEDED, (done.error, done.notes)
    assert done.source_lost is not None and "SIGKILL" in done.source_lost.how
    assert done.replacement is None
    target = record.spec.target.name
    ownership = await dep.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (2, target, FenceState.OPEN)
    status = await dep.runtime.status(target)
    assert (status.mode, status.serving, status.epoch) == ("owner", True, 2)
    report = await _served_within_bound(scenario)
    assert report.verdict.versions.get("2", 0) > 0  # the target answers, with v1's memory
    killer.answered_once("2")


async def test_a_source_killed_while_the_fence_waits_for_its_turn_is_taken_over(
    scenario: LiveScenario,
) -> None:
    """The source is in a turn when the fence closes (frozen in it); it is killed
    while the gateway waits for that turn's ack (the fence persisted as ``Fenced``). After one
    fence timeout the engine finds it dead, and bumps the epoch to the shadow instead
    of fencing again; the shadow answers the turn the source died in, once."""
    dep, client = scenario.deployment, scenario.client
    assert client is not None
    long_turn: list[int] = []

    async def busy_source(record: MigrationRecord) -> None:
        accepted = await client.post_message(SESSION, "sleep 2", id="long-turn")
        long_turn.append(accepted.seq)

        async def released() -> bool:  # to the source: the fence will wait for its ack
            return (await dep.admin.status(SESSION)).delivered_through >= accepted.seq

        await _until(released)
        # Frozen mid-turn (SIGSTOP): alive, so the engine fences it as a slow source —
        # and the turn cannot end before the fence closes, however loaded the machine.
        source = dep.runtime.instance(record.spec.source.name)
        assert source is not None
        os.killpg(source.process.pid, signal.SIGSTOP)

    async def fenced() -> bool:
        return (await dep.admin.ownership(SESSION)).fence is FenceState.FENCED

    async def kill_when_fenced(source: str) -> None:
        await _until(fenced, timeout_s=60.0)
        await dep.runtime.kill(source)

    record = scenario.plan("refagent:v2")
    killer = asyncio.create_task(kill_when_fenced(record.spec.source.name))
    try:
        outcome = await scenario.run_migration(
            record, _engine(scenario, {Phase.FENCING: busy_source})
        )
    finally:
        killer.cancel()
    done = outcome.record
    assert killer.done()
    assert done.phase is Phase.SUCCEEDED, (done.error, done.notes)
    assert done.source_lost is not None and done.source_lost.phase is Phase.FENCING
    assert done.fence_attempts == 1, done.notes  # one timeout, then no fence again
    await _served_within_bound(scenario)
    [seq] = long_turn
    replies = scenario.load.replies[seq]
    assert len(replies) == 1 and "slept 2s" in replies[0].content, replies
    assert replies[0].version == "2"


async def test_a_source_killed_at_validating_is_replaced_on_its_own_image(
    tmp_path: Path,
) -> None:
    """The upgrade gate needs the source's answers to judge the target: with the source
    dead there is no verdict, and v2 is not given the session unproven. A new owner of
    v1 takes it at the next epoch, from the snapshot and the journal."""
    gate = ValidationPolicy(turns=5, timeout_s=30.0, gate=GatePolicy(judge="normalised"))
    policy = POLICY.model_copy(update={"validation": gate})
    async with LiveScenario(tmp_path, rate=40, policy=policy) as scenario:
        await _replies(scenario, 10)
        dep = scenario.deployment
        record = scenario.plan("refagent:v2")
        killer = MidTurnKiller(scenario)
        outcome = await scenario.run_migration(
            record, _engine(scenario, {Phase.VALIDATING: killer})
        )
        done = outcome.record
        assert done.phase is Phase.ROLLED_BACK, (done.error, done.notes)
        assert (done.reason, done.failed_phase) == ("SourceLost", Phase.VALIDATING)
        assert done.validation is None  # no verdict was made up
        replacement = done.replacement
        assert replacement is not None and replacement.image == "refagent:v1"
        ownership = await dep.admin.ownership(SESSION)
        assert (ownership.epoch, ownership.owner) == (2, replacement.name)
        shadow = await dep.runtime.status(record.spec.target.name)
        assert not shadow.alive
        report = await _served_within_bound(scenario, rolled_back=True)
        assert set(report.verdict.versions) == {"1"}
        killer.answered_once("1")
