"""What every phase of the migration engine does with the world: poll until something
is seen (backing off), check that an instance is still alive, and enter the next
phase — or the failure the error calls for (roll back before the epoch bump, fail
after it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

from shadowpod.domain.errors import SchemaTooNew, ShadowpodError
from shadowpod.engine.failures import (
    IncompatibleStateSchema,
    InstanceCannotStart,
    InstanceFailed,
    MaxDurationExceeded,
    PhaseTimedOut,
    SourceLost,
)
from shadowpod.engine.ports import (
    InstanceSpec,
    InstanceStatus,
    RecordStore,
    Runtime,
    SessionControl,
)
from shadowpod.engine.record import (
    COMMITTED_PHASES,
    InstanceRef,
    MigrationRecord,
    Phase,
    SourceLoss,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S: Final = 0.01
# Polls back off to this: a phase that takes a second (a process starting) is not
# asked a hundred times, while one that takes milliseconds is seen at once.
MAX_POLL_S: Final = 0.05
Clock = Callable[[], float]
# How an instance that is gone for good reports: a runtime that never started it
# ("unknown") cannot say it is dead, so that one is not taken for dead.
ENDED: Final = frozenset({"crashed", "failed", "stopped"})


def dead(status: InstanceStatus) -> bool:
    """Gone for good, or up but failed for good (an owner whose writes are refused):
    either way it will never ack a turn again. A slow instance is alive."""
    return (not status.alive and status.mode in ENDED) or status.mode == "failed"


def how_it_ended(status: InstanceStatus) -> str:
    return status.error or ("it failed" if status.alive else f"it {status.mode}")


class Steps:
    def __init__(
        self,
        runtime: Runtime,
        control: SessionControl,
        records: RecordStore,
        *,
        clock: Clock,
        poll_s: float = POLL_S,
    ) -> None:
        self.runtime = runtime
        self.control = control
        self.records = records
        self.clock = clock
        self.poll_s = poll_s

    def enter(self, record: MigrationRecord, phase: Phase, **changes: Any) -> MigrationRecord:
        return record.enter(phase, now=self.clock(), **changes)

    def overdue(self, record: MigrationRecord) -> bool:
        """Past ``max_duration_s`` before the cutover. After the epoch bump there is no
        way back, and a rollback must run to its end: neither is cut short."""
        if record.phase in COMMITTED_PHASES or record.phase is Phase.ROLLING_BACK:
            return False
        return self.clock() > record.started + record.spec.policy.max_duration_s

    def failed(self, record: MigrationRecord, exc: BaseException) -> MigrationRecord:
        message = str(exc) or type(exc).__name__
        reason = exc.reason if isinstance(exc, ShadowpodError) else type(exc).__name__
        logger.warning(
            "migration step %s failed (%s): %s",
            record.phase,
            reason,
            message,
            extra={"migration": record.spec.id},
        )
        failed: dict[str, Any] = {
            "failed_phase": record.phase,
            "reason": reason,
            "error": message,
        }
        if isinstance(exc, SourceLost) and record.source_lost is None:
            failed["source_lost"] = exc.loss.model_copy(update={"phase": record.phase})
        if record.phase in (Phase.ROLLING_BACK,) or record.phase in COMMITTED_PHASES:
            return self.enter(record, Phase.FAILED, **failed)
        # A dead source is never left owning the session: the rollback replaces it,
        # even where the policy would keep a failed migration as it is.
        if (
            record.spec.policy.rollback_on_failure
            or "source_lost" in failed
            or (record.source_lost is not None)
        ):
            return self.enter(record, Phase.ROLLING_BACK, **failed)
        return self.enter(record, Phase.FAILED, **failed)

    async def wait(
        self,
        check: Callable[[], Awaitable[T | None]],
        *,
        timeout_s: float,
        what: str,
        record: MigrationRecord | None = None,
    ) -> T:
        """``check()`` once it is not ``None``; ``PhaseTimedOut`` after ``timeout_s``, or
        ``MaxDurationExceeded`` once ``record`` is overdue (see ``overdue``)."""
        deadline = self.clock() + timeout_s
        delays = self.delays()
        while True:
            value = await check()
            if value is not None:
                return value
            if record is not None and self.overdue(record):
                limit = record.spec.policy.max_duration_s
                raise MaxDurationExceeded(
                    f"{what} did not happen before the migration's {limit:g}s were up"
                )
            if self.clock() > deadline:
                raise PhaseTimedOut(f"{what} did not happen within {timeout_s:g}s")
            await asyncio.sleep(next(delays))

    def delays(self, slowest: float = MAX_POLL_S) -> Iterator[float]:
        delay = self.poll_s
        while True:
            yield delay
            delay = min(delay * 1.5, max(self.poll_s, slowest))

    async def start_owner(
        self, record: MigrationRecord, epoch: int, instance: InstanceRef | None = None
    ) -> None:
        """Start ``instance`` (the target unless given) as the session's owner at
        ``epoch``, from the latest snapshot and the journal (the restart strategy's new
        owner; a promoted shadow that crashed; a dead source's replacement)."""
        spec = record.spec
        instance = instance or spec.target
        await self.runtime.start(
            InstanceSpec(
                name=instance.name,
                image=instance.image,
                session=spec.session,
                mode="owner",
                epoch=epoch,
            )
        )

    async def serving(
        self, record: MigrationRecord, epoch: int, instance: InstanceRef | None = None
    ) -> MigrationRecord:
        """Until ``instance`` (the target unless given) is seen serving at ``epoch``.
        One that crashed is started again (the normal recovery path: the latest
        snapshot and the journal); one that failed or exited by itself fails the step
        with its error. ``record`` with the restarts counted and noted."""
        instance = instance or record.spec.target
        deadline = self.clock() + record.spec.policy.phase_timeout_s
        delays = self.delays()
        while True:
            status = await self.runtime.status(instance.name)
            if status.mode in ("failed", "stopped"):
                how = status.error or f"it {status.mode}"
                said = f"the new owner {instance.name!r} did not take over epoch {epoch}: {how}"
                if status.reason is not None:
                    raise InstanceCannotStart(said, status.reason)
                raise InstanceFailed(said)
            if status.alive and status.serving and status.epoch == epoch:
                return record
            if not status.alive:
                await self.start_owner(record, epoch, instance)
                note = f"new owner {instance.name} restarted at epoch {epoch}"
                if status.left_behind:
                    note += f"; killed what it left running: {', '.join(status.left_behind)}"
                record = record.model_copy(
                    update={"recoveries": record.recoveries + 1, "notes": [*record.notes, note]}
                )
                await self.records.save(record)
            if self.clock() > deadline:
                raise PhaseTimedOut(
                    f"the new owner {instance.name!r} did not take over epoch {epoch} in time"
                )
            await asyncio.sleep(next(delays))

    async def source_loss(self, record: MigrationRecord) -> SourceLoss | None:
        """The source's end, if it is dead (see ``dead``); ``None`` while it lives —
        however slow it is."""
        if record.source_lost is not None:
            return record.source_lost
        status = await self.runtime.status(record.spec.source.name)
        if not dead(status):
            return None
        return SourceLoss(phase=record.phase, seen=self.clock(), how=how_it_ended(status))

    async def alive(self, name: str, role: str) -> InstanceStatus:
        status = await self.runtime.status(name)
        if role == "source" and dead(status):
            loss = SourceLoss(phase=Phase.PENDING, seen=self.clock(), how=how_it_ended(status))
            raise SourceLost(f"the source instance {name!r} is dead: {loss.how}", loss)
        detail = f": {status.error}" if status.error else ""
        if not status.alive or status.mode == "failed":
            how = "is not running" if not status.alive else "failed"
            message = f"the {role} instance {name!r} {how}{detail}"
            # The instance itself said it cannot read the state it was given: where a
            # runtime cannot tell an image's schemas before running it (pods), this is
            # how preflight's check is made.
            if status.error is not None and SchemaTooNew.reason in status.error:
                raise IncompatibleStateSchema(message)
            if status.reason is not None:
                raise InstanceCannotStart(message, status.reason)
            raise InstanceFailed(message)
        return status
