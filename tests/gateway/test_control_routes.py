"""Control over HTTP: sessions, ownership by compare-and-set, snapshot requests."""

from __future__ import annotations

import aiohttp

from shadowpod.api.models import CreateSession, CredentialSpec, ScheduleSpec
from shadowpod.client.gateway import GatewayClient
from shadowpod.sessions.tokens import new_token, token_hash
from tests.gateway.conftest import CONTROL, Reply, Session, call


async def test_creating_a_session_is_201_and_returns_its_agent_token_once(
    http: aiohttp.ClientSession, url: str
) -> None:
    created = await call(http, "POST", f"{url}/v1/sessions", token=CONTROL, json={"session": "s-1"})
    listed = await call(http, "GET", f"{url}/v1/sessions", token=CONTROL)
    status = await call(http, "GET", f"{url}/v1/sessions/s-1", token=CONTROL)

    assert created.status == 201
    assert set(created.json) == {"session", "agent_token"}
    token = created.json["agent_token"]
    assert created.json["session"] == "s-1" and len(token) >= 32
    for later in (listed, status):  # never shown again
        assert token not in later.text
    journal = await call(http, "GET", f"{url}/v1/sessions/s-1/journal", token=token)
    assert journal.status == 200
    assert journal.json == {"entries": [], "head": 0}


async def test_a_session_created_with_the_callers_token_hash_opens_with_that_token(
    http: aiohttp.ClientSession, url: str
) -> None:
    """The operator keeps the token in a Secret before the session exists: a crash
    between the two leaves nothing it cannot finish."""
    token = new_token()
    created = await call(
        http,
        "POST",
        f"{url}/v1/sessions",
        token=CONTROL,
        json={"session": "s-1", "agent_token_sha256": token_hash(token)},
    )
    assert created.status == 201
    assert created.json == {"session": "s-1"}  # no token of the gateway's own
    opened = await call(http, "GET", f"{url}/v1/sessions/s-1/journal", token=token)
    other = await call(http, "GET", f"{url}/v1/sessions/s-1/journal", token=new_token())
    assert (opened.status, other.status) == (200, 401)


async def test_a_token_hash_that_is_not_sha256_hex_is_refused(
    http: aiohttp.ClientSession, url: str
) -> None:
    refused = await call(
        http,
        "POST",
        f"{url}/v1/sessions",
        token=CONTROL,
        json={"session": "s-1", "agent_token_sha256": "not-a-hash"},
    )
    assert refused.status == 400
    assert "agent_token_sha256" in refused.text
    listed = await call(http, "GET", f"{url}/v1/sessions", token=CONTROL)
    assert listed.json == []


async def test_creating_a_session_twice_is_409_session_exists(
    control: GatewayClient, http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    again = await call(
        http, "POST", f"{url}/v1/sessions", token=CONTROL, json={"session": session.name}
    )
    assert again.status == 409
    assert again.reason == "SessionExists"
    # The first agent token still opens the session: nothing was replaced.
    async with GatewayClient(url, session.agent_token) as agent:
        assert (await agent.journal(session.name, after=0))[1] == 0


async def test_credentials_and_schedules_of_a_new_session_are_journaled(
    control: GatewayClient, http: aiohttp.ClientSession, url: str
) -> None:
    await control.create_session(
        CreateSession(
            session="s",
            meta={"team": "blue"},
            credentials=[CredentialSpec(name="github", secret_ref="secret/gh#token")],
            schedules=[ScheduleSpec(schedule_id="daily", every_s=86_400, content="report")],
        )
    )
    events = (await call(http, "GET", f"{url}/v1/sessions/s/events")).json["events"]

    assert [(e["id"], e["kind"]) for e in events] == [
        ("credential:github", "credential"),
        ("schedule-set:daily", "schedule"),
    ]
    assert events[0]["payload"] == {"name": "github", "secret_ref": "secret/gh#token"}
    assert events[1]["payload"] == {
        "schedule_id": "daily",
        "op": "set",
        "every_s": 86400.0,
        "content": "report",
    }


async def test_the_agent_token_meta_key_is_reserved(http: aiohttp.ClientSession, url: str) -> None:
    reply = await call(
        http,
        "POST",
        f"{url}/v1/sessions",
        token=CONTROL,
        json={"session": "s", "meta": {"agent_token_sha256": "0" * 64}},
    )
    assert reply.status == 400 and reply.reason == "InvalidRequest"
    assert "reserved" in reply.json["message"]


async def test_sessions_are_listed_with_their_head(
    control: GatewayClient, client: GatewayClient, http: aiohttp.ClientSession, url: str
) -> None:
    for name in ("b", "a"):
        await control.create_session(CreateSession(session=name))
    await client.post_message("b", "hi")

    listed = (await call(http, "GET", f"{url}/v1/sessions", token=CONTROL)).json

    assert [(s["session"], s["head"]) for s in listed] == [("a", 0), ("b", 1)]
    assert all(s["created"].endswith("Z") for s in listed)


async def test_a_deleted_session_is_gone_and_its_token_opens_nothing(
    control: GatewayClient, http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    deleted = await call(http, "DELETE", f"{url}/v1/sessions/{session.name}", token=CONTROL)
    status = await call(http, "GET", f"{url}/v1/sessions/{session.name}")
    again = await call(http, "DELETE", f"{url}/v1/sessions/{session.name}", token=CONTROL)

    assert (deleted.status, deleted.text) == (204, "")
    assert (status.status, status.reason) == (404, "SessionNotFound")
    assert (again.status, again.reason) == (404, "SessionNotFound")
    # A new session of the same name has a new token; the old one does not open it.
    await control.create_session(CreateSession(session=session.name))
    old_token = await call(
        http, "GET", f"{url}/v1/sessions/{session.name}/journal", token=session.agent_token
    )
    assert (old_token.status, old_token.reason) == (401, "Unauthorized")


async def test_ownership_is_handed_over_by_compare_and_set(
    control: GatewayClient, http: aiohttp.ClientSession, url: str, session: Session
) -> None:
    path = f"{url}/v1/sessions/{session.name}/ownership"

    async def put(expect: int, epoch: int, owner: str) -> Reply:
        change = {"expect_epoch": expect, "epoch": epoch, "owner": owner}
        return await call(http, "PUT", path, token=CONTROL, json=change)

    initial = await call(http, "GET", path, token=CONTROL)
    first = await put(0, 1, "pod-a")
    stale = await put(0, 2, "pod-b")
    second = await put(1, 3, "pod-b")
    backwards = await put(3, 2, "pod-c")
    invalid = await put(3, 0, "pod-c")

    assert initial.json["epoch"] == 0 and initial.json["owner"] is None
    assert initial.json["fence"] == "open"
    assert first.status == 200
    assert (first.json["epoch"], first.json["owner"], first.json["fence"]) == (1, "pod-a", "open")
    assert (stale.status, stale.reason) == (409, "EpochConflict")
    assert "expected ownership epoch 0, found 1" in stale.json["message"]
    assert (second.json["epoch"], second.json["owner"]) == (3, "pod-b")
    assert (backwards.status, backwards.reason) == (409, "EpochDecrease")
    assert (invalid.status, invalid.locs) == (400, ["epoch"])
    now = (await call(http, "GET", path, token=CONTROL)).json
    assert (now["epoch"], now["owner"]) == (3, "pod-b")
    # Each epoch change is journaled; the seq of the latest is the fence_seq.
    events = (await call(http, "GET", f"{url}/v1/sessions/{session.name}/events")).json["events"]
    assert [(e["kind"], e["payload"]["event"], e["payload"]["owner"]) for e in events] == [
        ("control", "epoch", "pod-a"),
        ("control", "epoch", "pod-b"),
    ]
    assert events[-1]["seq"] == now["fence_seq"] == second.json["fence_seq"]


async def test_a_snapshot_request_journals_a_control_entry(
    control: GatewayClient, http: aiohttp.ClientSession, url: str, owned: Session
) -> None:
    reply = await call(
        http, "POST", f"{url}/v1/sessions/{owned.name}/snapshot-requests", token=CONTROL
    )
    assert reply.status == 202
    seq = reply.json["seq"]
    events = (await call(http, "GET", f"{url}/v1/sessions/{owned.name}/events")).json["events"]
    assert events[-1]["seq"] == seq
    assert (events[-1]["kind"], events[-1]["payload"]["event"]) == ("control", "snapshot_request")
    unauthorised = await call(
        http, "POST", f"{url}/v1/sessions/{owned.name}/snapshot-requests", token=owned.agent_token
    )
    assert unauthorised.status == 401


async def test_unfence_without_a_fence_changes_nothing_and_checks_the_epoch(
    control: GatewayClient, owned: Session, http: aiohttp.ClientSession, url: str
) -> None:
    path = f"{url}/v1/sessions/{owned.name}/unfence"
    same = await call(http, "POST", path, token=CONTROL, json={"expect_epoch": 1})
    wrong = await call(http, "POST", path, token=CONTROL, json={"expect_epoch": 3})

    assert same.status == 200
    assert (same.json["epoch"], same.json["fence"]) == (1, "open")
    assert (wrong.status, wrong.reason) == (409, "EpochConflict")
    assert (await control.ownership(owned.name)).epoch == 1


async def test_every_sessions_position_comes_in_one_read_for_the_control_token(
    http: aiohttp.ClientSession, url: str
) -> None:
    for session in ("p-1", "p-2"):
        await call(http, "POST", f"{url}/v1/sessions", token=CONTROL, json={"session": session})
    async with GatewayClient(url) as client:
        await client.post_message("p-2", "hi", id="hi")
    refused = await call(http, "GET", f"{url}/v1/positions")
    answer = await call(http, "GET", f"{url}/v1/positions", token=CONTROL)
    assert refused.status == 401 and refused.json["reason"]
    assert answer.status == 200
    assert answer.json == {
        "sessions": [
            {"session": "p-1", "head": 0, "acked": 0, "epoch": 0, "fence": "open"},
            {"session": "p-2", "head": 1, "acked": 0, "epoch": 0, "fence": "open"},
        ]
    }
