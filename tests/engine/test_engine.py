"""The engine's contract, on in-memory fakes of its ports (no processes, no HTTP):
phases, failures and their reasons, retries of an unreachable port, the migration's
maximum duration, one clock, and resuming from a record saved at any phase.

The same behaviour with real processes is in test_migration.py and test_resume.py.
"""

from __future__ import annotations

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.ports import ImageInfo
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    MigrationSpec,
    Phase,
)
from tests.engine.fakes import (
    FakeClock,
    FakeControl,
    FakeInstance,
    FakeRuntime,
    FakeSession,
    MemoryRecords,
)

SOURCE = "s-1"
TARGET = "s-2"
SHADOW_PHASES = [
    "Pending", "Preflight", "Snapshotting", "Restoring", "CatchingUp",
    "Fencing", "Committed", "Draining", "Succeeded",
]  # fmt: skip


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.session = FakeSession("s")
        self.runtime = FakeRuntime(self.session, self.clock)
        self.control = FakeControl(self.session)
        self.records = MemoryRecords()
        self.runtime.owner(SOURCE)

    def engine(self) -> MigrationEngine:
        return MigrationEngine(
            self.runtime, self.control, self.records, clock=self.clock, poll_s=0.0001
        )

    def record(
        self, *, image: str = "agent:v2", credentials: list[str] | None = None, **policy: object
    ) -> MigrationRecord:
        spec = MigrationSpec(
            id="m-1",
            session="s",
            source=InstanceRef(name=SOURCE, image="agent:v1"),
            target=InstanceRef(name=TARGET, image=image),
            credentials=credentials or [],
            policy=MigrationPolicy(**policy),
        )
        return MigrationRecord(spec=spec)

    def behave(self, name: str, **attributes: object) -> None:
        def apply(instance: FakeInstance) -> None:
            for key, value in attributes.items():
                setattr(instance, key, value)

        self.runtime.behaviour[name] = apply


@pytest.fixture
def world() -> World:
    return World()


async def test_a_migration_goes_through_every_phase_and_the_shadow_owns_the_session(
    world: World,
) -> None:
    record = await world.engine().run(world.record())
    assert record.phase is Phase.SUCCEEDED, record.error
    assert world.records.phases() == SHADOW_PHASES
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)
    assert world.runtime.alive() == {TARGET}  # the source drained and exited
    assert [s.name for s in world.runtime.started] == [TARGET]
    assert record.fence is not None and record.fence.epoch == 2
    assert (record.reason, record.error) == (None, None)


async def test_the_record_is_timed_on_the_engines_clock(world: World) -> None:
    record = await world.engine().run(world.record())
    assert record.started == pytest.approx(1_000_000.0)
    assert record.ended == world.clock.now
    # Every poll of the fake runtime is one second of the fake clock.
    assert record.total_s is not None and record.total_s >= 5
    assert sum(record.phase_seconds().values()) == pytest.approx(record.total_s)


async def test_a_target_that_cannot_read_the_source_state_rolls_back_with_its_reason(
    world: World,
) -> None:
    world.runtime.images["agent:v3"] = ImageInfo(
        image="agent:v3", state_schema=3, reads_state_schemas=[3]
    )
    record = await world.engine().run(world.record(image="agent:v3"))
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == ("IncompatibleStateSchema", Phase.PREFLIGHT)
    assert "reads agent state schemas [3]" in (record.error or "")
    assert world.runtime.started == []
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)


async def test_a_shadow_that_says_it_cannot_read_the_state_rolls_back_as_incompatible(
    world: World,
) -> None:
    """A runtime that cannot tell an image's schemas before running it (pods) learns
    them from the shadow itself: it exits saying SchemaTooNew."""

    def cannot_read(instance: FakeInstance) -> None:
        instance.alive, instance.mode = False, "failed"
        instance.error = "exited with code 1: SchemaTooNew: session state has schema v2"

    world.runtime.behaviour[TARGET] = cannot_read
    record = await world.engine().run(world.record())
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "IncompatibleStateSchema")
    assert record.failed_phase is Phase.RESTORING
    assert "SchemaTooNew" in (record.error or "")
    assert world.runtime.alive() == {SOURCE}


async def test_credentials_the_target_would_not_have_roll_back_before_anything_starts(
    world: World,
) -> None:
    world.runtime.missing["agent:v2"] = ["weather-api"]
    record = await world.engine().run(world.record(credentials=["weather-api", "mail"]))
    assert record.phase is Phase.ROLLED_BACK
    assert record.reason == "CredentialsMissing"
    assert "weather-api" in (record.error or "") and "mail" not in (record.error or "")
    assert world.runtime.started == []


async def test_an_image_that_cannot_be_resolved_rolls_back_saying_so(world: World) -> None:
    record = await world.engine().run(world.record(image="agent:nope"))
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "ImageNotFound")


async def test_a_runtime_that_cannot_start_the_shadow_rolls_back_and_leaves_the_source(
    world: World,
) -> None:
    world.runtime.failing_starts[TARGET] = "the node has no room for the shadow"
    record = await world.engine().run(world.record())
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "RuntimeFailure")
    assert record.failed_phase is Phase.RESTORING
    assert record.error == "the node has no room for the shadow"
    assert world.runtime.alive() == {SOURCE}
    assert world.session.ownership.owner == SOURCE


async def test_a_runtime_unreachable_for_a_while_is_asked_again(world: World) -> None:
    world.runtime.unavailable_calls = 3
    record = await world.engine().run(world.record())
    assert record.phase is Phase.SUCCEEDED, record.error
    assert world.runtime.unavailable_calls == 0


async def test_a_gateway_unreachable_for_a_while_is_asked_again(world: World) -> None:
    world.session.gateway_down_calls = 4
    record = await world.engine().run(world.record())
    assert record.phase is Phase.SUCCEEDED, record.error


async def test_a_runtime_unreachable_past_the_phase_timeout_rolls_back(world: World) -> None:
    world.runtime.unavailable_calls = 10**6
    record = await world.engine().run(world.record(phase_timeout_s=10.0))
    assert record.phase is Phase.FAILED  # the rollback could not reach the runtime either
    assert record.reason == "RuntimeUnavailable"


async def test_a_shadow_that_never_catches_up_rolls_back_at_the_maximum_duration(
    world: World,
) -> None:
    world.behave(TARGET, catches_up=False)
    record = await world.engine().run(world.record(max_duration_s=20.0, phase_timeout_s=1000.0))
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "MaxDurationExceeded")
    assert record.failed_phase is Phase.CATCHING_UP
    assert 20.0 <= world.clock.now - record.started <= 25.0  # not the phase's 1000 s
    assert world.runtime.alive() == {SOURCE}
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)


async def test_the_maximum_duration_does_not_cut_short_what_comes_after_the_cutover(
    world: World,
) -> None:
    world.behave(TARGET, takeover_polls=30)  # a new owner slow to take over
    record = await world.engine().run(world.record(max_duration_s=10.0, phase_timeout_s=100.0))
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.total_s is not None and record.total_s > 30.0


async def test_a_phase_timeout_fails_with_its_own_reason(world: World) -> None:
    world.behave(TARGET, ready_after=10**6)
    record = await world.engine().run(world.record(phase_timeout_s=5.0, max_duration_s=1000.0))
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "PhaseTimeout")
    assert record.failed_phase is Phase.RESTORING


async def test_a_busy_source_is_fenced_again_after_catching_up(world: World) -> None:
    world.session.busy_fences = 2
    record = await world.engine().run(world.record(max_fence_attempts=3))
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.fence is not None and record.fence.attempts == 3
    assert world.session.fences == 1


async def test_a_source_busy_through_every_fence_attempt_rolls_back(world: World) -> None:
    world.session.busy_fences = 3
    record = await world.engine().run(world.record(max_fence_attempts=3))
    assert (record.phase, record.reason) == (Phase.ROLLED_BACK, "MigrationStepFailed")
    assert "busy through 3 fence attempts" in (record.error or "")
    assert world.session.ownership.owner == SOURCE


async def test_a_new_owner_that_fails_after_the_bump_fails_the_migration(world: World) -> None:
    world.behave(TARGET, fails_to_serve="cannot read the session: schema v9")
    record = await world.engine().run(world.record())
    assert (record.phase, record.reason) == (Phase.FAILED, "InstanceFailed")
    assert record.failed_phase is Phase.COMMITTED
    assert "schema v9" in (record.error or "")


class EngineStopped(BaseException):
    """The engine's process dying at a phase boundary: nothing the engine handles."""


@pytest.mark.parametrize("phase", [p for p in SHADOW_PHASES if p != "Succeeded"])
async def test_an_engine_stopped_at_any_phase_is_finished_by_a_new_one(
    world: World, phase: str
) -> None:
    class StopsOnce(MemoryRecords):
        stopped = False

        async def save(self, record: MigrationRecord) -> None:
            await super().save(record)
            if record.phase == phase and not self.stopped:
                self.stopped = True
                raise EngineStopped

    world.records = StopsOnce()
    with pytest.raises(EngineStopped):
        await world.engine().run(world.record())
    stored = await world.records.load("m-1")
    assert stored is not None and stored.phase == phase
    record = await world.engine().run(stored)
    assert record.phase is Phase.SUCCEEDED, record.error
    assert [s.name for s in world.runtime.started] == [TARGET]  # started once
    assert world.session.fences == 1 and world.session.ownership.epoch == 2
    assert world.runtime.alive() == {TARGET}
