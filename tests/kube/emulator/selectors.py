"""Label and field selectors, in the query-string form (``app=web,tier!=db``,
``env in (a,b)``, ``!legacy``) and the object form (``matchLabels`` /
``matchExpressions``), matched the way the API server matches them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kube.emulator.errors import bad_request

_SET_TERM = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=()]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")

Labels = Mapping[str, str]
Requirement = Callable[[Labels], bool]


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses: ``a in (x,y),b`` is two terms."""
    terms, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term for term in terms if term.strip()]


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text:
            return cls()
        found: list[Requirement] = []
        for term in _split_terms(text):
            found.append(_parse_label_term(term))
        return cls(tuple(found))

    @classmethod
    def from_object(cls, selector: Mapping[str, Any] | None) -> LabelSelector:
        """A ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions``."""
        if not selector:
            return cls()
        found: list[Requirement] = []
        for key, value in dict(selector.get("matchLabels") or {}).items():
            found.append(_equals(key, str(value)))
        for expression in selector.get("matchExpressions") or []:
            key = expression["key"]
            values = {str(value) for value in expression.get("values") or []}
            operator = expression["operator"]
            if operator == "In":
                found.append(_within(key, values))
            elif operator == "NotIn":
                found.append(_outside(key, values))
            elif operator == "Exists":
                found.append(_exists(key))
            elif operator == "DoesNotExist":
                found.append(_absent(key))
            else:
                raise bad_request(f"{operator!r} is not a valid label selector operator")
        return cls(tuple(found))

    def matches(self, labels: Labels | None) -> bool:
        present = labels or {}
        return all(requirement(present) for requirement in self.requirements)


def _equals(key: str, value: str) -> Requirement:
    return lambda labels: labels.get(key) == value


def _differs(key: str, value: str) -> Requirement:
    return lambda labels: labels.get(key) != value


def _within(key: str, values: set[str]) -> Requirement:
    return lambda labels: key in labels and labels[key] in values


def _outside(key: str, values: set[str]) -> Requirement:
    return lambda labels: labels.get(key) not in values


def _exists(key: str) -> Requirement:
    return lambda labels: key in labels


def _absent(key: str) -> Requirement:
    return lambda labels: key not in labels


def _parse_label_term(term: str) -> Requirement:
    if match := _SET_TERM.match(term):
        key, operator, raw = match.groups()
        values = {value.strip() for value in raw.split(",") if value.strip()}
        return _within(key, values) if operator == "in" else _outside(key, values)
    if match := _EQ_TERM.match(term):
        key, operator, value = match.groups()
        return _differs(key, value) if operator == "!=" else _equals(key, value)
    if match := _EXISTS_TERM.match(term):
        negated, key = match.groups()
        return _absent(key) if negated else _exists(key)
    raise bad_request(f"unable to parse requirement: {term!r} is not a valid label selector")


# The field selectors each kind supports, as the API server's field label conversion
# functions list them; anything else is refused there with 400, and so it is here.
COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
FIELDS_BY_PLURAL: Mapping[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "secrets": frozenset({"type"}),
    "nodes": frozenset({"spec.unschedulable"}),
    "namespaces": frozenset({"status.phase"}),
}


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A field's value as a selector compares it: a string, ``""`` when absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, bool, str], ...] = ()  # (path, equal?, value)

    @classmethod
    def parse(cls, text: str | None, plural: str) -> FieldSelector:
        if not text:
            return cls()
        allowed = COMMON_FIELDS | FIELDS_BY_PLURAL.get(plural, frozenset())
        terms = []
        for term in _split_terms(text):
            match = _EQ_TERM.match(term)
            if match is None:
                raise bad_request(f"invalid field selector: {term!r}")
            path, operator, value = match.groups()
            if path not in allowed:
                raise bad_request(
                    f'field label not supported: "{path}" (for {plural}: '
                    f"{', '.join(sorted(allowed))})"
                )
            terms.append((path, operator != "!=", value))
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in self.terms)

    def name(self) -> str | None:
        """The name this selector pins (``metadata.name=x``), if it does."""
        for path, equal, value in self.terms:
            if path == "metadata.name" and equal:
                return value
        return None
