"""The objects, and every write to them as the API server makes it: server-side
fields, resourceVersion preconditions, generation, the status subresource, graceful
and finalizer-blocked deletion. Writes are synchronous (no ``await`` inside), so each
is atomic on the emulator's event loop; every one is published to the watch cache.

Objects live in kmock's ``ObjectsArray`` (``emulator.objects[...]``), one history per
object, trimmed to its last few versions; a deleted object leaves it.
"""

from __future__ import annotations

import copy
import datetime
import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kmock

from tests.kube.emulator import errors, kinds, patching
from tests.kube.emulator.resources import ServedResource
from tests.kube.emulator.watching import Change, WatchCache

Key = tuple[kmock.resource, str | None, str]
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_SERVER_FIELDS = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def now(offset_s: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What ``metadata.generation`` counts changes of: all but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


def _rv_of(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    return meta.get("resourceVersion") if isinstance(meta, Mapping) else None


class ObjectStore:
    def __init__(self, objects: kmock.ObjectsArray, cache: WatchCache, history_limit: int):
        self.objects = objects
        self.cache = cache
        self.history_limit = max(1, history_limit)
        self.rv = 0
        self.uids: dict[str, Key] = {}
        # The keys of each resource's objects, in creation order: a list reads only its
        # own kind, not every object stored (thousands, in the operator's benchmark).
        self._keys: dict[kmock.resource, dict[Key, None]] = {}
        self.observers: list[Callable[[Change], None]] = []  # the controllers

    # --- reading ----------------------------------------------------------------------

    def get(self, served: ServedResource, namespace: str | None, name: str) -> dict[str, Any]:
        key = (served.key, namespace if served.namespaced else None, name)
        if key not in self.objects:
            raise errors.not_found(served.plural, name, served.group)
        return self.objects[key].raw

    def find(
        self, served: ServedResource, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        key = (served.key, namespace if served.namespaced else None, name)
        return self.objects[key].raw if key in self.objects else None

    def all_of(
        self, served: ServedResource, namespace: str | None = None
    ) -> Iterator[dict[str, Any]]:
        for key in list(self._keys.get(served.key, ())):
            if namespace is None or key[1] == namespace:
                yield self.objects[key].raw

    def everything(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        for key, entry in list(self.objects.items()):
            yield key, entry.raw

    # --- writing ----------------------------------------------------------------------

    def create(self, served: ServedResource, namespace: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, Mapping):
            raise errors.bad_request(f"the body of a create must be a {served.kind} object")
        obj = copy.deepcopy(dict(body))
        self._check_type(served, obj)
        obj["apiVersion"], obj["kind"] = served.api_version, served.kind
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if served.namespaced:
            if not namespace:
                raise errors.bad_request(
                    f"{served.plural} are namespaced: create them under /namespaces/<namespace>/"
                )
            if meta.get("namespace") not in (None, "", namespace):
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    f"on the request ({meta['namespace']!r} vs {namespace!r})"
                )
            self._check_namespace_open(namespace)
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise errors.invalid(
                    served.kind,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                    served.group,
                )
            meta["name"] = self._generate_name(served, meta.get("namespace"), prefix)
        kinds.check_name(served, meta["name"])
        kinds.check_labels(served, meta["name"], meta)
        key: Key = (served.key, meta.get("namespace"), meta["name"])
        if key in self.objects:
            raise errors.already_exists(served.plural, meta["name"], served.group)
        for field in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
            "resourceVersion",
        ):
            meta.pop(field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        kinds.prepare_create(served, obj)
        return self._commit(served, key, obj, None)

    def replace(
        self,
        served: ServedResource,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None,
    ) -> dict[str, Any]:
        current = self.get(served, namespace, name)
        if not isinstance(body, Mapping):
            raise errors.bad_request(f"the body of an update must be a {served.kind} object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        self._check_type(served, dict(body))
        return self._update(served, current, copy.deepcopy(dict(body)), subresource)

    def patch(
        self,
        served: ServedResource,
        namespace: str | None,
        name: str,
        content_type: str,
        body: Any,
        subresource: str | None,
    ) -> dict[str, Any]:
        current = self.get(served, namespace, name)
        media = content_type.split(";")[0].strip().lower()
        supported = [patching.JSON, patching.MERGE]
        if served.strategic_merge:
            supported.append(patching.STRATEGIC)
        if media not in supported:
            raise errors.unsupported_media_type(media, supported)
        try:
            if media == patching.JSON:
                patched = patching.json_patch(current, body)
            elif not isinstance(body, Mapping):
                raise errors.bad_request(f"a {media} patch must be a JSON object")
            elif media == patching.MERGE:
                patched = patching.merge_patch(current, body)
            else:
                patched = patching.strategic_merge_patch(current, body)
        except patching.PatchError as exc:
            raise errors.invalid(served.kind, name, [("patch", str(exc))], served.group) from exc
        return self._update(served, current, patched, subresource)

    def write_status(
        self, served: ServedResource, current: dict[str, Any], status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A controller's own status write (PDB status, CRD conditions)."""
        return self._update(served, current, {**current, "status": dict(status)}, "status")

    def bind(self, served: ServedResource, current: dict[str, Any], node: str) -> dict[str, Any]:
        """The scheduler's binding: the one way ``spec.nodeName`` is set after creation."""
        name = current["metadata"]["name"]
        if current["metadata"].get("deletionTimestamp"):
            raise errors.conflict(served.plural, name, why="the pod is being deleted")
        bound = (current.get("spec") or {}).get("nodeName")
        if bound:
            raise errors.conflict(
                served.plural, name, why=f"pod {name} is already assigned to node {bound!r}"
            )
        new = copy.deepcopy(current)
        new["spec"]["nodeName"] = node
        conditions = [
            c
            for c in new.get("status", {}).get("conditions") or []
            if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": now(),
                "lastProbeTime": None,
            }
        )
        new.setdefault("status", {})["conditions"] = conditions
        return self._commit(served, self._key(served, current), new, current)

    def delete(
        self,
        served: ServedResource,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any],
    ) -> tuple[dict[str, Any], bool]:
        """Delete as the API does; returns the object and whether it is gone already."""
        current = self.get(served, namespace, name)
        meta = current["metadata"]
        preconditions = options.get("preconditions") or {}
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = preconditions.get(field)
            if wanted is not None and wanted != meta.get(field):
                raise errors.conflict(
                    served.plural,
                    name,
                    served.group,
                    f"Precondition failed: {label} in precondition: {wanted}, {label} in object "
                    f"meta: {meta.get(field)}",
                )
        new = copy.deepcopy(current)
        new_meta = new["metadata"]
        if served.plural == "namespaces":
            new["status"] = {**(new.get("status") or {}), "phase": "Terminating"}
        grace = self._grace(served, current, options)
        if grace > 0:
            deadline = now(grace)
            if not meta.get("deletionTimestamp") or deadline < meta["deletionTimestamp"]:
                if not meta.get("deletionTimestamp"):
                    new_meta["generation"] = meta.get("generation", 1) + 1
                new_meta["deletionTimestamp"] = deadline
                new_meta["deletionGracePeriodSeconds"] = grace
            if new == current:
                return current, False
            return self._commit(served, self._key(served, current), new, current), False
        if not meta.get("deletionTimestamp"):
            new_meta["generation"] = meta.get("generation", 1) + 1
            new_meta["deletionTimestamp"] = now()
        new_meta["deletionGracePeriodSeconds"] = 0
        if self._may_go(served, new):
            return self._remove(served, self._key(served, current), current), True
        if new == current:
            return current, False
        return self._commit(served, self._key(served, current), new, current), False

    # --- internals --------------------------------------------------------------------

    def _update(
        self,
        served: ServedResource,
        current: dict[str, Any],
        proposed: dict[str, Any],
        subresource: str | None,
    ) -> dict[str, Any]:
        name = current["metadata"]["name"]
        wanted_rv = _rv_of(proposed)
        if wanted_rv and wanted_rv != _rv_of(current):
            raise errors.conflict(served.plural, name, served.group)
        if subresource == "status":
            new = copy.deepcopy(current)
            if proposed.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = copy.deepcopy(proposed["status"])
        elif subresource is None:
            new = proposed
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                meta = new["metadata"] = {}
            for field in _SERVER_FIELDS:
                if field in current["metadata"]:
                    meta[field] = current["metadata"][field]
                else:
                    meta.pop(field, None)
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
            if served.has_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            kinds.check_labels(served, name, meta)
            kinds.prepare_update(served, current, new)
            if _spec_part(new) != _spec_part(current):
                meta["generation"] = current["metadata"].get("generation", 1) + 1
        else:
            raise errors.method_not_allowed("an update", f"{served.plural}/{subresource}")
        key = self._key(served, current)
        if self._may_go(served, new):
            return self._remove(served, key, new)
        if new == current:
            return current  # a no-op write: no new resourceVersion, no watch event
        return self._commit(served, key, new, current)

    def _commit(
        self, served: ServedResource, key: Key, new: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        if old is None:
            self.objects[key] = new
            self.uids[new["metadata"]["uid"]] = key
            self._keys.setdefault(key[0], {})[key] = None
        else:
            history = self.objects[key].history
            history.append(new)
            if len(history) > self.history_limit:
                del history[: len(history) - self.history_limit]
        self._publish(Change(self.rv, served.key, "ADDED" if old is None else "MODIFIED", new, old))
        return new

    def _remove(self, served: ServedResource, key: Key, last: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        final = copy.deepcopy(last)
        final["metadata"]["resourceVersion"] = str(self.rv)
        old = self.objects[key].raw
        del self.objects[key]
        self._keys[key[0]].pop(key, None)
        self.uids.pop(final["metadata"].get("uid", ""), None)
        self._publish(Change(self.rv, served.key, "DELETED", final, old))
        return final

    def _publish(self, change: Change) -> None:
        self.cache.publish(change)
        for observer in self.observers:
            observer(change)

    @staticmethod
    def _may_go(served: ServedResource, obj: Mapping[str, Any]) -> bool:
        """Deletion may finish: requested, no finalizers, and (pods) the kubelet is done."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if served.plural == "namespaces":
            return not (obj.get("spec") or {}).get("finalizers")
        return meta.get("deletionGracePeriodSeconds") == 0

    @staticmethod
    def _grace(served: ServedResource, pod: Mapping[str, Any], options: Mapping[str, Any]) -> int:
        """Seconds a pod gets to stop; 0 for anything else, and for pods no kubelet runs."""
        if served.plural != "pods":
            return 0
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        given = options.get("gracePeriodSeconds")
        grace = spec.get("terminationGracePeriodSeconds", 30) if given is None else int(given)
        return max(grace, 0)

    def _key(self, served: ServedResource, obj: Mapping[str, Any]) -> Key:
        meta = obj["metadata"]
        return (served.key, meta.get("namespace") if served.namespaced else None, meta["name"])

    def _check_type(self, served: ServedResource, obj: Mapping[str, Any]) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, "", served.kind) or api_version not in (None, "", served.api_version):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) and kind ({kind}) do not match "
                f"the endpoint's {served.api_version} {served.kind}"
            )

    def _check_namespace_open(self, namespace: str) -> None:
        key: Key = (kmock.resource("", "v1", "namespaces"), None, namespace)
        if key not in self.objects:
            raise errors.not_found("namespaces", namespace)
        if self.objects[key].raw["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated"
            )

    def _generate_name(self, served: ServedResource, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + "".join(random.choices(_NAME_CHARS, k=5))
            if (served.key, namespace, name) not in self.objects:
                return name
