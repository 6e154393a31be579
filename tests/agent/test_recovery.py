"""Recovery: the owner crashed, and a new owner of a newer image is started at the next
epoch (DESIGN.md §4, "the normal recovery path: new pod from the latest snapshot +
journal"). It must take over from everything journaled, not from the snapshot alone.

Uses the reference agent, whose v2 keeps its own state in another schema.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from shadowpod.api.models import OwnershipChange
from shadowpod.domain.payloads import EntryKind
from shadowpod.domain.schema import dump_state, load_state
from shadowpod.engine.ports import InstanceSpec
from shadowpod.local.deployment import LocalDeployment
from shadowpod.local.images import reference_images
from tests.agent.support import (
    SESSION,
    agent_get,
    folded,
    of_kind,
    post,
    read_journal,
    replies_to,
    wait_answered,
)


@pytest.fixture
async def refdep(tmp_path: Path) -> AsyncIterator[LocalDeployment]:
    async with LocalDeployment(tmp_path, reference_images()) as deployment:
        try:
            yield deployment
        finally:
            # A SIGKILLed owner cannot drain: its background processes (each in its
            # own process group) outlive it. Here they would outlive the test too.
            for entry in of_kind(await read_journal(deployment.admin), EntryKind.PROCESS):
                if entry.epoch == 1 and entry.payload["op"] == "started":
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(entry.payload["pid"], signal.SIGKILL)


async def test_a_new_owner_after_a_crash_takes_over_from_snapshot_and_journal(
    refdep: LocalDeployment, tmp_path: Path
) -> None:
    dep = refdep
    async with dep.client() as client:
        await dep.create_session(SESSION, image="refagent:v1", instance="v1")
        await wait_answered(
            dep.admin, [await post(client, "my name is Ada"), await post(client, "hello")]
        )
        v1 = dep.runtime.instance("v1")
        assert v1 is not None
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{v1.url}/v1/snapshot") as response,
        ):
            assert response.status == 201
            snapshot_at = (await response.json())["watermark"]
        # Written after the snapshot: only the journal has these.
        after_snapshot = [
            await post(client, "remember: never deploy on friday"),
            await post(client, "still there?"),
        ]
        await wait_answered(dep.admin, after_snapshot)
        assert [s.watermark for s in await dep.admin.snapshots(SESSION)] == [snapshot_at]

        await dep.runtime.kill("v1")
        await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="v2"))
        await dep.runtime.start(
            InstanceSpec(name="v2", image="refagent:v2", session=SESSION, mode="owner", epoch=2)
        )
        await dep.wait_serving("v2")
        last = await post(client, "hello again")
        entries = await wait_answered(dep.admin, [last])

    # v2 counts on from the last turn v1 journaled (not from the snapshot's), still
    # knows the name, and knows the rule learned after the snapshot.
    (reply,) = replies_to(entries, last)
    assert reply.payload["content"] == "v2 > turn 5: hello again (hi Ada)"
    assert reply.epoch == 2
    state = load_state(await agent_get(dep, "v2", "/v1/state"))
    assert [f.text for f in state.facts.values()] == ["never deploy on friday"]
    # v1's own state, brought to v2's schema: nothing of v1's shape left over.
    assert state.agent.schema_version == 2
    assert state.agent.values == {"turns": {"count": 5}, "profile": {"greeted": False}}
    upto = [e for e in await read_journal(dep.admin) if e.seq <= state.watermark]
    assert dump_state(folded(upto)) == dump_state(state)
