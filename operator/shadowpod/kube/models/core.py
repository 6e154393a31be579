"""Types shaped like core/v1's, so a session's container reads like a pod's.

``EnvVar``, ``ResourceRequirements`` and ``Quantity`` take what a container spec
takes (a subset: no ``resourceFieldRef``, no resource claims); the operator copies
them into the owner and shadow pods as they are.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import ConfigDict, Field, Strict, StringConstraints, WithJsonSchema

from shadowpod.kube.models.base import (
    DNS1123_SUBDOMAIN,
    Bool,
    KubeModel,
    Rule,
    validations,
)

# resource.Quantity's grammar without a sign: a resource amount is never negative.
QUANTITY_PATTERN: Final = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# An amount such as ``500m``, ``1Gi`` or ``2``: an integer or a string, as in a pod.
Quantity = Annotated[
    Annotated[int, Strict(), Field(ge=0)]
    | Annotated[str, Strict(), StringConstraints(pattern=QUANTITY_PATTERN, max_length=64)],
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "maxLength": 64,
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

ObjectName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
]
# A key of a Secret or ConfigMap.
DataKey = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
]


class ResourceRequirements(KubeModel):
    """Compute resources of the agent container, as in a pod (cpu, memory …)."""

    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=16, description="The most the container may use."
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="What the scheduler reserves for the container (at most the limit).",
    )


class SecretKeySelector(KubeModel):
    """A key of a Secret in the session's namespace."""

    name: ObjectName = Field(description="The Secret's name.")
    key: DataKey = Field(description="The key within the Secret.")
    optional: Bool | None = Field(
        default=None, description="Start without it when the Secret or key is missing."
    )


class ConfigMapKeySelector(KubeModel):
    """A key of a ConfigMap in the session's namespace."""

    name: ObjectName = Field(description="The ConfigMap's name.")
    key: DataKey = Field(description="The key within the ConfigMap.")
    optional: Bool | None = Field(
        default=None, description="Start without it when the ConfigMap or key is missing."
    )


class ObjectFieldSelector(KubeModel):
    """A field of the pod, through the downward API (metadata.name, spec.nodeName …)."""

    field_path: str = Field(min_length=1, max_length=256)
    api_version: str | None = Field(default=None, max_length=64)


class EnvVarSource(KubeModel):
    """Where an environment variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0)"
                " + (has(self.fieldRef) ? 1 : 0) == 1",
                "valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef",
            )
        )
    )

    secret_key_ref: SecretKeySelector | None = None
    config_map_key_ref: ConfigMapKeySelector | None = None
    field_ref: ObjectFieldSelector | None = None


class EnvVar(KubeModel):
    """An environment variable of the agent container, as in a pod."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "!(has(self.value) && has(self.valueFrom))",
                "an env entry takes value or valueFrom, not both: keep one",
            ),
            Rule(
                "!self.name.startsWith('SHADOWPOD_')",
                "env names starting with SHADOWPOD_ are set by the operator (identity, mode,"
                " epoch): rename the variable",
                field_path=".name",
            ),
        )
    )

    name: str = Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = Field(default=None, max_length=32768)
    value_from: EnvVarSource | None = None
