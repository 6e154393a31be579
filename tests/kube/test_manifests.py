"""The operator's manifests, run for real: an owner pod of the reference agent, built by
``kube.manifests`` and run by the kubelet fixture against a real gateway, serves its
session; its PodDisruptionBudget refuses the pod's eviction."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shadowpod.api.models import CreateSession, OwnershipChange
from shadowpod.client.gateway import GatewayClient
from shadowpod.kube import manifests, names
from shadowpod.kube.answers import Answers
from shadowpod.kube.answers import manifest as answers_manifest
from shadowpod.kube.models.v1alpha1 import AgentSession
from shadowpod.local.gateway_process import GatewayProcess
from shadowpod.sessions.tokens import new_owner_key, owner_credential
from tests.kube.connection import KubeConnection
from tests.kube.kubelet import Kubelet
from tests.kube.support import eventually

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-kubernetes" / "agentsession.yaml"
NAMESPACE = "default"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "gateway")
    await process.start()
    yield process
    await process.stop()


async def create_session_object(api: client.ApiClient) -> AgentSession:
    """The example AgentSession, created in the API (its pods' owner must exist)."""
    body = yaml.safe_load(EXAMPLE.read_text())
    created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "shadowpod.dev", "v1alpha1", NAMESPACE, "agentsessions", body
    )
    return AgentSession.model_validate(created)


async def ready(api: client.ApiClient, name: str) -> bool:
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, NAMESPACE)
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


async def test_an_owner_pod_serves_its_session_and_its_budget_refuses_eviction(
    emulator_kube: KubeConnection, kubelet: Kubelet, gateway: GatewayProcess
) -> None:
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        session = await create_session_object(api)
        assert session.metadata.name is not None
        gateway_session = names.gateway_session(NAMESPACE, session.metadata.name)
        instance = names.new_instance(session.metadata.name)
        owner_key = new_owner_key()  # owner writes need the pod's credential
        async with GatewayClient(gateway.url, gateway.control_token) as admin:
            created = await admin.create_session(
                CreateSession(session=gateway_session, owner_key=owner_key)
            )
            await admin.set_ownership(
                gateway_session, OwnershipChange(expect_epoch=0, epoch=1, owner=instance)
            )
        credential = {
            "metadata": {"name": "weather-api"},
            "data": {"token": "c2VjcmV0"},
        }
        await core.create_namespaced_secret(NAMESPACE, credential)
        secret = manifests.token_secret(
            session, token=created.agent_token, gateway_url=gateway.url, owner_key=owner_key
        )
        credential_of_pod = owner_credential(owner_key, gateway_session, instance)
        secret["data"][names.owner_credential_key(instance)] = base64.b64encode(
            credential_of_pod.encode()
        ).decode()
        await core.create_namespaced_secret(NAMESPACE, secret)
        pod = manifests.agent_pod(
            session, instance=instance, gateway_session=gateway_session, mode="owner", epoch=1
        )
        await core.create_namespaced_pod(NAMESPACE, pod)
        await eventually(lambda: ready(api, instance), timeout=60)

        async with GatewayClient(gateway.url) as user:
            accepted = await user.post_message(gateway_session, "my name is Ada")
            replies = await _replies(user, gateway_session, accepted.seq)
        assert replies[0]["payload"]["content"].startswith("[v1]")
        assert replies[0]["payload"]["meta"]["instance"] == instance
        assert replies[0]["epoch"] == 1

        policy = client.PolicyV1Api(api)
        await policy.create_namespaced_pod_disruption_budget(
            NAMESPACE, manifests.owner_budget(session)
        )
        with pytest.raises(ApiException) as refused:
            await _evict(core, instance)
        assert refused.value.status == 429


async def _replies(
    user: GatewayClient, session: str, seq: int, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The assistant messages answering inbound ``seq``."""
    deadline = asyncio.get_running_loop().time() + timeout
    after = 0
    found: list[dict[str, Any]] = []
    while not found:
        page = await user.events(session, after=after, wait_s=1.0)
        found = [
            e
            for e in page.events
            if e["kind"] == "message"
            and e["payload"]["role"] == "assistant"
            and e["payload"].get("turn") == seq
        ]
        after = page.next_after
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no reply to seq {seq} within {timeout}s")
    return found


async def _evict(core: client.CoreV1Api, pod: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}}
    await core.create_namespaced_pod_eviction(pod, NAMESPACE, body)


async def test_what_the_operator_makes_for_a_63_character_session_is_admitted(
    emulator_kube: KubeConnection,
) -> None:
    """A session's name may be 63 characters; the migrations the operator names after
    it (an image change, a drain) and a hand-made one of 253 must still label their
    pods, PodCheckpoints and answers within the API server's 63 per label value."""
    async with emulator_kube.api() as api:
        body = yaml.safe_load(EXAMPLE.read_text())
        body["metadata"]["name"] = "s" * 63
        created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
            "shadowpod.dev", "v1alpha1", NAMESPACE, "agentsessions", body
        )
        session = AgentSession.model_validate(created)
        name = "s" * 63
        migrations = [
            names.image_migration(name, 12),
            names.drain_migration(name, "node-a", f"{name}-abcde"),
            "m" * 253,
        ]
        core = client.CoreV1Api(api)
        for n, migration in enumerate(migrations):
            pod = manifests.agent_pod(
                session,
                instance=f"{name}-{n}",
                gateway_session=names.gateway_session(NAMESPACE, name),
                mode="shadow",
                migration=migration,
            )
            made = await core.create_namespaced_pod(NAMESPACE, pod)
            label = made.metadata.labels[names.MIGRATION_LABEL]
            assert len(label) <= 63 and label.startswith(migration[:40])
            answers = Answers(
                migration=migration, session=name, source_image="a:v1", target_image="a:v2"
            )
            owner = {
                "apiVersion": "shadowpod.dev/v1alpha1",
                "kind": "AgentMigration",
                "metadata": {"name": migration, "namespace": NAMESPACE, "uid": "u"},
            }
            await core.create_namespaced_config_map(NAMESPACE, answers_manifest(owner, answers))
        # Distinct migrations keep distinct labels (the digest of the whole name).
        assert len({names.label_value(m) for m in [*migrations, "m" * 252]}) == 4


def test_the_agents_identity_and_credentials_are_readable_by_a_non_root_user() -> None:
    """The kubelet writes these files as root; the agent runs as its image's user
    (65532 in the reference agent's image). At 0400 the agent could not read its own
    session id and exited (PermissionError) on a real node."""
    session = AgentSession.model_validate(
        {**yaml.safe_load(EXAMPLE.read_text()), "metadata": {"name": "ada", "uid": "u1"}}
    )
    pod = manifests.agent_pod(
        session, instance="ada-x1", gateway_session="default.ada", mode="owner", epoch=1
    )
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    modes = {
        "identity": volumes["identity"]["projected"]["defaultMode"],
        "credential-0": volumes["credential-0"]["secret"]["defaultMode"],
    }
    assert {name: mode & 0o004 for name, mode in modes.items()} == {
        "identity": 0o004,
        "credential-0": 0o004,
    }, {name: oct(mode) for name, mode in modes.items()}
