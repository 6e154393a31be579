"""Objects checked against a structural schema the way the API server checks them."""

from __future__ import annotations

from typing import Any

import pytest

from shadowpod.kube.models.values import object_problems, problems, with_defaults

QUANTITY: dict[str, Any] = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": "^[0-9]+(m|Mi|Gi)?$",
    "maxLength": 8,
    "minimum": 0,
    "x-kubernetes-int-or-string": True,
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "size": QUANTITY,
        "when": {"type": "string", "format": "date-time"},
        "seq": {"type": "integer", "format": "int64", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "maxProperties": 2,
        },
        "note": {"type": "string", "nullable": True},
        "policy": {
            "type": "object",
            "default": {},
            "properties": {
                "mode": {"type": "string", "enum": ["Fast", "Safe"], "default": "Safe"},
                "limit": {"type": "integer", "default": 3, "maximum": 10},
            },
        },
        "either": {"type": "string", "anyOf": [{"maxLength": 1}, {"pattern": "^x+$"}]},
        "never": {"type": "string", "not": {"pattern": "^bad$"}},
    },
}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({}, "<root>.name: required"),
        ({"name": "toolong"}, "<root>.name: must be at most 5 characters long"),
        ({"name": 5}, "<root>.name: must be of type string"),
        ({"name": "a", "size": True}, "<root>.size: must be an integer or a string"),
        ({"name": "a", "size": "1Ki"}, "<root>.size: must match"),
        ({"name": "a", "size": -1}, "<root>.size: must be at least 0"),
        ({"name": "a", "when": "2026-11-24 noon"}, "<root>.when: must be an RFC 3339 date-time"),
        ({"name": "a", "when": "2026-13-24T10:00:00Z"}, "<root>.when: must be an RFC 3339"),
        ({"name": "a", "seq": 2**63}, "<root>.seq: must fit in int64"),
        ({"name": "a", "tags": ["x", "x"]}, "<root>.tags[1]: duplicate entry 'x'"),
        (
            {"name": "a", "labels": {"a": "1", "b": "2", "c": "3"}},
            "<root>.labels: must have at most 2",
        ),
        ({"name": "a", "labels": {"a": 1}}, "<root>.labels.a: must be of type string"),
        (
            {"name": "a", "policy": {"mode": "Slow"}},
            "<root>.policy.mode: must be one of 'Fast', 'Safe'",
        ),
        ({"name": "a", "policy": {"limit": 11}}, "<root>.policy.limit: must be at most 10"),
        ({"name": "a", "policy": {"colour": "red"}}, "<root>.policy.colour: unknown field"),
        ({"name": "a", "either": "yy"}, "<root>.either: must match anyOf of its schema"),
        ({"name": "a", "never": "bad"}, "<root>.never: must not match the schema under not"),
        ({"name": "a", "extra": 1}, "<root>.extra: unknown field"),
    ],
)
def test_refused(value: dict[str, Any], problem: str) -> None:
    found = problems(SCHEMA, with_defaults(SCHEMA, value))
    assert len(found) == 1, found
    assert found[0].startswith(problem)


@pytest.mark.parametrize(
    "value",
    [
        {"name": "a"},
        {"name": "a", "size": 2, "when": "2026-11-24T10:00:00.123+01:00"},
        {"name": "a", "size": "500m", "seq": 2**63 - 1, "tags": ["x", "y"]},
        {"name": "a", "note": None, "either": "xxxx", "never": "good"},
    ],
)
def test_admitted(value: dict[str, Any]) -> None:
    assert problems(SCHEMA, with_defaults(SCHEMA, value)) == []


def test_defaults_fill_in_nested_and_nulls_are_dropped() -> None:
    stored = with_defaults(SCHEMA, {"name": "a", "when": None, "note": None})
    assert stored == {"name": "a", "note": None, "policy": {"mode": "Safe", "limit": 3}}
    assert with_defaults(SCHEMA, {"name": "a", "policy": {"limit": 5}})["policy"] == {
        "limit": 5,
        "mode": "Safe",
    }


def test_defaults_do_not_change_the_input() -> None:
    value = {"name": "a"}
    with_defaults(SCHEMA, value)
    assert value == {"name": "a"}


def test_a_whole_object_leaves_metadata_to_the_api_server() -> None:
    root = {
        "type": "object",
        "properties": {"metadata": {"type": "object"}, "spec": {"type": "object"}},
    }
    assert object_problems(root, {"metadata": {"name": "x", "uid": "u"}, "spec": {}}) == []
    assert object_problems(root, {"metadata": {}, "spec": {}, "spek": {}}) == [
        "<root>.spek: unknown field"
    ]
