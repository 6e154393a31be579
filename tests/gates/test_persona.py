"""The persona check on the local runtime: a version that calls itself by another name
is flagged by the probe after its restore; the policy rolls it back, warns, or has it
re-anchor its identity (real processes, a client talking to the session throughout)."""

from __future__ import annotations

from pathlib import Path

from shadowpod.agent import SessionIdentity
from shadowpod.engine.record import MigrationPolicy, Phase
from shadowpod.gates.persona import OnDrift, PersonaPolicy
from shadowpod.gates.semantic import MiniLMEmbedder
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.gate_demo import SESSION, SOURCE, GateAttempt, attempt_upgrade
from shadowpod.local.images import reference_images
from tests.agent.support import post, wait_answered

RENAMED = "refagent:v2-renamed"
IDENTITY = SessionIdentity(
    session=SESSION, name="Refagent", principles=["I answer every message once, in order"]
)


async def upgrade(tmp_path: Path, on_drift: OnDrift) -> GateAttempt:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await dep.create_session(
            SESSION, image=SOURCE.image, instance=SOURCE.name, identity=IDENTITY
        )
        async with dep.client() as client:
            await wait_answered(dep.admin, [await post(client, "my name is Ada", SESSION)], SESSION)
        policy = MigrationPolicy(persona=PersonaPolicy(probe="who are you?", on_drift=on_drift))
        return await attempt_upgrade(dep, SOURCE, RENAMED, policy, last="who are you?")


async def test_a_version_with_another_name_is_rolled_back(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    attempt = await upgrade(tmp_path, "rollback")
    record = attempt.record
    assert record.phase is Phase.ROLLED_BACK, record.error
    assert (record.reason, record.failed_phase) == ("PersonaDrift", Phase.VALIDATING)
    assert record.fence is None  # before the fence: the session untouched
    [check] = record.persona_checks
    assert (check.stage, check.drifted, check.action) == ("restore", True, "rolled back")
    assert check.baseline == "I am Refagent: I answer every message once, in order."
    assert check.reply == "I am Rex: I answer every message once, in order."
    assert "similarity" in check.reason
    assert (attempt.lost, attempt.duplicated) == (0, 0)
    assert attempt.last_by == SOURCE.name
    assert attempt.last_reply.startswith("I am Refagent")


async def test_a_warning_keeps_the_probes_and_lets_the_upgrade_through(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    attempt = await upgrade(tmp_path, "warn")
    record = attempt.record
    assert record.phase is Phase.SUCCEEDED, record.error
    restore, promotion = record.persona_checks
    assert (restore.stage, restore.drifted, restore.action) == ("restore", True, "warned")
    assert (promotion.stage, promotion.instance) == ("promotion", record.spec.target.name)
    assert promotion.drifted and promotion.action.startswith("warned (after the fence")
    assert attempt.last_reply.startswith("I am Rex")  # nobody re-anchored it
    assert (attempt.lost, attempt.duplicated) == (0, 0)


async def test_reanchor_gives_the_new_version_the_sessions_identity(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    attempt = await upgrade(tmp_path, "reanchor")
    record = attempt.record
    assert record.phase is Phase.SUCCEEDED, record.error
    drifted, anchored, promoted = record.persona_checks
    assert (drifted.drifted, drifted.action) == (True, "reanchored")
    assert (anchored.stage, anchored.drifted) == ("restore", False)
    assert anchored.reply == "I am Refagent: I answer every message once, in order."
    assert (promoted.stage, promoted.drifted) == ("promotion", False)
    assert attempt.last_by == record.spec.target.name  # the new version serves, as itself
    assert attempt.last_reply.startswith("I am Refagent")
    assert (attempt.lost, attempt.duplicated) == (0, 0)
