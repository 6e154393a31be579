"""What kmock 0.8's stock ``KubernetesEmulator`` gets wrong for Kopf and the official
clients, each pinned by a test of the stock class as it is.

``ApiServerEmulator`` exists to close these gaps. When a kmock upgrade fixes one, its
test here fails: drop the matching part of the subclass (and the test) then.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest
from kubernetes_asyncio import client

WIDGETS = "/apis/test.shadowpod.dev/v1/namespaces/ns/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def stock() -> AsyncIterator[tuple[kmock.KubernetesEmulator, str]]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources["test.shadowpod.dev/v1/widgets"] = kmock.ResourceInfo(
            kind="Widget",
            namespaced=True,
            verbs={"list", "watch", "create", "patch"},
            subresources={"status"},
        )
        yield emulator, str(server.url).rstrip("/")


async def call(method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kwargs) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def stream_types(url: str, params: dict[str, str], wait: float) -> list[str]:
    """Event types a watch yields within ``wait`` seconds (the stream may not end)."""
    types: list[str] = []
    async with aiohttp.ClientSession() as http:
        try:
            async with http.get(
                url, params=params, timeout=aiohttp.ClientTimeout(total=wait)
            ) as response:
                async for line in response.content:
                    if line.strip():
                        types.append(json.loads(line)["type"])
        except TimeoutError:
            types.append("<still open>")
    return types


async def test_stock_creates_answer_200_so_the_official_client_returns_none(stock) -> None:
    _, url = stock
    status, _ = await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}})
    assert status == 200
    async with client.ApiClient(client.Configuration(host=url)) as api:
        created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
            "test.shadowpod.dev",
            "v1",
            "ns",
            "widgets",
            {"apiVersion": "test.shadowpod.dev/v1", "kind": "Widget", "metadata": {"name": "b"}},
        )
    assert created is None


async def test_stock_fills_no_server_side_fields(stock) -> None:
    _, url = stock
    _, created = await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}})
    assert created == {"metadata": {"name": "a"}}  # no uid, namespace, RV, generation, kind


async def test_stock_accepts_a_stale_resource_version(stock) -> None:
    _, url = stock
    await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}})
    status, _ = await call(
        "PATCH",
        url + WIDGETS + "/a",
        headers=MERGE,
        json={"metadata": {"resourceVersion": "stale"}, "spec": {"x": 1}},
    )
    assert status == 200


async def test_stock_breaks_on_generate_name(stock) -> None:
    _, url = stock
    _, first = await call("POST", url + WIDGETS, json={"metadata": {"generateName": "w-"}})
    status, _ = await call("POST", url + WIDGETS, json={"metadata": {"generateName": "w-"}})
    assert "name" not in first["metadata"]  # stored under no name at all
    assert status == 409  # so the next one "already exists"


async def test_stock_lets_the_status_subresource_write_spec(stock) -> None:
    _, url = stock
    await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}, "spec": {"x": 1}})
    _, patched = await call(
        "PATCH", url + WIDGETS + "/a/status", headers=MERGE, json={"spec": {"x": 2}}
    )
    assert patched["spec"] == {"x": 2}


async def test_stock_ignores_label_selectors(stock) -> None:
    _, url = stock
    await call("POST", url + WIDGETS, json={"metadata": {"name": "a", "labels": {"k": "v"}}})
    _, listed = await call("GET", url + WIDGETS, params={"labelSelector": "k=other"})
    assert len(listed["items"]) == 1


async def test_stock_reads_watch_true_as_a_list(stock) -> None:
    _, url = stock
    status, listed = await call("GET", url + WIDGETS, params={"watch": "True"})
    assert status == 200 and "items" in listed


async def test_stock_replays_every_object_on_a_watch_from_a_resource_version(stock) -> None:
    _, url = stock
    await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}})
    types = await stream_types(url + WIDGETS, {"watch": "true", "resourceVersion": "999"}, 1.0)
    assert types[0] == "ADDED"


async def test_stock_ignores_timeout_seconds(stock) -> None:
    _, url = stock
    types = await stream_types(url + WIDGETS, {"watch": "true", "timeoutSeconds": "1"}, 2.5)
    assert types == ["<still open>"]


async def test_stock_fails_on_the_namespaces_collection(stock) -> None:
    _, url = stock
    status, _ = await call("POST", url + "/api/v1/namespaces", json={"metadata": {"name": "x"}})
    assert status == 500  # its path parser fails on /api/v1/namespaces


async def test_stock_keeps_writing_when_a_reaction_answered_instead(stock) -> None:
    emulator, url = stock
    emulator["post", kmock.resource("test.shadowpod.dev", "v1", "widgets")] << 503
    status, _ = await call("POST", url + WIDGETS, json={"metadata": {"name": "a"}})
    assert status == 503
    await asyncio.sleep(0)
    assert (kmock.resource("test.shadowpod.dev", "v1", "widgets"), "ns", "a") in emulator.objects
