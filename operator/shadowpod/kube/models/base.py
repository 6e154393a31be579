"""What every custom-resource model shares: the Kubernetes JSON conventions.

- Field names are snake_case in Python and camelCase on the wire (aliases); a model
  accepts both, and ``to_kube()`` writes camelCase without unset optional fields.
- Unknown fields are refused: the CRD and these models are generated together, so an
  unknown field is a typo (the API server would prune it silently).
- Integers and booleans are strict, as the API server is: ``"2"`` is not the number 2.
- Times are RFC 3339 in UTC: ``Time`` to the second (``metav1.Time``), ``MicroTime``
  to the microsecond (``metav1.MicroTime``) where phases last milliseconds.
- Validation the API server can do is declared here, next to the field: bounds,
  patterns and enums as JSON schema, the rest as CEL rules (``Rule``), all copied into
  the CRD by ``shadowpod crds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
)
from pydantic.alias_generators import to_camel

from shadowpod.domain.bounds import INT64_MAX

# RFC 1123 names, as Kubernetes checks object names and label values.
DNS1123_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A condition's or an event's reason: one CamelCase word (metav1.Condition's pattern).
REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

INT64_FORMAT: Final = {"format": "int64"}


class KubeModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
    )

    def to_kube(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, JSON types, no nulls."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- scalars --------------------------------------------------------------------------

Bool = Annotated[bool, Strict()]
# An integer whose field states its own bounds (``Field(ge=..., le=...)``): bounds on an
# alias would win over the field's, silently.
Integer = Annotated[int, Strict()]
# A count that fits Kubernetes' int32 fields.
Count = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)]
# A journal seq, an epoch, a generation: the int64 of the journal and of metadata.
Int64 = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX, json_schema_extra=INT64_FORMAT)]


def _in_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("a time needs its zone: write RFC 3339, e.g. 2026-11-24T10:00:00Z")
    return value.astimezone(UTC)


def _rfc3339(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339_micro(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Time = Annotated[
    datetime,
    AfterValidator(_in_utc),
    PlainSerializer(_rfc3339, return_type=str, when_used="json"),
]
MicroTime = Annotated[
    datetime,
    AfterValidator(_in_utc),
    PlainSerializer(_rfc3339_micro, return_type=str, when_used="json"),
]


# --- schema annotations -----------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A CEL rule the API server evaluates (``x-kubernetes-validations``).

    ``rule`` sees the value it is declared on as ``self`` (and, in a transition rule,
    the stored value as ``oldSelf``). ``message`` says what is wrong and what to do.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def to_schema(self) -> dict[str, str]:
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.reason is not None:
            entry["reason"] = self.reason
        return entry


def validations(*rules: Rule) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules."""
    return {"x-kubernetes-validations": [rule.to_schema() for rule in rules]}


def list_map(*keys: str) -> dict[str, Any]:
    """``json_schema_extra`` of a list whose items are merged by ``keys`` (as ``env``)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


ATOMIC_LIST: Final[dict[str, Any]] = {"x-kubernetes-list-type": "atomic"}
# A defaulted nested object: the API server fills ``{}`` in, then the defaults inside it.
DEFAULT_OBJECT: Final[dict[str, Any]] = {"default": {}}


# --- object metadata --------------------------------------------------------------------


class ObjectMeta(KubeModel):
    """The part of ``metadata`` Shadowpod reads; the API server owns the rest (kept as is)."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
