"""Why a phase of the migration engine failed: each kind carries the ``reason`` the
record (and the resource's condition) reports."""

from __future__ import annotations

from shadowpod.domain.errors import ShadowpodError
from shadowpod.engine.record import SourceLoss


class StepFailed(ShadowpodError):
    """A phase cannot succeed; the message says why (it ends up in the record)."""

    reason = "MigrationStepFailed"


class PhaseTimedOut(StepFailed):
    reason = "PhaseTimeout"


class MaxDurationExceeded(StepFailed):
    reason = "MaxDurationExceeded"


class IncompatibleStateSchema(StepFailed):
    reason = "IncompatibleStateSchema"


class CredentialsMissing(StepFailed):
    reason = "CredentialsMissing"


class OwnershipChanged(StepFailed):
    reason = "OwnershipChanged"


class InstanceFailed(StepFailed):
    reason = "InstanceFailed"


class InstanceCannotStart(InstanceFailed):
    """The runtime knows why an instance will never run (an image it cannot pull, a
    node that does not exist): failed at once with the runtime's reason, not after a
    phase timeout."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SourceLost(StepFailed):
    """The source died before the epoch bump (a crash, a kill, a deleted pod): nobody
    serves the session until a new owner takes it. The engine finishes forward (see
    ``MigrationEngine``); this reason says why where it could not."""

    reason = "SourceLost"

    def __init__(self, message: str, loss: SourceLoss) -> None:
        super().__init__(message)
        self.loss = loss


class CheckpointNeedsSameImage(StepFailed):
    reason = "CheckpointNeedsSameImage"


class ValidationFailed(StepFailed):
    """The target's answers did not agree enough with the source's (upgrade gate)."""

    reason = "ValidationFailed"
