"""What became of a fence the engine may not have seen finish.

An exchange's answer can be lost (the gateway call timed out, or the engine stopped
before saving it) while the exchange itself commits; or a fence can be left standing
with no exchange behind it. Before fencing again, and before rolling back, the engine
reads the ownership and decides from what it shows.
"""

from __future__ import annotations

from shadowpod.domain.errors import ShadowpodError
from shadowpod.domain.ownership import FenceState, Ownership
from shadowpod.engine.failures import OwnershipChanged
from shadowpod.engine.ports import SessionControl, Unavailable
from shadowpod.engine.record import FenceInfo, MigrationRecord


def bumped_to_target(record: MigrationRecord, ownership: Ownership) -> bool:
    """The epoch moved from the source's to the migration's target: the fence committed."""
    return (
        record.source_epoch is not None
        and ownership.epoch == record.source_epoch + 1
        and ownership.owner == record.spec.target.name
    )


def fence_found(record: MigrationRecord, ownership: Ownership) -> FenceInfo:
    """The fence of an exchange that committed without the engine seeing its answer."""
    return FenceInfo(
        epoch=ownership.epoch,
        fence_seq=ownership.fence_seq or 0,
        waited_ms=0.0,
        attempts=record.fence_attempts,
    )


async def lift_stale_fence(control: SessionControl, record: MigrationRecord) -> Ownership:
    """The ownership once no fence of the source epoch is left standing.

    A fence with no exchange behind it (its gateway call or its engine died) holds the
    source's delivery back for good; lift it. If an exchange was in fact still running
    and commits first, the unfence is refused — read again and see the bump.
    """
    session = record.spec.session
    ownership = await control.ownership(session)
    if ownership.fence is not FenceState.FENCED or ownership.epoch != record.source_epoch:
        return ownership
    try:
        await control.unfence(session, expect_epoch=ownership.epoch)
    except ShadowpodError:
        ownership = await control.ownership(session)
        if not bumped_to_target(record, ownership):
            raise
        return ownership
    return await control.ownership(session)


async def bump_to(control: SessionControl, record: MigrationRecord, owner: str) -> Ownership:
    """The epoch moved from the source's to ``owner`` with a plain compare-and-set, no
    fence: for a source that is dead, which has no turn to finish and can write nothing
    (and the bump would refuse its writes anyway). Asked again after a lost answer or
    a crash, it finds the bump made and returns it."""
    session = record.spec.session
    assert record.source_epoch is not None
    epoch = record.source_epoch + 1
    ownership = await control.ownership(session)
    if ownership.epoch == epoch and ownership.owner == owner:
        return ownership
    if ownership.epoch != record.source_epoch:
        raise OwnershipChanged(
            f"ownership of {session!r} changed under the migration: epoch "
            f"{ownership.epoch}, owner {ownership.owner!r}"
        )
    try:
        return await control.set_owner(
            session, expect_epoch=record.source_epoch, epoch=epoch, owner=owner
        )
    except Unavailable:
        raise
    except ShadowpodError:
        ownership = await control.ownership(session)  # a retry after a lost answer
        if ownership.epoch == epoch and ownership.owner == owner:
            return ownership
        raise
