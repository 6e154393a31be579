"""``AgentDeployment``: the agent template a fleet of AgentSessions follows, and how a new
version of it rolls out to them (steps, pace, failure budget).

Its strategy converts to ``shadowpod.fleet.strategy.RolloutStrategy`` (the planner's
input) and its status keeps the planner's ``RolloutState``, so that a restarted operator
continues a rollout where its status says it was.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator

from shadowpod.fleet.followers import FailureKind
from shadowpod.fleet.progress import Progress, RolloutPhase
from shadowpod.fleet.state import Failure, Halt, RolloutState
from shadowpod.fleet.strategy import (
    MAX_CONCURRENCY,
    MAX_PAUSE_SECONDS,
    MAX_SESSIONS,
    MAX_STEPS,
    Canary,
    Pace,
    Pause,
    RolloutStrategy,
)
from shadowpod.kube.models.base import (
    ATOMIC_LIST,
    DEFAULT_OBJECT,
    Bool,
    Count,
    Int64,
    Integer,
    KubeModel,
    Rule,
    Time,
    list_map,
    validations,
)
from shadowpod.kube.models.conditions import Condition, one_per_type
from shadowpod.kube.models.core import EnvVar, ObjectName, ResourceRequirements
from shadowpod.kube.models.resource import AGE, CustomResource, PrinterColumn, ResourceDefinition
from shadowpod.kube.models.v1alpha1.policy import MigrationPolicy
from shadowpod.kube.models.v1alpha1.session import (
    Argument,
    CheckpointPolicy,
    Credential,
    Identity,
    Image,
    MemoryVolume,
)
from shadowpod.kube.models.v1alpha1.version import API_VERSION, CATEGORIES, GROUP, VERSION

Text = Annotated[str, StringConstraints(max_length=2048)]

# The annotations ``kubectl shadowpod rollout resume|abort`` write: requests about one
# rollout rather than desired state (not yet read by the operator).
RESUME_ANNOTATION: Final = "rollout.shadowpod.dev/resumes"
ABORT_ANNOTATION: Final = "rollout.shadowpod.dev/abort-revision"
# The labels of a rollout's AgentMigrations: which template, which revision.
# Failures one rollout remembers: a step halts after failureBudget + 1, so only a huge
# budget comes near; the status object stays well under etcd's 1.5 MiB.
MAX_FAILURES: Final = 5_000
DEPLOYMENT_LABEL: Final = "shadowpod.dev/deployment"
REVISION_LABEL: Final = "shadowpod.dev/rollout-revision"


class AgentTemplate(KubeModel):
    """What every session of the deployment runs, unless the session says otherwise: the
    container (image, command, env, resources), its credentials, memory and identity."""

    image: Image = Field(description="The agent's image: changing it starts a rollout.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    command: list[Argument] = Field(
        default_factory=list, max_length=64, json_schema_extra=ATOMIC_LIST
    )
    args: list[Argument] = Field(default_factory=list, max_length=64, json_schema_extra=ATOMIC_LIST)
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, json_schema_extra=list_map("name")
    )
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    credentials: list[Credential] = Field(
        default_factory=list, max_length=32, json_schema_extra=list_map("name")
    )
    memory: MemoryVolume | None = None
    identity: Identity | None = None
    checkpoint: CheckpointPolicy = Field(
        default_factory=CheckpointPolicy, json_schema_extra=DEFAULT_OBJECT
    )


class CanaryStep(KubeModel):
    """Raise the sessions on the new version to ``sessions``, or ``percent`` of those
    that may move (pinned ones never do), rounded up."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.sessions) != has(self.percent)",
                "a canary step takes sessions or percent, not both nor neither: write"
                " canary: {sessions: 1} or canary: {percent: 10}",
            )
        )
    )

    sessions: Integer | None = Field(default=None, ge=1, le=MAX_SESSIONS)
    percent: Integer | None = Field(default=None, ge=1, le=100)


class PauseStep(KubeModel):
    """Wait ``durationSeconds``, or without it until ``kubectl shadowpod rollout resume``."""

    duration_seconds: Integer | None = Field(default=None, ge=1, le=MAX_PAUSE_SECONDS)


class RolloutStep(KubeModel):
    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.canary) != has(self.pause)",
                "a step is a canary or a pause: write - canary: {percent: 10} or - pause: {}"
                " as two steps",
            )
        )
    )

    canary: CanaryStep | None = None
    pause: PauseStep | None = None


class RolloutStrategySpec(KubeModel):
    """How a new version reaches the sessions: the steps in order, then every other
    session in batches at the pace; more than ``failureBudget`` migrations of one step
    rolled back (gate rejected, schema incompatible, timed out) halt the rollout."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.maxConcurrentPerNode <= self.maxConcurrentMigrations",
                "maxConcurrentPerNode may not exceed maxConcurrentMigrations: one node can"
                " never have more moves than the whole rollout; lower maxConcurrentPerNode",
                field_path=".maxConcurrentPerNode",
            )
        )
    )

    steps: list[RolloutStep] = Field(
        default_factory=list,
        max_length=MAX_STEPS,
        json_schema_extra=ATOMIC_LIST,
        description="Canary and pause steps; after the last, every session follows.",
    )
    max_concurrent_migrations: Integer = Field(
        default=10,
        ge=1,
        le=MAX_CONCURRENCY,
        description="The rollout's migrations queued or running at once (the operator's"
        " --max-concurrent-migrations caps all migrations of the cluster on top).",
    )
    max_concurrent_per_node: Integer = Field(
        default=2, ge=1, le=MAX_CONCURRENCY, description="Of those, out of one node."
    )
    max_unavailable: Integer = Field(
        default=0,
        ge=0,
        le=MAX_SESSIONS,
        description="Sessions of the rollout without a serving owner before it starts no"
        " more moves. A live move keeps serving: 0.",
    )
    failure_budget: Integer = Field(
        default=0,
        ge=0,
        le=MAX_SESSIONS,
        description="Rollbacks tolerated per step; one more halts the rollout.",
    )

    def to_strategy(self) -> RolloutStrategy:
        """The planner's strategy; raises StrategyError (with what to do) for what the
        API server cannot check, such as a canary step smaller than an earlier one."""
        steps: list[Canary | Pause] = []
        for step in self.steps:
            if step.canary is not None:
                steps.append(Canary(sessions=step.canary.sessions, percent=step.canary.percent))
            else:
                assert step.pause is not None
                steps.append(Pause(seconds=step.pause.duration_seconds))
        return RolloutStrategy(
            steps=tuple(steps),
            pace=Pace(
                max_concurrent=self.max_concurrent_migrations,
                max_per_node=self.max_concurrent_per_node,
                max_unavailable=self.max_unavailable,
            ),
            failure_budget=self.failure_budget,
        )


class AgentDeploymentSpec(KubeModel):
    """The template sessions follow (``spec.deploymentRef`` on an AgentSession), their
    migration policy, and how a change of the template's image rolls out."""

    template: AgentTemplate
    migration: MigrationPolicy = Field(
        default_factory=MigrationPolicy, json_schema_extra=DEFAULT_OBJECT
    )
    strategy: RolloutStrategySpec = Field(
        default_factory=RolloutStrategySpec, json_schema_extra=DEFAULT_OBJECT
    )
    paused: Bool = Field(
        default=False,
        description="Start no migrations (running ones finish), as a Deployment's.",
    )


# --- status ------------------------------------------------------------------------------


class VersionCount(KubeModel):
    image: str = Field(max_length=512)
    sessions: Count


class SessionCounts(KubeModel):
    """The following sessions, by where they stand in the rollout."""

    total: Count = 0
    updated: Count = Field(default=0, description="On the rollout's image.")
    pinned: Count = 0
    queued: Count = Field(default=0, description="Waiting in the cluster-wide pacing queue.")
    migrating: Count = 0
    failed: Count = Field(default=0, description="Their move rolled back in this rollout.")
    unavailable: Count = Field(default=0, description="Without a serving owner.")
    suspended: Count = Field(
        default=0,
        description="Suspended (operatingMode): not moved; they resume on the rollout's version.",
    )


class GateRejection(KubeModel):
    session: ObjectName
    judge: str = Field(max_length=64)
    message: Text = ""


class GateVerdictsStatus(KubeModel):
    """The upgrade gates' verdicts on the rollout's migrations."""

    passed: Count = 0
    rejected: Count = 0
    recent_rejections: list[GateRejection] = Field(
        default_factory=list, max_length=5, json_schema_extra=ATOMIC_LIST
    )


class RolloutFailure(KubeModel):
    """A migration of the rollout that did not reach its image."""

    session: ObjectName
    migration: ObjectName
    step: Count
    reason: FailureKind
    message: Text = ""
    aborting: Bool = Field(default=False, description="A move back during an abort.")


class RolloutHalt(KubeModel):
    step: Count
    reason: FailureKind
    message: str = Field(max_length=32768)
    time: Time


class DeploymentCondition(Condition):
    """Progressing (moving sessions, or done), Available (the sessions serve) and Halted
    (the failure budget was spent: the reason says how)."""

    type: Literal["Progressing", "Available", "Halted"]


class AgentDeploymentStatus(KubeModel):
    """Where the rollout of ``targetImage`` stands, and what the planner remembers."""

    observed_generation: Int64 | None = None
    phase: RolloutPhase | None = None
    revision: Int64 = Field(default=0, description="Grows by one with each new image.")
    target_image: str | None = Field(default=None, max_length=512)
    stable_image: str | None = Field(
        default=None, max_length=512, description="The image before it: an abort goes back."
    )
    current_step: Count = 0
    steps: Count = Field(default=0, description="The strategy's steps plus the final one.")
    step_description: str | None = Field(default=None, max_length=256)
    message: str | None = Field(default=None, max_length=32768)
    versions: list[VersionCount] = Field(
        default_factory=list, max_length=256, json_schema_extra=list_map("image")
    )
    sessions: SessionCounts = Field(default_factory=SessionCounts)
    gate_verdicts: GateVerdictsStatus = Field(default_factory=GateVerdictsStatus)
    estimated_completion_time: Time | None = None
    # The planner's memory (RolloutState): read back after a restart.
    start_time: Time | None = None
    step_start_time: Time | None = None
    completion_time: Time | None = None
    failures: list[RolloutFailure] = Field(
        default_factory=list,
        max_length=MAX_FAILURES,
        json_schema_extra=ATOMIC_LIST,
        description="Every migration of this revision that rolled back, in order.",
    )
    forgiven_failures: Count = Field(
        default=0, description="Failures before this index were forgiven by a resume."
    )
    observed_resumes: Count = Field(default=0, description="Resume requests acted on.")
    halt: RolloutHalt | None = None
    aborted: Bool = False
    conditions: list[DeploymentCondition] = Field(
        default_factory=list, max_length=3, json_schema_extra=list_map("type")
    )

    _one_per_type = field_validator("conditions")(one_per_type)

    def rollout_state(self) -> RolloutState:
        """The planner's state as this status stored it."""
        return RolloutState(
            revision=self.revision,
            target=self.target_image,
            stable=self.stable_image,
            step=self.current_step,
            started_at=_seconds(self.start_time),
            step_started_at=_seconds(self.step_start_time),
            completed_at=_seconds(self.completion_time),
            failures=tuple(
                Failure(f.session, f.migration, f.step, f.reason, f.message, f.aborting)
                for f in self.failures
            ),
            forgiven=self.forgiven_failures,
            resumes_seen=self.observed_resumes,
            halted=None
            if self.halt is None
            else Halt(
                self.halt.step, self.halt.reason, self.halt.message, self.halt.time.timestamp()
            ),
            aborted=self.aborted,
        )

    @classmethod
    def of(
        cls,
        state: RolloutState,
        progress: Progress,
        conditions: list[DeploymentCondition],
        generation: int | None,
    ) -> AgentDeploymentStatus:
        """The status to write for the planner's state and progress."""
        halt = state.halted
        return cls(
            observed_generation=generation,
            phase=progress.phase,
            revision=state.revision,
            target_image=state.target,
            stable_image=state.stable,
            current_step=state.step,
            steps=progress.steps,
            step_description=progress.step_description,
            message=progress.message[:32768],
            versions=[VersionCount(image=v, sessions=n) for v, n in progress.versions[:256]],
            sessions=SessionCounts(
                total=progress.total,
                updated=progress.updated,
                pinned=progress.pinned,
                queued=progress.queued,
                migrating=progress.running,
                failed=progress.failed,
                unavailable=progress.unavailable,
                suspended=progress.suspended,
            ),
            gate_verdicts=GateVerdictsStatus(
                passed=progress.gates.passed,
                rejected=progress.gates.rejected,
                recent_rejections=[
                    GateRejection(session=r.session, judge=r.judge[:64], message=r.message[:2048])
                    for r in progress.gates.recent_rejections
                ],
            ),
            estimated_completion_time=_time(progress.estimated_completion),
            start_time=_time(state.started_at),
            step_start_time=_time(state.step_started_at),
            completion_time=_time(state.completed_at),
            failures=[
                RolloutFailure(
                    session=f.session,
                    migration=f.migration,
                    step=f.step,
                    reason=f.kind,
                    message=f.message[:2048],
                    aborting=f.aborting,
                )
                for f in state.failures
            ],
            forgiven_failures=state.forgiven,
            observed_resumes=state.resumes_seen,
            halt=None
            if halt is None
            else RolloutHalt(
                step=halt.step, reason=halt.reason, message=halt.message, time=_time(halt.at)
            ),
            aborted=state.aborted,
            conditions=conditions,
        )


def _seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _time(value: float | None) -> datetime | None:
    # Status times are to the second (metav1.Time): the planner's clock is read back so.
    return None if value is None else datetime.fromtimestamp(int(value), UTC)


class AgentDeployment(CustomResource):
    """An agent template AgentSessions follow (spec.deploymentRef). Changing its image
    rolls the new version out to every following session live: canary steps, pauses,
    a pace and a failure budget that halts a bad version before it spreads."""

    definition: ClassVar[ResourceDefinition] = ResourceDefinition(
        group=GROUP,
        version=VERSION,
        kind="AgentDeployment",
        plural="agentdeployments",
        short_names=("agd",),
        categories=CATEGORIES,
        columns=(
            PrinterColumn("Image", "string", ".spec.template.image", "The template's image."),
            PrinterColumn("Phase", "string", ".status.phase", "Where the rollout stands."),
            PrinterColumn("Step", "integer", ".status.currentStep", "The rollout's step."),
            PrinterColumn("Sessions", "integer", ".status.sessions.total", "Following sessions."),
            PrinterColumn(
                "Up-to-date", "integer", ".status.sessions.updated", "On the template's image."
            ),
            PrinterColumn(
                "Available",
                "string",
                '.status.conditions[?(@.type=="Available")].status',
                "Whether the sessions serve.",
            ),
            AGE,
            PrinterColumn(
                "Halted",
                "string",
                '.status.conditions[?(@.type=="Halted")].reason',
                "Why the rollout halted, if it did.",
                priority=1,
            ),
            PrinterColumn(
                "ETA",
                "date",
                ".status.estimatedCompletionTime",
                "When the rollout should be done.",
                priority=1,
            ),
            PrinterColumn(
                "Message", "string", ".status.message", "The rollout's latest word.", priority=1
            ),
        ),
        rules=(
            Rule(
                "size(self.metadata.name) <= 63",
                "an AgentDeployment's name is at most 63 characters: it labels the rollout's"
                " migrations and a label value is at most 63; choose a shorter name",
            ),
        ),
    )

    api_version: Literal["shadowpod.dev/v1alpha1"] = API_VERSION
    kind: Literal["AgentDeployment"] = "AgentDeployment"
    spec: AgentDeploymentSpec
    status: AgentDeploymentStatus | None = None
