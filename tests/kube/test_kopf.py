"""Kopf runs in a side thread against the emulator (or a real cluster) and behaves as
on a real API server: one handler run per change, its finalizer added and released,
status patched, daemons started and stopped, events posted, a clean stop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator
from tests.kube.kopf_thread import FINALIZER, OperatorThread
from tests.kube.support import Widgets, eventually
from tests.kube.toy_operator import Calls, toy_registry


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
async def operator(
    kube: KubeConnection, namespace: str, widgets: Widgets, calls: Calls
) -> AsyncIterator[OperatorThread]:
    running = OperatorThread(toy_registry(calls), kube, namespaces=[namespace])
    await running.start()
    yield running
    await running.stop()


async def handled(widgets: Widgets, name: str, size: int) -> bool:
    status = (await widgets.get(name)).get("status") or {}
    return status.get("size") == size


async def test_a_create_runs_its_handler_once_adds_the_finalizer_and_patches_status(
    operator: OperatorThread, widgets: Widgets, calls: Calls
) -> None:
    await widgets.create("w1", {"size": 1})
    await eventually(lambda: handled(widgets, "w1", 1), timeout=30)
    widget = await widgets.get("w1")
    assert FINALIZER in widget["metadata"]["finalizers"]
    assert widget["status"]["phase"] == "Ready"

    # A later change, once handled, proves every earlier event was processed too:
    # Kopf handles one object's events in order.
    await widgets.patch("w1", {"spec": {"size": 2}})
    await eventually(lambda: handled(widgets, "w1", 2), timeout=30)
    assert calls.count("create", "w1") == 1
    assert calls.count("update", "w1") == 1


async def test_a_status_write_by_someone_else_runs_no_handler(
    operator: OperatorThread, widgets: Widgets, calls: Calls
) -> None:
    await widgets.create("w1", {"size": 1})
    await eventually(lambda: handled(widgets, "w1", 1), timeout=30)
    await widgets.patch_status("w1", {"status": {"note": "from elsewhere"}})
    await widgets.patch("w1", {"spec": {"size": 5}})
    await eventually(lambda: handled(widgets, "w1", 5), timeout=30)
    assert calls.count("update", "w1") == 1


async def test_events_are_posted_for_the_object(
    operator: OperatorThread, api: client.ApiClient, widgets: Widgets, namespace: str
) -> None:
    await widgets.create("w1", {"size": 3})

    async def reasons() -> set[str]:
        found = await client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="involvedObject.name=w1"
        )
        return {event.reason for event in found.items}

    assert "Created" in await eventually(reasons, timeout=30)


async def test_deletion_stops_the_daemon_runs_the_delete_handler_and_releases_the_finalizer(
    operator: OperatorThread, widgets: Widgets, calls: Calls
) -> None:
    await widgets.create("w1", {"size": 1})
    await eventually(lambda: calls.count("daemon-started", "w1") == 1, timeout=30)
    await eventually(lambda: handled(widgets, "w1", 1), timeout=30)

    await widgets.delete("w1")

    await eventually(lambda: widgets.gone("w1"), timeout=30)
    assert calls.count("delete", "w1") == 1
    assert calls.count("daemon-stopped", "w1") == 1


async def test_a_restarted_operator_does_not_handle_what_was_handled(
    kube: KubeConnection, namespace: str, widgets: Widgets, calls: Calls
) -> None:
    first = OperatorThread(toy_registry(calls), kube, namespaces=[namespace])
    await first.start()
    await widgets.create("w1", {"size": 1})
    await eventually(lambda: handled(widgets, "w1", 1), timeout=30)
    await first.stop()

    second = OperatorThread(toy_registry(calls), kube, namespaces=[namespace])
    await second.start()
    try:
        await widgets.patch("w1", {"spec": {"size": 2}})
        await eventually(lambda: handled(widgets, "w1", 2), timeout=30)
    finally:
        await second.stop()
    assert calls.count("create", "w1") == 1
    assert calls.count("update", "w1") == 1


async def test_a_stopped_operator_leaves_no_watch_open(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection, calls: Calls
) -> None:
    running = OperatorThread(toy_registry(calls), emulator_kube, namespaces=["default"])
    await running.start()
    await eventually(lambda: emulator.watchers > 0, timeout=30)
    await running.stop()
    await eventually(lambda: emulator.watchers == 0, timeout=10)
