"""A migration's phases (DESIGN.md §4): the engine moves through them, and the
operator's AgentMigration status shows them — so they live below both."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Phase(StrEnum):
    # Waiting in the operator's cluster-wide pacing queue; no engine step has run.
    QUEUED = "Queued"
    PENDING = "Pending"
    PREFLIGHT = "Preflight"
    SNAPSHOTTING = "Snapshotting"
    RESTORING = "Restoring"
    CATCHING_UP = "CatchingUp"
    # The upgrade gate (optional): the new version's answers judged before the fence.
    VALIDATING = "Validating"
    FENCING = "Fencing"
    COMMITTED = "Committed"
    DRAINING = "Draining"
    SUCCEEDED = "Succeeded"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    # The restart baseline stops the source before it starts the target.
    STOPPING = "Stopping"


TERMINAL: Final = frozenset({Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.FAILED})
