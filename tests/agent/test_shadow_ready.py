"""``@agent.on_shadow_ready``: a shadow warms what its first owner turn would build,
on the state it caught up to, before it is promoted — and writes nothing doing so."""

from __future__ import annotations

from pathlib import Path

from shadowpod.domain.payloads import EntryKind
from shadowpod.engine.record import InstanceRef, MigrationPolicy, Phase
from shadowpod.local.deployment import LocalDeployment
from tests.agent.support import SESSION, agent_get, lines_of, post, replies_to, wait_answered


async def _moved_after_three_counts(dep: LocalDeployment, target_image: str) -> tuple[str, int]:
    """v1 counts to 3, then the session moves to ``target_image``; returns the new
    owner and the seq of the last turn before the move."""
    await dep.create_session(SESSION, image="surfaces:1", instance="v1")
    async with dep.client() as client:
        counted = [await post(client, "count") for _ in range(3)]
        before = await wait_answered(dep.admin, counted)
    record = dep.plan(
        SESSION,
        source=InstanceRef(name="v1", image="surfaces:1"),
        target_image=target_image,
        policy=MigrationPolicy(phase_timeout_s=20.0),
    )
    record = await dep.migrate(record)
    assert record.phase is Phase.SUCCEEDED, record.error
    return record.spec.target.name, before[-1].seq


async def test_the_shadow_warms_on_the_state_it_caught_up_to_before_it_is_promoted(
    dep: LocalDeployment, tmp_path: Path
) -> None:
    target, last_before = await _moved_after_three_counts(dep, "surfaces:2")
    status = await agent_get(dep, target, "/v1/status")
    async with dep.client() as client:
        after = await post(client, "count")
        entries = await wait_answered(dep.admin, [after])

    instance = dep.runtime.instance(target)
    assert instance is not None
    warmed = [
        line
        for line in lines_of(tmp_path / "warm.log")
        if line.startswith(f"{instance.process.pid} ")
    ]
    # It saw the agent's values as of the head (read through v2's migration of v1's state).
    assert warmed and warmed[0].endswith("count=3"), warmed
    # ... as a shadow: at a watermark before the marker that promoted it.
    fence_seq = status["promotion"]["fence_seq"]
    assert last_before <= status["warmed"] < fence_seq
    # Nothing journaled by it: between the last turn and the marker, the migration's
    # control entries only.
    moved = [e for e in entries if last_before < e.seq <= fence_seq]
    assert {e.kind for e in moved} == {EntryKind.CONTROL}
    (reply,) = replies_to(entries, after)
    assert reply.payload["content"] == "count 4"


async def test_a_failing_warm_up_does_not_stop_the_shadow_from_taking_over(
    dep: LocalDeployment, tmp_path: Path
) -> None:
    target, _ = await _moved_after_three_counts(dep, "surfaces:warm-fails")
    async with dep.client() as client:
        after = await post(client, "count")
        entries = await wait_answered(dep.admin, [after])

    instance = dep.runtime.instance(target)
    assert instance is not None
    assert any(
        line.startswith(f"{instance.process.pid} ") for line in lines_of(tmp_path / "warm.log")
    )
    (reply,) = replies_to(entries, after)
    assert reply.payload["content"] == "count 4"
    assert reply.payload["meta"]["instance"] == target
