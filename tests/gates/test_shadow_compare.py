"""Shadow compare on the local runtime: a live migration whose target must first
answer the session's live turns as the source did.

Real processes: a gateway, the source agent, the shadow, the sandbox of the target
image; a client keeps talking to the session all along.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from shadowpod.engine.record import (
    InstanceRef,
    MigrationPolicy,
    MigrationRecord,
    Phase,
    ValidationPolicy,
)
from shadowpod.gates.policy import GatePolicy
from shadowpod.gates.semantic import MiniLMEmbedder
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import post, read_journal, replies, wait_answered

SESSION = "s1"
SOURCE = "owner-1"
LIVE = ("what is my name?", "hello", "what's my name")


async def migrate_while_talking(
    dep: LocalDeployment, target_image: str, gate: GatePolicy
) -> tuple[MigrationRecord, list[int]]:
    await dep.create_session(SESSION, image="refagent:v2", instance=SOURCE)
    async with dep.client() as client:
        sent = [await post(client, "my name is Ada", SESSION)]
        await wait_answered(dep.admin, sent, SESSION)
        record = dep.plan(
            SESSION,
            source=InstanceRef(name=SOURCE, image="refagent:v2"),
            target_image=target_image,
            policy=MigrationPolicy(
                validation=ValidationPolicy(turns=3, timeout_s=20, gate=gate),
                max_duration_s=60,
            ),
        )
        migration = asyncio.create_task(dep.migrate(record))
        n = 0
        while not migration.done() and n < 300:  # bounded: ~5 messages a second
            sent.append(await post(client, LIVE[n % len(LIVE)], SESSION))
            n += 1
            await asyncio.wait({migration}, timeout=0.2)
        result = await migration
        sent.append(await post(client, "what is my name?", SESSION))  # after the verdict
        await wait_answered(dep.admin, sent, SESSION)
    return result, sent


def one_reply_each(entries: list, sent: list[int]) -> None:  # type: ignore[type-arg]
    per_turn = Counter(e.payload["turn"] for e in replies(entries))
    assert {seq: per_turn[seq] for seq in sent} == dict.fromkeys(sent, 1)  # 0 lost, 0 twice


async def test_a_version_that_forgets_the_name_is_rolled_back_before_the_fence(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        result, sent = await migrate_while_talking(
            dep, "refagent:v2-forgetful", GatePolicy(judge="semantic")
        )
        assert result.phase is Phase.ROLLED_BACK, result.error
        assert result.reason == "ValidationFailed"
        assert result.failed_phase is Phase.VALIDATING
        assert result.fence is None  # never fenced: the session was not touched
        summary = result.validation
        assert summary is not None and not summary.passed
        assert summary.compared >= 3 and summary.agreed < summary.compared
        assert "I do not know your name yet" in " ".join(summary.worst)
        assert "refagent:v2-forgetful FAILED" in (result.error or "")
        # The source kept serving through it all and still does, at its epoch.
        entries = await read_journal(dep.admin, SESSION)
        one_reply_each(entries, sent)
        last = [e for e in replies(entries) if e.payload["turn"] == sent[-1]]
        assert last[0].payload["content"].endswith("your name is Ada (hi Ada)")
        assert last[0].epoch == 1 and last[0].payload["meta"]["instance"] == SOURCE
        assert not (await dep.runtime.status(result.spec.target.name)).alive


async def test_a_reworded_version_passes_the_semantic_gate_and_takes_over(
    tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        result, sent = await migrate_while_talking(
            dep, "refagent:v2-reworded", GatePolicy(judge="semantic")
        )
        assert result.phase is Phase.SUCCEEDED, result.error
        summary = result.validation
        assert summary is not None and summary.passed and summary.compared >= 3
        assert "Validating" in result.timings
        entries = await read_journal(dep.admin, SESSION)
        one_reply_each(entries, sent)
        last = [e for e in replies(entries) if e.payload["turn"] == sent[-1]]
        assert last[0].payload["content"].endswith("you are Ada (hello Ada)")  # the new owner


async def test_the_same_reworded_version_fails_an_exact_gate(tmp_path: Path) -> None:
    async with LocalDeployment(tmp_path, reference_images()) as dep:
        result, sent = await migrate_while_talking(
            dep, "refagent:v2-reworded", GatePolicy(judge="exact")
        )
        assert result.phase is Phase.ROLLED_BACK and result.reason == "ValidationFailed"
        one_reply_each(await read_journal(dep.admin, SESSION), sent)
