"""A pydantic model's JSON schema, made into the structural OpenAPI v3 schema a CRD holds.

Pydantic writes JSON Schema 2020-12; a CRD takes a structural subset of OpenAPI 3.0
(see ``structural``): no ``$ref`` (definitions are inlined), no ``title``, no
``additionalProperties: false`` (the API server prunes unknown fields instead), no
``null`` type (an optional field is one that is not ``required``). Keywords this module
does not know how to carry are refused rather than passed on, so a new kind of field
cannot slip into a CRD unchecked.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel

from shadowpod.domain.bounds import INT64_MAX
from shadowpod.kube.models.values import with_defaults


class SchemaConversionError(ValueError):
    """A model uses something a structural schema cannot express."""


# Keywords carried into the CRD, in the order they are written (readable YAML, stable diffs).
KEYWORD_ORDER: Final = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)
RULES: Final = "x-kubernetes-validations"
# Dropped: documentation for Python readers, or what a CRD says by leaving it out.
_DROPPED: Final = frozenset({"title"})


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The schema of ``model`` (by its camelCase aliases) as a CRD holds it."""
    document = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, Any] = document.pop("$defs", {})
    return _convert(document, definitions, model.__name__)


def _convert(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    node = _resolve(node, definitions, where)
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            converted[key] = {
                name: _convert(schema, definitions, f"{where}.{name}")
                for name, schema in value.items()
            }
        elif key == "items":
            converted[key] = _convert(value, definitions, f"{where}[]")
        elif key == "additionalProperties":
            if value is False:  # extra="forbid": the API server prunes instead
                continue
            if not isinstance(value, dict):
                raise SchemaConversionError(f"{where}: additionalProperties must be a schema")
            converted[key] = _convert(value, definitions, f"{where}{{}}")
        elif key == "description":
            converted[key] = tidy_description(value)
        elif key == "const":
            converted["enum"] = [value]
        elif key == "default" and value is None:
            continue  # an optional field's "no value" is its absence
        elif key == "anyOf":
            if not node.get("x-kubernetes-int-or-string"):
                raise SchemaConversionError(
                    f"{where}: a union other than `X | None` or int-or-string has no"
                    " structural schema"
                )
            converted[key] = value
        elif key in KEYWORD_ORDER:
            converted[key] = value
        else:
            raise SchemaConversionError(
                f"{where}: JSON schema keyword {key!r} is not carried into CRDs"
                " (express it with the keywords in openapi.KEYWORD_ORDER or a CEL Rule)"
            )
    if converted.get("default") == {} and converted.get("type") == "object":
        # A real API server checks a default as it is written, CEL rules included: it
        # does not fill in the defaults nested in it first, so a bare `{}` fails every
        # rule that reads one of its defaulted fields ("no such key").
        converted["default"] = with_defaults(converted, {})
    if converted.get("format") == "int64" and converted.get("maximum") == INT64_MAX:
        del converted["maximum"]  # int64 says it; as a float64 bound 2**63-1 is inexact
    return {key: converted[key] for key in KEYWORD_ORDER if key in converted}


def tidy_description(text: str) -> str:
    """A docstring's paragraphs, each on one line: ``kubectl explain`` wraps them itself."""
    paragraphs = (" ".join(paragraph.split()) for paragraph in text.split("\n\n"))
    return "\n\n".join(paragraph for paragraph in paragraphs if paragraph)


def _resolve(node: dict[str, Any], definitions: dict[str, Any], where: str) -> dict[str, Any]:
    """``node`` with ``$ref`` inlined and ``X | None`` made ``X`` (siblings win)."""
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _resolve(_merged(definitions[name], siblings), definitions, where)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [option for option in node["anyOf"] if option != {"type": "null"}]
        if len(options) == 1 and len(options) < len(node["anyOf"]):
            siblings = {key: value for key, value in node.items() if key != "anyOf"}
            return _merged(_resolve(options[0], definitions, where), siblings)
    return node


def _merged(target: dict[str, Any], siblings: dict[str, Any]) -> dict[str, Any]:
    """``target`` with a field's own keywords over it; the rules of both apply."""
    merged = {**target, **siblings}
    rules = [*target.get(RULES, []), *siblings.get(RULES, [])]
    if rules:
        merged[RULES] = rules
    return merged
