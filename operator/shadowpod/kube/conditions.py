"""Conditions as the Kubernetes API conventions keep them.

One condition per type; ``lastTransitionTime`` moves only when ``status`` changes (a new
reason or message alone is not a transition); ``observedGeneration`` says which spec the
condition was judged against. Every type a kind declares is set on the first
reconcile, as ``Unknown`` when nothing is known yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TypeVar

from shadowpod.kube.models.conditions import Condition, ConditionStatus

C = TypeVar("C", bound=Condition)


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def find(conditions: Sequence[C], kind: str) -> C | None:
    return next((c for c in conditions if c.type == kind), None)


def set_condition(
    conditions: Sequence[C],
    model: type[C],
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    at: datetime | None = None,
) -> list[C]:
    """``conditions`` with ``kind`` set; the others, and their order, as they were."""
    old = find(conditions, kind)
    changed_at = old.last_transition_time if old is not None and old.status == status else None
    new = model.model_validate(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "observed_generation": generation,
            "last_transition_time": changed_at or at or now(),
        }
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == kind else c for c in conditions]


def with_defaults(
    conditions: Sequence[C],
    model: type[C],
    defaults: Sequence[tuple[str, ConditionStatus, str, str]],
    *,
    generation: int | None,
) -> list[C]:
    """``conditions`` with every type of ``defaults`` present: (type, status, reason,
    message) for those missing, so that a new object shows all its condition types."""
    result = list(conditions)
    for kind, status, reason, message in defaults:
        if find(result, kind) is None:
            result = set_condition(
                result, model, kind, status, reason, message, generation=generation
            )
    return result
