"""Nothing stalls silently. An owner's writes against the gateway's limits (1 MiB per
append, 1000 entries): what can be cut to fit is, and what can never be journaled is
an error everyone can see — never a session that silently stops answering. The same
for anything else the gateway refuses for good."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from shadowpod.api.models import OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.payloads import EntryKind
from shadowpod.engine.ports import InstanceSpec, InstanceStatus
from shadowpod.journal.factory import store_from_url
from shadowpod.local.deployment import LocalDeployment
from tests.agent.agents import filler
from tests.agent.support import (
    SESSION,
    agent_get,
    folded,
    of_kind,
    post,
    read_journal,
    replies_to,
    wait_answered,
    wait_for,
)

OWNER = "owner-1"
MIB = 1024 * 1024


async def test_one_state_value_larger_than_an_append_is_journaled_in_parts(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    """A long conversation kept as one value of the agent's state."""
    await dep.create_session(SESSION, image="surfaces:1", instance=OWNER)
    size = 1_500_000  # characters; JSON-escaped and UTF-8 encoded, more bytes than that
    grown = await post(client, f"grow history {size}")
    after = await post(client, "count")
    entries = await wait_answered(dep.admin, [grown, after])

    parts = [e for e in of_kind(entries, EntryKind.STATE) if "part" in e.payload]
    assert len(parts) >= 3
    assert {p.payload["turn"] for p in parts} == {grown}
    (ack,) = [e for e in of_kind(entries, EntryKind.ACK) if e.payload["turn"] == grown]
    assert max(p.seq for p in parts) < ack.seq  # the turn's ack comes last
    values = folded(entries).agent.values
    assert values["history"] == filler(size)
    assert values["count"] == 1

    # A new owner that has only the journal (no snapshot) reads it back whole.
    await dep.runtime.kill(OWNER)
    await dep.admin.set_ownership(SESSION, OwnershipChange(expect_epoch=1, epoch=2, owner="next"))
    await dep.runtime.start(
        InstanceSpec(name="next", image="surfaces:1", session=SESSION, mode="owner", epoch=2)
    )
    await dep.wait_serving("next")
    asked = await post(client, "sizes")
    (reply,) = replies_to(await wait_answered(dep.admin, [asked]), asked)
    assert reply.payload["meta"]["sizes"] == {"history": size}
    assert reply.epoch == 2


async def test_a_turn_whose_outputs_add_up_past_the_limit_is_journaled_in_order(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    await dep.create_session(SESSION, image="surfaces:1", instance=OWNER)
    bulk = await post(client, "bulk 6 300000")  # six values of ~0.4 MB each
    entries = await wait_answered(dep.admin, [bulk])
    outputs = [e for e in entries if e.payload.get("turn") == bulk and e.epoch == 1]
    kinds = [e.kind for e in outputs]
    assert kinds == [EntryKind.MEMORY] * 6 + [EntryKind.MESSAGE, EntryKind.ACK]
    assert [e.payload.get("key") for e in outputs[:6]] == [f"bulk-{n}" for n in range(6)]
    assert len({e.id for e in outputs}) == len(outputs)
    assert folded(entries).memory["bulk-5"] == filler(300000)


async def test_the_gateways_limit_is_learnt_from_its_answer(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    """An owner told the gateway takes 8 MiB per append finds out it takes 1."""
    await dep.create_session(SESSION, image="surfaces:big-appends", instance=OWNER)
    grown = await post(client, "grow history 1500000")
    bulk = await post(client, "bulk 3 400000")
    entries = await wait_answered(dep.admin, [grown, bulk])
    state = folded(entries)
    assert len(str(state.agent.values["history"])) == 1_500_000
    assert len(state.memory) == 3
    status = await agent_get(dep, OWNER, "/v1/status")
    assert (status["mode"], status["ready"], status["error"]) == ("owner", True, None)


async def test_a_write_that_can_never_succeed_fails_the_owner_where_everyone_sees_it(
    dep: LocalDeployment, client: GatewayClient, tmp_path: Path
) -> None:
    """A reply larger than the gateway takes in one append cannot be cut: the owner
    stops, says why in its status and log, and is neither ready nor healthy."""
    await dep.create_session(SESSION, image="surfaces:1", instance=OWNER)
    shout = await post(client, "shout 900000")  # within a message's 1M characters

    async def failed() -> dict[str, object] | None:
        status = await agent_get(dep, OWNER, "/v1/status")
        return status if status["mode"] == "failed" else None

    status = await wait_for(failed, "the owner to report its failure")
    assert status["ready"] is False and status["serving"] is False
    error = str(status["error"])
    assert f"turn {shout}" in error and "--max-body-bytes" in error, error
    owner = dep.runtime.instance(OWNER)
    assert owner is not None
    async with aiohttp.ClientSession() as http:
        for path in ("/readyz", "/healthz"):
            async with http.get(owner.url + path) as response:
                assert response.status == 503, path
    logged = [json.loads(line) for line in owner.log.read_text().splitlines()]
    assert [r["msg"] for r in logged if r["level"] == "error"] == [
        f"the owner cannot go on: {error}"
    ]
    # Still up, so that all this can be read; the engine sees it through its runtime.
    assert owner.process.returncode is None
    seen = await dep.runtime.status(OWNER)
    assert (seen.alive, seen.mode, seen.serving) == (True, "failed", False)
    assert seen.error == error
    # Nothing of the turn was journaled: the message is still there for a next owner.
    entries = await read_journal(dep.admin)
    assert replies_to(entries, shout) == []
    assert shout in folded(entries).pending


async def test_instances_of_a_session_that_is_gone_say_so_instead_of_retrying_forever(
    dep: LocalDeployment, client: GatewayClient
) -> None:
    """The gateway goes down, and comes back without the session (deleted from its
    journal meanwhile): every reconnect of its owner and of its shadow is refused
    (404) — for good, and they must say so."""
    await dep.create_session(SESSION, image="surfaces:1", instance=OWNER)
    await wait_answered(dep.admin, [await post(client, "hello")])
    await dep.runtime.start(
        InstanceSpec(name="shadow", image="surfaces:1", session=SESSION, mode="shadow")
    )

    async def tailing() -> bool | None:
        status = await dep.runtime.status("shadow")
        return (status.ready and status.catchup_entries is not None) or None

    await wait_for(tailing, "the shadow to tail the journal")
    await dep.gateway.stop()
    async with store_from_url(dep.gateway.journal_url) as store:
        await store.delete_session(SESSION)
    await dep.gateway.start()

    async def failed(name: str) -> InstanceStatus | None:
        status = await dep.runtime.status(name)
        return status if status.mode == "failed" and not status.alive else None

    # The shadow exits on it, as on any error it cannot go on from; its log says why.
    await wait_for(lambda: failed("shadow"), "the shadow to fail")
    instance = dep.runtime.instance("shadow")
    assert instance is not None
    logged = [json.loads(line) for line in instance.log.read_text().splitlines()]
    failures = [r for r in logged if r["level"] == "error"]
    assert len(failures) == 1 and "404 SessionNotFound" in failures[0]["exc"], failures

    # The owner stays up, failed, and says why (once its own reconnect, on its own
    # backoff, has been refused: it may come after the shadow's).
    async def owner_failed() -> InstanceStatus | None:
        status = await dep.runtime.status(OWNER)
        return status if status.mode == "failed" or not status.alive else None

    owner = await wait_for(owner_failed, "the owner to say it failed")
    assert (owner.alive, owner.mode, owner.ready) == (True, "failed", False)
    assert owner.error is not None
    assert "404 SessionNotFound: session 's1' does not exist" in owner.error, owner.error
