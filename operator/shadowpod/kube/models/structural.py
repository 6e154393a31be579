"""What the API server refuses in a CustomResourceDefinition, checked without one.

The rules of apiextensions.k8s.io/v1 (Kubernetes' "Specifying a structural schema" and
the CRD validation in apiextensions-apiserver), for the schemas and CRDs Shadowpod
writes:

- every node is typed (or ``x-kubernetes-int-or-string`` / ``-preserve-unknown-fields``),
  the root is an object, arrays have ``items``;
- no ``$ref``, ``definitions``, ``patternProperties``, ``dependencies``, ``id``,
  ``additionalItems``, ``uniqueItems: true``, ``type: null``, nor unknown keywords;
  ``additionalProperties`` is never ``false``, never beside ``properties``, never at the
  root;
- ``allOf``/``anyOf``/``oneOf``/``not`` only restrict what is specified outside them,
  and set no type, default, description, title, nullable, additionalProperties nor
  extension (except int-or-string's two patterns);
- ``metadata`` at the root restricts ``name`` and ``generateName`` only; ``apiVersion``
  and ``kind`` are strings; no defaults in either;
- with the status subresource, the root holds only the keywords the API server allows
  there;
- ``x-kubernetes-list-type`` / ``-list-map-keys`` / ``-map-type`` are consistent (a map
  list's keys are required-or-defaulted scalar properties of object items, set items
  are scalars or atomic);
- CEL rules are non-empty, messages have no line breaks, ``reason`` is a known one,
  ``fieldPath`` names a field of the schema, ``oldSelf`` appears only where old and new
  values can be correlated (not under a list that is not a map list);
- defaults validate against their schema and hold no unknown field;
- names are DNS labels, printer columns well-formed, exactly one storage version.

Problems are reported as ``<path>: <what is wrong>`` with the API server's paths.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from shadowpod.kube.models import values

_PROPS: Final = frozenset(
    {
        "id",
        "$schema",
        "$ref",
        "description",
        "type",
        "format",
        "title",
        "default",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "enum",
        "maxProperties",
        "minProperties",
        "required",
        "items",
        "allOf",
        "oneOf",
        "anyOf",
        "not",
        "properties",
        "additionalProperties",
        "patternProperties",
        "dependencies",
        "additionalItems",
        "definitions",
        "externalDocs",
        "example",
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
_UNSUPPORTED: Final = {
    "id": "id is not supported",
    "$ref": "$ref is not supported",
    "definitions": "definitions is not supported",
    "dependencies": "dependencies is not supported",
    "patternProperties": "patternProperties is not supported",
    "additionalItems": "additionalItems is not supported",
}
_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "array", "object"})
# Generic keywords a junctor (allOf, anyOf, oneOf, not) may not set.
_JUNCTOR_FORBIDDEN: Final = (
    "type",
    "default",
    "title",
    "description",
    "nullable",
    "externalDocs",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
)
_JUNCTORS: Final = ("allOf", "anyOf", "oneOf")
# With the status subresource the root may hold only these.
_ROOT_ALLOWED: Final = frozenset(
    {
        "description",
        "type",
        "format",
        "title",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "required",
        "items",
        "properties",
        "externalDocs",
        "example",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    }
)
_RULE_KEYS: Final = frozenset(
    {"rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf"}
)
_REASONS: Final = frozenset(
    {"FieldValueRequired", "FieldValueForbidden", "FieldValueInvalid", "FieldValueDuplicate"}
)
_INT_OR_STRING: Final = [{"type": "integer"}, {"type": "string"}]
_DNS1035_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_COLUMN_TYPES: Final = frozenset({"integer", "number", "string", "boolean", "date"})
_COLUMN_FORMATS: Final = frozenset(
    {"int32", "int64", "float", "double", "byte", "date", "date-time", "password"}
)
_COLUMN_KEYS: Final = frozenset({"name", "type", "format", "description", "priority", "jsonPath"})
_OLD_SELF: Final = re.compile(r"\boldSelf\b")
_STRING_LITERAL: Final = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
# Constructs Python's re knows and Go's RE2 (the API server's) refuses.
_NOT_RE2: Final = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\(\?P=")
_FIELD_PATH_STEP: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\['([^']+)'\]")


def crd_problems(crd: Mapping[str, Any]) -> list[str]:
    """Why the API server would refuse ``crd`` (apiextensions.k8s.io/v1); empty if it would not."""
    found: list[str] = []
    if crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        found.append("apiVersion: must be apiextensions.k8s.io/v1")
    if crd.get("kind") != "CustomResourceDefinition":
        found.append("kind: must be CustomResourceDefinition")
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    group = spec.get("group", "")
    if not (_DNS1123_SUBDOMAIN.match(group) and "." in group):
        found.append(f"spec.group: {group!r} must be a DNS subdomain with at least one dot")
    name = crd.get("metadata", {}).get("name")
    if name != f"{names.get('plural')}.{group}":
        found.append(f"metadata.name: {name!r} must be spec.names.plural + '.' + spec.group")
    found += _names_problems(names)
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        found.append("spec.scope: must be Namespaced or Cluster")
    versions = spec.get("versions", [])
    if not versions:
        found.append("spec.versions: must have at least one version")
    if sum(bool(version.get("storage")) for version in versions) != 1:
        found.append("spec.versions: exactly one version must be the storage version")
    for index, version in enumerate(versions):
        found += _version_problems(version, f"spec.versions[{index}]")
    return found


def _names_problems(names: Mapping[str, Any]) -> list[str]:
    found = []
    for key in ("plural", "singular", "kind"):
        if not names.get(key):
            found.append(f"spec.names.{key}: required")
    for key in ("plural", "singular"):
        if names.get(key) and not _is_dns1035(names[key]):
            found.append(f"spec.names.{key}: {names[key]!r} must be a DNS-1035 label")
    for key in ("kind", "listKind"):
        if names.get(key) and not _is_dns1035(str(names[key]).lower()):
            found.append(f"spec.names.{key}: {names[key]!r} must be a DNS-1035 label in lower case")
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        found.append("spec.names.listKind: kind and listKind may not be the same")
    for key in ("shortNames", "categories"):
        for index, value in enumerate(names.get(key, [])):
            if not _is_dns1035(value):
                found.append(f"spec.names.{key}[{index}]: {value!r} must be a DNS-1035 label")
    return found


def _is_dns1035(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1035_LABEL.match(value))


def _version_problems(version: Mapping[str, Any], path: str) -> list[str]:
    found = []
    if not _is_dns1035(version.get("name", "")):
        found.append(f"{path}.name: must be a DNS-1035 label")
    subresources = version.get("subresources") or {}
    if "status" in subresources and subresources["status"] != {}:
        found.append(f"{path}.subresources.status: must be {{}}")
    for index, column in enumerate(version.get("additionalPrinterColumns", [])):
        found += _column_problems(column, f"{path}.additionalPrinterColumns[{index}]")
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    if not isinstance(schema, dict):
        found.append(f"{path}.schema.openAPIV3Schema: required")
        return found
    found += schema_problems(
        schema, f"{path}.schema.openAPIV3Schema", status_subresource="status" in subresources
    )
    return found


def _column_problems(column: Mapping[str, Any], path: str) -> list[str]:
    found = []
    if unknown := sorted(set(column) - _COLUMN_KEYS):
        found.append(f"{path}: unknown field(s) {', '.join(unknown)}")
    if not column.get("name"):
        found.append(f"{path}.name: required")
    if column.get("type") not in _COLUMN_TYPES:
        found.append(f"{path}.type: must be one of {', '.join(sorted(_COLUMN_TYPES))}")
    if "format" in column and column["format"] not in _COLUMN_FORMATS:
        found.append(f"{path}.format: must be one of {', '.join(sorted(_COLUMN_FORMATS))}")
    json_path = column.get("jsonPath", "")
    if not json_path.startswith("."):
        found.append(f"{path}.jsonPath: must be a simple json path starting with .")
    priority = column.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        found.append(f"{path}.priority: must be a non-negative integer")
    return found


def schema_problems(
    schema: Mapping[str, Any], path: str = "openAPIV3Schema", *, status_subresource: bool = True
) -> list[str]:
    """Why ``schema`` is not a structural schema a CRD version may hold."""
    found: list[str] = []
    if schema.get("nullable"):
        found.append(f"{path}.nullable: nullable cannot be true at the root")
    if status_subresource and (extra := sorted(set(schema) - _ROOT_ALLOWED)):
        found.append(
            f"{path}: only {', '.join(sorted(_ROOT_ALLOWED))} are allowed at the root of the"
            f" schema if the status subresource is enabled, not {', '.join(extra)}"
        )
    _SchemaWalk(found).node(schema, path, level="root")
    return found


class _SchemaWalk:
    """One pass over a schema, collecting problems as it goes."""

    def __init__(self, found: list[str]) -> None:
        self.found = found

    def node(
        self,
        node: Any,
        path: str,
        *,
        level: str,
        in_meta: bool = False,
        uncorrelatable: str | None = None,
    ) -> None:
        if not isinstance(node, dict):
            self.found.append(f"{path}: must be a schema object")
            return
        self._keywords(node, path)
        self._type(node, path, level)
        self._extensions(node, path)
        self._list_and_map_types(node, path)
        self._junctors(node, path)
        self._default(node, path, in_meta)
        self._rules(node, path, uncorrelatable)
        if "pattern" in node:
            self._pattern(node["pattern"], f"{path}.pattern")
        if level == "root":
            self._root_fields(node, path)
        self._children(node, path, level, in_meta, uncorrelatable)

    # --- the node itself ------------------------------------------------------------------

    def _keywords(self, node: Mapping[str, Any], path: str) -> None:
        for key in sorted(set(node) - _PROPS):
            self.found.append(f"{path}.{key}: unknown field")
        for key, why in _UNSUPPORTED.items():
            if key in node:
                self.found.append(f"{path}.{key}: Forbidden: {why}")
        if node.get("uniqueItems"):
            self.found.append(
                f"{path}.uniqueItems: Forbidden: uniqueItems cannot be set to true since the"
                " runtime complexity becomes quadratic"
            )
        if node.get("x-kubernetes-preserve-unknown-fields") is False:
            self.found.append(
                f"{path}.x-kubernetes-preserve-unknown-fields: must be true or undefined"
            )

    def _type(self, node: Mapping[str, Any], path: str, level: str) -> None:
        kind = node.get("type", "")
        if kind == "null":
            self.found.append(
                f"{path}.type: Forbidden: type cannot be set to null, use nullable as an"
                " alternative"
            )
        elif kind and kind not in _TYPES:
            self.found.append(f"{path}.type: Unsupported value: {kind!r}")
        exempt = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        if not kind and not exempt and not node.get("x-kubernetes-embedded-resource"):
            where = {
                "root": "at the root",
                "item": "for specified array items",
                "field": "for specified object fields",
            }[level]
            self.found.append(f"{path}.type: Required value: must not be empty {where}")
        if level == "root" and kind and kind != "object":
            self.found.append(f"{path}.type: must be object at the root")
        if kind == "array" and "items" not in node:
            self.found.append(f"{path}.items: Required value: must be specified")
        if isinstance(node.get("items"), list):
            self.found.append(f"{path}.items: items must be a schema object and not an array")
        extra = node.get("additionalProperties")
        if extra is not None:
            if level == "root":
                self.found.append(f"{path}.additionalProperties: must not be used at the root")
            if extra is False:
                self.found.append(f"{path}.additionalProperties: cannot be set to false")
            elif node.get("properties") and isinstance(extra, dict):
                self.found.append(
                    f"{path}.additionalProperties: additionalProperties and properties are"
                    " mutual exclusive"
                )

    def _extensions(self, node: Mapping[str, Any], path: str) -> None:
        int_or_string = node.get("x-kubernetes-int-or-string")
        if int_or_string and node.get("x-kubernetes-preserve-unknown-fields"):
            self.found.append(
                f"{path}.x-kubernetes-preserve-unknown-fields: must be false if"
                " x-kubernetes-int-or-string is true"
            )
        if int_or_string and node.get("x-kubernetes-embedded-resource"):
            self.found.append(
                f"{path}.x-kubernetes-embedded-resource: must be false if"
                " x-kubernetes-int-or-string is true"
            )
        if node.get("x-kubernetes-embedded-resource"):
            if node.get("type") != "object":
                self.found.append(
                    f"{path}.type: must be object if x-kubernetes-embedded-resource is true"
                )
            if not node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
                self.found.append(
                    f"{path}.properties: must not be empty if x-kubernetes-embedded-resource is"
                    " true without x-kubernetes-preserve-unknown-fields"
                )

    def _list_and_map_types(self, node: Mapping[str, Any], path: str) -> None:
        list_type = node.get("x-kubernetes-list-type")
        keys = node.get("x-kubernetes-list-map-keys") or []
        items = node.get("items") if isinstance(node.get("items"), dict) else None
        if list_type is not None:
            if node.get("type") != "array":
                self.found.append(
                    f"{path}.type: must be array if x-kubernetes-list-type is specified"
                )
            if list_type not in ("atomic", "set", "map"):
                self.found.append(
                    f"{path}.x-kubernetes-list-type: Unsupported value: {list_type!r}:"
                    " supported values: atomic, set, map"
                )
        if keys and list_type != "map":
            self.found.append(
                f"{path}.x-kubernetes-list-type: must be map if x-kubernetes-list-map-keys is"
                " non-empty"
            )
        if list_type == "map":
            self._map_list(items, keys, path)
        if list_type == "set" and items is not None:
            if (
                items.get("type") == "array"
                and items.get("x-kubernetes-list-type", "atomic") != "atomic"
            ):
                self.found.append(
                    f"{path}.items.x-kubernetes-list-type: must be atomic as item of a list with"
                    " x-kubernetes-list-type=set"
                )
            if items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
                self.found.append(
                    f"{path}.items.x-kubernetes-map-type: must be atomic as item of a list with"
                    " x-kubernetes-list-type=set"
                )
        if list_type in ("set", "map") and items is not None and items.get("nullable"):
            self.found.append(
                f"{path}.items.nullable: cannot be nullable when x-kubernetes-list-type is"
                f" {list_type}"
            )
        map_type = node.get("x-kubernetes-map-type")
        if map_type is not None:
            if node.get("type") != "object":
                self.found.append(
                    f"{path}.type: must be object if x-kubernetes-map-type is specified"
                )
            if map_type not in ("atomic", "granular"):
                self.found.append(
                    f"{path}.x-kubernetes-map-type: Unsupported value: {map_type!r}: supported"
                    " values: atomic, granular"
                )

    def _map_list(self, items: Mapping[str, Any] | None, keys: list[str], path: str) -> None:
        if not keys:
            self.found.append(
                f"{path}.x-kubernetes-list-map-keys: Required value: must not be empty if"
                " x-kubernetes-list-type is map"
            )
        if items is None:
            self.found.append(f"{path}.items: must have a schema if x-kubernetes-list-type is map")
            return
        if items.get("type") != "object":
            self.found.append(
                f"{path}.items.type: must be object if parent array's x-kubernetes-list-type is map"
            )
            return
        if len(set(keys)) != len(keys):
            self.found.append(
                f"{path}.x-kubernetes-list-map-keys: must not contain duplicate entries"
            )
        properties = items.get("properties", {})
        for key in keys:
            field = properties.get(key)
            if field is None:
                self.found.append(
                    f"{path}.x-kubernetes-list-map-keys: entries must all be names of item"
                    f" properties, not {key!r}"
                )
                continue
            where = f"{path}.items.properties[{key}]"
            if field.get("type") in ("array", "object"):
                self.found.append(
                    f"{where}.type: must be a scalar type if parent array's x-kubernetes-list-type"
                    " is map"
                )
            if key not in items.get("required", []) and "default" not in field:
                self.found.append(
                    f"{where}.default: this property is in x-kubernetes-list-map-keys, so it must"
                    " have a default or be a required property"
                )
            if field.get("nullable"):
                self.found.append(
                    f"{where}.nullable: this property is in x-kubernetes-list-map-keys, so it"
                    " cannot be nullable"
                )

    def _default(self, node: Mapping[str, Any], path: str, in_meta: bool) -> None:
        if "default" not in node:
            return
        if in_meta:
            self.found.append(
                f"{path}.default: must not be set in top-level apiVersion, kind or metadata"
            )
            return
        for problem in values.problems(dict(node), node["default"], f"{path}.default"):
            self.found.append(f"{problem} (defaults must validate against their schema)")

    def _pattern(self, pattern: Any, path: str) -> None:
        if not isinstance(pattern, str):
            self.found.append(f"{path}: must be a string")
            return
        try:
            re.compile(pattern)
        except re.error as exc:
            self.found.append(f"{path}: must be a valid regular expression, but isn't: {exc}")
            return
        if _NOT_RE2.search(pattern):
            self.found.append(
                f"{path}: must be a valid regular expression, but isn't: lookarounds and"
                " backreferences are not RE2"
            )

    # --- CEL rules ------------------------------------------------------------------------

    def _rules(self, node: Mapping[str, Any], path: str, uncorrelatable: str | None) -> None:
        rules = node.get("x-kubernetes-validations")
        if rules is None:
            return
        if not isinstance(rules, list):
            self.found.append(f"{path}.x-kubernetes-validations: must be a list")
            return
        for index, rule in enumerate(rules):
            where = f"{path}.x-kubernetes-validations[{index}]"
            if not isinstance(rule, dict):
                self.found.append(f"{where}: must be an object")
                continue
            self._rule(node, rule, where, uncorrelatable)

    def _rule(
        self,
        node: Mapping[str, Any],
        rule: Mapping[str, Any],
        where: str,
        uncorrelatable: str | None,
    ) -> None:
        for key in sorted(set(rule) - _RULE_KEYS):
            self.found.append(f"{where}.{key}: unknown field")
        text = str(rule.get("rule", "")).strip()
        message = str(rule.get("message", ""))
        if not text:
            self.found.append(f"{where}.rule: Required value: rule is not specified")
        if "message" in rule and not message.strip():
            self.found.append(f"{where}.message: must be non-empty if specified")
        elif re.search(r"[\n\r]", message):
            self.found.append(f"{where}.message: must not contain line breaks")
        elif re.search(r"[\n\r]", text) and not message.strip():
            self.found.append(
                f"{where}.message: message must be specified if rule contains line breaks"
            )
        if "reason" in rule and rule["reason"] not in _REASONS:
            self.found.append(
                f"{where}.reason: Unsupported value: {rule['reason']!r}: supported values:"
                f" {', '.join(sorted(_REASONS))}"
            )
        if "fieldPath" in rule:
            field_path = str(rule["fieldPath"])
            if not field_path.strip() or re.search(r"[\n\r]", field_path):
                self.found.append(f"{where}.fieldPath: must be non-empty and on one line")
            elif not field_path_exists(node, field_path):
                self.found.append(f"{where}.fieldPath: {field_path!r} must be a valid path")
        uses_old_self = bool(_OLD_SELF.search(_STRING_LITERAL.sub("''", text)))
        if uses_old_self and uncorrelatable is not None:
            self.found.append(
                f"{where}.rule: oldSelf cannot be used on the uncorrelatable portion of the"
                f" schema within {uncorrelatable}"
            )
        if not uses_old_self and "optionalOldSelf" in rule:
            self.found.append(
                f"{where}.optionalOldSelf: may not be set if oldSelf is not used in rule"
            )

    # --- the root -------------------------------------------------------------------------

    def _root_fields(self, node: Mapping[str, Any], path: str) -> None:
        properties = node.get("properties", {})
        for key in ("apiVersion", "kind"):
            if key in properties and properties[key].get("type") != "string":
                self.found.append(f"{path}.properties[{key}].type: must be string")
        metadata = properties.get("metadata")
        if metadata is None:
            return
        where = f"{path}.properties[metadata]"
        if metadata.get("type", "object") != "object":
            self.found.append(f"{where}.type: must be object")
        rest = {key: value for key, value in metadata.items() if key not in ("type", "properties")}
        other = set(metadata.get("properties", {})) - {"name", "generateName"}
        if rest or other:
            self.found.append(
                f"{where}: Forbidden: must not specify anything other than name and"
                " generateName, but metadata is implicitly specified"
            )

    # --- children and junctors -----------------------------------------------------------

    def _children(
        self,
        node: Mapping[str, Any],
        path: str,
        level: str,
        in_meta: bool,
        uncorrelatable: str | None,
    ) -> None:
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            self.found.append(f"{path}.properties: must be an object")
            properties = {}
        atomic_map = node.get("x-kubernetes-map-type") == "atomic"
        for name, child in properties.items():
            self.node(
                child,
                f"{path}.properties[{name}]",
                level="field",
                in_meta=in_meta or (level == "root" and name in ("apiVersion", "kind", "metadata")),
                uncorrelatable=uncorrelatable or (path if atomic_map else None),
            )
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            self.node(
                extra,
                f"{path}.additionalProperties",
                level="field",
                in_meta=in_meta,
                uncorrelatable=uncorrelatable,
            )
        items = node.get("items")
        if isinstance(items, dict):
            map_list = node.get("x-kubernetes-list-type") == "map"
            self.node(
                items,
                f"{path}.items",
                level="item",
                in_meta=in_meta,
                uncorrelatable=uncorrelatable or (None if map_list else path),
            )

    def _junctors(self, node: Mapping[str, Any], path: str) -> None:
        int_or_string_any = node.get("anyOf") == _INT_OR_STRING
        all_of = node.get("allOf") or []
        int_or_string_all = bool(all_of) and all_of[0].get("anyOf") == _INT_OR_STRING
        for junctor in _JUNCTORS:
            for index, nested in enumerate(node.get(junctor) or []):
                skip_any_of = junctor == "anyOf" and int_or_string_any
                skip_first = junctor == "allOf" and index == 0 and int_or_string_all
                if skip_any_of:
                    continue
                self._nested(nested, node, f"{path}.{junctor}[{index}]", skip_any_of=skip_first)
        if "not" in node:
            self._nested(node["not"], node, f"{path}.not", skip_any_of=False)

    def _nested(
        self, nested: Any, outer: Mapping[str, Any], path: str, *, skip_any_of: bool
    ) -> None:
        """A junctor's schema: value validation only, of what ``outer`` specifies."""
        if not isinstance(nested, dict):
            self.found.append(f"{path}: must be a schema object")
            return
        self._keywords(nested, path)
        for key in _JUNCTOR_FORBIDDEN:
            if key in nested and (key != "x-kubernetes-preserve-unknown-fields" or nested[key]):
                self.found.append(f"{path}.{key}: Forbidden: must be undefined to be structural")
        if "metadata" in nested.get("properties", {}):
            self.found.append(
                f"{path}.properties[metadata]: Forbidden: must not be specified in a nested context"
            )
        for name, child in nested.get("properties", {}).items():
            outer_child = outer.get("properties", {}).get(name)
            if outer_child is None:
                self.found.append(
                    f"{path}.properties[{name}]: Required value: must be specified outside of"
                    " allOf, anyOf, oneOf and not too (structural schemas specify every field)"
                )
                continue
            self._nested(child, outer_child, f"{path}.properties[{name}]", skip_any_of=False)
        if "items" in nested:
            outer_items = outer.get("items")
            if not isinstance(outer_items, dict):
                self.found.append(
                    f"{path}.items: Required value: must be specified outside of the junctor too"
                )
            else:
                self._nested(nested["items"], outer_items, f"{path}.items", skip_any_of=False)
        for junctor in _JUNCTORS:
            if junctor == "anyOf" and skip_any_of:
                continue
            for index, deeper in enumerate(nested.get(junctor) or []):
                self._nested(deeper, outer, f"{path}.{junctor}[{index}]", skip_any_of=False)
        if "not" in nested:
            self._nested(nested["not"], outer, f"{path}.not", skip_any_of=False)


def field_path_exists(node: Mapping[str, Any], field_path: str) -> bool:
    """Whether ``field_path`` (``.a.b``, ``['a-b']``; no list indexes) names a field of ``node``."""
    position = 0
    current: Mapping[str, Any] = node
    while position < len(field_path):
        step = _FIELD_PATH_STEP.match(field_path, position)
        if step is None:
            return False
        name = step.group(1) or step.group(2)
        properties = current.get("properties", {})
        extra = current.get("additionalProperties")
        if name in properties:
            current = properties[name]
        elif isinstance(extra, dict):
            current = extra
        else:
            return False
        position = step.end()
    return position > 0
