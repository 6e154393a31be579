"""Cordon and drain through the API alone, as kubectl does them — so they work on a
real cluster as well as on the emulator."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException


async def cordon(api: client.ApiClient, node: str, unschedulable: bool = True) -> None:
    await client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": unschedulable}})


async def drain(
    api: client.ApiClient,
    node: str,
    *,
    timeout: float = 120.0,
    retry_s: float = 0.5,
    evicted_at: dict[str, float] | None = None,
) -> list[str]:
    """Cordon ``node`` and evict its pods, retrying what a budget refuses (429) as
    ``kubectl drain`` does, until none is left; the pods evicted, as ns/name, and in
    ``evicted_at`` when each was (wall-clock time, as migration records keep it)."""
    core = client.CoreV1Api(api)
    await cordon(api, node)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    evicted: list[str] = []
    while True:
        pods = (
            await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        ).items
        left = [pod for pod in pods if pod.status.phase not in ("Succeeded", "Failed")]
        if not left:
            return evicted
        if loop.time() > deadline:
            names = ", ".join(f"{p.metadata.namespace}/{p.metadata.name}" for p in left)
            raise TimeoutError(f"drain of {node} did not finish in {timeout} s: {names} left")
        for pod in left:
            if pod.metadata.deletion_timestamp is not None:
                continue
            body: Any = client.V1Eviction(
                metadata=client.V1ObjectMeta(
                    name=pod.metadata.name, namespace=pod.metadata.namespace
                )
            )
            try:
                await core.create_namespaced_pod_eviction(
                    pod.metadata.name, pod.metadata.namespace, body
                )
            except ApiException as exc:
                if exc.status not in (404, 429):
                    raise
                continue
            evicted.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
            if evicted_at is not None:
                evicted_at[evicted[-1]] = time.time()
        await asyncio.sleep(retry_s)


class ClusterNodes:
    """A real cluster's nodes, for the operator tests' ``world.nodes``: they exist
    already (the kubelets registered them); adding one checks it is there and Ready."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def add_node(self, name: str) -> None:
        try:
            node = await client.CoreV1Api(self.api).read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                raise AssertionError(
                    f"the cluster has no node {name}: the operator tests want two nodes, "
                    "node-1 and node-2, as `make cluster` starts them"
                ) from exc
            raise
        ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
        assert ready and ready[0].status == "True", f"node {name} is not Ready: {ready}"
