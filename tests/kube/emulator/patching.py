"""The three patch formats of the API: JSON merge patch (RFC 7386), JSON patch
(RFC 6902, ``test`` operations included — Kopf relies on them) and a strategic merge
patch for the built-in kinds.

The strategic merge patch knows lists by field name, not by the full schema path:
lists of ``containers``, ``env``, ``volumes``, ``conditions`` … merge by their merge
key, ``finalizers`` merge as a set, and the ``$patch`` / ``$deleteFromPrimitiveList``
directives are honoured; every other list is replaced, as in a merge patch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

MERGE_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "taints": "key",
    "addresses": "type",
}
PRIMITIVE_SETS = frozenset({"finalizers"})


class PatchError(ValueError):
    """The patch cannot be applied: a failed ``test``, a missing path, a bad shape."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    try:
        patched = jsonpatch.apply_patch(target, operations, in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(
            f"the server rejected our request due to an error in our request: {exc}"
        ) from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError(f"the JSON patch cannot be applied: {exc}") from exc
    if not isinstance(patched, dict):
        raise PatchError("the JSON patch must leave an object")
    return patched


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {key: value for key, value in patch.items() if key != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys")):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [item for item in result.get(name) or [] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key], key)
        elif isinstance(value, list) and key in PRIMITIVE_SETS:
            kept = list(result.get(key) or [])
            result[key] = kept + [item for item in value if item not in kept]
        else:
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str, field: str) -> list[Any]:
    if any(isinstance(item, Mapping) and item.get("$patch") == "replace" for item in patch):
        return [item for item in patch if not (isinstance(item, Mapping) and "$patch" in item)]
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, Mapping) or merge_key not in item:
            raise PatchError(f"{field}: every item of a strategic merge needs {merge_key!r}")
        position = next(
            (i for i, have in enumerate(merged) if have.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
        elif position is None:
            merged.append(copy.deepcopy(dict(item)))
        else:
            merged[position] = strategic_merge_patch(merged[position], item, field)
    return merged
