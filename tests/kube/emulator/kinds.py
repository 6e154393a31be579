"""What the API server does for particular kinds on create and update: defaults,
validation, the fields only the server sets, and what may not change."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from tests.kube.emulator.errors import invalid
from tests.kube.emulator.resources import ServedResource, crd_problems

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A label value (and a label key's name part), as the API server validates them.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MAX = 63
_LABEL_VALUE_FORMAT = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)

# Kinds whose status may be given on create (a kubelet registers its node with one).
STATUS_ON_CREATE = frozenset({"nodes", "events"})
# What a pod update may change in spec (the rest of a pod's spec is immutable).
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"
POD_MUTABLE_SPEC = frozenset({"activeDeadlineSeconds", "tolerations", "schedulingGates"})


def check_name(served: ServedResource, name: str) -> None:
    pattern, limit = (DNS_LABEL, 63) if served.plural == "namespaces" else (DNS_SUBDOMAIN, 253)
    if len(name) > limit or not pattern.match(name):
        raise invalid(
            served.kind,
            name,
            [
                (
                    "metadata.name",
                    f"Invalid value: {name!r}: a lowercase RFC 1123 "
                    f"{'label' if limit == 63 else 'subdomain'} must consist of lower case "
                    "alphanumeric characters, '-' or '.', and must start and end with an "
                    "alphanumeric character",
                )
            ],
            served.group,
        )


def check_labels(served: ServedResource, name: str, meta: Mapping[str, Any]) -> None:
    """``metadata.labels`` as the API server checks them on every write, of every kind:
    keys are ``[prefix/]name`` (a DNS subdomain prefix, a name of at most 63), values
    at most 63 characters of a restricted alphabet."""
    labels = meta.get("labels") or {}
    causes = []
    for key, value in labels.items() if isinstance(labels, Mapping) else ():
        prefix, _, part = str(key).rpartition("/")
        if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
            causes.append(f"Invalid value: {key!r}: prefix part a lowercase RFC 1123 subdomain")
        if not part or len(part) > LABEL_VALUE_MAX or not LABEL_VALUE.match(part):
            causes.append(f"Invalid value: {key!r}: name part must be 1-63 characters")
        if not isinstance(value, str):
            causes.append(f"Invalid value: {value!r}: a label value must be a string")
        elif len(value) > LABEL_VALUE_MAX:
            # The API server counts bytes (k8s.io/apimachinery IsValidLabelValue).
            causes.append(f'Invalid value: "{value}": must be no more than 63 bytes')
        elif not LABEL_VALUE.match(value):
            causes.append(f'Invalid value: "{value}": {_LABEL_VALUE_FORMAT}')
    if causes:
        raise invalid(served.kind, name, [("metadata.labels", c) for c in causes], served.group)


def event_problems(served: ServedResource, obj: dict[str, Any]) -> list[tuple[str, str]]:
    """A real API server's check of a new Event (ValidateEventCreate): one with an
    eventTime (and every events.k8s.io Event) must say who reported it and what was
    done, each in at most 128 characters; without an eventTime it is a legacy Event and
    needs none of them."""
    if served.group != "events.k8s.io" and not obj.get("eventTime"):
        return []
    controller = "reportingController" if served.group else "reportingComponent"
    problems = []
    for field in (controller, "reportingInstance", "action"):
        value = obj.get(field)
        if not value:
            problems.append((field, "Required value"))
        elif len(str(value)) > 128:
            problems.append((field, "Too long: may not be more than 128 bytes"))
    return problems


def prepare_create(served: ServedResource, obj: dict[str, Any]) -> None:
    """Defaults and validation of a new object, in place (server fields are set apart)."""
    if served.has_status and served.plural not in STATUS_ON_CREATE:
        obj.pop("status", None)
    name = obj["metadata"]["name"]
    if served.plural == "pods":
        _default_pod(served, obj, name)
    elif served.plural == "secrets":
        _fold_string_data(served, obj, name)
        obj.setdefault("type", "Opaque")
    elif served.plural == "events":
        problems = event_problems(served, obj)
        if problems:
            raise invalid(served.kind, name, problems, served.group)
    elif served.plural == "namespaces":
        obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        obj["status"] = {"phase": "Active"}
    elif served.plural == "customresourcedefinitions":
        problems = crd_problems(obj)
        if problems:
            raise invalid(served.kind, name, problems, served.group)
        finalizers = obj["metadata"].setdefault("finalizers", [])
        if CRD_CLEANUP not in finalizers:
            finalizers.append(CRD_CLEANUP)
        names = obj["spec"]["names"]
        accepted = {"singular": names.get("singular") or names["kind"].lower(), **names}
        accepted.setdefault("listKind", f"{names['kind']}List")
        obj["status"] = {
            "acceptedNames": accepted,
            "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                },
            ],
        }


def prepare_update(served: ServedResource, old: Mapping[str, Any], new: dict[str, Any]) -> None:
    """Validation of a change to the main resource, in place."""
    name = new["metadata"]["name"]
    if served.plural == "secrets":
        _fold_string_data(served, new, name)
    if served.plural == "pods":
        _check_pod_update(served, old, new, name)
    if served.plural == "customresourcedefinitions":
        problems = crd_problems(new)
        if problems:
            raise invalid(served.kind, name, problems, served.group)
    was_deleting = bool(old["metadata"].get("deletionTimestamp"))
    added = set(new["metadata"].get("finalizers") or []) - set(
        old["metadata"].get("finalizers") or []
    )
    if was_deleting and added:
        raise invalid(
            served.kind,
            name,
            [
                (
                    "metadata.finalizers",
                    f"Forbidden: no new finalizers can be added if the object "
                    f"is being deleted, found new finalizers {sorted(added)!r}",
                )
            ],
            served.group,
        )


def _default_pod(served: ServedResource, pod: dict[str, Any], name: str) -> None:
    spec = pod.setdefault("spec", {})
    containers = spec.get("containers") or []
    causes: list[tuple[str, str]] = []
    if not containers:
        causes.append(("spec.containers", "Required value"))
    seen: set[str] = set()
    for index, container in enumerate(containers):
        where = f"spec.containers[{index}]"
        if not container.get("name"):
            causes.append((f"{where}.name", "Required value"))
        elif container["name"] in seen:
            causes.append((f"{where}.name", f"Duplicate value: {container['name']!r}"))
        seen.add(container.get("name", ""))
        if not container.get("image"):
            causes.append((f"{where}.image", "Required value"))
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
    if causes:
        raise invalid(served.kind, name, causes, served.group)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def _check_pod_update(
    served: ServedResource, old: Mapping[str, Any], new: dict[str, Any], name: str
) -> None:
    before, after = old.get("spec") or {}, new.get("spec") or {}

    def without_mutable(spec: Mapping[str, Any]) -> dict[str, Any]:
        kept = {key: value for key, value in spec.items() if key not in POD_MUTABLE_SPEC}
        for field in ("containers", "initContainers"):
            if field in kept:
                kept[field] = [
                    {key: value for key, value in c.items() if key != "image"} for c in kept[field]
                ]
        return kept

    if without_mutable(before) != without_mutable(after):
        raise invalid(
            served.kind,
            name,
            [
                (
                    "spec",
                    "Forbidden: pod updates may not change fields other than "
                    "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                    "tolerations) or `spec.schedulingGates`; bind a pod to a node through its "
                    "binding subresource",
                )
            ],
            served.group,
        )


def _fold_string_data(served: ServedResource, secret: dict[str, Any], name: str) -> None:
    data = dict(secret.get("data") or {})
    for key, value in dict(secret.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    causes = []
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            causes.append((f"data[{key}]", "Invalid value: not base64-encoded"))
    if causes:
        raise invalid(served.kind, name, causes, served.group)
    if data:
        secret["data"] = data
