"""The journal's rules hold whatever the way in: the control API, the owner's HTTP
routes and its WebSocket channel all get the store's answer, as a JSON 4xx."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from shadowpod.client.gateway import GatewayClient
from tests.gateway.conftest import CONTROL, RunningGateway, Session, call


async def test_a_new_owner_at_the_same_epoch_is_refused_and_the_old_owner_keeps_its_place(
    gateway: RunningGateway, http: aiohttp.ClientSession, owned: Session, agent: GatewayClient
) -> None:
    url = f"{gateway.url}/v1/sessions/{owned.name}/ownership"
    refused = await call(
        http, "PUT", url, token=CONTROL, json={"expect_epoch": 1, "epoch": 1, "owner": "pod-b"}
    )
    assert (refused.status, refused.reason) == (409, "OwnerChangeNeedsNewEpoch")
    assert "ask for epoch 2" in refused.json["message"]
    record = (await call(http, "GET", url, token=CONTROL)).json
    assert (record["epoch"], record["owner"]) == (1, "pod-a")

    moved = await call(
        http, "PUT", url, token=CONTROL, json={"expect_epoch": 1, "epoch": 2, "owner": "pod-b"}
    )
    assert moved.status == 200
    stale = await call(
        http,
        "POST",
        f"{gateway.url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={"epoch": 1, "entries": [{"kind": "message", "payload": _reply(1)}]},
    )
    assert (stale.status, stale.reason) == (409, "Fenced")  # the old owner writes nothing


def _reply(turn: int) -> dict[str, Any]:
    return {"role": "assistant", "content": "r", "turn": turn}


async def test_an_ack_beyond_the_head_is_refused_both_ways_in(
    gateway: RunningGateway, http: aiohttp.ClientSession, owned: Session, client: GatewayClient
) -> None:
    hi = await client.post_message(owned.name, "hi")
    beyond = hi.seq + 1_000
    over_http = await call(
        http,
        "POST",
        f"{gateway.url}/v1/sessions/{owned.name}/acks",
        token=owned.agent_token,
        json={"epoch": 1, "turn": beyond},
    )
    assert (over_http.status, over_http.reason) == (409, "InvalidTurn")
    assert f"beyond the journal's head ({hi.seq})" in over_http.json["message"]

    async with http.ws_connect(
        f"{gateway.url}/v1/sessions/{owned.name}/owner/channel",
        params={"epoch": 1, "after": 0},
        headers={"Authorization": f"Bearer {owned.agent_token}"},
    ) as ws:
        entries = [
            {"kind": "message", "payload": _reply(hi.seq)},
            {"kind": "ack", "payload": {"turn": beyond}},
        ]
        await ws.send_bytes(orjson.dumps({"op": "append", "id": 3, "entries": entries}))
        async with asyncio.timeout(5):
            while (frame := orjson.loads((await ws.receive()).data))["op"] != "error":
                pass
    assert (frame["id"], frame["status"], frame["reason"]) == (3, 409, "InvalidTurn")

    status = (
        await call(http, "GET", f"{gateway.url}/v1/sessions/{owned.name}", token=CONTROL)
    ).json
    assert status["acked"] == 0  # not reported as the acked position
    assert status["head"] == hi.seq  # and nothing of either append was journaled
