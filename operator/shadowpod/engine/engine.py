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
from collections.abc import Awaitable, Callable

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.failures import (
    CheckpointNeedsSameImage,
    CredentialsMissing,
    IncompatibleStateSchema,
    MaxDurationExceeded,
    OwnershipChanged,
    SourceLost,
    StepFailed,
)
from shadowpod.engine.fence_checks import (
    bump_to,
    bumped_to_target,
    fence_found,
    lift_stale_fence,
)
from shadowpod.engine.persona import persona_checked
from shadowpod.engine.ports import (
    Checkpointer,
    CheckpointRestoreUnsupported,
    FenceOutcomeUnknown,
    FencePause,
    FenceTimedOut,
    InstanceSpec,
    InstanceStatus,
    RecordStore,
    Runtime,
    SessionControl,
    Unavailable,
    Validator,
)
from shadowpod.engine.record import FenceInfo, InstanceRef, MigrationRecord, Phase, SourceLoss
from shadowpod.engine.restart import Restart
from shadowpod.engine.steps import POLL_S, Clock, Steps
from shadowpod.engine.validating import Validation

logger = logging.getLogger(__name__)


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
        self.steps = Steps(runtime, control, records, clock=clock, poll_s=poll_s)
        self.validation = Validation(self.steps, validator)
        self.restart = Restart(self.steps)

    async def run(self, record: MigrationRecord) -> MigrationRecord:
        """Drive ``record`` to a terminal phase, saving it on every phase change.

        The clock the engine was given times the record (its start, every phase) as
        it does the engine's deadlines: a record resumed by another engine is timed
        on the same clock.
        """
        if record.phase is Phase.PENDING and not record.timings:
            record = record.model_copy(update={"started": self.steps.clock()})
        await self.records.save(record)
        while not record.done:
            record = await self.step(record)
            await self.records.save(record)
        return record

    async def step(self, record: MigrationRecord) -> MigrationRecord:
        """Act on ``record``'s phase; the record in the phase that comes next."""
        if self.steps.overdue(record):
            limit = record.spec.policy.max_duration_s
            return self.steps.failed(
                record,
                MaxDurationExceeded(f"the migration did not reach its cutover within {limit:g}s"),
            )
        action = self._actions(record)[record.phase]
        retry_until: float | None = None
        delays = self.steps.delays(slowest=1.0)
        while True:
            try:
                return await action(record)
            except (Unavailable, OSError, TimeoutError) as exc:
                now = self.steps.clock()
                retry_until = retry_until or now + record.spec.policy.phase_timeout_s
                if now > retry_until or self.steps.overdue(record):
                    return self.steps.failed(record, exc)
                logger.info(
                    "migration step %s will be retried: %s",
                    record.phase,
                    exc,
                    extra={"migration": record.spec.id},
                )
                await asyncio.sleep(next(delays))
            except ShadowpodError as exc:
                return self.steps.failed(record, exc)

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
                Phase.STOPPING: self.restart.stopping,
                Phase.COMMITTED: self.restart.committed,
                Phase.RESTORING: self.restart.restoring,
            }
        if record.spec.strategy == "criu":
            common[Phase.SNAPSHOTTING] = self._checkpointing
        return {
            **common,
            Phase.RESTORING: self._restoring,
            Phase.CATCHING_UP: self._catching_up,
            Phase.VALIDATING: self.validation.validating,
            Phase.FENCING: self._fencing,
            Phase.COMMITTED: self._committed,
            Phase.DRAINING: self._draining,
        }

    # --- shared phases ----------------------------------------------------------------

    async def _pending(self, record: MigrationRecord) -> MigrationRecord:
        return self.steps.enter(record, Phase.PREFLIGHT)

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
        return self.steps.enter(record, Phase.SNAPSHOTTING, source_epoch=ownership.epoch)

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
            await self.steps.alive(record.spec.source.name, "source")  # one that failed never will
            return None

        try:
            watermark = await self.steps.wait(
                stored,
                timeout_s=record.spec.policy.phase_timeout_s,
                what=f"a snapshot of {session!r} by the source at seq {requested} or later",
                record=record,
            )
        except SourceLost as exc:
            return await self._without_snapshot(record, exc.loss)
        next_phase = Phase.STOPPING if record.spec.strategy == "restart" else Phase.RESTORING
        return self.steps.enter(record, next_phase, snapshot_watermark=watermark)

    async def _without_snapshot(self, record: MigrationRecord, loss: SourceLoss) -> MigrationRecord:
        """A source that died before its snapshot will never write it: the target starts
        from the latest snapshot there is (or none) and the journal — the state is a
        fold of the journal, a snapshot only a shortcut."""
        latest = await self.control.latest_snapshot(record.spec.session)
        note = (
            f"the source {record.spec.source.name} died before its snapshot ({loss.how}); "
            f"the target starts from the latest snapshot (at {latest}) and the journal"
        )
        logger.warning(
            "migration %s: %s", record.spec.id, note, extra={"migration": record.spec.id}
        )
        if record.spec.strategy == "criu":  # nothing left to checkpoint
            spec = record.spec.model_copy(update={"strategy": "shadow", "fallback": False})
            record = record.model_copy(update={"spec": spec, "checkpoint": None})
        next_phase = Phase.STOPPING if record.spec.strategy == "restart" else Phase.RESTORING
        return self.steps.enter(
            record,
            next_phase,
            snapshot_watermark=latest,
            source_lost=loss.model_copy(update={"phase": record.phase}),
            notes=[*record.notes, note],
        )

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
            await self.steps.alive(spec.source.name, "source")
            taken = await checkpointer.checkpoint(spec.source.name, spec.target.name)
        except SourceLost as exc:
            return await self._without_snapshot(record, exc.loss)
        except CheckpointRestoreUnsupported as exc:
            if not spec.fallback:
                raise
            return await self._snapshotting(self._fall_back(record, exc))
        return self.steps.enter(
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
            return self.steps.enter(
                record,
                Phase.COMMITTED,
                fence=fence_found(record, ownership),
                notes=[*record.notes, note],
            )
        if spec.strategy in ("shadow", "criu"):
            await self.runtime.stop(spec.target.name, grace_s=spec.policy.drain_grace_s)
        if record.checkpoint is not None and self.checkpointer is not None:
            await self.checkpointer.discard(record.checkpoint)
        loss = await self.steps.source_loss(record)
        if loss is not None:
            return await self._replace_source(record, loss)
        return self.steps.enter(record, Phase.ROLLED_BACK)

    async def _replace_source(self, record: MigrationRecord, loss: SourceLoss) -> MigrationRecord:
        """A rollback whose source is dead: the session would be left with no one to
        serve it. A new owner of the source's image — which reads the state, where the
        target could not be shown to — takes the next epoch, from the latest snapshot
        and the journal; the migration still ends ``RolledBack`` (the move to the target
        did not happen), with ``replacement`` saying who serves."""
        spec = record.spec
        if record.replacement is None:
            source_epoch = record.source_epoch
            if source_epoch is None:  # rolled back from Preflight, before it was read
                ownership = await self.control.ownership(spec.session)
                if ownership.owner != spec.source.name:
                    return self.steps.enter(record, Phase.ROLLED_BACK)  # not ours to replace
                source_epoch = ownership.epoch
            chosen = InstanceRef(name=f"{spec.target.name}-r", image=spec.source.image)
            note = (
                f"the source {spec.source.name} is dead ({loss.how}): a new owner "
                f"{chosen.name} of {spec.source.image} replaces it"
            )
            logger.warning("migration %s: %s", spec.id, note, extra={"migration": spec.id})
            record = record.model_copy(
                update={
                    "source_epoch": source_epoch,
                    "source_lost": record.source_lost or loss,
                    "replacement": chosen,
                    "notes": [*record.notes, note],
                }
            )
            await self.records.save(record)  # the name is chosen once, before it is used
        replacement = record.replacement
        assert replacement is not None
        ownership = await bump_to(self.control, record, replacement.name)
        record = await self.steps.serving(record, ownership.epoch, replacement)
        return self.steps.enter(record, Phase.ROLLED_BACK)

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
                    return self.steps.enter(self._fall_back(record, exc), Phase.SNAPSHOTTING)
            else:
                await self.runtime.start(shadow)

        async def ready() -> InstanceStatus | None:
            status = await self.steps.alive(spec.target.name, "shadow")
            return status if status.ready else None

        await self.steps.wait(
            ready,
            timeout_s=spec.policy.phase_timeout_s,
            what="the shadow reporting ready",
            record=record,
        )
        return self.steps.enter(record, Phase.CATCHING_UP)

    async def _catching_up(self, record: MigrationRecord) -> MigrationRecord:
        spec = record.spec

        async def caught_up() -> InstanceStatus | None:
            status = await self.steps.alive(spec.target.name, "shadow")
            if status.catchup_entries is None:
                return None  # still replaying its first backlog
            head = await self.control.head(spec.session)
            return status if head - status.watermark <= spec.policy.catchup_lag_threshold else None

        status = await self.steps.wait(
            caught_up,
            timeout_s=spec.policy.phase_timeout_s,
            what="the shadow catching up",
            record=record,
        )
        # Validated once: a fence retry comes back through CatchingUp.
        validate = (spec.policy.validation is not None and record.validation is None) or (
            spec.policy.persona is not None and not persona_checked(record, "restore")
        )
        if validate and record.source_lost is not None:
            raise SourceLost(
                f"the source {spec.source.name} is dead ({record.source_lost.how}): the "
                "upgrade gate cannot compare the target with it, and an image it has not "
                "passed does not take the session",
                record.source_lost,
            )
        return self.steps.enter(
            record,
            Phase.VALIDATING if validate else Phase.FENCING,
            catchup_entries=status.catchup_entries,
            catchup_entries_per_s=status.catchup_entries_per_s,
        )

    async def _fencing(self, record: MigrationRecord) -> MigrationRecord:
        spec, policy = record.spec, record.spec.policy
        assert record.source_epoch is not None
        ownership = await lift_stale_fence(self.control, record)
        if bumped_to_target(record, ownership):
            # An earlier attempt committed but its answer was lost (or the engine
            # stopped before saving it): the fence succeeded.
            return self.steps.enter(record, Phase.COMMITTED, fence=fence_found(record, ownership))
        if ownership.epoch != record.source_epoch:
            raise OwnershipChanged(
                f"ownership of {spec.session!r} changed under the migration: epoch "
                f"{ownership.epoch}, owner {ownership.owner!r}"
            )
        if (loss := await self.steps.source_loss(record)) is not None:
            return await self._take_over(record, loss)
        # Never hand the epoch to a shadow that is gone: the source would stop serving
        # for a new owner to be started from the snapshot; a rollback costs nothing.
        await self.steps.alive(spec.target.name, "shadow")
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
            return self.steps.enter(
                record, Phase.CATCHING_UP, fence_attempts=attempts, notes=[*record.notes, note]
            )
        except FenceTimedOut as exc:
            # A source that never acks may be dead rather than busy: then there is
            # nothing to wait for, and nobody to give the session back to.
            if (loss := await self.steps.source_loss(record)) is not None:
                return await self._take_over(
                    record.model_copy(update={"fence_attempts": attempts}), loss
                )
            if attempts >= policy.max_fence_attempts:
                raise StepFailed(
                    f"the source stayed busy through {attempts} fence attempts: {exc}"
                ) from exc
            note = f"fence attempt {attempts} timed out (the source was mid-turn); retrying"
            return self.steps.enter(
                record, Phase.CATCHING_UP, fence_attempts=attempts, notes=[*record.notes, note]
            )
        fence = FenceInfo(
            epoch=outcome.epoch,
            fence_seq=outcome.fence_seq,
            waited_ms=outcome.waited_ms,
            attempts=attempts,
        )
        return self.steps.enter(record, Phase.COMMITTED, fence=fence, fence_attempts=attempts)

    async def _take_over(self, record: MigrationRecord, loss: SourceLoss) -> MigrationRecord:
        """The cutover from a dead source: no turn of its to wait for, no fence to hold
        — the epoch is bumped to the shadow at once. A dead process cannot write, and
        the bump refuses anything of its epoch anyway. The shadow, which has followed
        the journal, sees the epoch marker naming it and is given every inbound entry
        the source had not acked (a turn it died in is taken again: its outputs are
        journaled with its ack, all or nothing)."""
        spec = record.spec
        if record.source_lost is None:
            note = (
                f"the source {spec.source.name} is dead ({loss.how}): the shadow takes "
                "over with an epoch bump, no fence to wait for"
            )
            logger.warning("migration %s: %s", spec.id, note, extra={"migration": spec.id})
            record = record.model_copy(
                update={
                    "source_lost": loss.model_copy(update={"phase": record.phase}),
                    "notes": [*record.notes, note],
                }
            )
            await self.records.save(record)  # the decision first: a resumed engine keeps it
        await self.steps.alive(spec.target.name, "shadow")  # else the rollback replaces it
        ownership = await bump_to(self.control, record, spec.target.name)
        fence = FenceInfo(
            epoch=ownership.epoch,
            fence_seq=ownership.fence_seq or 0,
            waited_ms=0.0,
            attempts=record.fence_attempts,
        )
        return self.steps.enter(record, Phase.COMMITTED, fence=fence)

    async def _committed(self, record: MigrationRecord) -> MigrationRecord:
        """Wait for the new owner to be seen serving at the new epoch. One that crashed
        is restarted (the normal recovery path); one that failed or exited by itself
        fails the migration with its error."""
        assert record.fence is not None
        record = await self.steps.serving(record, record.fence.epoch)
        probed = await self.validation.promoted_persona(record)
        return self.steps.enter(probed, Phase.DRAINING)

    async def _draining(self, record: MigrationRecord) -> MigrationRecord:
        spec, policy = record.spec, record.spec.policy

        async def exited() -> bool | None:
            return True if not (await self.runtime.status(spec.source.name)).alive else None

        notes = record.notes
        try:  # the source stops by itself once it sees it was superseded
            await self.steps.wait(
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

        pause: float | None = None
        if record.source_lost is None:  # a dead source's cutover held nothing back
            try:
                measurement = await self.steps.wait(
                    measured, timeout_s=2.0, what="a fence pause measurement"
                )
                pause = measurement.ms
            except StepFailed:
                pass  # the held-back message was not served yet: nothing to report
        # Seen serving once more: a new owner that crashed while the source drained is
        # restarted here, not left for nobody to find.
        assert record.fence is not None
        record = await self.steps.serving(
            record.model_copy(update={"notes": notes}), record.fence.epoch
        )
        return self.steps.enter(record, Phase.SUCCEEDED, fence_pause_ms=pause)
