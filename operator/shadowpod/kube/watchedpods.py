"""The sessions' pods as the operator's pod watch last showed them, kept small.

Kopf already watches every pod with a session label (``handlers.pod_changed``); a
session pass used to read its owner pod again with a GET, one request per pass per
session — the larger part of what an image bump under load costs before its
AgentMigration exists. A pass reads the pod here instead, as an informer's cache is
read, and asks the API only for a pod the watch has not shown yet (one it has just
made). What a stale entry can do is bounded by the watch itself: the event that makes
it stale (ready, not ready, deleted) is also the one that runs the session's next pass.

Each pod is kept as the few fields a pass reads, in the pod's own shape (so the
helpers that read a pod read either): at 10,000 sessions a whole pod each would be the
operator's largest memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shadowpod.kube import names


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What a session pass reads of ``pod``: its name, labels, deletion, agent container's
    image, node, phase and Ready condition."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = spec.get("containers") or []
    agent = next((c for c in containers if c.get("name") == names.AGENT_CONTAINER), None)
    agent = agent or (containers[0] if containers else {})
    kept_meta = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    if meta.get("deletionTimestamp"):
        kept_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    if meta.get("labels"):
        kept_meta["labels"] = dict(meta["labels"])
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": kept_meta,
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [{"name": agent.get("name"), "image": agent.get("image")}],
        },
        "status": {"phase": status.get("phase"), "conditions": [dict(c) for c in ready]},
    }


class WatchedPods:
    """Pods by (namespace, name), as their last watch event showed them."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}

    def seen(self, pod: Mapping[str, Any], *, gone: bool) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if gone:
            self._pods.pop(key, None)
        else:
            self._pods[key] = slim(pod)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._pods.get((namespace, name))

    def __len__(self) -> int:
        return len(self._pods)
