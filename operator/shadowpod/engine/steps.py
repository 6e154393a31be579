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
    InstanceFailed,
    MaxDurationExceeded,
    PhaseTimedOut,
)
from shadowpod.engine.ports import (
    InstanceSpec,
    InstanceStatus,
    RecordStore,
    Runtime,
    SessionControl,
)
from shadowpod.engine.record import COMMITTED_PHASES, MigrationRecord, Phase

logger = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S: Final = 0.01
# Polls back off to this: a phase that takes a second (a process starting) is not
# asked a hundred times, while one that takes milliseconds is seen at once.
MAX_POLL_S: Final = 0.05
Clock = Callable[[], float]


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
        failed = {"failed_phase": record.phase, "reason": reason, "error": message}
        if record.phase in (Phase.ROLLING_BACK,) or record.phase in COMMITTED_PHASES:
            return self.enter(record, Phase.FAILED, **failed)
        if record.spec.policy.rollback_on_failure:
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

    async def start_owner(self, record: MigrationRecord, epoch: int) -> None:
        """Start the target as the session's owner at ``epoch``, from the latest snapshot
        (the restart strategy's new owner; a promoted shadow that crashed)."""
        spec = record.spec
        await self.runtime.start(
            InstanceSpec(
                name=spec.target.name,
                image=spec.target.image,
                session=spec.session,
                mode="owner",
                epoch=epoch,
            )
        )

    async def alive(self, name: str, role: str) -> InstanceStatus:
        status = await self.runtime.status(name)
        detail = f": {status.error}" if status.error else ""
        if not status.alive or status.mode == "failed":
            how = "is not running" if not status.alive else "failed"
            message = f"the {role} instance {name!r} {how}{detail}"
            # The instance itself said it cannot read the state it was given: where a
            # runtime cannot tell an image's schemas before running it (pods), this is
            # how preflight's check is made.
            if status.error is not None and SchemaTooNew.reason in status.error:
                raise IncompatibleStateSchema(message)
            raise InstanceFailed(message)
        return status
