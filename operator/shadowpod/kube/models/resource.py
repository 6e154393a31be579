"""A custom resource: its model, and how its CRD presents it (names, columns, rules).

A kind's model subclasses ``CustomResource`` with ``spec`` and ``status`` fields and
declares ``definition``; ``shadowpod crds`` turns the two into the CRD.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field

from shadowpod.kube.models.base import KubeModel, ObjectMeta, Rule

ColumnType = Literal["integer", "number", "string", "boolean", "date"]


@dataclass(frozen=True)
class PrinterColumn:
    """A column of ``kubectl get``; ``priority`` 1 shows it only with ``-o wide``."""

    name: str
    type: ColumnType
    json_path: str
    description: str
    priority: int = 0

    def to_crd(self) -> dict[str, Any]:
        column: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            column["priority"] = self.priority
        return column


AGE: PrinterColumn = PrinterColumn(
    "Age", "date", ".metadata.creationTimestamp", "Time since the object was created."
)


@dataclass(frozen=True)
class ResourceDefinition:
    """How the API server names and shows a kind, and the rules it checks on whole objects."""

    group: str
    version: str
    kind: str
    plural: str
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    # Rules on the whole object: the only place where CEL can read ``metadata.name``.
    rules: tuple[Rule, ...] = field(default=())

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def name(self) -> str:
        """The CRD's own name: ``<plural>.<group>``."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


class CustomResource(KubeModel):
    """An object of a custom kind as the API server returns it."""

    definition: ClassVar[ResourceDefinition]

    api_version: str
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @classmethod
    def spec_model(cls) -> type[BaseModel]:
        return _model_of(cls, "spec")

    @classmethod
    def status_model(cls) -> type[BaseModel]:
        return _model_of(cls, "status")


def _model_of(resource: type[BaseModel], name: str) -> type[BaseModel]:
    """The model of ``resource``'s field ``name``, with an ``| None`` taken off."""
    annotation = resource.model_fields[name].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = (arg for arg in get_args(annotation) if arg is not type(None))
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise TypeError(f"{resource.__name__}.{name} must be a pydantic model")
    return annotation
