"""A rollout's passes on the API-server emulator: one at a time per AgentDeployment, an
ask while one waits folded into it — and a waiting pass that is cancelled gives its
turn back, so later asks still run."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from shadowpod.client.gateway import GatewayClient
from shadowpod.kube import rollouts
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.config import OperatorConfig
from shadowpod.kube.context import OperatorContext
from shadowpod.kube.metrics import OperatorMetrics
from shadowpod.kube.models.v1alpha1 import API_VERSION
from tests.kube.connection import KubeConnection

NAMESPACE = "default"


def _deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"template": {"image": "refagent:v1"}},
    }


async def test_a_cancelled_waiting_pass_does_not_swallow_the_later_ones(
    emulator_kube: KubeConnection,
) -> None:
    """A session's timer that ends (the session became steady) cancels the pass it ran,
    which may be waiting for its rollout's turn. Before, that rollout kept a "pass due"
    mark forever: every later ask — its own timer included — was folded into a pass
    that never ran, and a rollout restarted mid-way stood still at "2 of 3"."""
    config = OperatorConfig(
        gateway_url="http://127.0.0.1:9", agent_gateway_url="http://127.0.0.1:9", control_token="t"
    )
    async with (
        emulator_kube.api() as client,
        aiohttp.ClientSession() as http,
        GatewayClient(config.gateway_url, config.control_token) as admin,
    ):
        ctx = OperatorContext(KubeApi(client), admin, http, config, OperatorMetrics())
        path = namespaced("agentdeployments", NAMESPACE, "agent")
        await ctx.api.create(namespaced("agentdeployments", NAMESPACE), _deployment("agent"))

        async with ctx.lock(f"deployment/{NAMESPACE}/agent"):  # a pass is running
            waiting = asyncio.create_task(rollouts.reconcile_named(ctx, NAMESPACE, "agent"))
            await asyncio.sleep(0.1)
            waiting.cancel()  # its caller stopped
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        assert ((await ctx.api.get(path)) or {}).get("status") is None

        await asyncio.wait_for(rollouts.reconcile_named(ctx, NAMESPACE, "agent"), timeout=30)
        status = ((await ctx.api.get(path)) or {}).get("status") or {}
        assert status.get("phase") == "Complete", status
