"""``MigrationRecords``: the engine's ``RecordStore`` over an AgentMigration.

The engine's whole record is kept in one annotation (``shadowpod.dev/record``), so
that a restarted operator resumes it exactly; what a user reads is written to the
status from it — phase, per-phase timings, the fence, the result and conditions —
after the record, every time the engine saves. A phase change also posts a Normal
event, on the migration and on its session, and feeds the metrics.
"""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import UTC, datetime
from typing import Any, Final

from shadowpod.engine.record import TERMINAL, MigrationRecord, Phase, ValidationSummary
from shadowpod.kube import conditions, names
from shadowpod.kube.api import namespaced
from shadowpod.kube.context import EventType, OperatorContext
from shadowpod.kube.models.conditions import ConditionStatus
from shadowpod.kube.models.v1alpha1 import MigrationCondition, MigrationResult, MigrationSummary
from shadowpod.kube.models.v1alpha1.validation import WORST_SHOWN

logger = logging.getLogger("shadowpod.operator")
RECORD_ANNOTATION: Final = f"{names.PREFIX}/record"
# The CRIU strategy's mechanism, as the strategy chose it (``checkpointers``).
MECHANISM_ANNOTATION: Final = f"{names.PREFIX}/checkpoint-mechanism"
VALIDATION_REASONS: Final = ("ValidationFailed", "ValidationUnavailable", "PersonaDrift")
# Reasons a rollback is also said by, as an event of their own (see ``_phase_changed``):
# the upgrade gate's, and a target that can never run (the pod runtime's).
SAID_ALONE: Final = (*VALIDATION_REASONS, "ImagePullFailed", "NodeNotFound")
# How a verdict names a disagreement: "turn 21 (score 0.77): why; source said …".
_WORST: Final = re.compile(r"^turn (\d+) \(score ([0-9.]+)\): (.*?)(?:; source said |$)", re.S)
RESULTS: Final = {
    Phase.SUCCEEDED: "Succeeded",
    Phase.ROLLED_BACK: "RolledBack",
    Phase.FAILED: "Failed",
}


def timestamp(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _percent(ratio: float) -> int:
    """Rounded down, so a verdict never reads better than it is (2/3 is 66, not 67)."""
    return max(0, min(100, math.floor(ratio * 100 + 1e-9)))


def disagreements(summary: ValidationSummary) -> list[dict[str, Any]]:
    """The verdict's worst disagreements by reference: seq, score, reason."""
    found = []
    for line in summary.worst:
        if (match := _WORST.match(line)) is None:
            continue
        item: dict[str, Any] = {
            "seq": int(match[1]),
            "scorePercent": _percent(float(match[2])),
            "reason": match[3][:512],
        }
        if summary.golden is not None:
            item["golden"] = summary.golden[:512]
        found.append(item)
    return found


def validation_status(record: MigrationRecord) -> dict[str, Any] | None:
    """The upgrade gate's verdict for the status: small; the answers are in a ConfigMap."""
    live = record.validation
    goldens = record.golden_validations
    if live is None and not goldens:
        return None
    verdicts = [*goldens, *([] if live is None else [live])]
    first = verdicts[0]
    worst = [d for v in verdicts for d in disagreements(v)]
    worst.sort(key=lambda d: (d["scorePercent"], d["seq"]))
    failing = next((v for v in verdicts if not v.passed), None)
    policy = record.spec.policy.validation
    live_done = live is not None or (policy is not None and policy.turns == 0)
    status: dict[str, Any] = {
        "judge": first.judge,
        "compared": 0 if live is None else live.compared,
        "agreed": 0 if live is None else live.agreed,
        "agreementPercent": 0 if live is None else _percent(live.agreement),
        "thresholdPercent": _percent(first.threshold),
        "passed": failing is None and live_done,
        "fromSeq": None if live is None else live.from_seq,
        "toSeq": None if live is None else live.to_seq,
        "worst": worst[:WORST_SHOWN],
        "goldens": [
            {
                "golden": v.golden or "",
                "compared": v.compared,
                "agreed": v.agreed,
                "passed": v.passed,
            }
            for v in goldens
        ],
        "answers": names.validation_answers(record.spec.id.partition("/")[2]),
        "message": (
            (failing or live or first).message
            if failing is not None or live_done
            else f"{len(goldens)} golden session(s) passed; the live turns are being compared"
        )[:2048]
        or None,
    }
    return status


def status_of(record: MigrationRecord, *, generation: int | None, old: list[Any]) -> dict[str, Any]:
    """The AgentMigration's status (camelCase JSON) for ``record``."""
    phases = []
    for phase, timing in record.timings.items():
        phases.append(
            {
                "phase": phase,
                "startTime": timestamp(timing.started),
                "endTime": timestamp(timing.ended),
                "durationMilliseconds": _ms(timing.seconds),
            }
        )
    result = RESULTS.get(record.phase)
    succeeded: ConditionStatus = "True" if record.phase is Phase.SUCCEEDED else "False"
    failed: ConditionStatus = "True" if result in ("RolledBack", "Failed") else "False"
    why = record.reason or ("Succeeded" if result == "Succeeded" else "InProgress")
    message = record.error or (f"in phase {record.phase}" if result is None else "done")
    kept = [MigrationCondition.model_validate(c) for c in old]
    conds = conditions.set_condition(
        kept, MigrationCondition, "Succeeded", succeeded, why, message, generation=generation
    )
    conds = conditions.set_condition(
        conds, MigrationCondition, "Failed", failed, why, message, generation=generation
    )
    spec = record.spec
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": record.phase,
        "strategy": "CRIU" if spec.strategy == "criu" else "State",
        "strategyMessage": None if record.strategy_note is None else record.strategy_note[:2048],
        "startTime": timestamp(record.started),
        "completionTime": timestamp(record.ended),
        "source": {
            "pod": spec.source.name,
            "image": spec.source.image,
            "epoch": record.source_epoch,
        },
        "target": {
            "pod": spec.target.name,
            "image": spec.target.image,
            "epoch": None if record.fence is None else record.fence.epoch,
        },
        "phases": phases,
        "snapshot": {
            "requestSeq": record.snapshot_request_seq,
            "watermarkSeq": record.snapshot_watermark,
        },
        "validation": validation_status(record),
        "persona": [
            {
                "stage": check.stage,
                "instance": check.instance,
                "drifted": check.drifted,
                "scorePercent": _percent(check.score),
                "reason": check.reason[:512],
                "action": check.action or None,
            }
            for check in record.persona_checks[-8:]
        ],
        "fenceAttempts": record.fence_attempts,
        "fence": None
        if record.fence is None
        else {
            "epoch": record.fence.epoch,
            "fenceSeq": record.fence.fence_seq,
            "waitedMilliseconds": round(record.fence.waited_ms),
            "attempts": record.fence.attempts,
        },
        "fencePauseMilliseconds": None
        if record.fence_pause_ms is None
        else round(record.fence_pause_ms),
        "messagesReplayed": record.catchup_entries,
        "catchUpEntriesPerSecond": None
        if record.catchup_entries_per_s is None
        else round(record.catchup_entries_per_s),
        "recoveries": record.recoveries,
        "result": result,
        "failedPhase": record.failed_phase,
        "message": message[:32768],
        "conditions": [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conds],
    }
    return status


def stored_record(migration: dict[str, Any]) -> MigrationRecord | None:
    """The engine's record kept on ``migration``; ``None`` before the engine first saved."""
    raw = (migration["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return None if raw is None else MigrationRecord.model_validate_json(raw)


def summary_of(migration: dict[str, Any]) -> MigrationSummary | None:
    """``migration`` in short, for its session's ``lastMigration``: once the engine has
    run it to its end (a migration refused before it started has no record)."""
    try:
        record = stored_record(migration)
    except ValueError:
        # Not the engine's record (edited by hand): the migration's own daemon says so.
        return None
    if record is None or not record.done:
        return None
    spec = record.spec
    return MigrationSummary(
        name=migration["metadata"]["name"],
        reason=record.reason or spec.reason,
        result=MigrationResult(RESULTS[record.phase]),
        source_image=spec.source.image,
        target_image=spec.target.image,
        start_time=datetime.fromtimestamp(record.started, UTC),
        completion_time=None if record.ended is None else datetime.fromtimestamp(record.ended, UTC),
        # Never below 0: a record resumed by another operator runs on another clock.
        duration_milliseconds=None
        if record.total_s is None
        else max(0, round(record.total_s * 1000)),
        fence_pause_milliseconds=None
        if record.fence_pause_ms is None
        else max(0, round(record.fence_pause_ms)),
    )


class MigrationRecords:
    def __init__(
        self, ctx: OperatorContext, migration: dict[str, Any], session: dict[str, Any]
    ) -> None:
        self.ctx = ctx
        self.migration = migration
        self.session = session
        meta = migration["metadata"]
        self.path = namespaced("agentmigrations", meta["namespace"], meta["name"])
        self._phase: Phase | None = None
        self._note: str | None = None

    def stored(self) -> MigrationRecord | None:
        return stored_record(self.migration)

    async def load(self, migration_id: str) -> MigrationRecord | None:
        fresh = await self.ctx.api.get(self.path)
        if fresh is not None:
            self.migration = fresh
        return self.stored()

    async def save(self, record: MigrationRecord) -> None:
        before = self.stored()
        patched = await self.ctx.api.patch(
            self.path, {"metadata": {"annotations": {RECORD_ANNOTATION: record.model_dump_json()}}}
        )
        if patched is None:
            return  # deleted meanwhile: the cancel path owns what is left
        self.migration = patched
        old = (patched.get("status") or {}).get("conditions", [])
        status = status_of(record, generation=patched["metadata"].get("generation"), old=old)
        if record.spec.strategy == "criu":
            mechanism = (patched["metadata"].get("annotations") or {}).get(MECHANISM_ANNOTATION)
            status["checkpointMechanism"] = mechanism or "KubeletAPI"
        else:
            status["checkpointMechanism"] = None
        patched_status = await self.ctx.api.patch(f"{self.path}/status", {"status": status})
        if patched_status is not None:
            self.migration = patched_status
        await self._judged(before, record)
        if record.strategy_note != self._note and record.strategy_note is not None:
            await self._strategy_said(record, first=self._phase is None)
            self._note = record.strategy_note
        if record.phase is not self._phase:
            await self._phase_changed(record)
            self._phase = record.phase

    async def _judged(self, before: MigrationRecord | None, record: MigrationRecord) -> None:
        """Verdicts new since the last save: counted, and said (Normal when passed)."""
        old_goldens = 0 if before is None else len(before.golden_validations)
        new = list(record.golden_validations[old_goldens:])
        if record.validation is not None and (before is None or before.validation is None):
            new.append(record.validation)
        metrics = self.ctx.metrics
        name = self.migration["metadata"]["name"]
        probed = 0 if before is None else len(before.persona_checks)
        for check in record.persona_checks[probed:]:
            if check.drifted:
                said = (
                    f"migration {name}: {check.instance} ({check.stage}) answered the persona"
                    f" probe unlike the source: {check.reason}"
                    + (f"; {check.action}" if check.action else "")
                )
                for obj in (self.migration, self.session):
                    await self.ctx.event(obj, "Warning", "PersonaDrift", said)
        for verdict in new:
            source = "golden" if verdict.golden is not None else "live"
            metrics.validation_turns.labels(judge=verdict.judge, source=source).inc(
                verdict.compared
            )
            metrics.validation_agreement.labels(source=source).observe(verdict.agreement)
            if verdict.passed:
                await self.ctx.event(
                    self.migration,
                    "Normal",
                    "ValidationPassed",
                    f"migration {name}: {verdict.message}",
                )

    async def _strategy_said(self, record: MigrationRecord, *, first: bool) -> None:
        """Which path, and why: once when the migration starts (or resumes), and again
        when a CRIU attempt falls back to the app-level path."""
        note = record.strategy_note or ""
        name = self.migration["metadata"]["name"]
        if first:
            strategy = "CRIU" if record.spec.strategy == "criu" else "State"
            await self.ctx.event(
                self.migration, "Normal", "StrategyChosen", f"migration {name}: {strategy}: {note}"
            )
        else:
            for obj in (self.migration, self.session):
                await self.ctx.event(
                    obj, "Warning", "CheckpointFallback", f"migration {name}: {note}"
                )

    async def _phase_changed(self, record: MigrationRecord) -> None:
        logger.info(
            "migration %s: %s",
            record.spec.id,
            record.phase,
            extra={
                "migration": record.spec.id,
                "session": record.spec.session,
                "epoch": record.fence.epoch if record.fence else record.source_epoch,
                "phase": record.phase.value,
                "reason": record.reason,
            },
        )
        metrics = self.ctx.metrics
        previous = self._phase
        if previous is not None and (timing := record.timings.get(previous)) and timing.seconds:
            metrics.phase_duration.labels(phase=previous).observe(timing.seconds)
        if previous is not None and previous not in TERMINAL:
            metrics.in_progress.labels(phase=previous).dec()
        if record.phase not in TERMINAL:
            metrics.in_progress.labels(phase=record.phase).inc()
            entered = record.timings.get(record.phase)
            metrics.migration_in_phase(
                record.spec.id, record.phase, entered.started if entered else time.time()
            )
        else:
            metrics.migration_in_phase(record.spec.id, None, 0)
            result = RESULTS[record.phase]
            reason = record.reason or record.spec.reason
            metrics.migrations.labels(result=result, reason=reason).inc()
            if record.total_s is not None:
                metrics.migration_duration.labels(result=result).observe(record.total_s)
                metrics.migration_policy_share.observe(
                    record.total_s / record.spec.policy.max_duration_s
                )
            if record.fence_pause_ms is not None:
                metrics.fence_pause.observe(record.fence_pause_ms / 1000)
            if result != "Succeeded" and record.reason in VALIDATION_REASONS:
                metrics.validation_rollbacks.labels(reason=record.reason).inc()
        kind: EventType = (
            "Warning" if record.phase in (Phase.ROLLING_BACK, Phase.FAILED) else "Normal"
        )
        message = f"migration {self.migration['metadata']['name']}: {record.phase}"
        if record.error and record.phase in (Phase.ROLLING_BACK, Phase.FAILED, Phase.ROLLED_BACK):
            message += f" ({record.reason}: {record.error})"
        for obj in (self.migration, self.session):
            await self.ctx.event(obj, kind, f"Migration{record.phase}", message)
        if record.phase is Phase.ROLLING_BACK and record.reason in SAID_ALONE:
            # The upgrade gate's own word, or why the target can never run: what a
            # user filters events by.
            said = f"migration {self.migration['metadata']['name']}: {record.error}"
            if record.reason == "ValidationFailed":
                said += "; kubectl shadowpod diff shows both answers"
            for obj in (self.migration, self.session):
                await self.ctx.event(obj, "Warning", record.reason, said)
