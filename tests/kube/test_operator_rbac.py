"""The operator's own API requests, recorded in an emulator run, against the chart's
RBAC: every verb on every resource the operator asked for in a session's life (made,
Running, an image bump moved live, deleted) is granted to its ServiceAccount by the
roles the chart renders for an operator watching that namespace (``-n default``, as
the suite runs it: ``operator.watchNamespaces``). A verb the chart misses fails here, in
`make test`, not only in `make cluster-test`, where the real API server answers 403."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from shadowpod.kube.models.v1alpha1 import GROUP
from tests.chart.conftest import render
from tests.chart.helm import RELEASE, Rendered
from tests.kube.connection import KubeConnection
from tests.kube.emulator import ApiServerEmulator, paths
from tests.kube.kubelet import Kubelet
from tests.kube.operator_world import World, bump, session_manifest, world_of
from tests.kube.support import eventually

# The emulator's request log, the operator's requests told apart by the token it is
# given: no real-cluster variant (there, make cluster-test runs the operator under the
# chart's RBAC itself, and a missing verb is a 403).
pytestmark = pytest.mark.timeout(300)

OPERATOR_ACCOUNT = f"{RELEASE}-shadowpod-operator"
OPERATOR_TOKEN = "shadowpod-operator-under-test"
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
# Kopf lists and watches namespaces when given some, and carries on with the names it
# was given when that is forbidden (kopf._core.reactor.observation): asked, not needed.
OPTIONAL = frozenset({("list", "", "namespaces", None), ("watch", "", "namespaces", None)})
Asked = tuple[str, str, str, str | None]


def _as_operator(kube: KubeConnection, directory: Path) -> KubeConnection:
    """The same emulator, with a token only the operator's requests carry."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "tests", "user": {"token": OPERATOR_TOKEN}}]
    path = directory / "operator-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return KubeConnection(path)


def _asked(emulator: ApiServerEmulator) -> set[Asked]:
    """(verb, API group, resource[/subresource], namespace) of each operator request."""
    asked = set()
    for request in emulator:
        if request.headers.get("Authorization") != f"Bearer {OPERATOR_TOKEN}":
            continue
        api = paths.parse(request.url.path)
        if api is None or api.plural is None:
            continue  # discovery, /version: every authenticated user may
        if request.method == "GET":
            watch = paths.truthy(request.params.get("watch"))
            verb = "watch" if watch else ("get" if api.name else "list")
        elif request.method == "DELETE" and api.name is None:
            verb = "deletecollection"
        else:
            verb = VERBS[request.method]
        resource = api.plural + (f"/{api.subresource}" if api.subresource else "")
        asked.add((verb, api.group, resource, api.namespace))
    return asked


def _operator_rules(rendered: Rendered) -> list[tuple[dict[str, Any], str | None]]:
    """The rules bound to the operator's ServiceAccount, each with the namespace it holds
    in (a RoleBinding's), or ``None`` for everywhere (a ClusterRoleBinding's)."""
    roles = {
        (r["kind"], r["metadata"]["name"]): r
        for k in ("ClusterRole", "Role")
        for r in rendered.all(k)
    }
    bound = []
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in rendered.all(kind):
            if not any(
                s["kind"] == "ServiceAccount" and s["name"] == OPERATOR_ACCOUNT
                for s in binding.get("subjects") or []
            ):
                continue
            ref = binding["roleRef"]
            for rule in roles[(ref["kind"], ref["name"])]["rules"]:
                where = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
                bound.append((rule, where))
    return bound


def _granted(
    rules: list[tuple[dict[str, Any], str | None]],
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
) -> bool:
    for rule, where in rules:
        if where is not None and where != namespace:
            continue
        if rule.get("resourceNames"):
            continue  # named objects only: not what a list, a watch or a create asks
        if (
            {group, "*"} & set(rule.get("apiGroups") or [])
            and {resource, "*"} & set(rule.get("resources") or [])
            and {verb, "*"} & set(rule.get("verbs") or [])
        ):
            return True
    return False


async def test_every_request_the_operator_makes_is_granted_by_the_charts_rbac(
    emulator: ApiServerEmulator, emulator_kube: KubeConnection, kubelet: Kubelet, tmp_path: Path
) -> None:
    async for world in world_of(emulator_kube, "default", tmp_path, nodes=kubelet):
        world.kube = _as_operator(emulator_kube, tmp_path)  # the operator's, not the test's
        await world.start_operator()
        await _a_session_life(world)
    asked = _asked(emulator)
    # The run did what it is meant to check: the operator wrote pods and statuses.
    assert ("create", "", "pods", "default") in asked, sorted(asked)
    assert ("patch", GROUP, "agentsessions/status", "default") in asked, sorted(asked)
    (tmp_path / "chart").mkdir()
    values = {"operator": {"watchNamespaces": ["default"]}}
    rules = _operator_rules(await render(values, tmp_path / "chart"))
    missing = sorted(a for a in asked - OPTIONAL if not _granted(rules, *a))
    assert missing == [], f"requests the chart's RBAC does not grant the operator: {missing}"


async def _a_session_life(world: World) -> None:
    await world.apply(session_manifest("r1"))
    await world.wait_running("r1", epoch=1)
    migration = await world.wait_finished(await bump(world, "r1", "refagent:v2"))
    assert migration["status"]["result"] == "Succeeded", migration["status"].get("message")
    await world.wait_settled("r1", epoch=2)
    await world.raw.delete(world.path("agentsessions", "r1"))
    await eventually(lambda: _gone(world, "r1"), timeout=60)


async def _gone(world: World, name: str) -> bool:
    return await world.raw.get(world.path("agentsessions", name)) is None
