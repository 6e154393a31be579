"""The restart strategy: the stop-and-recreate baseline a live migration is measured
against. The source is stopped, the epoch bumped, and a new owner started from the
snapshot — the session answers nothing in between."""

from __future__ import annotations

from shadowpod.engine.failures import OwnershipChanged
from shadowpod.engine.ports import InstanceStatus
from shadowpod.engine.record import FenceInfo, MigrationRecord, Phase
from shadowpod.engine.steps import Steps


class Restart:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def stopping(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        await self.steps.runtime.stop(spec.source.name, grace_s=spec.policy.drain_grace_s)
        return self.steps.enter(record, Phase.COMMITTED)

    async def committed(self, record: MigrationRecord) -> MigrationRecord:
        spec, control = record.spec, self.steps.control
        assert record.source_epoch is not None
        epoch = record.source_epoch + 1
        ownership = await control.ownership(spec.session)
        if ownership.epoch == record.source_epoch:
            ownership = await control.set_owner(
                spec.session, expect_epoch=record.source_epoch, epoch=epoch, owner=spec.target.name
            )
        elif not (ownership.epoch == epoch and ownership.owner == spec.target.name):
            raise OwnershipChanged(f"ownership changed under the migration: {ownership}")
        fence = FenceInfo(
            epoch=epoch, fence_seq=ownership.fence_seq or 0, waited_ms=0.0, attempts=0
        )
        return self.steps.enter(record, Phase.RESTORING, fence=fence)

    async def restoring(self, record: MigrationRecord) -> MigrationRecord:
        spec, steps = record.spec, self.steps
        assert record.fence is not None
        epoch = record.fence.epoch
        if not (await steps.runtime.status(spec.target.name)).alive:
            await steps.start_owner(record, epoch)

        async def serving() -> InstanceStatus | None:
            status = await steps.alive(spec.target.name, "new owner")
            return status if status.serving and status.epoch == epoch else None

        await steps.wait(
            serving, timeout_s=spec.policy.phase_timeout_s, what="the new owner serving"
        )
        return steps.enter(record, Phase.SUCCEEDED)
