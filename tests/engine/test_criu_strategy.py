"""The ``criu`` strategy on in-memory fakes: the source checkpointed instead of
snapshotted, the shadow restored from the checkpoint and caught up from its
watermark; what the engine refuses (another image, a runtime without CRIU) and how
it rolls back. With real processes and CRIU: tests/image/test_criu.py."""

from __future__ import annotations

import pytest

from shadowpod.engine.engine import MigrationEngine
from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    MigrationSpec,
    Phase,
)
from tests.engine.fakes import (
    FakeCheckpointer,
    FakeClock,
    FakeControl,
    FakeInstance,
    FakeRuntime,
    FakeSession,
    MemoryRecords,
)

SOURCE = "s-1"
TARGET = "s-2"


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.session = FakeSession("s")
        self.runtime = FakeRuntime(self.session, self.clock)
        self.checkpointer = FakeCheckpointer(self.runtime)
        self.control = FakeControl(self.session)
        self.records = MemoryRecords()
        self.runtime.owner(SOURCE)

    def engine(self, *, checkpoints: bool = True) -> MigrationEngine:
        return MigrationEngine(
            self.runtime,
            self.control,
            self.records,
            clock=self.clock,
            poll_s=0.0001,
            checkpointer=self.checkpointer if checkpoints else None,
        )

    def record(self, *, image: str = "agent:v1") -> MigrationRecord:
        spec = MigrationSpec(
            id="m-1",
            session="s",
            source=InstanceRef(name=SOURCE, image="agent:v1"),
            target=InstanceRef(name=TARGET, image=image),
            strategy="criu",
            policy=MigrationPolicy(),
        )
        return MigrationRecord(spec=spec)


@pytest.fixture
def world() -> World:
    return World()


async def test_the_shadow_is_restored_from_a_checkpoint_and_promoted(world: World) -> None:
    record = await world.engine().run(world.record())
    assert record.phase is Phase.SUCCEEDED, record.error
    assert world.records.phases() == [
        "Pending", "Preflight", "Snapshotting", "Restoring", "CatchingUp",
        "Fencing", "Committed", "Draining", "Succeeded",
    ]  # fmt: skip
    # Checkpointed, not snapshotted: no snapshot was asked of the source.
    [(source, target, watermark)] = world.checkpointer.taken
    assert (source, target) == (SOURCE, TARGET)
    assert world.session.snapshots == []
    assert (record.checkpoint, record.snapshot_watermark) == ("checkpoint-1", watermark)
    assert record.checkpoint_ms == 12.5
    # The shadow came from the checkpoint, as a shadow at the checkpoint's watermark.
    [(ref, spec)] = world.checkpointer.restored
    assert (ref, spec.name, spec.mode) == ("checkpoint-1", TARGET, "shadow")
    assert spec.snapshot == watermark
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (2, TARGET)
    assert world.runtime.alive() == {TARGET}


async def test_another_image_is_refused_before_anything_is_checkpointed(world: World) -> None:
    record = await world.engine().run(world.record(image="agent:v2"))
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == ("CheckpointNeedsSameImage", Phase.PREFLIGHT)
    assert "app-level state strategy" in (record.error or "")
    assert world.checkpointer.taken == [] and world.runtime.started == []


async def test_a_runtime_without_criu_refuses_the_strategy_saying_what_to_use(
    world: World,
) -> None:
    record = await world.engine(checkpoints=False).run(world.record())
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == (
        "CheckpointRestoreUnsupported",
        Phase.PREFLIGHT,
    )
    assert "app-level state strategy" in (record.error or "")
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)


async def test_a_checkpoint_that_fails_rolls_back_and_the_source_keeps_owning(
    world: World,
) -> None:
    world.checkpointer.failure = "criu dump of pid 42 failed: Can't get 1:16 opt"
    record = await world.engine().run(world.record())
    assert record.phase is Phase.ROLLED_BACK
    assert (record.reason, record.failed_phase) == ("RuntimeFailure", Phase.SNAPSHOTTING)
    assert "criu dump" in (record.error or "")
    assert world.runtime.alive() == {SOURCE}
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)


async def test_a_restored_shadow_that_fails_is_removed_and_its_checkpoint_discarded(
    world: World,
) -> None:
    def fails(instance: FakeInstance) -> None:
        instance.alive, instance.mode = False, "failed"
        instance.error = "exited with code 1: restoring the checkpoint failed"

    world.runtime.behaviour[TARGET] = fails
    record = await world.engine().run(world.record())
    assert (record.phase, record.failed_phase) == (Phase.ROLLED_BACK, Phase.RESTORING)
    assert "restoring the checkpoint failed" in (record.error or "")
    assert TARGET in world.runtime.stopped
    assert world.checkpointer.discarded == ["checkpoint-1"]
    assert (world.session.ownership.epoch, world.session.ownership.owner) == (1, SOURCE)
