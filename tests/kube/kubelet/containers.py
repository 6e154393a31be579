"""What a container is given: its command, its environment (values, Secret and
ConfigMap keys, fields of its pod, ``$(VAR)`` references) and its volumes as files.

A local process has no mount namespace: a volume's files are written under the pod's
directory, and every mount path (and the termination message path) at the start of
an argument or an environment value is rewritten to where its files are. A container
therefore finds its files at the paths its manifest names, as in a real pod.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shadowpod.local.images import ImageMap, LocalImage

Lookup = Callable[[str, str], Mapping[str, Any] | None]  # (plural, name) -> object or None
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR", "SHADOWPOD_EXAMPLES")


class NotReadyToStart(Exception):
    """The container cannot start yet: ``reason`` and ``message`` go into its status."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def field_of(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API field: metadata.name, metadata.labels['x'], status.podIP …"""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str((pod["metadata"].get(match[1]) or {}).get(match[2], ""))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        raise NotReadyToStart("CreateContainerConfigError", f"unsupported field path {path!r}")
    return str(value)


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names replaced, ``$$`` escapes a ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REFERENCE.sub(replace, text)


def _decoded(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


def _required(lookup: Lookup, plural: str, name: str, optional: bool) -> Mapping[str, Any] | None:
    found = lookup(plural, name)
    if found is None and not optional:
        kind = "secret" if plural == "secrets" else "configmap"
        raise NotReadyToStart("CreateContainerConfigError", f'{kind} "{name}" not found')
    return found


def environment(
    pod: Mapping[str, Any], container: Mapping[str, Any], image: LocalImage | None, lookup: Lookup
) -> dict[str, str]:
    """The container's environment: a local image's (with this machine's basics, PATH
    …) under the pod's; with ``image`` ``None`` (a Docker container, whose image brings
    its own), the pod's alone."""
    env: dict[str, str] = {}
    if image is not None:
        env.update({key: os.environ[key] for key in BASE_ENV if key in os.environ})
        env.update(image.env)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "secretRef" in source:
            ref = source["secretRef"]
            found = _required(lookup, "secrets", ref["name"], ref.get("optional", False))
            for key, value in _decoded(found or {}).items():
                env[prefix + key] = value.decode()
        if "configMapRef" in source:
            ref = source["configMapRef"]
            found = _required(lookup, "configmaps", ref["name"], ref.get("optional", False))
            for key, text in ((found or {}).get("data") or {}).items():
                env[prefix + key] = text
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            found = _required(lookup, "secrets", ref["name"], ref.get("optional", False))
            data = _decoded(found or {})
            if ref["key"] in data:
                env[name] = data[ref["key"]].decode()
            elif found is not None and not ref.get("optional", False):
                raise NotReadyToStart(
                    "CreateContainerConfigError",
                    f"couldn't find key {ref['key']} in Secret {pod['metadata']['namespace']}/"
                    f"{ref['name']}",
                )
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            found = _required(lookup, "configmaps", ref["name"], ref.get("optional", False))
            value = ((found or {}).get("data") or {}).get(ref["key"])
            if value is not None:
                env[name] = value
        elif "fieldRef" in source:
            env[name] = field_of(pod, source["fieldRef"]["fieldPath"])
        else:
            env[name] = ""
    return env


def command(container: Mapping[str, Any], image: LocalImage, env: Mapping[str, str]) -> list[str]:
    """``command`` replaces the image's entrypoint; ``args`` alone follow the image's."""
    if container.get("command"):
        argv = list(container["command"]) + list(container.get("args") or [])
    else:
        argv = list(image.command) + list(container.get("args") or [])
    return [expand(str(part), env) for part in argv]


def write_volumes(pod: Mapping[str, Any], root: Path, lookup: Lookup) -> dict[str, Path]:
    """Every volume of the pod as a directory of files; {volume name: its directory}."""
    written: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        directory = root / "volumes" / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {}
        if "secret" in volume:
            files.update(_secret_files(volume["secret"], lookup))
        elif "configMap" in volume:
            files.update(_config_map_files(volume["configMap"], lookup))
        elif "downwardAPI" in volume:
            files.update(_downward_files(volume["downwardAPI"], pod))
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                if "secret" in source:
                    files.update(_secret_files(source["secret"], lookup))
                if "configMap" in source:
                    files.update(_config_map_files(source["configMap"], lookup))
                if "downwardAPI" in source:
                    files.update(_downward_files(source["downwardAPI"], pod))
        for relative, content in files.items():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.tmp")
            temporary.write_bytes(content)
            temporary.chmod(0o600)
            temporary.replace(target)
        written[volume["name"]] = directory
    return written


def _select(items: list[Mapping[str, Any]] | None, data: Mapping[str, bytes]) -> dict[str, bytes]:
    if not items:
        return dict(data)
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def _secret_files(source: Mapping[str, Any], lookup: Lookup) -> dict[str, bytes]:
    name = source.get("secretName") or source.get("name") or ""
    found = _required(lookup, "secrets", name, source.get("optional", False))
    return _select(source.get("items"), _decoded(found or {}))


def _config_map_files(source: Mapping[str, Any], lookup: Lookup) -> dict[str, bytes]:
    found = _required(lookup, "configmaps", source["name"], source.get("optional", False))
    data = {key: text.encode() for key, text in ((found or {}).get("data") or {}).items()}
    return _select(source.get("items"), data)


def _downward_files(source: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, bytes]:
    files = {}
    for item in source.get("items") or []:
        if "fieldRef" in item:
            files[item["path"]] = field_of(pod, item["fieldRef"]["fieldPath"]).encode()
    return files


def mounts(
    container: Mapping[str, Any], volumes: Mapping[str, Path], termination_log: Path
) -> dict[str, str]:
    """{path inside the container: path here}, longest first (the most specific wins)."""
    found = {container.get("terminationMessagePath", "/dev/termination-log"): str(termination_log)}
    for mount in container.get("volumeMounts") or []:
        source = volumes.get(mount["name"])
        if source is None:
            raise NotReadyToStart(
                "CreateContainerConfigError",
                f"volume {mount['name']!r} is not in the pod's volumes",
            )
        here = source / mount["subPath"] if mount.get("subPath") else source
        found[mount["mountPath"].rstrip("/")] = str(here)
    return dict(sorted(found.items(), key=lambda item: -len(item[0])))


def rewrite(text: str, table: Mapping[str, str]) -> str:
    for inside, here in table.items():
        if text == inside or text.startswith(inside + "/"):
            return here + text[len(inside) :]
        for separator in ("=", ":"):  # --flag=/path, HOST:/path
            marker = separator + inside
            if marker in text:
                head, _, tail = text.partition(marker)
                if not tail or tail.startswith("/"):
                    return head + separator + here + tail
    return text


def resolve_image(images: ImageMap, name: str) -> LocalImage:
    try:
        return images.resolve(name)
    except Exception as exc:
        raise NotReadyToStart("ErrImagePull", str(exc)) from exc
