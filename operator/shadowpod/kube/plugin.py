"""What ``kubectl shadowpod`` reads and writes, without rendering (``cli.kubectl`` draws
the tables and the progress bar): sessions, migrations, a new migration, a cancel, the
answers an upgrade gate compared, and an AgentDeployment's rollout (status, pause,
resume, abort, history)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config

from shadowpod.kube import answers, names
from shadowpod.kube.api import KubeApi, namespaced
from shadowpod.kube.models.v1alpha1 import API_VERSION
from shadowpod.kube.models.v1alpha1.deployment import (
    ABORT_ANNOTATION,
    DEPLOYMENT_LABEL,
    RESUME_ANNOTATION,
)


@dataclass(frozen=True)
class Target:
    kubeconfig: str | None
    context: str | None
    namespace: str | None


class KubeconfigUnusable(Exception):
    """No kubeconfig, or one that names no usable cluster: says which file and what to do."""


def _any_file(paths: str) -> bool:
    """Whether any of KUBECONFIG's files (``:``-separated) is there: a stat, once."""
    return any(os.path.isfile(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


@asynccontextmanager
async def connect(target: Target) -> AsyncIterator[tuple[KubeApi, str]]:
    """The API and the namespace to use (the flag's, else the kubeconfig context's)."""
    configuration = client.Configuration()
    where = target.kubeconfig or "~/.kube/config"
    if not _any_file(where):
        raise KubeconfigUnusable(
            f"no kubeconfig at {where}: give one with --kubeconfig or KUBECONFIG (kubectl's "
            "own works), and --context to pick a context"
        )
    try:
        await kube_config.load_kube_config(
            config_file=target.kubeconfig,
            context=target.context,
            client_configuration=configuration,
            persist_config=False,
        )
        _, active = kube_config.list_kube_config_contexts(config_file=target.kubeconfig)
    except (kube_config.ConfigException, OSError) as exc:
        raise KubeconfigUnusable(
            f"no usable kubeconfig ({where}: {exc}): give one with --kubeconfig or "
            "KUBECONFIG, and --context to pick a context"
        ) from None
    namespace = target.namespace
    if namespace is None:
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    async with client.ApiClient(configuration) as api:
        yield KubeApi(api), namespace


async def sessions(api: KubeApi, namespace: str, name: str | None) -> list[dict[str, Any]]:
    if name is not None:
        found = await api.get(namespaced("agentsessions", namespace, name))
        return [] if found is None else [found]
    return await api.list(namespaced("agentsessions", namespace))


async def history(api: KubeApi, namespace: str, session: str) -> list[dict[str, Any]]:
    listed = await api.list(namespaced("agentmigrations", namespace))
    mine = [m for m in listed if m["spec"]["sessionRef"]["name"] == session]
    return sorted(mine, key=lambda m: m["metadata"].get("creationTimestamp", ""))


async def migrate(
    api: KubeApi,
    namespace: str,
    session: str,
    *,
    image: str | None,
    node: str | None,
    reason: str = "Manual",
) -> dict[str, Any]:
    """A new AgentMigration of ``session`` (same image and any other node by default)."""
    body = await api.get(namespaced("agentsessions", namespace, session))
    if body is None:
        raise LookupError(f"AgentSession {session!r} not found in namespace {namespace!r}")
    target: dict[str, str] = {}
    if image is not None:
        target["image"] = image
    if node is not None:
        target["nodeName"] = node
    if not target:  # a move: the same image, wherever the scheduler puts it
        target["image"] = (body.get("status") or {}).get("image") or body["spec"].get("image")
        if not target["image"]:
            raise LookupError(f"AgentSession {session!r} runs no image yet: give --image")
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "AgentMigration",
        "metadata": {
            "name": f"{session}-m{int(time.time())}",
            "namespace": namespace,
            "labels": {names.SESSION_LABEL: session},
        },
        "spec": {"sessionRef": {"name": session}, "target": target, "reason": reason},
    }
    return await api.create(namespaced("agentmigrations", namespace), manifest)


async def fork(
    api: KubeApi,
    namespace: str,
    parent: str,
    name: str,
    *,
    seq: int | None,
    snapshot: int | None,
    image: str | None = None,
) -> dict[str, Any]:
    """A new AgentSession ``name``: the parent's spec (running; on ``image`` if given),
    started as a fork of the parent at ``seq`` or at its snapshot ``snapshot``."""
    body = await api.get(namespaced("agentsessions", namespace, parent))
    if body is None:
        raise LookupError(f"AgentSession {parent!r} not found in namespace {namespace!r}")
    spec = {
        k: v for k, v in body["spec"].items() if k not in ("forkFrom", "operatingMode", "pinned")
    }
    point: dict[str, Any] = {"session": parent}
    point.update({"seq": seq} if seq is not None else {"snapshot": snapshot})
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "AgentSession",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**spec, **({"image": image} if image else {}), "forkFrom": point},
    }
    return await api.create(namespaced("agentsessions", namespace), manifest)


async def migration(api: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    return await api.get(namespaced("agentmigrations", namespace, name))


async def cancel(api: KubeApi, namespace: str, name: str) -> bool:
    return await api.delete(namespaced("agentmigrations", namespace, name))


async def pods(api: KubeApi, namespace: str, session: str) -> list[dict[str, Any]]:
    return await api.list(namespaced("pods", namespace), labels=names.session_selector(session))


async def validation_answers(
    api: KubeApi, namespace: str, name: str
) -> tuple[dict[str, Any], answers.Answers | None]:
    """The migration ``name`` and the answers its upgrade gate compared, if any."""
    found = await migration(api, namespace, name)
    if found is None:
        raise LookupError(f"AgentMigration {name!r} not found in namespace {namespace!r}")
    return found, await answers.load(api, namespace, name)


async def deployment(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    found = await api.get(namespaced("agentdeployments", namespace, name))
    if found is None:
        raise LookupError(f"AgentDeployment {name!r} not found in namespace {namespace!r}")
    return found


async def pause(api: KubeApi, namespace: str, name: str, *, paused: bool = True) -> None:
    """``spec.paused``, as ``kubectl rollout pause`` sets a Deployment's."""
    await deployment(api, namespace, name)
    path = namespaced("agentdeployments", namespace, name)
    await api.patch(path, {"spec": {"paused": paused}})


async def resume(api: KubeApi, namespace: str, name: str) -> int:
    """Unpause, and raise the resume count: the operator ends a pause step or lifts a
    halt once for each new count. Returns the count asked for."""
    body = await deployment(api, namespace, name)
    annotations = body["metadata"].get("annotations") or {}
    try:
        count = int(annotations.get(RESUME_ANNOTATION, "0")) + 1
    except ValueError:
        count = 1
    observed = ((body.get("status") or {}).get("observedResumes")) or 0
    count = max(count, int(observed) + 1)
    await api.patch(
        namespaced("agentdeployments", namespace, name),
        {
            "metadata": {"annotations": {RESUME_ANNOTATION: str(count)}},
            "spec": {"paused": False},
        },
    )
    return count


async def abort(api: KubeApi, namespace: str, name: str) -> int:
    """Abort the current revision: its upgraded sessions move back. Returns it."""
    body = await deployment(api, namespace, name)
    revision = int((body.get("status") or {}).get("revision") or 0)
    if revision == 0:
        raise LookupError(f"AgentDeployment {name!r} has no rollout to abort yet")
    await api.patch(
        namespaced("agentdeployments", namespace, name),
        {"metadata": {"annotations": {ABORT_ANNOTATION: str(revision)}}},
    )
    return revision


async def rollout_history(api: KubeApi, namespace: str, name: str) -> list[dict[str, Any]]:
    """The migrations the deployment's rollouts made, oldest first."""
    await deployment(api, namespace, name)
    listed = await api.list(
        namespaced("agentmigrations", namespace), labels={DEPLOYMENT_LABEL: names.label_value(name)}
    )
    return sorted(
        listed, key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"]["name"])
    )
