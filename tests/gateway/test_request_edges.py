"""Requests at the edge of what the document allows, and clients that leave mid-way.

The OpenAPI document says which bodies are valid; the server must take exactly those:
an integer field takes what JSON Schema calls an integer — ``3``, and the integer-valued
``3.0`` and ``3e0`` (schemathesis sends them as valid data) — but not ``3.5``, ``true``
or ``"3"``; a token hash may be ``null`` (what the client sends for an unset one). A
client hanging up while it sends a body is the client's doing: no 5xx is counted,
nothing is logged as an error.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import jsonschema
import pytest
import referencing
import referencing.jsonschema

from tests.gateway.conftest import CONTROL, Reply, Session, call
from tests.gateway.test_memory import gateway_process  # noqa: F401 — the real process
from tests.gateway.test_openapi import load_spec

# Each body with one integer field written as NUMBER.
BODIES = [
    ("PUT", "ownership", CONTROL, '{"expect_epoch": NUMBER, "epoch": 2, "owner": "pod-b"}'),
    ("POST", "unfence", CONTROL, '{"expect_epoch": NUMBER}'),
    ("POST", "drained", None, '{"instance": "pod-a", "epoch": NUMBER, "processes": []}'),
]
# Not integers, as JSON Schema says: refused, naming the field, and nothing changes.
NOT_INTEGERS = ["1.5", "0.999", "true", '"1"', "1e-1", "[1]"]


@pytest.mark.parametrize("number", ["1", "1.0", "1e0", "10E-1", "1.000"])
@pytest.mark.parametrize(("method", "route", "token", "body"), BODIES, ids=[b[1] for b in BODIES])
async def test_an_integer_field_takes_what_json_schema_calls_an_integer(
    http: aiohttp.ClientSession,
    url: str,
    owned: Session,
    number: str,
    method: str,
    route: str,
    token: str | None,
    body: str,
) -> None:
    async def send(value: str) -> Reply:
        return await call(
            http,
            method,
            f"{url}/v1/sessions/{owned.name}/{route}",
            token=token or owned.agent_token,
            data=body.replace("NUMBER", value),
            headers={"Content-Type": "application/json"},
        )

    for value in NOT_INTEGERS:
        refused = await send(value)
        assert (refused.status, refused.reason) == (400, "InvalidRequest"), (value, refused.json)
        assert any(loc.endswith("epoch") for loc in refused.locs), refused.locs
    taken = await send(number)  # the epoch 1 however it is written: the request works
    assert taken.status < 300, (number, taken.json)


async def test_a_boolean_field_takes_only_true_or_false(
    http: aiohttp.ClientSession, url: str
) -> None:
    """``"true"``, ``1`` and ``"yes"`` are not JSON Schema booleans: a session asked for
    with one is refused (it was made, silently with owner credentials), with true it is
    made."""
    for value in ['"true"', "1", '"yes"', '"false"']:
        reply = await call(
            http,
            "POST",
            f"{url}/v1/sessions",
            token=CONTROL,
            data='{"session": "booleans", "owner_credentials": VALUE}'.replace("VALUE", value),
            headers={"Content-Type": "application/json"},
        )
        assert (reply.status, reply.reason) == (400, "InvalidRequest"), (value, reply.json)
        assert reply.locs == ["owner_credentials"], reply.locs
    made = await call(
        http,
        "POST",
        f"{url}/v1/sessions",
        token=CONTROL,
        json={"session": "booleans", "owner_credentials": True},
    )
    assert made.status == 201, made.json


async def test_null_token_hashes_are_unset_as_the_server_and_the_document_say(
    http: aiohttp.ClientSession, url: str
) -> None:
    """The client sends an unset hash as null; the server takes it; so must the document
    (it said ``type: string``: schemathesis called the server wrong for taking it)."""
    body = {"session": "nulls", "agent_token_sha256": None, "owner_key": None}
    spec = load_spec()
    schema = {**spec["components"]["schemas"]["CreateSession"], "components": spec["components"]}
    resolver = referencing.Registry().with_resource(
        "", referencing.Resource.from_contents(schema, referencing.jsonschema.DRAFT202012)
    )
    jsonschema.Draft202012Validator(schema, registry=resolver).validate(body)
    reply = await call(http, "POST", f"{url}/v1/sessions", token=CONTROL, json=body)
    assert reply.status == 201, reply.json
    assert reply.json["agent_token"]  # unset: the gateway made one


async def test_a_client_hanging_up_mid_body_is_no_server_error(
    gateway_process: tuple[str, int],  # noqa: F811 — the fixture imported above
    tmp_path: Path,
) -> None:
    url, _ = gateway_process  # a real process: its server sees the connection drop
    async with aiohttp.ClientSession() as http:
        control = {"Authorization": f"Bearer {CONTROL}"}
        async with http.post(f"{url}/v1/sessions", json={"session": "s"}, headers=control) as r:
            token = (await r.json())["agent_token"]
        change = {"expect_epoch": 0, "epoch": 1, "owner": "a"}
        async with http.put(f"{url}/v1/sessions/s/ownership", json=change, headers=control):
            pass
    host, port = url.removeprefix("http://").split(":")
    routes = [
        ("POST", "/v1/sessions/s/messages", None),
        ("PUT", "/v1/sessions/s/snapshots/0?epoch=1&schema_version=3", token),
        ("POST", "/v1/sessions/s/journal", token),
    ]
    for method, path, bearer in routes:
        for framing in ("Content-Length: 100000", "Transfer-Encoding: chunked"):
            _, writer = await asyncio.open_connection(host, int(port))
            head = [f"{method} {path} HTTP/1.1", "Host: g", framing]
            head.append("Content-Type: application/json")
            if bearer is not None:
                head.append(f"Authorization: Bearer {bearer}")
            body = b'{"content": "' + b"x" * 5000
            if framing.startswith("Transfer"):
                body = f"{len(body):x}\r\n".encode() + body + b"\r\n"
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            await asyncio.sleep(0.3)  # the route is reading the body
            writer.transport.abort()  # and the client is gone
            await asyncio.sleep(0.3)
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as metrics:
        counted = [
            line
            for line in (await metrics.text()).splitlines()
            if line.startswith("shadowpod_http_requests_total")
            and "/v1/sessions/{session}/" in line
        ]
    assert counted, "the requests were not counted at all"
    assert not [line for line in counted if 'code="5' in line], counted
    assert "Traceback" not in (tmp_path / "gateway.log").read_text()
