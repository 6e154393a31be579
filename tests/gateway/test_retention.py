"""A session's retention policy, enforced by the gateway: set, applied at once, and
applied again after every snapshot the owner stores."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadowpod.api.models import CreateSession, ForkFrom
from shadowpod.client.gateway import GatewayClient, GatewayError
from tests.gateway.conftest import CONTROL, Session, ack, call, reply


async def _turns(client: GatewayClient, agent: GatewayClient, session: str, n: int) -> None:
    for i in range(n):
        inbound = await client.post_message(session, f"m{i}")
        await agent.append(
            session, epoch=1, entries=[reply(inbound.seq, f"r{i}"), ack(inbound.seq)]
        )


async def _snapshot(agent: GatewayClient, session: str, watermark: int) -> None:
    document = {"schema_version": 3, "watermark": watermark}
    await agent.put_snapshot(
        session, epoch=1, watermark=watermark, schema_version=3, document=document
    )


async def test_the_policy_truncates_behind_the_oldest_kept_snapshot_at_every_snapshot(
    control: GatewayClient, agent: GatewayClient, client: GatewayClient, owned: Session
) -> None:
    await _turns(client, agent, owned.name, 4)  # epoch marker 1, turns at 2-4 … 11-13
    for watermark in (4, 7):
        await _snapshot(agent, owned.name, watermark)
    assert (await control.status(owned.name)).truncated_through == 0  # no policy: all kept

    applied = await control.set_retention(owned.name, 1)
    assert (applied.deleted_snapshots, applied.truncated_through) == (1, 7)
    assert [s.watermark for s in await agent.snapshots(owned.name)] == [7]

    await _snapshot(agent, owned.name, 13)  # the policy applies again by itself
    assert [s.watermark for s in await agent.snapshots(owned.name)] == [13]
    assert (await control.status(owned.name)).truncated_through == 11  # the last acked turn


async def test_a_bad_policy_is_a_400_that_says_what_to_give(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    answer = await call(
        http,
        "PUT",
        f"{url}/v1/sessions/{owned.name}/retention",
        token=CONTROL,
        json={"keep_snapshots": 0},
    )
    assert (answer.status, answer.reason) == (400, "InvalidRequest")
    assert "keep_snapshots" in answer.text


async def test_a_policy_for_a_missing_session_is_a_404(control: GatewayClient) -> None:
    with pytest.raises(GatewayError) as refused:
        await control.set_retention("ghost", 2)
    assert (refused.value.status, refused.value.reason) == (404, "SessionNotFound")


async def test_journal_sizes_are_per_namespace_in_metrics_and_per_session_in_the_status(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, client: GatewayClient
) -> None:
    for name, namespace, messages in (("a1", "team-a", 3), ("a2", "team-a", 2), ("b1", "", 4)):
        await control.create_session(CreateSession(session=name, meta={"namespace": namespace}))
        for i in range(messages):
            await client.post_message(name, f"m{i}")
    forked = CreateSession(
        session="a3", meta={"namespace": "team-a"}, fork_from=ForkFrom(session="a1", seq=2)
    )
    await control.create_session(forked)
    await client.post_message("a3", "its own")

    status = await control.status("a3")
    assert (status.head, status.journal_entries, status.fork_of) == (3, 1, "a1")
    assert (await control.status("a1")).journal_entries == 3
    scraped = await call(http, "GET", f"{url}/metrics")
    samples = {
        (s.name, s.labels.get("session_namespace")): s.value
        for f in text_string_to_metric_families(scraped.text)
        for s in f.samples
    }
    # The fork's two shared entries are counted once, with its parent.
    assert samples[("shadowpod_journal_entries", "team-a")] == 3 + 2 + 1
    assert samples[("shadowpod_journal_entries", "")] == 4
    assert samples[("shadowpod_journal_sessions", "team-a")] == 3
