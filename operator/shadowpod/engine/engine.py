"""The migration engine: ShadowPod + ExchangeFence as a state machine (DESIGN.md §4).

The engine performs no I/O of its own: it acts through its ports. Each phase action
can run again after a crash — it checks what the world already shows (is the shadow
running? was the epoch already bumped?) before it acts — and the record is saved on
every phase change, before the new phase acts. So ``run`` on a saved record continues
correctly from wherever the previous engine stopped.

Anything that fails before the epoch bump rolls back: the shadow is removed, any
fence is lifted, and the source, which never stopped serving, stays owner. So does a
migration still short of the bump after ``max_duration_s`` (``MaxDurationExceeded``).
A port that cannot reach what it drives (``Unavailable``) is asked again, for up to
the phase's timeout, before the step fails. After the
bump there is no way back; the engine finishes forward (restarting the new owner if
it crashes) or reports ``Failed`` for the normal recovery path. ``Succeeded`` means
the new owner was seen serving — its adoption of the session journaled at the new
epoch — not only started: a new owner that fails before that (its takeover write
refused, say) fails the migration, with its error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

from shadowpod.domain.errors import SchemaTooNew, ShadowpodError
from shadowpod.engine.fence_checks import bumped_to_target, fence_found, lift_stale_fence
from shadowpod.engine.persona import check_persona, persona_checked
from shadowpod.engine.ports import (
    Checkpointer,
    CheckpointRestoreUnsupported,
    CompareWindowLost,
    FenceOutcomeUnknown,
    FencePause,
    FenceTimedOut,
    InstanceSpec,
    InstanceStatus,
    RecordStore,
    Runtime,
    SessionControl,
    Unavailable,
    ValidationUnavailable,
    Validator,
)
from shadowpod.engine.record import (
    COMMITTED_PHASES,
    FenceInfo,
    MigrationRecord,
    Phase,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S: Final = 0.01
# Polls back off to this: a phase that takes a second (a process starting) is not
# asked a hundred times, while one that takes milliseconds is seen at once.
MAX_POLL_S: Final = 0.05
# A shadow that loses its compare window (restarted) gets a new one this many times.
MAX_WINDOW_REOPENS: Final = 2
Clock = Callable[[], float]


class StepFailed(ShadowpodError):
    """A phase cannot succeed; the message says why (it ends up in the record)."""

    reason = "MigrationStepFailed"


class PhaseTimedOut(StepFailed):
    reason = "PhaseTimeout"


class MaxDurationExceeded(StepFailed):
    reason = "MaxDurationExceeded"


class IncompatibleStateSchema(StepFailed):
    reason = "IncompatibleStateSchema"


class CredentialsMissing(StepFailed):
    reason = "CredentialsMissing"


class OwnershipChanged(StepFailed):
    reason = "OwnershipChanged"


class InstanceFailed(StepFailed):
    reason = "InstanceFailed"


class CheckpointNeedsSameImage(StepFailed):
    reason = "CheckpointNeedsSameImage"


class ValidationFailed(StepFailed):
    """The target's answers did not agree enough with the source's (upgrade gate)."""

    reason = "ValidationFailed"


class MigrationEngine:
    def __init__(
        self,
        runtime: Runtime,
        control: SessionControl,
        records: RecordStore,
        *,
        clock: Clock = time.time,
        poll_s: float = POLL_S,
        checkpointer: Checkpointer | None = None,
        validator: Validator | None = None,
    ) -> None:
        self.runtime = runtime
        self.checkpointer = checkpointer
        self.control = control
        self.records = records
        self.validator = validator
        self._clock = clock
        self._poll_s = poll_s

    async def run(self, record: MigrationRecord) -> MigrationRecord:
        """Drive ``record`` to a terminal phase, saving it on every phase change.

        The clock the engine was given times the record (its start, every phase) as
        it does the engine's deadlines: a record resumed by another engine is timed
        on the same clock.
        """
        if record.phase is Phase.PENDING and not record.timings:
            record = record.model_copy(update={"started": self._clock()})
        await self.records.save(record)
        while not record.done:
            record = await self.step(record)
            await self.records.save(record)
        return record

    async def step(self, record: MigrationRecord) -> MigrationRecord:
        """Act on ``record``'s phase; the record in the phase that comes next."""
        if self._overdue(record):
            limit = record.spec.policy.max_duration_s
            return self._failed(
                record,
                MaxDurationExceeded(f"the migration did not reach its cutover within {limit:g}s"),
            )
        action = self._actions(record)[record.phase]
        retry_until: float | None = None
        delays = self._delays(slowest=1.0)
        while True:
            try:
                return await action(record)
            except (Unavailable, OSError, TimeoutError) as exc:
                now = self._clock()
                retry_until = retry_until or now + record.spec.policy.phase_timeout_s
                if now > retry_until or self._overdue(record):
                    return self._failed(record, exc)
                logger.info(
                    "migration step %s will be retried: %s",
                    record.phase,
                    exc,
                    extra={"migration": record.spec.id},
                )
                await asyncio.sleep(next(delays))
            except ShadowpodError as exc:
                return self._failed(record, exc)

    def _enter(self, record: MigrationRecord, phase: Phase, **changes: Any) -> MigrationRecord:
        return record.enter(phase, now=self._clock(), **changes)

    def _overdue(self, record: MigrationRecord) -> bool:
        """Past ``max_duration_s`` before the cutover. After the epoch bump there is no
        way back, and a rollback must run to its end: neither is cut short."""
        if record.phase in COMMITTED_PHASES or record.phase is Phase.ROLLING_BACK:
            return False
        return self._clock() > record.started + record.spec.policy.max_duration_s

    def _failed(self, record: MigrationRecord, exc: BaseException) -> MigrationRecord:
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
            return self._enter(record, Phase.FAILED, **failed)
        if record.spec.policy.rollback_on_failure:
            return self._enter(record, Phase.ROLLING_BACK, **failed)
        return self._enter(record, Phase.FAILED, **failed)

    def _actions(
        self, record: MigrationRecord
    ) -> dict[Phase, Callable[[MigrationRecord], Awaitable[MigrationRecord]]]:
        common = {
            Phase.PENDING: self._pending,
            Phase.PREFLIGHT: self._preflight,
            Phase.SNAPSHOTTING: self._snapshotting,
            Phase.ROLLING_BACK: self._rolling_back,
        }
        if record.spec.strategy == "restart":
            return {
                **common,
                Phase.STOPPING: self._restart_stopping,
                Phase.COMMITTED: self._restart_committed,
                Phase.RESTORING: self._restart_restoring,
            }
        if record.spec.strategy == "criu":
            common[Phase.SNAPSHOTTING] = self._checkpointing
        return {
            **common,
            Phase.RESTORING: self._restoring,
            Phase.CATCHING_UP: self._catching_up,
            Phase.VALIDATING: self._validating,
            Phase.FENCING: self._fencing,
            Phase.COMMITTED: self._committed,
            Phase.DRAINING: self._draining,
        }

    # --- helpers ----------------------------------------------------------------------

    async def _wait(
        self,
        check: Callable[[], Awaitable[T | None]],
        *,
        timeout_s: float,
        what: str,
        record: MigrationRecord | None = None,
    ) -> T:
        """``check()`` once it is not ``None``; ``PhaseTimedOut`` after ``timeout_s``, or
        ``MaxDurationExceeded`` once ``record`` is overdue (see ``_overdue``)."""
        deadline = self._clock() + timeout_s
        delays = self._delays()
        while True:
            value = await check()
            if value is not None:
                return value
            if record is not None and self._overdue(record):
                limit = record.spec.policy.max_duration_s
                raise MaxDurationExceeded(
                    f"{what} did not happen before the migration's {limit:g}s were up"
                )
            if self._clock() > deadline:
                raise PhaseTimedOut(f"{what} did not happen within {timeout_s:g}s")
            await asyncio.sleep(next(delays))

    def _delays(self, slowest: float = MAX_POLL_S) -> Iterator[float]:
        delay = self._poll_s
        while True:
            yield delay
            delay = min(delay * 1.5, max(self._poll_s, slowest))

    async def _alive(self, name: str, role: str) -> InstanceStatus:
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

    # --- shared phases ----------------------------------------------------------------

    async def _pending(self, record: MigrationRecord) -> MigrationRecord:
        return self._enter(record, Phase.PREFLIGHT)

    async def _preflight(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        target = await self.runtime.describe(spec.target.image)
        source = await self.runtime.describe(spec.source.image)
        if source.state_schema not in target.reads_state_schemas:
            raise IncompatibleStateSchema(
                f"{spec.target.image} reads agent state schemas {target.reads_state_schemas}, but "
                f"{spec.source.image} writes v{source.state_schema}: add a migration to the target"
            )
        if spec.strategy == "criu":
            try:
                self._can_checkpoint(spec.source.image, spec.target.image)
            except CheckpointRestoreUnsupported as exc:
                if not spec.fallback:
                    raise
                record = self._fall_back(record, exc)
        missing = await self.runtime.missing_credentials(spec.target.image, spec.credentials)
        if missing:
            raise CredentialsMissing(
                f"credentials {', '.join(missing)} would not be mounted in {spec.target.image}; "
                "create the Secrets before migrating"
            )
        ownership = await self.control.ownership(spec.session)
        if ownership.owner != spec.source.name:
            raise OwnershipChanged(
                f"session {spec.session!r} is owned by {ownership.owner!r}, not by the source "
                f"{spec.source.name!r}"
            )
        return self._enter(record, Phase.SNAPSHOTTING, source_epoch=ownership.epoch)

    async def _snapshotting(self, record: MigrationRecord) -> MigrationRecord:
        session = record.spec.session
        if record.snapshot_request_seq is None:
            seq = await self.control.request_snapshot(session)
            record = record.model_copy(update={"snapshot_request_seq": seq})
            await self.records.save(record)
        requested = record.snapshot_request_seq
        assert requested is not None

        async def stored() -> int | None:
            watermark = await self.control.latest_snapshot(session)
            if watermark is not None and watermark >= requested:
                return watermark
            await self._alive(record.spec.source.name, "source")  # one that failed never will
            return None

        watermark = await self._wait(
            stored,
            timeout_s=record.spec.policy.phase_timeout_s,
            what=f"a snapshot of {session!r} by the source at seq {requested} or later",
            record=record,
        )
        next_phase = Phase.STOPPING if record.spec.strategy == "restart" else Phase.RESTORING
        return self._enter(record, next_phase, snapshot_watermark=watermark)

    def _can_checkpoint(self, source: str, target: str) -> Checkpointer:
        if self.checkpointer is None:
            raise CheckpointRestoreUnsupported(
                "this runtime cannot checkpoint agent processes (no CRIU): use the "
                "app-level state strategy"
            )
        if source != target:
            raise CheckpointNeedsSameImage(
                f"a checkpoint of {source} cannot be restored as {target}: a process image "
                "only runs on its own binary; use the app-level state strategy to change images"
            )
        return self.checkpointer

    async def _checkpointing(self, record: MigrationRecord) -> MigrationRecord:
        """The criu strategy's Snapshotting: the source, checkpointed while it serves."""
        spec = record.spec
        try:
            checkpointer = self._can_checkpoint(spec.source.image, spec.target.image)
            await self._alive(spec.source.name, "source")
            taken = await checkpointer.checkpoint(spec.source.name, spec.target.name)
        except CheckpointRestoreUnsupported as exc:
            if not spec.fallback:
                raise
            return await self._snapshotting(self._fall_back(record, exc))
        return self._enter(
            record,
            Phase.RESTORING,
            snapshot_watermark=taken.watermark,
            checkpoint=taken.ref,
            checkpoint_ms=taken.dump_ms,
            checkpoint_bytes=taken.bytes,
        )

    def _fall_back(
        self, record: MigrationRecord, exc: CheckpointRestoreUnsupported
    ) -> MigrationRecord:
        """The criu strategy given up for the shadow strategy (``spec.fallback``)."""
        note = f"CRIU was not possible ({exc}); fell back to the app-level state path"
        logger.warning(
            "migration %s: %s", record.spec.id, note, extra={"migration": record.spec.id}
        )
        spec = record.spec.model_copy(update={"strategy": "shadow", "fallback": False})
        return record.model_copy(
            update={
                "spec": spec,
                "checkpoint": None,
                "strategy_note": note,
                "notes": [*record.notes, note],
            }
        )

    async def _rolling_back(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        # The fence first, the shadow after: an exchange whose answer was lost may still
        # be committing, and the gateway serializes it with the unfence. Stopping the
        # shadow first could leave the session owned by a stopped instance.
        ownership = await lift_stale_fence(self.control, record)
        if bumped_to_target(record, ownership):
            note = "rollback found the epoch already bumped; finishing forward"
            return self._enter(
                record,
                Phase.COMMITTED,
                fence=fence_found(record, ownership),
                notes=[*record.notes, note],
            )
        if spec.strategy in ("shadow", "criu"):
            await self.runtime.stop(spec.target.name, grace_s=spec.policy.drain_grace_s)
        if record.checkpoint is not None and self.checkpointer is not None:
            await self.checkpointer.discard(record.checkpoint)
        return self._enter(record, Phase.ROLLED_BACK)

    # --- shadow strategy --------------------------------------------------------------

    async def _restoring(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        status = await self.runtime.status(spec.target.name)
        if not status.alive:
            shadow = InstanceSpec(
                name=spec.target.name,
                image=spec.target.image,
                session=spec.session,
                mode="shadow",
                snapshot=record.snapshot_watermark,
            )
            if spec.strategy == "criu":
                assert record.checkpoint is not None
                checkpointer = self._can_checkpoint(spec.source.image, spec.target.image)
                try:
                    await checkpointer.restore(record.checkpoint, shadow)
                except CheckpointRestoreUnsupported as exc:
                    if not spec.fallback:
                        raise
                    await checkpointer.discard(record.checkpoint)
                    # Back to Snapshotting: the app-level path needs a snapshot.
                    return self._enter(self._fall_back(record, exc), Phase.SNAPSHOTTING)
            else:
                await self.runtime.start(shadow)

        async def ready() -> InstanceStatus | None:
            status = await self._alive(spec.target.name, "shadow")
            return status if status.ready else None

        await self._wait(
            ready,
            timeout_s=spec.policy.phase_timeout_s,
            what="the shadow reporting ready",
            record=record,
        )
        return self._enter(record, Phase.CATCHING_UP)

    async def _catching_up(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec

        async def caught_up() -> InstanceStatus | None:
            status = await self._alive(spec.target.name, "shadow")
            if status.catchup_entries is None:
                return None  # still replaying its first backlog
            head = await self.control.head(spec.session)
            return status if head - status.watermark <= spec.policy.catchup_lag_threshold else None

        status = await self._wait(
            caught_up,
            timeout_s=spec.policy.phase_timeout_s,
            what="the shadow catching up",
            record=record,
        )
        # Validated once: a fence retry comes back through CatchingUp.
        validate = (spec.policy.validation is not None and record.validation is None) or (
            spec.policy.persona is not None and not persona_checked(record, "restore")
        )
        return self._enter(
            record,
            Phase.VALIDATING if validate else Phase.FENCING,
            catchup_entries=status.catchup_entries,
            catchup_entries_per_s=status.catchup_entries_per_s,
        )

    async def _validating(self, record: MigrationRecord) -> MigrationRecord:
        """Shadow compare: golden sessions first; then a compare window opened on the
        shadow, which answers every live turn after it in its sandbox as it follows;
        wait for the policy's number of turns (or its time) and judge the shadow's
        answers; fence, or roll back with ``ValidationFailed`` — the source serving
        all along, the session untouched."""
        spec = record.spec
        if self.validator is None:
            raise StepFailed("this engine's runtime cannot validate (no validator given)")
        validator = self.validator
        if spec.policy.persona is not None and not persona_checked(record, "restore"):
            record, drift = await check_persona(validator, record, "restore")
            await self.records.save(record)
            if drift is not None:
                return self._failed(record, drift)
        policy = spec.policy.validation
        if policy is None:
            return self._enter(record, Phase.FENCING)
        if policy.goldens and not record.golden_validations:
            verdicts = [
                await validator.replay_golden(
                    golden, spec.target.image, instance=spec.target.name, gate=policy.gate
                )
                for golden in policy.goldens
            ]
            record = record.model_copy(update={"golden_validations": verdicts})
            await self.records.save(record)
            if failed := [v for v in verdicts if not v.passed]:
                return self._failed(record, ValidationFailed(failed[0].message))
        if policy.turns == 0:
            return self._enter(record, Phase.FENCING)
        waiting_since = record.timings[Phase.VALIDATING].started
        reopened = 0
        while True:
            record = await self._open_window(record, validator)
            try:
                return await self._compare_window(record, validator, waiting_since)
            except CompareWindowLost as exc:
                reopened += 1
                if reopened > MAX_WINDOW_REOPENS:
                    raise ValidationUnavailable(
                        f"the shadow lost its compare window {reopened} times: {exc}"
                    ) from exc
                note = f"the shadow lost its compare window ({exc}); opening another"
                record = record.model_copy(
                    update={"validation_from": None, "notes": [*record.notes, note]}
                )
                await self.records.save(record)
                waiting_since = self._clock()

    async def _open_window(self, record: MigrationRecord, validator: Validator) -> MigrationRecord:
        """The window at the journal head, or the one the record already names (a
        resumed engine): the shadow keeps it, or says where its new one starts."""
        spec = record.spec
        asked = record.validation_from
        if asked is None:
            asked = await self.control.head(spec.session)
        policy = spec.policy.validation
        opened = await validator.open_window(
            spec.session,
            instance=spec.target.name,
            after_seq=asked,
            turns=None if policy is None else policy.turns,
        )
        if opened == record.validation_from:
            return record
        notes = record.notes
        if record.validation_from is not None:
            notes = [
                *notes,
                f"the shadow had no compare window from seq {record.validation_from} "
                f"(restarted); it compares from seq {opened}",
            ]
        record = record.model_copy(update={"validation_from": opened, "notes": notes})
        await self.records.save(record)
        return record

    async def _compare_window(
        self, record: MigrationRecord, validator: Validator, waiting_since: float
    ) -> MigrationRecord:
        """Wait for the policy's live turns (or its time), then the verdict on them."""
        spec = record.spec
        policy = spec.policy.validation
        assert policy is not None
        after = record.validation_from
        assert after is not None
        # Polled as fast as other waits: a full window noticed late is migration time.
        delays = self._delays()
        while True:
            # Both instances alive, and the turns so far, asked at once: a full window
            # seen a round trip later is migration time. The policy's number of turns
            # is judged: more that came meanwhile are not (each costs the judge time).
            _, _, (count, to_seq) = await asyncio.gather(
                self._alive(spec.target.name, "shadow"),
                self._alive(spec.source.name, "source"),
                validator.completed_turns(
                    spec.session, instance=spec.target.name, after_seq=after, up_to=policy.turns
                ),
            )
            if count >= policy.turns or self._clock() > waiting_since + policy.timeout_s:
                break
            if self._overdue(record):
                raise MaxDurationExceeded(
                    f"{policy.turns} live turns to compare did not come before the "
                    f"migration's {spec.policy.max_duration_s:g}s were up"
                )
            await asyncio.sleep(next(delays))
        summary = await validator.compare(
            spec.session,
            spec.target.image,
            instance=spec.target.name,
            after_seq=after,
            to_seq=to_seq,
            gate=policy.gate,
        )
        record = record.model_copy(update={"validation": summary})
        if not summary.passed:  # the verdict stays in the record that rolls back
            return self._failed(record, ValidationFailed(summary.message))
        return self._enter(record, Phase.FENCING)

    async def _fencing(self, record: MigrationRecord) -> MigrationRecord:
        spec, policy = record.spec, record.spec.policy
        assert record.source_epoch is not None
        ownership = await lift_stale_fence(self.control, record)
        if bumped_to_target(record, ownership):
            # An earlier attempt committed but its answer was lost (or the engine
            # stopped before saving it): the fence succeeded.
            return self._enter(record, Phase.COMMITTED, fence=fence_found(record, ownership))
        if ownership.epoch != record.source_epoch:
            raise OwnershipChanged(
                f"ownership of {spec.session!r} changed under the migration: epoch "
                f"{ownership.epoch}, owner {ownership.owner!r}"
            )
        attempts = record.fence_attempts + 1
        try:
            outcome = await self.control.fence(
                spec.session,
                expect_epoch=record.source_epoch,
                new_owner=spec.target.name,
                timeout_s=policy.fence_timeout_s,
            )
        except FenceOutcomeUnknown as exc:
            if attempts >= policy.max_fence_attempts:
                raise StepFailed(f"no answer to {attempts} fence attempts: {exc}") from exc
            # Back through CatchingUp: the next Fencing reads what became of this one.
            note = f"fence attempt {attempts} got no answer ({exc}); checking and retrying"
            return self._enter(
                record, Phase.CATCHING_UP, fence_attempts=attempts, notes=[*record.notes, note]
            )
        except FenceTimedOut as exc:
            if attempts >= policy.max_fence_attempts:
                raise StepFailed(
                    f"the source stayed busy through {attempts} fence attempts: {exc}"
                ) from exc
            note = f"fence attempt {attempts} timed out (the source was mid-turn); retrying"
            return self._enter(
                record, Phase.CATCHING_UP, fence_attempts=attempts, notes=[*record.notes, note]
            )
        fence = FenceInfo(
            epoch=outcome.epoch,
            fence_seq=outcome.fence_seq,
            waited_ms=outcome.waited_ms,
            attempts=attempts,
        )
        return self._enter(record, Phase.COMMITTED, fence=fence, fence_attempts=attempts)

    async def _committed(self, record: MigrationRecord) -> MigrationRecord:
        """Wait for the new owner to be seen serving at the new epoch. One that crashed
        is restarted (the normal recovery path); one that failed or exited by itself
        fails the migration with its error."""
        spec = record.spec
        assert record.fence is not None
        epoch = record.fence.epoch
        deadline = self._clock() + spec.policy.phase_timeout_s
        delays = self._delays()
        while True:
            status = await self.runtime.status(spec.target.name)
            if status.mode in ("failed", "stopped"):
                how = status.error or f"it {status.mode}"
                raise InstanceFailed(
                    f"the new owner {spec.target.name!r} did not take over epoch {epoch}: {how}"
                )
            if status.alive and status.serving and status.epoch == epoch:
                return self._enter(await self._promoted_persona(record), Phase.DRAINING)
            if not status.alive:
                # The normal recovery path: a new instance from the latest snapshot.
                await self.runtime.start(
                    InstanceSpec(
                        name=spec.target.name,
                        image=spec.target.image,
                        session=spec.session,
                        mode="owner",
                        epoch=epoch,
                    )
                )
                note = f"new owner restarted at epoch {epoch}"
                if status.left_behind:
                    note += f"; killed what it left running: {', '.join(status.left_behind)}"
                record = record.model_copy(
                    update={"recoveries": record.recoveries + 1, "notes": [*record.notes, note]}
                )
                await self.records.save(record)
            if self._clock() > deadline:
                raise PhaseTimedOut(f"the new owner did not take over epoch {epoch} in time")
            await asyncio.sleep(next(delays))

    async def _promoted_persona(self, record: MigrationRecord) -> MigrationRecord:
        """The new owner's persona probe, when the policy asks: kept in the record;
        after the fence nothing it finds (nor its failing) undoes the migration."""
        if (
            record.spec.policy.persona is None
            or self.validator is None
            or persona_checked(record, "promotion")
        ):
            return record
        try:
            record, _ = await check_persona(self.validator, record, "promotion")
        except (ShadowpodError, OSError, TimeoutError) as exc:
            note = f"the new owner's persona probe could not be made: {exc}"
            return record.model_copy(update={"notes": [*record.notes, note]})
        return record

    async def _draining(self, record: MigrationRecord) -> MigrationRecord:
        spec, policy = record.spec, record.spec.policy

        async def exited() -> bool | None:
            return True if not (await self.runtime.status(spec.source.name)).alive else None

        notes = record.notes
        try:  # the source stops by itself once it sees it was superseded
            await self._wait(
                exited, timeout_s=policy.drain_grace_s + 2.0, what="the source exiting"
            )
        except StepFailed:
            await self.runtime.stop(spec.source.name, grace_s=policy.drain_grace_s)
            notes = [*notes, "the source did not exit by itself: stopped"]
        if left := (await self.runtime.status(spec.source.name)).left_behind:
            notes = [*notes, f"the source left running, killed: {', '.join(left)}"]

        async def measured() -> FencePause | None:
            pause = await self.control.fence_pause(spec.session)
            return None if pause.pending else pause

        try:
            pause = (await self._wait(measured, timeout_s=2.0, what="a fence pause measurement")).ms
        except StepFailed:
            pause = None  # the held-back message was not served yet: nothing to report
        return self._enter(record, Phase.SUCCEEDED, fence_pause_ms=pause, notes=notes)

    # --- restart strategy: the stop-and-recreate baseline -----------------------------

    async def _restart_stopping(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        await self.runtime.stop(spec.source.name, grace_s=spec.policy.drain_grace_s)
        return self._enter(record, Phase.COMMITTED)

    async def _restart_committed(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        assert record.source_epoch is not None
        epoch = record.source_epoch + 1
        ownership = await self.control.ownership(spec.session)
        if ownership.epoch == record.source_epoch:
            ownership = await self.control.set_owner(
                spec.session, expect_epoch=record.source_epoch, epoch=epoch, owner=spec.target.name
            )
        elif not (ownership.epoch == epoch and ownership.owner == spec.target.name):
            raise OwnershipChanged(f"ownership changed under the migration: {ownership}")
        fence = FenceInfo(
            epoch=epoch, fence_seq=ownership.fence_seq or 0, waited_ms=0.0, attempts=0
        )
        return self._enter(record, Phase.RESTORING, fence=fence)

    async def _restart_restoring(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec
        assert record.fence is not None
        epoch = record.fence.epoch
        if not (await self.runtime.status(spec.target.name)).alive:
            await self.runtime.start(
                InstanceSpec(
                    name=spec.target.name,
                    image=spec.target.image,
                    session=spec.session,
                    mode="owner",
                    epoch=epoch,
                )
            )

        async def serving() -> InstanceStatus | None:
            status = await self._alive(spec.target.name, "new owner")
            return status if status.serving and status.epoch == epoch else None

        await self._wait(
            serving, timeout_s=spec.policy.phase_timeout_s, what="the new owner serving"
        )
        return self._enter(record, Phase.SUCCEEDED)
