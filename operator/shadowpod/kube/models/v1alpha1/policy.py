"""How a session is migrated: the policy an AgentSession declares and an AgentMigration runs.

Durations are integers with their unit in the name (``fenceTimeoutSeconds``), as the
Kubernetes API conventions ask and as core/v1 writes them
(``terminationGracePeriodSeconds``): every client reads them without a Go duration
parser, and the API server checks their bounds itself.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from shadowpod.kube.models.base import Bool, Integer, KubeModel, Rule, validations
from shadowpod.kube.models.v1alpha1.validation import PersonaPolicy, ValidationPolicy


class MigrationStrategy(StrEnum):
    """How the state moves: State (app-level snapshot + journal), CRIU (a
    container checkpoint, same image only), or Auto (CRIU when the image is
    unchanged and the node can restore it, else State)."""

    AUTO = "Auto"
    STATE = "State"
    CRIU = "CRIU"


class EvictionStrategy(StrEnum):
    """What draining the owner's node does: LiveMigrate moves the session live first
    (a PodDisruptionBudget holds the drain until it has moved); None lets the pod be
    evicted, and a new owner recovers from the latest snapshot and the journal."""

    LIVE_MIGRATE = "LiveMigrate"
    NONE = "None"


class MigrationPolicy(KubeModel):
    """Bounds and choices of the session's migrations (ShadowPod + ExchangeFence)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.phaseTimeoutSeconds <= self.maxDurationSeconds",
                "phaseTimeoutSeconds may not exceed maxDurationSeconds: every phase must fit"
                " in the whole migration; lower the one or raise the other",
                field_path=".phaseTimeoutSeconds",
            ),
            Rule(
                "self.fenceTimeoutSeconds * self.maxFenceAttempts <= self.maxDurationSeconds",
                "fenceTimeoutSeconds x maxFenceAttempts must fit in maxDurationSeconds: each"
                " fence attempt may hold messages back that long; lower them or raise"
                " maxDurationSeconds",
                field_path=".fenceTimeoutSeconds",
            ),
            Rule(
                "!has(self.validation)"
                " || self.validation.timeoutSeconds <= self.maxDurationSeconds",
                "validation.timeoutSeconds may not exceed maxDurationSeconds: the turns to"
                " compare must come within the whole migration; lower the one or raise the other",
                field_path=".validation.timeoutSeconds",
            ),
        )
    )

    strategy: MigrationStrategy = Field(
        default=MigrationStrategy.AUTO, description="Auto, State or CRIU."
    )
    fence_timeout_seconds: Integer = Field(
        default=2,
        ge=1,
        le=600,
        description="How long one fence attempt may hold new messages back while the source"
        " finishes its turn (1 s to 10 min); then the fence lifts and is tried again.",
    )
    max_fence_attempts: Integer = Field(
        default=3, ge=1, le=10, description="Fence attempts before the migration rolls back."
    )
    catch_up_lag_threshold: Integer = Field(
        default=50,
        ge=0,
        le=1_000_000,
        description="Journal entries the shadow may be behind the head when the fence starts.",
    )
    max_duration_seconds: Integer = Field(
        default=120,
        ge=1,
        le=86_400,
        description="The whole migration's limit; past it, a migration not yet committed"
        " rolls back.",
    )
    phase_timeout_seconds: Integer = Field(
        default=30, ge=1, le=3_600, description="The limit of each phase."
    )
    drain_grace_period_seconds: Integer = Field(
        default=5,
        ge=0,
        le=3_600,
        description="Between SIGTERM and SIGKILL for the old owner's background processes.",
    )
    rollback_on_failure: Bool = Field(
        default=True,
        description="When a phase before the commit fails, remove the shadow (true) or leave"
        " it for inspection and mark the migration Failed (false); the source stays owner"
        " either way.",
    )
    eviction_strategy: EvictionStrategy = Field(
        default=EvictionStrategy.LIVE_MIGRATE,
        description="LiveMigrate (move off a draining node live) or None (opt out: the owner"
        " pod is evicted and recovered).",
    )
    validation: ValidationPolicy | None = Field(
        default=None,
        description="An upgrade gate before the fence, for migrations that change the image"
        " (a move to another node keeps the image and is not validated).",
    )
    persona: PersonaPolicy | None = Field(
        default=None,
        description="A persona check for migrations that change the image: the shadow's"
        " and the new owner's answers to a self-description probe against the source's.",
    )
