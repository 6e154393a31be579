"""The operator's own API client (kube/api.py) presents its credentials: in a pod those
are the ServiceAccount's bearer token, which a real API server requires — without it
every request is `system:anonymous` and refused (403). The emulator does not
authenticate, so this runs against an HTTP server that does, as the API server does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from shadowpod.kube.api import KubeApi

TOKEN = "sa-token-of-the-operator"


@pytest.fixture
async def api_server() -> AsyncIterator[TestServer]:
    """Answers a Secret to the token's holder, 403 to anyone else."""

    async def secret(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(
                {
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "Forbidden",
                    "code": 403,
                    "message": 'secrets "s" is forbidden: User "system:anonymous" cannot get',
                },
                status=403,
            )
        return web.json_response({"kind": "Secret", "metadata": {"name": "s"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/secrets/s", secret)
    app.router.add_post("/api/v1/nodes/n/proxy/checkpoint", secret)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


def in_cluster_configuration(server: TestServer) -> client.Configuration:
    """What kubernetes_asyncio's in-cluster loader makes of a pod's ServiceAccount."""
    configuration = client.Configuration()
    configuration.host = str(server.make_url("")).rstrip("/")
    configuration.api_key["BearerToken"] = f"Bearer {TOKEN}"
    return configuration


async def test_requests_carry_the_service_accounts_bearer_token(api_server: TestServer) -> None:
    async with client.ApiClient(in_cluster_configuration(api_server)) as api_client:
        api = KubeApi(api_client)
        found = await api.get("/api/v1/namespaces/ns/secrets/s")
        assert found is not None and found["metadata"]["name"] == "s"
        status, _ = await api.post_raw("/api/v1/nodes/n/proxy/checkpoint", query={})
        assert status == 200
