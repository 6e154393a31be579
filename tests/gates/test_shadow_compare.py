"""Shadow compare on the local runtime: a live migration whose target must first
answer the session's live turns as the source did (``shadowpod demo --gate``).

Real processes: a gateway, the source agent, the shadow, the sandbox of the target
image; a client keeps talking to the session all along.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from shadowpod.cli.main import cli
from shadowpod.engine.record import MigrationPolicy, Phase, ValidationPolicy
from shadowpod.gates.policy import GatePolicy, LLMEndpoint
from shadowpod.gates.semantic import MiniLMEmbedder
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.gate_demo import (
    ACCEPTED,
    SOURCE,
    attempt_upgrade,
    gate_policy,
    run_gate_demo,
    start_session,
)
from shadowpod.local.images import reference_images
from tests.gates.sessions import record_reference_session


async def test_a_forgetful_upgrade_is_rolled_back_and_a_reworded_one_accepted(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    rejected, accepted = await run_gate_demo(tmp_path)

    record = rejected.record
    assert record.phase is Phase.ROLLED_BACK, record.error
    assert (record.reason, record.failed_phase) == ("ValidationFailed", Phase.VALIDATING)
    assert record.fence is None  # never fenced: the session was not touched
    summary = record.validation
    assert summary is not None and not summary.passed
    assert summary.compared >= 3 and summary.agreed < summary.compared
    assert "I do not know your name yet" in " ".join(summary.worst)
    assert "refagent:v2-forgetful FAILED" in (record.error or "")
    # The source served through it all, and still does: nothing lost, nothing twice.
    assert (rejected.lost, rejected.duplicated) == (0, 0)
    assert rejected.last_by == SOURCE.name
    assert rejected.last_reply.endswith("your name is Ada (hi Ada)")

    record = accepted.record
    assert record.phase is Phase.SUCCEEDED, record.error
    assert record.validation is not None and record.validation.passed
    assert list(record.timings).index("Validating") == list(record.timings).index("Fencing") - 1
    assert (accepted.lost, accepted.duplicated) == (0, 0)
    assert accepted.last_by == record.spec.target.name  # the new version now serves
    assert accepted.last_reply.endswith("you are Ada (hello Ada)")


async def test_the_reworded_upgrade_fails_an_exact_gate(tmp_path: Path) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await start_session(dep)
        attempt = await attempt_upgrade(
            dep, SOURCE, ACCEPTED, gate_policy(GatePolicy(judge="exact"))
        )
    assert attempt.record.phase is Phase.ROLLED_BACK
    assert attempt.record.reason == "ValidationFailed"
    assert (attempt.lost, attempt.duplicated) == (0, 0)


def test_demo_gate_reports_both_upgrades(tmp_path: Path, embedder: MiniLMEmbedder) -> None:
    result = CliRunner().invoke(
        cli, ["demo", "--gate", "--json", "--workdir", str(tmp_path / "demo")]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    rejected, accepted = report["upgrades"]
    assert (rejected["result"], rejected["reason"]) == ("RolledBack", "ValidationFailed")
    assert accepted["result"] == "Succeeded" and accepted["validation"]["passed"] is True
    assert rejected["lost"] == accepted["lost"] == 0


async def test_a_judge_that_cannot_run_rolls_back_saying_so(tmp_path: Path) -> None:
    unreachable = GatePolicy(
        judge="llm", llm=LLMEndpoint(url="http://127.0.0.5:9/v1", model="judge")
    )
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        await start_session(dep)
        attempt = await attempt_upgrade(dep, SOURCE, ACCEPTED, gate_policy(unreachable))
    assert attempt.record.phase is Phase.ROLLED_BACK
    assert attempt.record.reason == "ValidationUnavailable"
    assert "cannot be reached" in (attempt.record.error or "")
    assert (attempt.lost, attempt.duplicated) == (0, 0)
    assert attempt.last_by == SOURCE.name


async def test_a_golden_session_in_the_policy_gates_the_migration(tmp_path: Path) -> None:
    golden = (await record_reference_session(tmp_path / "recording")).golden
    async with LocalDeployment(tmp_path / "dep", reference_images()) as dep:
        await start_session(dep)
        policy = MigrationPolicy(
            validation=ValidationPolicy(
                turns=0, gate=GatePolicy(judge="normalised"), goldens=[str(golden)]
            )
        )
        rejected = await attempt_upgrade(dep, SOURCE, "refagent:v2-forgetful", policy)
        assert rejected.record.phase is Phase.ROLLED_BACK
        assert rejected.record.reason == "ValidationFailed"
        assert f"on the golden session {golden}" in (rejected.record.error or "")
        [verdict] = rejected.record.golden_validations
        assert verdict.golden == str(golden) and not verdict.passed
        accepted = await attempt_upgrade(dep, SOURCE, "refagent:v2-b", policy)
        assert accepted.record.phase is Phase.SUCCEEDED, accepted.record.error
        assert accepted.record.golden_validations[0].passed
        assert all((a.lost, a.duplicated) == (0, 0) for a in (rejected, accepted))
