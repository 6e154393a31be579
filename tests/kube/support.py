"""Small helpers for API tests: the test CRD's objects, waiting for a watch event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

WIDGET_CRD = Path(__file__).parent / "crds" / "widgets.yaml"
GROUP, VERSION, PLURAL = "test.shadowpod.dev", "v1", "widgets"


async def ensure_widget_crd(api: client.ApiClient) -> None:
    """Install the tests' CRD where it is not (a real cluster); the emulator has it."""
    crds = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(WIDGET_CRD.read_text())
    try:
        await crds.read_custom_resource_definition(body["metadata"]["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise
        await crds.create_custom_resource_definition(body)
        await asyncio.sleep(2)  # a real server establishes a new CRD's names asynchronously


def _patch_type(body: Any) -> str:
    return (
        "application/json-patch+json" if isinstance(body, list) else "application/merge-patch+json"
    )


class Widgets:
    """The tests' custom resource through CustomObjectsApi, as an operator calls it."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.objects = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def create(self, name: str, spec: dict[str, Any] | None = None, **meta: Any) -> Any:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Widget",
            "metadata": {"name": name, **meta},
            "spec": spec or {},
        }
        return await self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )

    async def get(self, name: str) -> Any:
        return await self.objects.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )

    async def patch(self, name: str, body: Any) -> Any:
        """A merge patch (a dict) or a JSON patch (a list); the client picks neither well:
        it sends a dict as a JSON patch unless told, and so would fail on a real server."""
        return await self.objects.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, body, _content_type=_patch_type(body)
        )

    async def patch_status(self, name: str, body: Any) -> Any:
        return await self.objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, body, _content_type=_patch_type(body)
        )

    async def replace(self, name: str, body: Any) -> Any:
        return await self.objects.replace_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, body
        )

    async def delete(self, name: str, **options: Any) -> Any:
        return await self.objects.delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, **options
        )

    async def list(self, **options: Any) -> Any:
        return await self.objects.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, **options
        )

    async def gone(self, name: str) -> bool:
        try:
            await self.get(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False


async def eventually(
    check: Callable[[], Any], *, timeout: float = 10.0, every: float = 0.05
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"still not true after {timeout} s: {check}")
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def watching(
    list_call: Callable[..., Any], *args: Any, **kwargs: Any
) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
    """Collect (type, raw object) events of a watch in the background while the body runs."""
    events: list[tuple[str, dict[str, Any]]] = []
    stream = watch.Watch()

    async def collect() -> None:
        async for event in stream.stream(list_call, *args, **kwargs):
            events.append((event["type"], event["raw_object"]))

    task = asyncio.create_task(collect())
    try:
        yield events
    finally:
        stream.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


OPERATOR_CRDS = Path(__file__).parents[2] / "crds"


async def ensure_operator_crds(api: client.ApiClient, timeout: float = 60) -> None:
    """The operator's CRDs (crds/) on a real cluster, as this checkout has them (a CRD
    there already is replaced), each Established; the emulator serves them itself."""
    crds = client.ApiextensionsV1Api(api)
    for path in sorted(OPERATOR_CRDS.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        try:
            found = await crds.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            await crds.create_custom_resource_definition(body)
        else:
            body["metadata"]["resourceVersion"] = found.metadata.resource_version
            await crds.replace_custom_resource_definition(name, body)

        async def established(name: str = name) -> bool:
            crd = await crds.read_custom_resource_definition(name)
            return any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or [])
            )

        await eventually(established, timeout=timeout)
