"""A source that dies before the epoch bump, on fakes of the engine's ports: the engine
tells it from a slow one and finishes forward — the shadow takes over by a plain epoch
bump where it can, or a rollback starts a new owner of the source's image — and a
resumed engine keeps the decision its record holds.

The same with real processes, at every phase: tests/local/test_source_loss.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.ports import ImageInfo
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    MigrationSpec,
    Phase,
    Strategy,
    ValidationPolicy,
)
from tests.engine.fakes import (
    FakeClock,
    FakeControl,
    FakeInstance,
    FakeRuntime,
    FakeSession,
    FakeValidator,
    MemoryRecords,
)

SOURCE = "s-1"
TARGET = "s-2"
BEFORE_THE_BUMP = [
    Phase.PREFLIGHT,
    Phase.SNAPSHOTTING,
    Phase.RESTORING,
    Phase.CATCHING_UP,
    Phase.FENCING,
]


class EngineCrashed(BaseException):
    """Stands for the engine's process dying (not an error the engine handles)."""


class KillingRecords(MemoryRecords):
    """Runs an action once, right after the first record in a phase is saved: at the
    phase boundary, before the phase acts."""

    def __init__(self, actions: dict[Phase, Callable[[MigrationRecord], None]]) -> None:
        super().__init__()
        self.actions = dict(actions)

    async def save(self, record: MigrationRecord) -> None:
        await super().save(record)
        if (action := self.actions.pop(record.phase, None)) is not None:
            action(record)


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.session = FakeSession("s")
        self.runtime = FakeRuntime(self.session, self.clock)
        self.control = FakeControl(self.session)
        self.records = MemoryRecords()
        self.runtime.owner(SOURCE)

    def engine(self, records: MemoryRecords | None = None) -> MigrationEngine:
        return MigrationEngine(
            self.runtime,
            self.control,
            records or self.records,
            clock=self.clock,
            poll_s=0.0001,
        )

    def record(
        self, *, image: str = "agent:v2", strategy: Strategy = "shadow", **policy: object
    ) -> MigrationRecord:
        spec = MigrationSpec(
            id="m-1",
            session="s",
            source=InstanceRef(name=SOURCE, image="agent:v1"),
            target=InstanceRef(name=TARGET, image=image),
            strategy=strategy,
            policy=MigrationPolicy(**policy),
        )
        return MigrationRecord(spec=spec)

    def kill_source_at(self, *phases: Phase) -> KillingRecords:
        self.records = KillingRecords(
            {phase: lambda _: self.runtime.kill(SOURCE) for phase in phases}
        )
        return self.records


@pytest.fixture
def world() -> World:
    return World()


@pytest.mark.parametrize("phase", BEFORE_THE_BUMP, ids=[p.value for p in BEFORE_THE_BUMP])
async def test_a_source_killed_before_the_bump_is_replaced_by_the_shadow_without_a_fence(
    world: World, phase: Phase
) -> None:
    records = world.kill_source_at(phase)
    done = await world.engine(records).run(world.record())

    assert done.phase is Phase.SUCCEEDED, done.error
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)
    assert world.session.fences == 0, "a dead source was fenced and waited for"
    assert world.control.set_owner_calls == 1
    assert world.runtime.alive() == {TARGET}
    loss = done.source_lost
    assert loss is not None and "SIGKILL" in loss.how
    # Seen where it matters: a snapshot that never comes, or the cutover.
    seen_in = (
        Phase.SNAPSHOTTING if phase in (Phase.PREFLIGHT, Phase.SNAPSHOTTING) else Phase.FENCING
    )
    assert loss.phase is seen_in
    assert done.fence is not None and done.fence.epoch == 2 and done.fence.waited_ms == 0.0
    assert done.fence_pause_ms is None  # nothing was held back by a fence
    assert done.replacement is None


async def test_a_source_dead_before_its_snapshot_leaves_the_target_to_the_journal(
    world: World,
) -> None:
    world.session.snapshots = [40]  # an older snapshot, from before the migration
    done = await world.engine(world.kill_source_at(Phase.SNAPSHOTTING)).run(world.record())
    assert done.phase is Phase.SUCCEEDED, done.error
    assert done.snapshot_watermark == 40
    [shadow] = world.runtime.started
    assert (shadow.name, shadow.mode, shadow.snapshot) == (TARGET, "shadow", 40)


async def test_a_source_that_dies_during_the_fence_is_taken_over_after_one_timeout(
    world: World,
) -> None:
    """The gateway's fence waits for a dead source's acks until it times out; then the
    source is looked at, found dead, and not fenced again."""

    records = KillingRecords({})
    world.records = records
    engine = world.engine(records)
    original = world.control.fence

    async def fence_then_die(session: str, **kwargs: object) -> object:
        world.runtime.kill(SOURCE)  # dies while the fence waits for its turn to end
        return await original(session, **kwargs)  # type: ignore[arg-type]

    world.control.fence = fence_then_die  # type: ignore[method-assign, assignment]
    done = await engine.run(world.record(max_fence_attempts=5))
    assert done.phase is Phase.SUCCEEDED, done.error
    assert done.fence_attempts == 1, done.notes
    assert done.source_lost is not None and done.source_lost.phase is Phase.FENCING
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)


async def test_a_slow_source_is_not_taken_for_a_dead_one(world: World) -> None:
    """Busy through every fence attempt, but alive: the migration rolls back and the
    source, which never stopped serving, stays the owner."""
    world.session.busy_fences = 3
    done = await world.engine().run(world.record(max_fence_attempts=3))
    assert done.phase is Phase.ROLLED_BACK
    assert done.reason == "MigrationStepFailed" and "stayed busy" in (done.error or "")
    assert (done.source_lost, done.replacement) == (None, None)
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)
    assert world.control.set_owner_calls == 0


async def test_at_validating_a_dead_source_is_replaced_on_its_own_image(world: World) -> None:
    """The upgrade gate compares the target with the source's live answers: with the
    source dead it cannot reach a verdict, and an unproven image does not take the
    session. A new owner of the source's image does, at the next epoch."""
    validator = FakeValidator(world.session)
    records = world.kill_source_at(Phase.VALIDATING)
    engine = MigrationEngine(
        world.runtime, world.control, records, clock=world.clock, poll_s=0.0001, validator=validator
    )
    done = await engine.run(world.record(validation=ValidationPolicy(turns=3)))

    assert done.phase is Phase.ROLLED_BACK
    assert (done.reason, done.failed_phase) == ("SourceLost", Phase.VALIDATING)
    assert done.replacement == InstanceRef(name=f"{TARGET}-r", image="agent:v1")
    ownership = world.session.ownership
    assert (ownership.epoch, ownership.owner) == (2, f"{TARGET}-r")
    assert world.runtime.alive() == {f"{TARGET}-r"}  # the shadow is gone, the new owner serves
    started = {s.name: s for s in world.runtime.started}
    assert (started[f"{TARGET}-r"].mode, started[f"{TARGET}-r"].epoch) == ("owner", 2)
    assert started[f"{TARGET}-r"].image == "agent:v1"
    assert validator.compares == []  # no verdict was made up


async def test_a_target_that_cannot_take_over_from_a_dead_source_leaves_a_new_owner_anyway(
    world: World,
) -> None:
    """The source dies; the shadow then says it cannot read the state: the session is
    not left ownerless — it gets a new owner of the source's image."""

    def cannot_read(instance: FakeInstance) -> None:
        instance.alive, instance.mode = False, "failed"
        instance.error = "exited with code 1: SchemaTooNew: state schema 1 is not readable"

    world.runtime.behaviour[TARGET] = cannot_read
    done = await world.engine(world.kill_source_at(Phase.RESTORING)).run(world.record())
    assert done.phase is Phase.ROLLED_BACK
    assert done.reason == "IncompatibleStateSchema"
    assert done.source_lost is not None and done.replacement is not None
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, f"{TARGET}-r")
    assert world.runtime.alive() == {f"{TARGET}-r"}


async def test_a_dead_source_is_replaced_even_where_the_policy_keeps_a_failed_migration(
    world: World,
) -> None:
    world.runtime.failing_starts[TARGET] = "no node has room for it"
    records = world.kill_source_at(Phase.SNAPSHOTTING)
    done = await world.engine(records).run(world.record(rollback_on_failure=False))
    assert done.phase is Phase.ROLLED_BACK, done.error
    assert done.reason == "RuntimeFailure"
    assert world.session.ownership.owner == f"{TARGET}-r"


async def test_the_restart_strategy_with_a_dead_source_goes_on_from_the_latest_snapshot(
    world: World,
) -> None:
    world.session.snapshots = [60]
    done = await world.engine(world.kill_source_at(Phase.SNAPSHOTTING)).run(
        world.record(strategy="restart")
    )
    assert done.phase is Phase.SUCCEEDED, done.error
    assert done.snapshot_watermark == 60 and done.source_lost is not None
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)


async def test_an_engine_resumed_after_the_decision_takes_over_without_fencing(
    world: World,
) -> None:
    """The engine dies right after it saved its decision (the source is dead); a new
    engine reads the record and carries it out — no fence, one bump."""

    def crash_once_decided(record: MigrationRecord) -> None:
        if record.source_lost is not None:
            raise EngineCrashed

    class CrashingRecords(MemoryRecords):
        async def save(self, record: MigrationRecord) -> None:
            await super().save(record)
            if record.phase is Phase.CATCHING_UP and SOURCE in world.runtime.alive():
                world.runtime.kill(SOURCE)
            crash_once_decided(record)

    crashing = CrashingRecords()
    with pytest.raises(EngineCrashed):
        await world.engine(crashing).run(world.record())
    stored = await crashing.load("m-1")
    assert stored is not None and stored.phase is Phase.FENCING
    assert stored.source_lost is not None
    assert world.session.ownership.epoch == 1  # decided, not acted on yet

    done = await world.engine().run(stored)
    assert done.phase is Phase.SUCCEEDED, done.error
    assert world.session.fences == 0 and world.control.set_owner_calls == 1
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)


async def test_an_engine_resumed_mid_replacement_starts_the_one_it_chose(world: World) -> None:
    world.runtime.images["agent:v3"] = ImageInfo(
        image="agent:v3", state_schema=3, reads_state_schemas=[3, 1]
    )

    class CrashingRecords(MemoryRecords):
        async def save(self, record: MigrationRecord) -> None:
            await super().save(record)
            if record.phase is Phase.SNAPSHOTTING and SOURCE in world.runtime.alive():
                world.runtime.kill(SOURCE)
            if record.replacement is not None and not world.session.instances.get(
                record.replacement.name
            ):
                raise EngineCrashed  # chosen and saved, not started

    world.runtime.failing_starts[TARGET] = "the image cannot be pulled"
    crashing = CrashingRecords()
    with pytest.raises(EngineCrashed):
        await world.engine(crashing).run(world.record(image="agent:v3"))
    stored = await crashing.load("m-1")
    assert stored is not None and stored.replacement is not None
    chosen = stored.replacement.name

    done = await world.engine().run(stored)
    assert done.phase is Phase.ROLLED_BACK
    assert [s.name for s in world.runtime.started] == [chosen]
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, chosen)
