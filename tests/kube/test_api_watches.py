"""Lists and watches as Kopf and an operator use them: from a resourceVersion, with
label and field selectors, bounded by timeoutSeconds."""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.support import Widgets, eventually, watching


def names(events: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"]["name"]) for kind, obj in events]


async def test_a_watch_from_a_resource_version_sees_only_what_came_after(
    widgets: Widgets,
) -> None:
    await widgets.create("before")
    listed = await widgets.list()
    version = listed["metadata"]["resourceVersion"]

    async with watching(
        widgets.objects.list_namespaced_custom_object,
        "test.shadowpod.dev",
        "v1",
        widgets.namespace,
        "widgets",
        resource_version=version,
    ) as events:
        await widgets.create("after")
        await widgets.patch("before", {"spec": {"size": 2}})
        await widgets.delete("after")
        await eventually(lambda: len(events) >= 3)

    assert names(events) == [("ADDED", "after"), ("MODIFIED", "before"), ("DELETED", "after")]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions) and versions[0] > int(version)


async def test_a_watch_without_a_version_starts_with_every_object(widgets: Widgets) -> None:
    await widgets.create("a")
    await widgets.create("b")
    async with watching(
        widgets.objects.list_namespaced_custom_object,
        "test.shadowpod.dev",
        "v1",
        widgets.namespace,
        "widgets",
    ) as events:
        await eventually(lambda: len(events) >= 2)
    assert sorted(names(events)) == [("ADDED", "a"), ("ADDED", "b")]


async def test_timeout_seconds_ends_the_stream(widgets: Widgets) -> None:
    stream = watch.Watch()
    seen = [
        event["type"]
        async for event in stream.stream(
            widgets.objects.list_namespaced_custom_object,
            "test.shadowpod.dev",
            "v1",
            widgets.namespace,
            "widgets",
            timeout_seconds=1,
        )
    ]
    assert seen == []  # no objects: nothing, and then the server ended the stream


async def test_label_selectors_filter_lists_and_watches(widgets: Widgets) -> None:
    await widgets.create("red", labels={"colour": "red"})
    await widgets.create("blue", labels={"colour": "blue"})
    listed = await widgets.list(label_selector="colour in (red),colour!=green")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["red"]
    assert len((await widgets.list(label_selector="!colour"))["items"]) == 0

    async with watching(
        widgets.objects.list_namespaced_custom_object,
        "test.shadowpod.dev",
        "v1",
        widgets.namespace,
        "widgets",
        label_selector="colour=red",
        resource_version=listed["metadata"]["resourceVersion"],
    ) as events:
        await widgets.patch("blue", {"metadata": {"labels": {"colour": "red"}}})
        await widgets.patch("red", {"metadata": {"labels": {"colour": "green"}}})
        await eventually(lambda: len(events) >= 2)
    # Moving into the selector is an ADDED, moving out of it a DELETED.
    assert names(events) == [("ADDED", "blue"), ("DELETED", "red")]


async def test_pods_are_selected_by_node_name(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    for name, node in (("on-a", "node-a"), ("on-b", "node-b")):
        await core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
            },
        )
    pods = await core.list_namespaced_pod(namespace, field_selector="spec.nodeName=node-a")
    assert [pod.metadata.name for pod in pods.items] == ["on-a"]
    with pytest.raises(ApiException) as caught:
        await core.list_namespaced_pod(namespace, field_selector="spec.image=x")
    assert caught.value.status == 400


async def test_a_watch_from_a_version_older_than_the_window_is_gone(tmp_path: Path) -> None:
    async with ApiServerEmulator(watch_window=3) as small, kmock.Server(small):
        kube = KubeConnection.to_emulator(str(small.url).rstrip("/"), tmp_path)
        async with kube.api() as api:
            core = client.CoreV1Api(api)
            first = await core.create_namespaced_config_map("default", {"metadata": {"name": "c0"}})
            for index in range(1, 5):
                await core.create_namespaced_config_map(
                    "default", {"metadata": {"name": f"c{index}"}}
                )
            response = await api.call_api(
                "/api/v1/namespaces/default/configmaps",
                "GET",
                query_params=[
                    ("watch", "true"),
                    ("resourceVersion", first.metadata.resource_version),
                ],
                _preload_content=False,
                _return_http_data_only=True,
            )
            text = await response.text()
    assert '"ERROR"' in text and '"code": 410' in text


async def test_the_official_clients_watch_true_is_a_watch(emulator_kube: KubeConnection) -> None:
    """kubernetes_asyncio sends ``watch=True``; the API reads it as Go's ParseBool does."""
    async with emulator_kube.api() as api:
        core = client.CoreV1Api(api)
        stream = watch.Watch()
        seen = [
            event["object"].metadata.name
            async for event in stream.stream(core.list_namespace, timeout_seconds=1)
        ]
    assert "default" in seen
