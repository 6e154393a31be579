"""API paths: ``/api/v1/namespaces/ns/pods/name/status`` → group, version, plural,
namespace, name, subresource. kmock 0.8's own parser fails on ``/api/v1/namespaces``
and reads ``/api/v1/namespaces/ns/status`` as a resource named ``status``."""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
TRUE_WORDS = frozenset({"1", "t", "T", "true", "TRUE", "True"})  # Go's strconv.ParseBool


@dataclass(frozen=True)
class ApiPath:
    group: str
    version: str | None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse(path: str) -> ApiPath | None:
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) == 2 and parts[0] == "apis":
        return ApiPath(parts[1], None)  # a group's discovery document
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return ApiPath(group, version)
    return ApiPath(
        group,
        version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource="/".join(rest[2:]) or None,
    )


def truthy(value: str | None) -> bool:
    return value in TRUE_WORDS
