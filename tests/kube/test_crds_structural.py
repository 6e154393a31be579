"""The structural-schema checker refuses what the API server refuses.

Each case breaks one rule in an otherwise valid CRD (the generated AgentSession CRD)
and expects the problem the API server would report; the controls change the CRD in
ways the API server accepts, and expect nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shadowpod.kube.models.crd import custom_resource_definition
from shadowpod.kube.models.structural import crd_problems, schema_problems
from shadowpod.kube.models.v1alpha1 import AgentMigration, AgentSession

Change = Callable[[dict[str, Any]], None]


def root(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def spec(crd: dict[str, Any]) -> dict[str, Any]:
    return root(crd)["properties"]["spec"]  # type: ignore[no-any-return]


def field(crd: dict[str, Any], *names: str) -> dict[str, Any]:
    node = spec(crd)
    for name in names:
        node = node["items"] if name == "[]" else node["properties"][name]
    return node


SPEC = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"


def atomic_identity_with_transition_rule(crd: dict[str, Any]) -> None:
    field(crd, "identity")["x-kubernetes-map-type"] = "atomic"
    field(crd, "identity", "name")["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": "name is immutable"}
    ]


def int_or_string_as_all_of(crd: dict[str, Any]) -> None:
    quantity = field(crd, "resources", "limits")["additionalProperties"]
    quantity["allOf"] = [{"anyOf": quantity.pop("anyOf")}, {"minimum": 0}]


# (what is broken, how, a piece of the problem the API server reports)
BROKEN: list[tuple[str, Change, str]] = [
    (
        "a field without type",
        lambda c: field(c, "image").pop("type"),
        f"{SPEC}.properties[image].type: Required value: must not be empty for specified"
        " object fields",
    ),
    (
        "array items without type",
        lambda c: field(c, "command", "[]").pop("type"),
        f"{SPEC}.properties[command].items.type: Required value: must not be empty for"
        " specified array items",
    ),
    (
        "a root without type",
        lambda c: root(c).pop("type"),
        "openAPIV3Schema.type: Required value: must not be empty at the root",
    ),
    (
        "a root that is not an object",
        lambda c: root(c).update(type="array"),
        "must be object at the root",
    ),
    ("an array without items", lambda c: field(c, "command").pop("items"), "items: Required value"),
    (
        "a $ref",
        lambda c: field(c, "env").update({"$ref": "#/definitions/EnvVar"}),
        "$ref: Forbidden: $ref is not supported",
    ),
    (
        "definitions",
        lambda c: spec(c).update(definitions={"x": {"type": "string"}}),
        "definitions is not supported",
    ),
    (
        "patternProperties",
        lambda c: field(c, "resources").update(patternProperties={"^a": {"type": "string"}}),
        "patternProperties is not supported",
    ),
    (
        "additionalProperties beside properties",
        lambda c: spec(c).update(additionalProperties={"type": "string"}),
        "additionalProperties and properties are mutual exclusive",
    ),
    (
        "additionalProperties false",
        lambda c: field(c, "identity").update(additionalProperties=False),
        "additionalProperties: cannot be set to false",
    ),
    (
        "additionalProperties at the root",
        lambda c: root(c).update(additionalProperties={"type": "string"}),
        "additionalProperties: must not be used at the root",
    ),
    (
        "uniqueItems",
        lambda c: field(c, "args").update(uniqueItems=True),
        "uniqueItems cannot be set to true",
    ),
    ("type null", lambda c: field(c, "image").update(type="null"), "type cannot be set to null"),
    (
        "an unknown type",
        lambda c: field(c, "image").update(type="text"),
        "Unsupported value: 'text'",
    ),
    (
        "a keyword CRDs do not have",
        lambda c: field(c, "image").update(const="x"),
        f"{SPEC}.properties[image].const: unknown field",
    ),
    (
        "preserve-unknown-fields false",
        lambda c: field(c, "identity").update({"x-kubernetes-preserve-unknown-fields": False}),
        "x-kubernetes-preserve-unknown-fields: must be true or undefined",
    ),
    (
        "int-or-string that also preserves unknown fields",
        lambda c: field(c, "resources")["properties"]["limits"]["additionalProperties"].update(
            {"x-kubernetes-preserve-unknown-fields": True}
        ),
        "must be false if x-kubernetes-int-or-string is true",
    ),
    (
        "an embedded resource that is not an object",
        lambda c: field(c, "image").update({"x-kubernetes-embedded-resource": True}),
        "must be object if x-kubernetes-embedded-resource is true",
    ),
    (
        "metadata restricting more than name and generateName",
        lambda c: root(c)["properties"]["metadata"].update(
            properties={"labels": {"type": "object", "maxProperties": 3}}
        ),
        "must not specify anything other than name and generateName",
    ),
    (
        "a default in metadata",
        lambda c: root(c)["properties"]["metadata"].update(default={"name": "x"}),
        "must not be set in top-level apiVersion, kind or metadata",
    ),
    (
        "kind that is not a string",
        lambda c: root(c)["properties"]["kind"].update(type="integer"),
        "properties[kind].type: must be string",
    ),
    (
        "a default out of bounds",
        lambda c: field(c, "migration", "fenceTimeoutSeconds").update(default=0),
        "properties[fenceTimeoutSeconds].default: must be at least 1 (defaults must validate",
    ),
    (
        "a default with an unknown field (not pruned)",
        lambda c: field(c, "migration").update(default={"fenceTimeout": "2s"}),
        "properties[migration].default.fenceTimeout: unknown field",
    ),
    (
        "a default of the wrong type",
        lambda c: field(c, "checkpoint", "retainSnapshots").update(default="3"),
        "properties[retainSnapshots].default: must be of type integer",
    ),
    (
        "a map list without keys",
        lambda c: field(c, "env").pop("x-kubernetes-list-map-keys"),
        "x-kubernetes-list-map-keys: Required value: must not be empty if"
        " x-kubernetes-list-type is map",
    ),
    (
        "a map list keyed by a field its items do not have",
        lambda c: field(c, "env").update({"x-kubernetes-list-map-keys": ["key"]}),
        "entries must all be names of item properties, not 'key'",
    ),
    (
        "a map list keyed by an optional field without default",
        lambda c: field(c, "env", "[]").update(required=[]),
        "it must have a default or be a required property",
    ),
    (
        "a map list keyed by an object",
        lambda c: field(c, "credentials").update({"x-kubernetes-list-map-keys": ["secretRef"]}),
        "must be a scalar type if parent array's x-kubernetes-list-type is map",
    ),
    (
        "a map list of strings",
        lambda c: field(c, "command").update(
            {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
        ),
        "must be object if parent array's x-kubernetes-list-type is map",
    ),
    (
        "map keys on a list that is not a map list",
        lambda c: field(c, "command").update({"x-kubernetes-list-map-keys": ["name"]}),
        "must be map if x-kubernetes-list-map-keys is non-empty",
    ),
    (
        "a set of granular objects",
        lambda c: field(c, "schedules").update({"x-kubernetes-list-type": "set"}),
        "must be atomic as item of a list with x-kubernetes-list-type=set",
    ),
    (
        "a list type on an object",
        lambda c: field(c, "identity").update({"x-kubernetes-list-type": "atomic"}),
        "must be array if x-kubernetes-list-type is specified",
    ),
    (
        "an unknown list type",
        lambda c: field(c, "args").update({"x-kubernetes-list-type": "bag"}),
        "Unsupported value: 'bag': supported values: atomic, set, map",
    ),
    (
        "a map type on an array",
        lambda c: field(c, "args").update({"x-kubernetes-map-type": "atomic"}),
        "must be object if x-kubernetes-map-type is specified",
    ),
    (
        "a type inside allOf",
        lambda c: field(c, "image").update(allOf=[{"type": "string"}]),
        "properties[image].allOf[0].type: Forbidden: must be undefined to be structural",
    ),
    (
        "a description inside anyOf",
        lambda c: spec(c).update(anyOf=[{"description": "x", "required": ["image"]}]),
        "anyOf[0].description: Forbidden: must be undefined to be structural",
    ),
    (
        "a default inside oneOf",
        lambda c: field(c, "image").update(oneOf=[{"default": "x"}]),
        "oneOf[0].default: Forbidden",
    ),
    (
        "a field only inside a junctor",
        lambda c: spec(c).update(anyOf=[{"properties": {"replicas": {"minimum": 1}}}]),
        "anyOf[0].properties[replicas]: Required value: must be specified outside",
    ),
    (
        "a rule inside a junctor",
        lambda c: spec(c).update({"not": {"x-kubernetes-validations": [{"rule": "true"}]}}),
        "not.x-kubernetes-validations: Forbidden",
    ),
    (
        "metadata inside a junctor",
        lambda c: root(c).update(allOf=[{"properties": {"metadata": {"required": ["name"]}}}]),
        "must not be specified in a nested context",
    ),
    (
        "a pattern that does not compile",
        lambda c: field(c, "image").update(pattern="(unclosed"),
        "pattern: must be a valid regular expression",
    ),
    (
        "a pattern RE2 does not have",
        lambda c: field(c, "image").update(pattern="^(?!latest).*$"),
        "lookarounds and backreferences are not RE2",
    ),
    (
        "a rule without text",
        lambda c: field(c, "identity").update({"x-kubernetes-validations": [{"rule": " "}]}),
        "rule: Required value: rule is not specified",
    ),
    (
        "a message over two lines",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(message="a\nb"),
        "message: must not contain line breaks",
    ),
    (
        "a rule over two lines without message",
        lambda c: field(c, "identity").update(
            {"x-kubernetes-validations": [{"rule": "true &&\ntrue"}]}
        ),
        "message must be specified if rule contains line breaks",
    ),
    (
        "an unknown reason",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(reason="TooLong"),
        "reason: Unsupported value: 'TooLong'",
    ),
    (
        "a fieldPath to no field",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(
            fieldPath=".phaseTimeout"
        ),
        "fieldPath: '.phaseTimeout' must be a valid path",
    ),
    (
        "oldSelf under a list that is not a map list",
        lambda c: field(c, "command", "[]").update(
            {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}]}
        ),
        "oldSelf cannot be used on the uncorrelatable portion of the schema within"
        f" {SPEC}.properties[command]",
    ),
    (
        "oldSelf under an atomic map",
        lambda c: atomic_identity_with_transition_rule(c),
        "oldSelf cannot be used on the uncorrelatable portion",
    ),
    (
        "optionalOldSelf without oldSelf",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(optionalOldSelf=True),
        "optionalOldSelf: may not be set if oldSelf is not used in rule",
    ),
    (
        "a root keyword the status subresource does not allow",
        lambda c: root(c).update(anyOf=[{"required": ["status"]}]),
        "are allowed at the root of the schema if the status subresource is enabled, not anyOf",
    ),
    (
        "a nullable root",
        lambda c: root(c).update(nullable=True),
        "nullable cannot be true at the root",
    ),
    (
        "a short name in capitals",
        lambda c: c["spec"]["names"].update(shortNames=["AGS"]),
        "spec.names.shortNames[0]: 'AGS' must be a DNS-1035 label",
    ),
    (
        "a category with an underscore",
        lambda c: c["spec"]["names"].update(categories=["shadow_pod"]),
        "spec.names.categories[0]: 'shadow_pod' must be a DNS-1035 label",
    ),
    (
        "kind and listKind the same",
        lambda c: c["spec"]["names"].update(listKind="AgentSession"),
        "kind and listKind may not be the same",
    ),
    (
        "a name that is not plural.group",
        lambda c: c["metadata"].update(name="agentsession.shadowpod.dev"),
        "metadata.name: 'agentsession.shadowpod.dev' must be spec.names.plural",
    ),
    (
        "a group without a dot",
        lambda c: c["spec"].update(group="shadowpod"),
        "spec.group: 'shadowpod' must be a DNS subdomain with at least one dot",
    ),
    (
        "two storage versions",
        lambda c: c["spec"]["versions"].append({**c["spec"]["versions"][0], "name": "v1alpha2"}),
        "exactly one version must be the storage version",
    ),
    (
        "a printer column of an unknown type",
        lambda c: c["spec"]["versions"][0]["additionalPrinterColumns"][0].update(type="float"),
        "additionalPrinterColumns[0].type: must be one of",
    ),
    (
        "a printer column path without its dot",
        lambda c: c["spec"]["versions"][0]["additionalPrinterColumns"][0].update(
            jsonPath="status.phase"
        ),
        "jsonPath: must be a simple json path starting with .",
    ),
    (
        "a status subresource with content",
        lambda c: c["spec"]["versions"][0]["subresources"].update(status={"x": 1}),
        "subresources.status: must be {}",
    ),
]


@pytest.fixture
def crd() -> dict[str, Any]:
    return custom_resource_definition(AgentSession)


def test_the_generated_crds_pass() -> None:
    assert crd_problems(custom_resource_definition(AgentSession)) == []
    assert crd_problems(custom_resource_definition(AgentMigration)) == []


@pytest.mark.parametrize(("broken", "change", "problem"), BROKEN, ids=[case[0] for case in BROKEN])
def test_a_broken_crd_is_refused(
    crd: dict[str, Any], broken: str, change: Change, problem: str
) -> None:
    change(crd)
    found = crd_problems(crd)
    assert any(problem in line for line in found), f"{broken}: {found}"


ACCEPTED: list[tuple[str, Change]] = [
    (
        "metadata restricting name and generateName",
        lambda c: root(c)["properties"]["metadata"].update(
            properties={
                "name": {"type": "string", "maxLength": 63},
                "generateName": {"type": "string", "maxLength": 58},
            }
        ),
    ),
    (
        "oldSelf on an item of a map list",
        lambda c: field(c, "env", "[]", "name").update(
            {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "m"}]}
        ),
    ),
    (
        "oldSelf under a map",
        lambda c: field(c, "resources", "limits").update(
            {"x-kubernetes-validations": [{"rule": "size(self) >= size(oldSelf)", "message": "m"}]}
        ),
    ),
    (
        "int-or-string's allOf pattern",
        lambda c: int_or_string_as_all_of(c),
    ),
    (
        "value validation inside a junctor, of a field specified outside",
        lambda c: spec(c).update(
            anyOf=[{"required": ["image"]}, {"properties": {"image": {"maxLength": 8}}}]
        ),
    ),
    (
        "a reason the API server knows",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(
            reason="FieldValueForbidden"
        ),
    ),
    (
        "a fieldPath in brackets",
        lambda c: field(c, "migration")["x-kubernetes-validations"][0].update(
            fieldPath="['phaseTimeoutSeconds']"
        ),
    ),
]


@pytest.mark.parametrize(("accepted", "change"), ACCEPTED, ids=[case[0] for case in ACCEPTED])
def test_what_the_api_server_accepts_passes(
    crd: dict[str, Any], accepted: str, change: Change
) -> None:
    change(crd)
    assert crd_problems(crd) == []


def test_problems_name_every_broken_node() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {}, "b": {"type": "array", "items": {}}},
    }
    assert schema_problems(schema, status_subresource=False) == [
        "openAPIV3Schema.properties[a].type: Required value: must not be empty for specified"
        " object fields",
        "openAPIV3Schema.properties[b].items.type: Required value: must not be empty for"
        " specified array items",
    ]
