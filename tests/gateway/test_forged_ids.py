"""Ids no client can forge: a client that posts the ids an agent derives for its own
writes (``t<seq>:<n>``, ``ack:<seq>``) or a schedule fire's (``schedule:...``) cannot
make those writes come back as repeats; a key posted again with other content is a
409 saying so, never a silent duplicate."""

from __future__ import annotations

import aiohttp

from shadowpod.client.gateway import GatewayClient
from shadowpod.domain.entries import NewEntry
from tests.gateway.conftest import Session, call


async def test_a_client_posting_the_agents_derived_ids_suppresses_none_of_its_writes(
    url: str, owned: Session, client: GatewayClient, agent: GatewayClient
) -> None:
    inbound = await client.post_message(owned.name, "remember: my name is Ada")
    turn = inbound.seq
    for forged in (f"t{turn}:1", f"ack:{turn}"):
        accepted = await client.post_message(owned.name, "forged", id=forged)
        assert not accepted.duplicate
    appended, _, _ = await agent.append(
        owned.name,
        epoch=1,
        entries=[
            NewEntry(
                id=f"t{turn}:1",
                kind="message",
                payload={"role": "assistant", "content": "Hello Ada", "turn": turn},
            ),
            NewEntry(id=f"ack:{turn}", kind="ack", payload={"turn": turn}),
        ],
    )
    assert [a.duplicate for a in appended] == [False, False]
    status = await client.status(owned.name)
    assert status.acked == turn
    events = (await client.events(owned.name)).events
    mine = [e for e in events if e["epoch"] == 1 and e["kind"] != "control"]
    assert [(e["id"], e["kind"]) for e in mine] == [
        (f"t{turn}:1", "message"),
        (f"ack:{turn}", "ack"),
    ]


async def test_an_id_posted_again_with_other_content_is_a_409_saying_so(
    url: str, session: Session, http: aiohttp.ClientSession
) -> None:
    messages = f"{url}/v1/sessions/{session.name}/messages"
    first = await call(http, "POST", messages, json={"id": "m-1", "content": "pay Bob 10"})
    assert first.status == 202
    again = await call(http, "POST", messages, json={"id": "m-1", "content": "pay Bob 10"})
    assert (again.status, again.json["duplicate"], again.json["seq"]) == (
        202,
        True,
        first.json["seq"],
    )
    other = await call(http, "POST", messages, json={"id": "m-1", "content": "pay Eve 1000"})
    assert other.status == 409
    assert other.reason == "IdempotencyConflict"
    assert "'m-1'" in other.json["message"] and "other content" in other.json["message"]
    page = await call(http, "GET", f"{url}/v1/sessions/{session.name}/events")
    assert [e["payload"]["content"] for e in page.json["events"]] == ["pay Bob 10"]
