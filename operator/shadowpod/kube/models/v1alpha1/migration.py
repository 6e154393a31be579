"""``AgentMigration``: one move of a session to a new image or another node.

The operator creates one when a session's image changes or its node is drained; a user
creates one to move a session on demand. Deleting a running one cancels it (rollback).
Its status is the migration engine's record (``shadowpod.engine.record``), kept in the
API so that a restarted operator continues from the stored phase.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator

from shadowpod.domain.phases import TERMINAL, Phase
from shadowpod.kube.models.base import (
    ATOMIC_LIST,
    DNS1123_LABEL,
    REASON_PATTERN,
    Count,
    Int64,
    KubeModel,
    MicroTime,
    Rule,
    list_map,
    validations,
)
from shadowpod.kube.models.conditions import Condition, one_per_type
from shadowpod.kube.models.core import ObjectName
from shadowpod.kube.models.resource import AGE, CustomResource, PrinterColumn, ResourceDefinition
from shadowpod.kube.models.v1alpha1.policy import MigrationPolicy, MigrationStrategy
from shadowpod.kube.models.v1alpha1.validation import (
    PersonaPolicy,
    PersonaStatus,
    ValidationPolicy,
    ValidationStatus,
)
from shadowpod.kube.models.v1alpha1.version import API_VERSION, CATEGORIES, GROUP, VERSION

# The phases a migration ends in, in the engine's order, for CEL's list literals.
FINISHED_PHASES: Final = [phase.value for phase in Phase if phase in TERMINAL]
_FINISHED_LIST: Final = "[" + ", ".join(f"'{phase}'" for phase in FINISHED_PHASES) + "]"

Image = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^\S+$")]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=REASON_PATTERN)]


def _immutable_message(field: str) -> str:
    return (
        f"{field} is immutable: an AgentMigration is one request; delete it (a running one"
        " rolls back) and create another"
    )


def _immutable(field: str) -> Rule:
    """A transition rule on the field itself: it runs when the field was and is set."""
    return Rule("self == oldSelf", _immutable_message(field))


def _immutable_optional(field: str) -> Rule:
    """A transition rule on the field's object, so that setting or unsetting it counts too."""
    return Rule(
        f"has(self.{field}) == has(oldSelf.{field})"
        f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        _immutable_message(field),
        field_path=f".{field}",
    )


class MigrationResult(StrEnum):
    """How a finished migration ended."""

    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


class SessionReference(KubeModel):
    """The AgentSession to move, in the AgentMigration's namespace."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)


class MigrationTarget(KubeModel):
    """Where the session goes: a new image, another node, or both."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.image) || has(self.nodeName)",
                "target needs image (move to a new image), nodeName (move to another node) or both",
            ),
            _immutable_optional("image"),
            _immutable_optional("nodeName"),
        )
    )

    image: Image | None = Field(
        default=None, description="The image the session moves to; unset keeps its image."
    )
    node_name: ObjectName | None = Field(
        default=None,
        description="The node the new owner runs on; unset lets the scheduler choose (never"
        " the source's node when it is cordoned).",
    )


class AgentMigrationSpec(KubeModel):
    """What to move where. Immutable: a migration is one request."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "!has(self.strategy) || self.strategy != 'CRIU' || !has(self.target.image)",
                "strategy CRIU restores the same process image, so it cannot change the image:"
                " leave target.image unset, or use strategy State or Auto",
                field_path=".strategy",
            ),
            _immutable_optional("strategy"),
            _immutable_optional("validation"),
            _immutable_optional("persona"),
        )
    )

    session_ref: SessionReference = Field(json_schema_extra=validations(_immutable("sessionRef")))
    target: MigrationTarget
    reason: Reason = Field(
        default="Manual",
        json_schema_extra=validations(_immutable("reason")),
        description="Why, in one CamelCase word: ImageChange and NodeDrain when the operator"
        " creates it, Manual by default.",
    )
    strategy: MigrationStrategy | None = Field(
        default=None, description="Auto, State or CRIU; unset takes the session's policy."
    )
    validation: ValidationPolicy | None = Field(
        default=None,
        description="The upgrade gate for this migration; unset takes the session's"
        " (spec.migration.validation), which only a change of image runs.",
    )
    persona: PersonaPolicy | None = Field(
        default=None,
        description="The persona check for this migration; unset takes the session's"
        " (spec.migration.persona), which only a change of image runs.",
    )


class PhaseTiming(KubeModel):
    """When a phase started and ended (a fence retry restarts CatchingUp's timing)."""

    phase: Phase
    start_time: MicroTime
    end_time: MicroTime | None = None
    duration_milliseconds: Int64 | None = None


class InstanceStatus(KubeModel):
    """A pod of the migration: the source (the owner it started from) or the target (its
    shadow, then the new owner)."""

    pod: str | None = Field(default=None, max_length=253)
    image: str | None = Field(default=None, max_length=512)
    node_name: str | None = Field(default=None, max_length=253)
    epoch: Int64 | None = Field(default=None, description="The epoch it owns or owned.")


class SnapshotStatus(KubeModel):
    """The snapshot the shadow restored from."""

    request_seq: Int64 | None = Field(
        default=None, description="The control entry that asked the source for it."
    )
    watermark_seq: Int64 | None = Field(default=None, description="The seq it covers up to.")


class FenceStatus(KubeModel):
    """The ExchangeFence that committed: from fenceSeq on the source can write nothing."""

    epoch: Int64 = Field(description="The new owner's epoch.")
    fence_seq: Int64 = Field(description="The seq of the control entry of the epoch bump.")
    waited_milliseconds: Int64 = Field(description="How long the fence waited for quiescence.")
    attempts: Count = Field(description="The attempts it took.")


class MigrationCondition(Condition):
    """Succeeded and Failed: both False while the migration runs; one turns True
    when it ends (a rollback is Failed, with the reason)."""

    type: Literal["Succeeded", "Failed"]


class AgentMigrationStatus(KubeModel):
    """The migration as it goes: written before each phase acts."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                f"has(self.result) ? self.result == self.phase : !(self.phase in {_FINISHED_LIST})",
                "status.result is the finished phase (Succeeded, RolledBack or Failed), and set"
                " only once the migration has finished",
                field_path=".result",
            ),
            Rule(
                f"!(oldSelf.phase in {_FINISHED_LIST}) || self.phase == oldSelf.phase",
                "a finished migration stays finished: create a new AgentMigration to move the"
                " session again",
                field_path=".phase",
            ),
        )
    )

    observed_generation: Int64 | None = None
    phase: Phase = Field(default=Phase.PENDING, description="The engine's phase.")
    strategy: Literal["State", "CRIU"] | None = Field(
        default=None, description="The strategy chosen (Auto resolved)."
    )
    strategy_message: str | None = Field(
        default=None,
        max_length=2048,
        description="Why that strategy: what Auto saw, or why a CRIU attempt fell back to"
        " the app-level state path.",
    )
    checkpoint_mechanism: Literal["PodCheckpoint", "KubeletAPI"] | None = Field(
        default=None,
        description="How the CRIU strategy checkpoints: KEP-5823's PodCheckpoint API (where"
        " the cluster serves it, for a move on the same node) or the kubelet checkpoint API"
        " with checkpoint images.",
    )
    start_time: MicroTime | None = None
    completion_time: MicroTime | None = None
    source: InstanceStatus | None = None
    target: InstanceStatus | None = None
    policy: MigrationPolicy | None = Field(
        default=None, description="The session's policy, as it was when the migration started."
    )
    phases: list[PhaseTiming] = Field(
        default_factory=list,
        max_length=len(Phase),
        json_schema_extra=list_map("phase"),
        description="Per-phase timings, in the order the phases were entered.",
    )
    snapshot: SnapshotStatus | None = None
    validation: ValidationStatus | None = Field(
        default=None, description="The upgrade gate's verdict, when the migration ran one."
    )
    persona: list[PersonaStatus] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra=ATOMIC_LIST,
        description="The persona probes made, in order.",
    )
    fence_attempts: Count = 0
    fence: FenceStatus | None = None
    fence_pause_milliseconds: Int64 | None = Field(
        default=None, description="How long the first message held back by the fence waited."
    )
    messages_buffered: Int64 | None = Field(
        default=None, description="Messages that arrived during the fence, for the new owner."
    )
    messages_replayed: Int64 | None = Field(
        default=None, description="Journal entries the shadow applied while catching up."
    )
    catch_up_entries_per_second: Int64 | None = None
    recoveries: Count = Field(default=0, description="Operator restarts it resumed from.")
    result: MigrationResult | None = None
    failed_phase: Phase | None = Field(default=None, description="Where it failed, if it did.")
    message: str | None = Field(
        default=None, max_length=32768, description="The latest step, or what went wrong."
    )
    conditions: list[MigrationCondition] = Field(
        default_factory=list, max_length=2, json_schema_extra=list_map("type")
    )

    _one_per_type = field_validator("conditions")(one_per_type)


class AgentMigration(CustomResource):
    """One live migration of an AgentSession, to a new image or another node."""

    definition: ClassVar[ResourceDefinition] = ResourceDefinition(
        group=GROUP,
        version=VERSION,
        kind="AgentMigration",
        plural="agentmigrations",
        short_names=("agm",),
        categories=CATEGORIES,
        columns=(
            PrinterColumn("Session", "string", ".spec.sessionRef.name", "The session it moves."),
            PrinterColumn("Image", "string", ".spec.target.image", "The target image."),
            PrinterColumn("Node", "string", ".spec.target.nodeName", "The target node."),
            PrinterColumn("Phase", "string", ".status.phase", "The engine's phase."),
            AGE,
            PrinterColumn("Reason", "string", ".spec.reason", "Why it runs.", priority=1),
            PrinterColumn(
                "Fence Pause (ms)",
                "integer",
                ".status.fencePauseMilliseconds",
                "How long the first held-back message waited.",
                priority=1,
            ),
            PrinterColumn(
                "Message", "string", ".status.message", "The latest step or error.", priority=1
            ),
        ),
    )

    api_version: Literal["shadowpod.dev/v1alpha1"] = API_VERSION
    kind: Literal["AgentMigration"] = "AgentMigration"
    spec: AgentMigrationSpec
    status: AgentMigrationStatus | None = None
