"""The Validating phase — the upgrade gate — and the persona probe of a new owner.

Shadow compare: golden sessions first; then a compare window opened on the shadow,
which answers every live turn after it in its sandbox as it follows; the policy's
number of turns (or its time) waited for, the shadow's answers judged; then fence, or
roll back with ``ValidationFailed`` — the source serving all along, the session
untouched. The persona probe asks the shadow who it is as it is restored (a drift the
policy refuses rolls back) and the new owner once promoted (recorded only: after the
fence nothing undoes the migration).
"""

from __future__ import annotations

import asyncio
from typing import Final

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.failures import MaxDurationExceeded, StepFailed, ValidationFailed
from shadowpod.engine.persona import check_persona, persona_checked
from shadowpod.engine.ports import CompareWindowLost, ValidationUnavailable, Validator
from shadowpod.engine.record import MigrationRecord, Phase
from shadowpod.engine.steps import Steps

# A shadow that loses its compare window (restarted) gets a new one this many times.
MAX_WINDOW_REOPENS: Final = 2


class Validation:
    def __init__(self, steps: Steps, validator: Validator | None) -> None:
        self.steps = steps
        self.validator = validator

    async def validating(self, record: MigrationRecord) -> MigrationRecord:
        """The Validating phase: the persona probe, the goldens, the compare window."""
        spec, steps = record.spec, self.steps
        if self.validator is None:
            raise StepFailed("this engine's runtime cannot validate (no validator given)")
        validator = self.validator
        if spec.policy.persona is not None and not persona_checked(record, "restore"):
            record, drift = await check_persona(validator, record, "restore")
            await steps.records.save(record)
            if drift is not None:
                return steps.failed(record, drift)
        policy = spec.policy.validation
        if policy is None:
            return steps.enter(record, Phase.FENCING)
        if policy.goldens and not record.golden_validations:
            verdicts = [
                await validator.replay_golden(
                    golden, spec.target.image, instance=spec.target.name, gate=policy.gate
                )
                for golden in policy.goldens
            ]
            record = record.model_copy(update={"golden_validations": verdicts})
            await steps.records.save(record)
            if failed := [v for v in verdicts if not v.passed]:
                return steps.failed(record, ValidationFailed(failed[0].message))
        if policy.turns == 0:
            return steps.enter(record, Phase.FENCING)
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
                await steps.records.save(record)
                waiting_since = steps.clock()

    async def _open_window(self, record: MigrationRecord, validator: Validator) -> MigrationRecord:
        """The window at the journal head, or the one the record already names (a
        resumed engine): the shadow keeps it, or says where its new one starts."""
        spec = record.spec
        asked = record.validation_from
        if asked is None:
            asked = await self.steps.control.head(spec.session)
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
        await self.steps.records.save(record)
        return record

    async def _compare_window(
        self, record: MigrationRecord, validator: Validator, waiting_since: float
    ) -> MigrationRecord:
        """Wait for the policy's live turns (or its time), then the verdict on them."""
        spec, steps = record.spec, self.steps
        policy = spec.policy.validation
        assert policy is not None
        after = record.validation_from
        assert after is not None
        # Polled as fast as other waits: a full window noticed late is migration time.
        delays = steps.delays()
        while True:
            # Both instances alive, and the turns so far, asked at once: a full window
            # seen a round trip later is migration time. The policy's number of turns
            # is judged: more that came meanwhile are not (each costs the judge time).
            _, _, (count, to_seq) = await asyncio.gather(
                steps.alive(spec.target.name, "shadow"),
                steps.alive(spec.source.name, "source"),
                validator.completed_turns(
                    spec.session, instance=spec.target.name, after_seq=after, up_to=policy.turns
                ),
            )
            if count >= policy.turns or steps.clock() > waiting_since + policy.timeout_s:
                break
            if steps.overdue(record):
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
            return steps.failed(record, ValidationFailed(summary.message))
        return steps.enter(record, Phase.FENCING)

    async def promoted_persona(self, record: MigrationRecord) -> MigrationRecord:
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
