"""A status condition, shaped and bounded like ``metav1.Condition``.

Each kind narrows ``type`` to its own condition types; a status keeps one condition
per type (the CRD makes ``conditions`` a list keyed by ``type``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, TypeVar

from pydantic import Field

from shadowpod.kube.models.base import REASON_PATTERN, Int64, KubeModel, Time

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(KubeModel):
    """One aspect of the object's state, as of lastTransitionTime."""

    type: str = Field(description="Which aspect this condition describes.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: Int64 | None = Field(
        default=None, description="The metadata.generation this condition was set from."
    )
    last_transition_time: Time = Field(description="When status last changed.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=REASON_PATTERN,
        description="Why, in one CamelCase word (for programs to branch on).",
    )
    message: str = Field(max_length=32768, description="Why, for people; may be empty.")


class _Typed(Protocol):
    @property
    def type(self) -> str: ...


ConditionT = TypeVar("ConditionT", bound=_Typed)


def one_per_type(conditions: Sequence[ConditionT]) -> Sequence[ConditionT]:
    """A status's conditions, refused when two share a type (the CRD refuses them too)."""
    types = [condition.type for condition in conditions]
    if duplicates := sorted({t for t in types if types.count(t) > 1}):
        raise ValueError(f"one condition per type: {', '.join(duplicates)} appear(s) twice")
    return conditions
