"""An object checked against a structural schema the way the API server checks it.

The API server does more than JSON Schema: it drops ``null`` from fields that are not
nullable and then fills in defaults (before it validates), accepts an int-or-string
node either way, keeps list-map keys and set items unique, and prunes fields the schema
does not know — reported here as ``unknown field``, as ``kubectl apply`` (strict field
validation) reports them. CEL rules are not evaluated here.
"""

from __future__ import annotations

import copy
import re
from datetime import datetime
from typing import Any, Final

# RFC 3339 as the API server's date-time format accepts it.
_DATE_TIME: Final = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)
_INT_RANGES: Final = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with nulls of non-nullable fields dropped and defaults filled in, as the
    API server stores it."""
    value = copy.deepcopy(value)
    _default(schema, value)
    return value


def _default(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties", {})
        for name in [name for name, item in value.items() if item is None]:
            if not properties.get(name, {}).get("nullable"):
                del value[name]
        for name, field in properties.items():
            if name not in value and "default" in field:
                value[name] = copy.deepcopy(field["default"])
            if name in value:
                _default(field, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                if name not in properties:
                    _default(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


def problems(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Why ``value`` does not validate against ``schema`` (empty when it does); each
    problem is ``<field path>: <what is wrong>``."""
    found: list[str] = []
    _check(schema, value, path or "<root>", found)
    return found


def object_problems(root: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """``problems`` of a whole custom object: ``metadata`` is the API server's own."""
    without_metadata = {key: item for key, item in obj.items() if key != "metadata"}
    schema = {
        **root,
        "properties": {
            key: field for key, field in root.get("properties", {}).items() if key != "metadata"
        },
    }
    found = problems(schema, without_metadata)
    if not isinstance(obj.get("metadata", {}), dict):
        found.append("metadata: must be an object")
    return found


def _check(schema: dict[str, Any], value: Any, path: str, found: list[str]) -> None:
    if value is None:
        if not schema.get("nullable"):
            found.append(f"{path}: must not be null")
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, str) and not _is_integer(value):
            found.append(f"{path}: must be an integer or a string")
            return
    elif "type" in schema and not _has_type(schema["type"], value):
        found.append(f"{path}: must be of type {schema['type']}")
        return
    _scalar(schema, value, path, found)
    if isinstance(value, dict):
        _object(schema, value, path, found)
    elif isinstance(value, list):
        _array(schema, value, path, found)
    for junctor in ("allOf", "anyOf", "oneOf"):
        if junctor in schema:
            passed = sum(not problems(option, value, path) for option in schema[junctor])
            total = len(schema[junctor])
            wanted = {"allOf": passed == total, "anyOf": passed >= 1, "oneOf": passed == 1}
            if not wanted[junctor]:
                found.append(f"{path}: must match {junctor} of its schema")
    if "not" in schema and not problems(schema["not"], value, path):
        found.append(f"{path}: must not match the schema under not")


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_type(name: str, value: Any) -> bool:
    match name:
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "integer":
            return _is_integer(value)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
    return False


def _scalar(schema: dict[str, Any], value: Any, path: str, found: list[str]) -> None:
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(option) for option in schema["enum"])
        found.append(f"{path}: must be one of {allowed}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        _number(schema, value, path, found)
    if isinstance(value, str):
        _string(schema, value, path, found)


def _number(schema: dict[str, Any], value: float, path: str, found: list[str]) -> None:
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") and value == low):
            found.append(f"{path}: must be at least {low}")
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or (schema.get("exclusiveMaximum") and value == high):
            found.append(f"{path}: must be at most {high}")
    if schema.get("format") in _INT_RANGES and _is_integer(value):
        low, high = _INT_RANGES[schema["format"]]
        if not low <= value <= high:
            found.append(f"{path}: must fit in {schema['format']}")


def _string(schema: dict[str, Any], value: str, path: str, found: list[str]) -> None:
    if len(value) < schema.get("minLength", 0):
        found.append(f"{path}: must be at least {schema['minLength']} characters long")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        found.append(f"{path}: must be at most {schema['maxLength']} characters long")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        found.append(f"{path}: must match {schema['pattern']}")
    if schema.get("format") == "date-time" and not _is_date_time(value):
        found.append(f"{path}: must be an RFC 3339 date-time, e.g. 2026-11-24T10:00:00Z")


def _is_date_time(value: str) -> bool:
    if not _DATE_TIME.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def _object(schema: dict[str, Any], value: dict[str, Any], path: str, found: list[str]) -> None:
    for name in schema.get("required", []):
        if name not in value:
            found.append(f"{path}.{name}: required")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        found.append(f"{path}: must have at most {schema['maxProperties']} properties")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        found.append(f"{path}: must have at least {schema['minProperties']} properties")
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for name, item in value.items():
        where = f"{path}.{name}"
        if name in properties:
            _check(properties[name], item, where, found)
        elif isinstance(extra, dict):
            _check(extra, item, where, found)
        elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
            found.append(f"{where}: unknown field")


def _array(schema: dict[str, Any], value: list[Any], path: str, found: list[str]) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        found.append(f"{path}: must have at most {schema['maxItems']} items")
    if len(value) < schema.get("minItems", 0):
        found.append(f"{path}: must have at least {schema['minItems']} items")
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            _check(items, item, f"{path}[{index}]", found)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        seen: list[Any] = []
        for index, item in enumerate(value):
            if item in seen:
                found.append(f"{path}[{index}]: duplicate entry {item!r}")
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen_keys: set[tuple[Any, ...]] = set()
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            key = tuple(repr(item.get(name)) for name in keys)
            if key in seen_keys:
                shown = ", ".join(f"{name}={item.get(name)!r}" for name in keys)
                found.append(f"{path}[{index}]: duplicate entry with {shown}")
            seen_keys.add(key)
