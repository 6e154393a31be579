"""A tiny Kopf operator of the tests' Widget resource: what the Kopf fixture must
carry for the real operator — handlers run once per change, a finalizer added and
released, status patched, a daemon started and stopped, events posted."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import kopf

from tests.kube.support import GROUP, PLURAL, VERSION


class Calls:
    """What the handlers did, counted across the operator's thread and the test's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: Counter[tuple[str, str]] = Counter()

    def record(self, what: str, name: str) -> None:
        with self._lock:
            self._seen[what, name] += 1

    def count(self, what: str, name: str) -> int:
        with self._lock:
            return self._seen[what, name]


def toy_registry(calls: Calls) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def create_widget(
        spec: kopf.Spec, name: str, body: kopf.Body, patch: kopf.Patch, **_: Any
    ) -> None:
        calls.record("create", name)
        patch.status["phase"] = "Ready"
        patch.status["size"] = spec.get("size", 0)
        kopf.info(body, reason="Created", message=f"widget {name} of size {spec.get('size')}")

    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    def update_widget(new: Any, name: str, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        calls.record("update", name)
        patch.status["size"] = (new or {}).get("size", 0)
        kopf.info(body, reason="Resized", message=f"now {patch.status['size']}")

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def delete_widget(name: str, **_: Any) -> None:
        calls.record("delete", name)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=5)
    async def watch_widget(stopped: kopf.DaemonStopped, name: str, **_: Any) -> None:
        calls.record("daemon-started", name)
        await stopped.wait()
        calls.record("daemon-stopped", name)

    return registry
