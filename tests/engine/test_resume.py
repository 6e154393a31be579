"""A crashed engine resumes from its stored record, at any phase boundary."""

from __future__ import annotations

import asyncio

import pytest

from shadowpod.domain.ownership import FenceState
from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.ports import FenceOutcomeUnknown
from shadowpod.engine.record import SHADOW_PHASES, MigrationRecord, Phase
from shadowpod.local.scenario import SESSION, LiveScenario
from tests.engine.conftest import EngineCrashed, HookedRecords, hooked_engine

BOUNDARIES = list(SHADOW_PHASES)


async def _crash(record: MigrationRecord) -> None:
    raise EngineCrashed(record.phase)


@pytest.mark.parametrize("phase", BOUNDARIES, ids=[p.value for p in BOUNDARIES])
async def test_an_engine_stopped_at_a_phase_boundary_resumes_and_finishes(
    scenario: LiveScenario, phase: Phase
) -> None:
    dep = scenario.deployment
    record = scenario.plan("refagent:v2")
    await asyncio.sleep(0.3)
    with pytest.raises(EngineCrashed):
        await scenario.run_migration(record, hooked_engine(scenario, {phase: _crash}))
    stored = await dep.records.load(record.spec.id)
    assert stored is not None and stored.phase is phase

    # A new engine (as after a restart) continues from what was stored.
    fresh = MigrationEngine(dep.runtime, dep.control, dep.records)
    outcome = await scenario.run_migration(stored, fresh)
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    ownership = await dep.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (
        2,
        record.spec.target.name,
        FenceState.OPEN,
    )
    await asyncio.sleep(0.3)
    report = await scenario.finish()
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]
    assert failed == []
    assert report.verdict.versions.get("2", 0) > 0


async def test_an_interrupted_rollback_resumes_to_rolled_back(scenario: LiveScenario) -> None:
    dep = scenario.deployment
    record = scenario.plan("refagent:v2")
    runtime = dep.runtime

    async def kill_shadow(r: MigrationRecord) -> None:
        await runtime.kill(r.spec.target.name)

    engine = hooked_engine(scenario, {Phase.CATCHING_UP: kill_shadow, Phase.ROLLING_BACK: _crash})
    with pytest.raises(EngineCrashed):
        await scenario.run_migration(record, engine)
    stored = await dep.records.load(record.spec.id)
    assert stored is not None and stored.phase is Phase.ROLLING_BACK
    outcome = await scenario.run_migration(
        stored, MigrationEngine(runtime, dep.control, dep.records)
    )
    assert outcome.record.phase is Phase.ROLLED_BACK
    ownership = await dep.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner, ownership.fence) == (1, "demo-v1", FenceState.OPEN)
    report = await scenario.finish()
    assert (report.verdict.lost, report.verdict.duplicated, report.verdict.reordered) == (0, 0, 0)


async def test_preflight_refuses_what_cannot_work_and_nothing_changes(
    scenario: LiveScenario,
) -> None:
    dep = scenario.deployment
    cases = {
        "refagent:v9": "not in the local image map",
    }
    for image, reason in cases.items():
        outcome = await scenario.migrate(image)
        assert outcome.record.phase is Phase.ROLLED_BACK
        assert outcome.record.failed_phase is Phase.PREFLIGHT
        assert outcome.record.error is not None and reason in outcome.record.error

    # v2 writes agent state schema 2; v1 cannot read it: moving back is refused.
    upgraded = await scenario.migrate("refagent:v2")
    assert upgraded.record.phase is Phase.SUCCEEDED
    back = await scenario.migrate("refagent:v1")
    assert back.record.phase is Phase.ROLLED_BACK
    assert back.record.error is not None and "reads agent state schemas [1]" in back.record.error

    # a credential the target would not have
    (dep.runtime.credentials_dir / "weather-api").unlink()
    missing = await scenario.migrate("refagent:v2-b")
    assert missing.record.phase is Phase.ROLLED_BACK
    assert missing.record.error is not None and "weather-api" in missing.record.error

    ownership = await dep.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner) == (2, upgraded.record.spec.target.name)
    report = await scenario.finish()
    assert (report.verdict.lost, report.verdict.duplicated, report.verdict.reordered) == (0, 0, 0)


class _AnswerLost:
    """The engine's fence call fails while the gateway's exchange is still waiting for
    the source to finish its turn; the exchange goes on and commits afterwards."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.exchanges: list[asyncio.Task[object]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def fence(self, session: str, **kwargs: object) -> object:
        exchange = asyncio.create_task(self._inner.fence(session, **kwargs))  # type: ignore[attr-defined]
        self.exchanges.append(exchange)
        await asyncio.sleep(0.2)
        assert not exchange.done(), "the source was meant to be mid-turn"
        raise FenceOutcomeUnknown("no answer from the gateway: connection reset")


@pytest.mark.parametrize("attempts", [5, 1], ids=["retry-finds-the-bump", "rollback-finds-it"])
async def test_a_fence_whose_answer_is_lost_is_found_committed_and_finished_forward(
    scenario: LiveScenario, attempts: int
) -> None:
    """Whether the next attempt or the rollback looks, it waits out the exchange still
    running and sees its bump: the new owner is kept (never stopped) and the migration
    succeeds. Stopping the shadow first would leave the session owned by nobody."""
    dep = scenario.deployment
    client = scenario.client
    assert client is not None

    async def mid_turn(record: MigrationRecord) -> None:
        # Released to the source just before the fence; shorter than the fence timeout.
        await client.post_message(SESSION, "sleep 0.8", id="mid-turn")
        await asyncio.sleep(0.1)

    record = scenario.plan("refagent:v2")
    policy = record.spec.policy.model_copy(update={"max_fence_attempts": attempts})
    record = record.model_copy(update={"spec": record.spec.model_copy(update={"policy": policy})})
    lost = _AnswerLost(dep.control)
    records = HookedRecords(dep.records, {Phase.CATCHING_UP: mid_turn})
    engine = MigrationEngine(dep.runtime, lost, records)  # type: ignore[arg-type]
    outcome = await scenario.run_migration(record, engine)
    await asyncio.gather(*lost.exchanges, return_exceptions=True)
    done = outcome.record
    assert done.phase is Phase.SUCCEEDED, done.error
    assert done.fence is not None and done.fence.epoch == 2
    assert any("already bumped" in n or "no answer" in n for n in done.notes), done.notes
    assert done.recoveries == 0  # the new owner was never stopped
    ownership = await dep.admin.ownership(SESSION)
    assert (ownership.epoch, ownership.owner) == (2, done.spec.target.name)
    report = await scenario.finish()
    assert [c.name for c in report.checks if not c.ok] == []


class _DiesAfterFence:
    """The gateway completes the fence, then the engine dies before it hears back."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def fence(self, session: str, **kwargs: object) -> object:
        await self._inner.fence(session, **kwargs)  # type: ignore[attr-defined]
        raise EngineCrashed("after the epoch bump")


async def test_an_engine_that_dies_right_after_the_epoch_bump_finishes_forward(
    scenario: LiveScenario,
) -> None:
    dep = scenario.deployment
    record = scenario.plan("refagent:v2")
    dying = MigrationEngine(dep.runtime, _DiesAfterFence(dep.control), dep.records)  # type: ignore[arg-type]
    with pytest.raises(EngineCrashed):
        await scenario.run_migration(record, dying)
    stored = await dep.records.load(record.spec.id)
    assert stored is not None and stored.phase is Phase.FENCING  # it never saved the commit
    outcome = await scenario.run_migration(
        stored, MigrationEngine(dep.runtime, dep.control, dep.records)
    )
    assert outcome.record.phase is Phase.SUCCEEDED, outcome.record.error
    assert outcome.record.fence is not None and outcome.record.fence.epoch == 2
    report = await scenario.finish()
    assert [c.name for c in report.checks if not c.ok] == []
