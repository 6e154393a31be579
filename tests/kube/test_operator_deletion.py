"""Deleting an AgentSession whose journal is kept for a period
(``journalRetentionPolicy.retainFor``) or still read by forks, on the emulated API with
a real gateway: the gateway keeps it marked deleted, readable by an admin, and the
operator takes the mark off when the session is created again."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from shadowpod.client.gateway import GatewayClient
from tests.kube.operator_world import World, reply_counts, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(240)


def _at(stamp: str | None) -> datetime:
    assert stamp is not None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def _deleted(world: World, name: str) -> None:
    await world.raw.delete(world.path("agentsessions", name))

    async def gone() -> bool:
        return await world.raw.get(world.path("agentsessions", name)) is None

    await eventually(gone, timeout=60)


async def test_a_session_deleted_with_retain_for_is_kept_marked_and_restored_when_created_again(
    world: World,
) -> None:
    manifest = session_manifest(
        "k1", journalRetentionPolicy={"whenDeleted": "Retain", "retainFor": "1d12h"}
    )
    await world.apply(manifest)
    await world.wait_running("k1", epoch=1)
    sid = world.gateway_session("k1")
    async with world.client() as client:
        posted = await client.post_message(sid, "keep me", id="keep")
    await _deleted(world, "k1")

    async with GatewayClient(world.gateway.url, world.gateway.control_token) as admin:
        [kept] = await admin.sessions(deleted=True)
        assert kept.session == sid
        assert _at(kept.delete_after) - _at(kept.deleted_at) == timedelta(hours=36)
        entries, _ = await admin.journal(sid, after=0)
        assert posted.seq in [e.seq for e in entries]  # an admin reads it whole

        await world.apply(manifest)  # created again within the period: the same session
        # It resumes the kept session (at the epoch its deletion fenced to), its
        # agent holding the new AgentSession's token: a message is answered.
        await world.wait_running("k1", epoch=2)
        async with world.client() as client:
            again = await client.post_message(sid, "still there?", id="again")

            async def answered() -> bool:
                return again.seq in await reply_counts(client, sid)

            await eventually(answered, timeout=60)

        async def restored() -> bool:
            return await admin.sessions(deleted=True) == []

        await eventually(restored, timeout=30)
        entries, _ = await admin.journal(sid, after=0)
        assert posted.seq in [e.seq for e in entries]


async def test_a_parent_deleted_while_forks_read_it_is_marked_and_swept_after_them(
    world: World,
) -> None:
    await world.apply(session_manifest("k3", journalRetentionPolicy={"whenDeleted": "Delete"}))
    await world.wait_running("k3", epoch=1)
    await world.apply(
        session_manifest(
            "k4",
            forkFrom={"session": "k3", "seq": 1},
            journalRetentionPolicy={"whenDeleted": "Delete"},
        )
    )
    await world.wait_running("k4")
    await _deleted(world, "k3")
    async with GatewayClient(world.gateway.url, world.gateway.control_token) as admin:
        [kept] = await admin.sessions(deleted=True)
        assert kept.session == world.gateway_session("k3")
        assert kept.delete_after == kept.deleted_at  # goes as soon as its forks do
    warnings = [r for t, r, _ in await world.events("k3") if t == "Warning"]
    assert "GatewayUnreachable" not in warnings
