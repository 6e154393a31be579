"""Bad requests are answered with the right 4xx and a JSON body naming the problem
(``reason``, ``message``, ``errors[].loc``), and the gateway keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.sessions.tokens import token_hash
from tests.gateway.conftest import CONTROL, Reply, Session, StartGateway, call


async def assert_still_serving(http: aiohttp.ClientSession, url: str, session: str) -> None:
    posted = await call(
        http, "POST", f"{url}/v1/sessions/{session}/messages", json={"content": "still here"}
    )
    assert posted.status == 202, posted.text
    events = await call(http, "GET", f"{url}/v1/sessions/{session}/events")
    assert events.json["events"][-1]["payload"]["content"] == "still here"


def assert_error(reply: Reply, status: int, reason: str) -> None:
    assert reply.status == status, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    body = reply.json
    assert set(body) == {"reason", "message", "errors"}
    assert body["reason"] == reason
    assert body["message"]


async def test_malformed_json_is_400_malformed_json(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{session.name}/messages",
        data=b'{"content": "unterminated',
        headers={"Content-Type": "application/json"},
    )
    assert_error(reply, 400, "MalformedJSON")
    assert "not valid JSON" in reply.json["message"]
    await assert_still_serving(http, url, session.name)


async def test_wrong_field_types_are_400_with_every_field_path(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{session.name}/messages",
        json={"content": 5, "role": "assistant", "colour": "red"},
    )
    assert_error(reply, 400, "InvalidRequest")
    assert sorted(reply.locs) == ["colour", "content", "role"]
    assert "content: Input should be a valid string" in reply.json["message"]
    await assert_still_serving(http, url, session.name)


async def test_a_body_that_is_not_an_object_is_400(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    reply = await call(http, "POST", f"{url}/v1/sessions/{session.name}/messages", json=["content"])
    assert_error(reply, 400, "InvalidRequest")


async def test_a_nested_field_path_names_the_entry_and_payload_field(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={
            "epoch": 1,
            "entries": [
                {"kind": "message", "payload": {"role": "assistant", "content": "fine"}},
                {"kind": "message", "payload": {"role": "robot", "content": "x"}},
            ],
        },
    )
    assert_error(reply, 400, "InvalidRequest")
    assert reply.locs == ["entries.1.payload.role"]
    events = await call(http, "GET", f"{url}/v1/sessions/{owned.name}/events")
    assert [e["kind"] for e in events.json["events"]] == ["control"]  # nothing appended


async def test_a_body_over_max_body_bytes_is_413_too_large(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    small = await start_gateway(max_body_bytes=2048)
    async with GatewayClient(small.url, CONTROL) as control:
        await control.create_session(CreateSession(session="s"))

    reply = await call(
        http, "POST", f"{small.url}/v1/sessions/s/messages", json={"content": "x" * 4096}
    )
    assert_error(reply, 413, "TooLarge")
    assert "2048 bytes" in reply.json["message"]
    await assert_still_serving(http, small.url, "s")


async def test_snapshots_have_their_own_larger_limit(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    small = await start_gateway(max_body_bytes=2048, max_snapshot_bytes=64 * 1024)
    async with GatewayClient(small.url, CONTROL) as control:
        token = (await control.create_session(CreateSession(session="s"))).agent_token
        await control.set_ownership("s", OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a"))
        await control.post_message("s", "hello")  # seq 2: something to snapshot

    async def put(size: int) -> Reply:
        return await call(
            http,
            "PUT",
            f"{small.url}/v1/sessions/s/snapshots/2",
            token=token,
            params={"schema_version": 3, "epoch": 1},
            json={"watermark": 2, "memory": {"blob": "x" * size}},
        )

    stored = await put(8 * 1024)
    assert stored.status == 201, stored.text  # over the body limit, within the snapshot limit
    refused = await put(128 * 1024)
    assert_error(refused, 413, "TooLarge")
    assert "65536 bytes" in refused.json["message"]
    await assert_still_serving(http, small.url, "s")


async def test_too_many_entries_in_one_owner_append_is_413_and_appends_nothing(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    small = await start_gateway(max_entries_per_append=2)
    async with GatewayClient(small.url, CONTROL) as control:
        created = await control.create_session(CreateSession(session="s"))
        await control.set_ownership("s", OwnershipChange(expect_epoch=0, epoch=1, owner="pod-a"))
    entries = [{"kind": "memory", "payload": {"key": f"k{n}", "value": n}} for n in range(3)]

    reply = await call(
        http,
        "POST",
        f"{small.url}/v1/sessions/s/journal",
        token=created.agent_token,
        json={"epoch": 1, "entries": entries},
    )
    assert_error(reply, 413, "TooManyEntries")
    assert "at most 2" in reply.json["message"]
    head = (await call(http, "GET", f"{small.url}/v1/sessions/s")).json["head"]
    assert head == 1  # only the epoch marker
    ok = await call(
        http,
        "POST",
        f"{small.url}/v1/sessions/s/journal",
        token=created.agent_token,
        json={"epoch": 1, "entries": entries[:2]},
    )
    assert ok.status == 200
    assert [a["seq"] for a in ok.json["appended"]] == [2, 3]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-the-control-token"},
        {"Authorization": f"Basic {CONTROL}"},
        {"Authorization": "Bearer "},
    ],
    ids=["missing", "wrong", "not-bearer", "empty"],
)
async def test_control_routes_need_the_control_token(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> None:
    reply = await call(http, "GET", f"{url}/v1/sessions", headers=headers)
    assert_error(reply, 401, "Unauthorized")
    assert reply.headers["WWW-Authenticate"] == 'Bearer realm="shadowpod"'
    assert (await call(http, "GET", f"{url}/v1/sessions", token=CONTROL)).status == 200


async def test_an_agent_token_opens_only_its_own_session(
    http: aiohttp.ClientSession, url: str, control: GatewayClient, session: Session
) -> None:
    other = await control.create_session(CreateSession(session="other"))

    mine = await call(
        http, "GET", f"{url}/v1/sessions/{session.name}/journal", token=session.agent_token
    )
    theirs = await call(http, "GET", f"{url}/v1/sessions/other/journal", token=session.agent_token)
    missing = await call(http, "GET", f"{url}/v1/sessions/other/journal")
    as_control = await call(http, "GET", f"{url}/v1/sessions/{session.name}/journal", token=CONTROL)
    control_route = await call(http, "GET", f"{url}/v1/sessions", token=other.agent_token)

    assert mine.status == as_control.status == 200
    for reply in (theirs, missing, control_route):
        assert_error(reply, 401, "Unauthorized")
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert "'other'" in theirs.json["message"]
    assert other.agent_token not in theirs.text and session.agent_token not in theirs.text


async def test_client_tokens_when_the_gateway_has_them(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    guarded = await start_gateway(client_token_hashes=frozenset({token_hash("client-1")}))
    async with GatewayClient(guarded.url, CONTROL) as control:
        await control.create_session(CreateSession(session="s"))
    post = f"{guarded.url}/v1/sessions/s/messages"

    anonymous = await call(http, "POST", post, json={"content": "a"})
    wrong = await call(http, "POST", post, json={"content": "b"}, token="client-2")
    with_client = await call(http, "POST", post, json={"content": "c"}, token="client-1")
    with_control = await call(http, "POST", post, json={"content": "d"}, token=CONTROL)
    read = await call(http, "GET", f"{guarded.url}/v1/sessions/s/events", token="client-1")

    assert_error(anonymous, 401, "Unauthorized")
    assert_error(wrong, 401, "Unauthorized")
    assert "WWW-Authenticate" in anonymous.headers
    assert (with_client.status, with_control.status) == (202, 202)
    assert [e["payload"]["content"] for e in read.json["events"]] == ["c", "d"]


async def test_an_unknown_session_is_404_session_not_found(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    for method, path, token in [
        ("POST", "/v1/sessions/ghost/messages", None),
        ("GET", "/v1/sessions/ghost/events", None),
        ("GET", "/v1/sessions/ghost", None),
        ("GET", "/v1/sessions/ghost/journal", CONTROL),
        ("GET", "/v1/sessions/ghost/ownership", CONTROL),
        ("DELETE", "/v1/sessions/ghost", CONTROL),
    ]:
        reply = await call(http, method, url + path, token=token, json={"content": "x"})
        assert_error(reply, 404, "SessionNotFound")
        assert "'ghost'" in reply.json["message"], path
    # An agent token is checked against the session it names: unknown is 404, not 401.
    reply = await call(http, "GET", f"{url}/v1/sessions/ghost/journal", token=session.agent_token)
    assert_error(reply, 404, "SessionNotFound")
    await assert_still_serving(http, url, session.name)


@pytest.mark.parametrize("bad", ["Upper", "-dash", "a" * 129, "sp%20ace"])
async def test_an_invalid_session_id_in_the_path_is_400(
    http: aiohttp.ClientSession, url: str, bad: str
) -> None:
    reply = await call(http, "POST", f"{url}/v1/sessions/{bad}/messages", json={"content": "x"})
    assert_error(reply, 400, "InvalidSession")
    assert "invalid session id" in reply.json["message"]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"after": "abc"}, "after"),
        ({"after": "-1"}, "after"),
        ({"limit": "0"}, "limit"),
        ({"wait": "soon"}, "wait"),
        ({"wait": "31"}, "wait"),
    ],
)
async def test_an_invalid_query_parameter_is_400_invalid_query(
    http: aiohttp.ClientSession, url: str, session: Session, params: dict[str, str], name: str
) -> None:
    reply = await call(http, "GET", f"{url}/v1/sessions/{session.name}/events", params=params)
    assert_error(reply, 400, "InvalidQuery")
    assert f"'{name}'" in reply.json["message"]


async def test_a_credential_carrying_a_secret_value_is_refused_naming_the_field(
    http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    create = await call(
        http,
        "POST",
        f"{url}/v1/sessions",
        token=CONTROL,
        json={"session": "leaky", "credentials": [{"name": "github", "value": "hunter2"}]},
    )
    append = await call(
        http,
        "POST",
        f"{url}/v1/sessions/{owned.name}/journal",
        token=owned.agent_token,
        json={
            "epoch": 1,
            "entries": [{"kind": "credential", "payload": {"name": "github", "value": "hunter2"}}],
        },
    )

    assert_error(create, 400, "InvalidRequest")
    assert create.locs == ["credentials.0.value"]
    assert_error(append, 400, "InvalidRequest")
    assert append.locs == ["entries.0.payload.value"]
    for reply in (create, append):
        assert "hunter2" not in reply.text  # the secret is not echoed back
    assert (await call(http, "GET", f"{url}/v1/sessions/leaky", token=CONTROL)).status == 404


async def test_unknown_routes_and_methods_answer_json_errors(
    http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    unknown = await call(http, "GET", f"{url}/v2/nothing")
    wrong_method = await call(http, "PATCH", f"{url}/v1/sessions/{session.name}/messages")

    assert_error(unknown, 404, "NotFound")
    assert_error(wrong_method, 405, "MethodNotAllowed")
    await assert_still_serving(http, url, session.name)
