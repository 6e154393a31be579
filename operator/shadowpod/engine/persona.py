"""The persona check in a migration (``shadowpod.gates.persona``): the shadow probed
after its restore, before the fence (drift: warn, re-anchor, or roll back with
``PersonaDrift``), and the new owner after its promotion (drift: warn or re-anchor;
there is no way back after the fence)."""

from __future__ import annotations

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.ports import Validator
from shadowpod.engine.record import MigrationRecord
from shadowpod.gates.persona import PersonaCheck, Stage


class PersonaDrift(ShadowpodError):
    """The target answered the persona probe as another agent than the source."""

    reason = "PersonaDrift"


def persona_checked(record: MigrationRecord, stage: Stage) -> bool:
    return any(check.stage == stage for check in record.persona_checks)


async def check_persona(
    validator: Validator, record: MigrationRecord, stage: Stage
) -> tuple[MigrationRecord, PersonaDrift | None]:
    """``record`` with the checks of ``stage`` kept, and the drift to roll back for
    (only before the fence, when the policy says ``rollback``)."""
    spec = record.spec
    policy = spec.policy.persona
    assert policy is not None
    baseline = next((c.baseline for c in record.persona_checks), None)

    async def probe(known: str | None) -> PersonaCheck:
        return await validator.persona(
            policy, stage=stage, instance=spec.target.name, source=spec.source.name, baseline=known
        )

    check = await probe(baseline)
    checks = [check]
    drift: PersonaDrift | None = None
    if check.drifted and policy.on_drift == "reanchor":
        await validator.reanchor(spec.target.name)
        checks = [check.model_copy(update={"action": "reanchored"})]
        again = await probe(check.baseline)
        checks.append(again.model_copy(update={"action": "warned"}) if again.drifted else again)
    elif check.drifted and policy.on_drift == "rollback" and stage == "restore":
        checks = [check.model_copy(update={"action": "rolled back"})]
        drift = PersonaDrift(
            f"{spec.target.image} answered the persona probe as another agent "
            f"({check.reason}): {check.reply[:160]!r}, where the source said "
            f"{check.baseline[:160]!r}"
        )
    elif check.drifted:
        after = " (after the fence: there is no way back)" if stage == "promotion" else ""
        checks = [check.model_copy(update={"action": "warned" + after})]
    return record.model_copy(update={"persona_checks": [*record.persona_checks, *checks]}), drift
