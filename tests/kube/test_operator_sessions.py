"""The operator end to end, on the emulated API with the kubelet fixture running the
reference agent's pods as processes and a real gateway: an AgentSession comes up,
bad manifests say what is wrong, a dead owner is replaced, deletion cleans up."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowpod.client.gateway import GatewayClient, GatewayError
from shadowpod.domain.entries import NewEntry
from shadowpod.kube import names
from tests.kube.operator_world import World, reply_counts, session_manifest
from tests.kube.support import eventually

pytestmark = pytest.mark.timeout(240)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "02-kubernetes" / "agentsession.yaml"


def condition(body: dict[str, object], kind: str) -> dict[str, str]:
    status = body.get("status") or {}
    assert isinstance(status, dict)
    found = [c for c in status.get("conditions", []) if c["type"] == kind]
    assert found, f"no {kind} condition in {status}"
    return dict(found[0])


async def test_a_new_session_gets_its_secret_budget_and_owner_pod_and_answers(
    world: World,
) -> None:
    await world.apply(session_manifest("s1"))
    body = await world.wait_running("s1", epoch=1)
    status = body["status"]
    assert status["image"] == "refagent:v1"
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Migrating", "Degraded"}
    assert condition(body, "Degraded")["status"] == "False"

    pods = await world.pods("s1")
    assert [p["metadata"]["name"] for p in pods] == [status["ownerPod"]]
    pod = pods[0]
    assert pod["metadata"]["labels"][names.ROLE_LABEL] == names.OWNER_ROLE
    assert pod["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    secret = await world.raw.get(world.path("secrets", names.token_secret("s1")))
    assert secret is not None
    token = base64.b64decode(secret["data"][names.TOKEN_KEY]).decode()
    budget = await world.raw.get(world.path("poddisruptionbudgets", names.disruption_budget("s1")))
    assert budget is not None and budget["spec"]["maxUnavailable"] == 0

    # The agent serves with the token in its Secret: a message gets an answer.
    async with world.client() as client:
        accepted = await client.post_message(world.gateway_session("s1"), "my name is Ada")

        async def answered() -> bool:
            return accepted.seq in await reply_counts(client, world.gateway_session("s1"))

        await eventually(answered, timeout=30)
    async with GatewayClient(world.gateway.url, token) as agent:
        assert (await agent.journal(world.gateway_session("s1"), after=0))[1] > 0


async def test_a_missing_credential_secret_is_a_condition_and_a_warning_not_a_crash(
    world: World,
) -> None:
    manifest = session_manifest(
        "s2", credentials=[{"name": "mail", "secretRef": {"name": "no-such-secret"}}]
    )
    await world.apply(manifest)

    async def degraded() -> dict[str, str] | None:
        body = await world.session("s2")
        found = [
            c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Degraded"
        ]
        return found[0] if found and found[0]["status"] == "True" else None

    cond = await eventually(degraded, timeout=30)
    assert cond["reason"] == "SecretNotFound"
    assert "no-such-secret" in cond["message"] and "create it" in cond["message"]
    assert ("Warning", "SecretNotFound") in {(t, r) for t, r, _ in await world.events("s2")}
    assert await world.pods("s2") == []  # nothing started half-configured

    # Fixed by creating the Secret: the session comes up, the condition clears.
    await world.raw.create(
        world.path("secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "no-such-secret"},
            "data": {"mail": base64.b64encode(b"hunter2").decode()},
        },
    )
    body = await world.wait_running("s2")
    assert condition(body, "Degraded")["status"] == "False"


async def test_an_owner_pod_deleted_outside_a_migration_is_replaced_at_a_new_epoch(
    world: World,
) -> None:
    await world.apply(session_manifest("s3"))
    body = await world.wait_running("s3", epoch=1)
    first = body["status"]["ownerPod"]
    async with world.client() as client:
        sid = world.gateway_session("s3")
        before = await client.post_message(sid, "my name is Ada", id="before")
        await world.raw.delete(world.path("pods", first), grace_s=0)
        body = await world.wait_running("s3", epoch=2)
        assert body["status"]["ownerPod"] != first
        after = await client.post_message(sid, "hello", id="after")

        async def replies() -> dict[int, int] | None:
            counts = await reply_counts(client, sid)
            return counts if after.seq in counts and before.seq in counts else None

        counts = await eventually(replies, timeout=60)
        assert counts[before.seq] == 1 and counts[after.seq] == 1  # answered once each
    events = await world.events("s3")
    assert any(t == "Warning" and r == "OwnerReplaced" for t, r, _ in events)


async def test_deleting_a_session_removes_its_pods_and_releases_the_finalizer(
    world: World,
) -> None:
    await world.apply(session_manifest("s4", journalRetentionPolicy={"whenDeleted": "Delete"}))
    await world.wait_running("s4")
    await world.raw.delete(world.path("agentsessions", "s4"))

    async def gone() -> bool:
        return await world.raw.get(world.path("agentsessions", "s4")) is None

    await eventually(gone, timeout=60)
    await eventually(lambda: _no_pods(world, "s4"), timeout=60)
    async with GatewayClient(world.gateway.url, world.gateway.control_token) as admin:
        with pytest.raises(GatewayError) as refused:
            await admin.status(world.gateway_session("s4"))
    assert refused.value.status == 404  # the journal went with it (whenDeleted: Delete)


async def test_deleting_a_session_with_the_gateway_down_does_not_hang(world: World) -> None:
    await world.apply(session_manifest("s5"))
    await world.wait_running("s5")
    await world.gateway.stop(kill=True)
    await world.raw.delete(world.path("agentsessions", "s5"))

    async def gone() -> bool:
        return await world.raw.get(world.path("agentsessions", "s5")) is None

    await eventually(gone, timeout=120)
    warnings = [
        m for t, r, m in await world.events("s5") if (t, r) == ("Warning", "GatewayUnreachable")
    ]
    assert warnings and "remain in the gateway" in warnings[0], warnings
    await eventually(lambda: _no_pods(world, "s5"), timeout=60)


async def test_a_session_the_gateway_cannot_serve_is_degraded_until_it_can(world: World) -> None:
    """A reconcile that fails (the gateway away for longer than its retries) says so on
    the session — Degraded with the reason, a Warning event, the error counted — and the
    next pass after the gateway is back brings the session up."""
    await world.gateway.stop(kill=True)
    await world.apply(session_manifest("s6"))

    async def degraded() -> dict[str, str] | None:
        conditions = ((await world.session("s6")).get("status") or {}).get("conditions", [])
        found = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        return found[0] if found else None

    cond = await eventually(degraded, timeout=60)
    assert cond["reason"] == "GatewayUnavailable"
    assert "the operator tries again" in cond["message"], cond
    body = await world.session("s6")
    assert body["status"]["phase"] == "Pending"
    assert condition(body, "Ready")["status"] == "False"
    warnings = [(r, m) for t, r, m in await world.events("s6") if t == "Warning"]
    assert warnings and {r for r, _ in warnings} == {"GatewayUnavailable"}, warnings
    assert all("trying again" in m for _, m in warnings), warnings
    errors = world.metrics.registry.get_sample_value(
        "shadowpod_reconcile_errors_total",
        {"kind": "AgentSession", "reason": "GatewayUnavailable"},
    )
    assert errors is not None and errors >= 1

    await world.gateway.start()
    body = await world.wait_running("s6", epoch=1, timeout=90)
    assert condition(body, "Degraded")["status"] == "False"


async def _no_pods(world: World, session: str) -> bool:
    return not await world.pods(session)


async def test_the_example_session_runs_with_its_credential_identity_and_memory(
    world: World,
) -> None:
    """examples/02-kubernetes/agentsession.yaml, applied as a user would (with the
    Secret its credential names), comes up and answers."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    await world.raw.create(
        world.path("secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "weather-api"},
            "data": {"token": base64.b64encode(b"sk-weather").decode()},
        },
    )
    await world.apply(manifest)
    body = await world.wait_running("support-ada", epoch=1)
    pod = await world.raw.get(world.path("pods", body["status"]["ownerPod"]))
    assert pod is not None
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert f"{names.CREDENTIALS_DIR}/weather-api" in mounts
    async with world.client() as client:
        sid = world.gateway_session("support-ada")
        accepted = await client.post_message(sid, "my name is Ada")

        async def answered() -> bool:
            return accepted.seq in await reply_counts(client, sid)

        await eventually(answered, timeout=30)


@pytest.mark.parametrize(
    ("spec", "reason", "says"),
    [
        ({"image": "Registry/RefAgent:v1"}, "InvalidImage", "not a valid image reference"),
        (
            {"credentials": [{"name": "mail", "secretRef": {"name": "mail", "key": "nope"}}]},
            "SecretKeyNotFound",
            "has no such key",
        ),
    ],
)
async def test_a_bad_manifest_the_api_admits_is_a_condition_and_an_event(
    world: World, spec: dict[str, object], reason: str, says: str
) -> None:
    await world.raw.create(
        world.path("secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "mail"},
            "data": {"pw": "eA=="},
        },
    )
    manifest = session_manifest("bad")
    manifest["spec"].update(spec)
    await world.apply(manifest)

    async def degraded() -> dict[str, str] | None:
        conditions = ((await world.session("bad")).get("status") or {}).get("conditions", [])
        found = [c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"]
        return found[0] if found else None

    condition = await eventually(degraded, timeout=30)
    assert condition["reason"] == reason and says in condition["message"]
    assert (await world.session("bad"))["status"]["phase"] == "Pending"
    warnings = [(r, m) for t, r, m in await world.events("bad") if t == "Warning"]
    assert [r for r, _ in warnings] == [reason]  # said once, not on every pass
    assert await world.pods("bad") == []


async def test_sessions_that_cannot_start_are_backed_off_and_a_valid_one_is_not_held_up(
    world: World,
) -> None:
    """Three sessions whose image is no reference, next to one that works: each broken
    one is tried again after a wait that doubles (from the 0.5 s reconcile interval),
    not on every pass, and the working one comes up as if they were not there."""
    for n in range(3):
        await world.apply(session_manifest(f"bad{n}", image="Registry/RefAgent:v1"))
    started = asyncio.get_running_loop().time()
    await world.apply(session_manifest("good"))
    await world.wait_running("good", epoch=1, timeout=30)
    await asyncio.sleep(max(0.0, 12.0 - (asyncio.get_running_loop().time() - started)))
    tries = world.metrics.registry.get_sample_value(
        "shadowpod_reconcile_errors_total", {"kind": "AgentSession", "reason": "InvalidImage"}
    )
    # In 12 s: tried at about 0, 0.5, 1.5, 3.5 and 7.5 s, with room for a pass triggered
    # by the operator's own status writes. On every pass, it would be 24 each.
    assert tries is not None and 3 <= tries <= 3 * 7, tries
    for n in range(3):
        warnings = [r for t, r, _ in await world.events(f"bad{n}") if t == "Warning"]
        assert warnings == ["InvalidImage"]  # said once
        assert (await world.session(f"bad{n}"))["status"]["phase"] == "Pending"

    # Corrected (a spec change): tried at once, whatever the wait was.
    await world.raw.patch(world.path("agentsessions", "bad0"), {"spec": {"image": "refagent:v1"}})
    await world.wait_running("bad0", epoch=1, timeout=30)


async def test_the_operators_events_carry_what_a_real_api_server_requires(world: World) -> None:
    """An Event with an eventTime must name its reportingComponent, reportingInstance and
    action, or a real API server refuses it (422; the emulator stored it): every event
    of the operator was lost on a real cluster."""
    manifest = session_manifest("bad-image")
    manifest["spec"]["image"] = "Registry/RefAgent:v1"
    await world.apply(manifest)

    async def posted() -> list[dict[str, Any]]:
        listed = await world.raw.list(world.path("events"))
        return [e for e in listed if e["involvedObject"]["name"] == "bad-image"]

    events = await eventually(posted, timeout=30)
    for event in events:
        assert event.get("eventTime"), event
        assert event.get("reportingComponent") and event.get("reportingInstance"), event
        assert event.get("action"), event
        assert len(event["reportingInstance"]) <= 128 and len(event["action"]) <= 128


async def test_each_owner_pod_holds_its_own_credential_and_a_replaced_pods_is_refused(
    world: World,
) -> None:
    """Every pod of a session holds the agent token: what lets only the owner the
    ownership record names write is its own credential, which the operator writes
    into the session's Secret for that pod alone (issue 24, item 3)."""
    await world.apply(session_manifest("s-cred"))
    first = (await world.wait_running("s-cred", epoch=1))["status"]["ownerPod"]
    sid = world.gateway_session("s-cred")

    async def secret_data() -> dict[str, str]:
        secret = await world.raw.get(world.path("secrets", names.token_secret("s-cred")))
        assert secret is not None
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}

    data = await secret_data()
    token, credential_of_first = data[names.TOKEN_KEY], data[names.owner_credential_key(first)]
    [pod] = await world.pods("s-cred")
    [identity] = [v for v in pod["spec"]["volumes"] if v["name"] == "identity"]
    projected = {
        item["key"]
        for source in identity["projected"]["sources"]
        if "secret" in source
        for item in source["secret"]["items"]
    }
    # Its own credential, never the owner key nor another pod's.
    assert projected == {names.TOKEN_KEY, names.GATEWAY_KEY, names.owner_credential_key(first)}
    fact = NewEntry(kind="fact", payload={"fact_id": "f", "text": "written by a test"})

    async with GatewayClient(world.gateway.url, token) as token_alone:
        with pytest.raises(GatewayError) as refused:
            await token_alone.append(sid, epoch=1, entries=[fact])
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    async with GatewayClient(
        world.gateway.url, token, owner=("someone-else", credential_of_first)
    ) as borrowed:
        with pytest.raises(GatewayError) as refused:
            await borrowed.append(sid, epoch=1, entries=[fact])
    assert refused.value.status == 401  # a credential is its own pod's only
    async with GatewayClient(
        world.gateway.url, token, owner=(first, credential_of_first)
    ) as as_first:
        await as_first.append(sid, epoch=1, entries=[fact])  # the owner, at its epoch

        await world.raw.delete(world.path("pods", first), grace_s=0)
        second = (await world.wait_running("s-cred", epoch=2))["status"]["ownerPod"]
        assert names.owner_credential_key(second) in await secret_data()
        # Fenced out: its credential writes at no epoch, the new one included.
        for epoch in (1, 2):
            with pytest.raises(GatewayError) as refused:
                await as_first.append(sid, epoch=epoch, entries=[fact])
            assert refused.value.status == 409, refused.value
    async with world.client() as client:
        accepted = await client.post_message(sid, "still answered?")

        async def answered() -> bool:
            return accepted.seq in await reply_counts(client, sid)

        await eventually(answered, timeout=60)  # the new owner writes with its own
