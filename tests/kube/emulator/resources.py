"""What the emulated API server serves: the built-in kinds an operator and its tests
use, and every version of every CustomResourceDefinition stored in it (loaded from a
directory of YAML files at start, or created through the API later, as on a real
server)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

ALL_VERBS = frozenset(
    {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
)


@dataclass(frozen=True)
class ServedResource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    subresources: frozenset[str] = frozenset()
    short_names: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()
    strategic_merge: bool = False  # built-in kinds accept strategic merge patches
    crd: str | None = None  # the CustomResourceDefinition that serves it
    storage_version: str = ""  # objects are kept once, under the storage version
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @functools.cached_property
    def key(self) -> kmock.resource:
        """The resource its objects are stored under (one storage version for all).
        Cached: building a ``kmock.resource`` is slow, and every read asks for it."""
        return kmock.resource(self.group, self.storage_version or self.version, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def info(self) -> kmock.ResourceInfo:
        return kmock.ResourceInfo(
            namespaced=self.namespaced,
            kind=self.kind,
            singular=self.singular or self.kind.lower(),
            verbs=set(ALL_VERBS),
            shortnames=set(self.short_names),
            categories=set(self.categories),
            subresources=set(self.subresources),
        )


def _builtin(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool = True,
    subresources: Iterable[str] = (),
    short_names: Iterable[str] = (),
) -> ServedResource:
    return ServedResource(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        subresources=frozenset(subresources),
        short_names=frozenset(short_names),
        # CustomResourceDefinitions too (a compiled-in kind: Helm patches them so); only
        # custom resources refuse strategic merge patches.
        strategic_merge=True,
    )


BUILTINS: tuple[ServedResource, ...] = (
    _builtin(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        subresources=["status"],
        short_names=["ns"],
    ),
    _builtin(
        "", "v1", "nodes", "Node", namespaced=False, subresources=["status"], short_names=["no"]
    ),
    _builtin(
        "",
        "v1",
        "pods",
        "Pod",
        subresources=["status", "binding", "eviction", "log"],
        short_names=["po"],
    ),
    _builtin("", "v1", "bindings", "Binding"),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
    _builtin("", "v1", "services", "Service", subresources=["status"], short_names=["svc"]),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
    _builtin("", "v1", "events", "Event", short_names=["ev"]),
    _builtin(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        subresources=["status"],
        short_names=["pvc"],
    ),
    _builtin("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
    _builtin(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        subresources=["status"],
        short_names=["pdb"],
    ),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease"),
    _builtin(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        subresources=["status", "scale"],
        short_names=["deploy"],
    ),
    _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=["netpol"]),
    # RBAC (the Helm chart's tests install it; nothing enforces it here).
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        subresources=["status"],
        short_names=["crd", "crds"],
    ),
)


def from_crd(crd: Mapping[str, Any]) -> list[ServedResource]:
    """The resources a CRD serves: one per served version, stored under the storage one."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [version for version in spec["versions"] if version.get("served", True)]
    storage = next(
        (version["name"] for version in spec["versions"] if version.get("storage")),
        spec["versions"][0]["name"],
    )
    return [
        ServedResource(
            group=spec["group"],
            version=version["name"],
            plural=names["plural"],
            kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            subresources=frozenset(version.get("subresources") or {}),
            short_names=frozenset(names.get("shortNames") or []),
            categories=frozenset(names.get("categories") or []),
            crd=crd["metadata"]["name"],
            storage_version=storage,
            schema=(version.get("schema") or {}).get("openAPIV3Schema"),
        )
        for version in versions
    ]


def crd_problems(crd: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What makes a CRD unacceptable, as (field, problem); empty when it is fine."""
    problems: list[tuple[str, str]] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for field_name in ("group",):
        if not spec.get(field_name):
            problems.append((f"spec.{field_name}", "Required value"))
    for field_name in ("plural", "kind"):
        if not names.get(field_name):
            problems.append((f"spec.names.{field_name}", "Required value"))
    if not spec.get("versions"):
        problems.append(("spec.versions", "Required value: at least one version"))
    elif sum(1 for version in spec["versions"] if version.get("storage")) != 1:
        problems.append(("spec.versions", "Invalid value: exactly one storage version"))
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if crd.get("metadata", {}).get("name") != expected:
        problems.append(
            (
                "metadata.name",
                f'Invalid value: must be spec.names.plural+"."+spec.group ({expected})',
            )
        )
    return problems
