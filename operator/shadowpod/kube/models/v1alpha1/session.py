"""``AgentSession``: one long-running agent session, served by one owner pod at a time."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator

from shadowpod.kube.models.base import (
    ATOMIC_LIST,
    DEFAULT_OBJECT,
    DNS1123_LABEL,
    Bool,
    Int64,
    Integer,
    KubeModel,
    Rule,
    Time,
    list_map,
    validations,
)
from shadowpod.kube.models.conditions import Condition, one_per_type
from shadowpod.kube.models.core import (
    DataKey,
    EnvVar,
    ObjectName,
    Quantity,
    ResourceRequirements,
)
from shadowpod.kube.models.resource import AGE, CustomResource, PrinterColumn, ResourceDefinition
from shadowpod.kube.models.v1alpha1.migration import MigrationResult
from shadowpod.kube.models.v1alpha1.policy import MigrationPolicy
from shadowpod.kube.models.v1alpha1.version import API_VERSION, CATEGORIES, GROUP, VERSION

# An image reference; the operator parses it (the API server cannot) and says so in a
# condition when it does not.
Image = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=r"^\S+$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS1123_LABEL)]
Argument = Annotated[str, StringConstraints(max_length=4096)]
Principle = Annotated[str, StringConstraints(min_length=1, max_length=1024)]

# The operator mounts identity files and credentials under this directory.
RUNTIME_DIR: Final = "/var/run/shadowpod"


class SecretReference(KubeModel):
    """A Secret in the session's namespace, or one key of it."""

    name: ObjectName = Field(description="The Secret's name.")
    key: DataKey | None = Field(
        default=None,
        description="Mount only this key, as a file named after the credential; without it"
        " every key of the Secret is mounted, a file each.",
    )


class Credential(KubeModel):
    """A credential the agent needs (an API key, a token), mounted from a Secret into
    /var/run/shadowpod/credentials/<name>. Never journaled nor snapshotted; a
    migration's shadow must have every one mounted before it may take over."""

    name: Name = Field(description="What the agent calls it; unique in the session.")
    secret_ref: SecretReference


class EmptyDirMemory(KubeModel):
    """A volume as long-lived as the pod: on a move the agent rebuilds it from the
    snapshot and the journal."""

    medium: Literal["", "Memory"] = Field(default="", description='"" (node disk) or Memory.')
    size_limit: Quantity | None = Field(default=None, description="The most it may hold.")


class ClaimMemory(KubeModel):
    """An existing PersistentVolumeClaim, shared by the owner and its shadow during a move:
    it must be ReadWriteMany for the session to move between nodes."""

    claim_name: ObjectName


class MemoryVolume(KubeModel):
    """A volume for the agent's files (persistent memory, scratch space)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.emptyDir) != has(self.persistentVolumeClaim)",
                "memory takes one volume: set emptyDir or persistentVolumeClaim",
            ),
            Rule(
                "!self.mountPath.contains('/../') && !self.mountPath.endsWith('/..')"
                f" && !self.mountPath.startsWith('{RUNTIME_DIR}')",
                f"memory.mountPath must not contain '..' nor lie under {RUNTIME_DIR}"
                " (the operator's identity and credential files): choose another directory",
                field_path=".mountPath",
            ),
        )
    )

    mount_path: str = Field(
        default="/var/lib/shadowpod/memory",
        max_length=1024,
        pattern=r"^(/[^/]+)+$",
        description="Where the volume appears in the agent container (an absolute path).",
    )
    empty_dir: EmptyDirMemory | None = None
    persistent_volume_claim: ClaimMemory | None = None


class Identity(KubeModel):
    """Who the agent is, given to it as files (downward API) and re-read after every move."""

    name: str = Field(min_length=1, max_length=128, description="The agent's name.")
    principles: list[Principle] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra=ATOMIC_LIST,
        description="Rules the agent keeps, in order.",
    )


class Schedule(KubeModel):
    """A recurring task. It belongs to the session, not to a pod: Shadowpod journals each
    firing as an inbound message, exactly once, whichever pod owns the session."""

    name: Name = Field(description="Unique in the session.")
    every_seconds: Integer = Field(ge=1, le=31_536_000, description="The period (at most a year).")
    message: str = Field(min_length=1, max_length=16384, description="What the agent receives.")
    wake: bool = Field(
        default=False,
        description="A fire wakes the session while it sleeps for being idle"
        " (idleSuspendAfter); without it, fires wait in the journal and are answered"
        " when something else resumes the session. A session suspended by"
        " operatingMode: Suspended is never woken.",
    )


class CheckpointPolicy(KubeModel):
    """State snapshots the owner takes: a restore or a migration starts from the latest."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.intervalEntries == 0 || self.intervalEntries >= 100",
                "checkpoint.intervalEntries is 0 (never) or at least 100: each snapshot"
                " writes the whole session state",
                field_path=".intervalEntries",
            )
        )
    )

    interval_entries: Integer = Field(
        default=10_000,
        ge=0,
        le=10_000_000,
        description="Take a snapshot every this many journal entries (0: never).",
    )
    retain_snapshots: Integer = Field(
        default=3,
        ge=1,
        le=100,
        description="Snapshots kept; the journal they cover is truncated (never past the"
        " last processed message).",
    )


class JournalRetention(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


# A keep period: days too ("7d"), as a deleted session is kept for days, not hours.
KEEP_PERIOD_PATTERN: Final = r"^([0-9]{1,5}(d|h|m|s))+$"


class JournalRetentionPolicy(KubeModel):
    """What becomes of the session's journal and snapshots when the AgentSession is deleted
    (as a StatefulSet's persistentVolumeClaimRetentionPolicy)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "!has(self.retainFor) || self.whenDeleted == 'Retain'",
                "journalRetentionPolicy.retainFor keeps a deleted session's journal for a"
                " while: it goes with whenDeleted: Retain (Delete deletes it at once)",
                field_path=".retainFor",
            ),
            Rule(
                f"!has(self.retainFor) || self.retainFor.matches('{KEEP_PERIOD_PATTERN}')",
                'journalRetentionPolicy.retainFor is a duration such as "7d", "36h" or'
                ' "1d12h" (units d, h, m, s)',
                field_path=".retainFor",
            ),
        )
    )

    when_deleted: JournalRetention = Field(
        default=JournalRetention.RETAIN,
        description="Retain (the gateway keeps them; a new AgentSession of the same name"
        " resumes the session) or Delete.",
    )
    retain_for: str | None = Field(
        default=None,
        max_length=32,
        description='With Retain: keep them this long after the deletion ("7d", "36h"),'
        " readable with the gateway's control token, then the gateway deletes them (a"
        " session forks still read: once they are gone). A new AgentSession of the same"
        " name within the period resumes the session. Unset: kept for good.",
    )

    @field_validator("retain_for")
    @classmethod
    def _a_keep_period(cls, value: str | None) -> str | None:
        # The API server checks it by the CEL rule above (one message, not two).
        if value is not None and not re.fullmatch(KEEP_PERIOD_PATTERN, value):
            raise ValueError(f"retainFor {value!r} is not a duration such as 7d or 36h")
        return value


class OperatingMode(StrEnum):
    RUNNING = "Running"
    SUSPENDED = "Suspended"


# A duration as Kubernetes users write one (agent-sandbox's, kubectl's): "15m", "1h30m".
DURATION_PATTERN: Final = r"^([0-9]{1,7}(h|m|s))+$"
_DURATION_PART: Final = re.compile(r"([0-9]+)(d|h|m|s)")
_UNIT_S: Final = {"d": 86_400, "h": 3600, "m": 60, "s": 1}


def duration_seconds(duration: str) -> int:
    """``duration`` (as ``DURATION_PATTERN`` or ``KEEP_PERIOD_PATTERN`` admits it) in
    seconds."""
    return sum(int(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(duration))


class DeploymentReference(KubeModel):
    """An AgentDeployment in the session's namespace."""

    name: Name


class ForkFrom(KubeModel):
    """Where a fork starts: another AgentSession of the namespace, at a seq of its
    journal or at one of its snapshots (exactly one of the two)."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.seq) != has(self.snapshot)",
                "forkFrom takes exactly one of seq and snapshot: where the fork starts",
            ),
            Rule(
                "self == oldSelf",
                "forkFrom cannot change: a session is forked once, when it is made",
            ),
        )
    )

    session: Name = Field(description="The AgentSession to fork, in this namespace.")
    seq: Int64 | None = Field(
        default=None, ge=0, description="Fork at this seq of its journal (its state there)."
    )
    snapshot: Int64 | None = Field(
        default=None, ge=0, description="Fork at its snapshot of this watermark."
    )


class AgentSessionSpec(KubeModel):
    """The session's agent: the container it runs in and how it is moved. Changing
    image starts a live migration to the new image. A session that follows an
    AgentDeployment (deploymentRef) may leave image out: its rollouts give it."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "has(self.image) || has(self.deploymentRef)",
                "spec.image is required unless the session follows an AgentDeployment: give"
                " image, or deploymentRef: {name: ...} to take the template's",
                field_path=".image",
            )
        )
    )

    image: Image | None = Field(
        default=None,
        description="The agent's container image. Optional with deploymentRef: the"
        " AgentDeployment's rollouts then choose it; set, it overrides the template's and the"
        " session is not rolled out.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="As in a pod: Always, IfNotPresent or Never."
    )
    command: list[Argument] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=ATOMIC_LIST,
        description="The entrypoint; the image's when empty.",
    )
    args: list[Argument] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=ATOMIC_LIST,
        description="Arguments to the entrypoint.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        json_schema_extra=list_map("name"),
        description="Environment variables, as in a pod.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU, memory … as in a pod."
    )
    credentials: list[Credential] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra=list_map("name"),
        description="Secrets the agent needs, mounted into every pod of the session.",
    )
    memory: MemoryVolume | None = Field(default=None, description="A volume for the agent's files.")
    identity: Identity | None = None
    schedules: list[Schedule] = Field(
        default_factory=list, max_length=32, json_schema_extra=list_map("name")
    )
    migration: MigrationPolicy = Field(
        default_factory=MigrationPolicy, json_schema_extra=DEFAULT_OBJECT
    )
    checkpoint: CheckpointPolicy = Field(
        default_factory=CheckpointPolicy, json_schema_extra=DEFAULT_OBJECT
    )
    journal_retention_policy: JournalRetentionPolicy = Field(
        default_factory=JournalRetentionPolicy, json_schema_extra=DEFAULT_OBJECT
    )
    deployment_ref: DeploymentReference | None = Field(
        default=None,
        description="The AgentDeployment whose template, migration policy and rollouts the"
        " session follows; the session's own fields override the template's.",
    )
    pinned: Bool = Field(
        default=False,
        description="Keep the session on its version: rollouts and their aborts pass it by"
        " until it is unpinned (a node drain still moves it, on the same image).",
    )
    operating_mode: OperatingMode = Field(
        default=OperatingMode.RUNNING,
        description="Running, or Suspended: the owner is fenced out after a final snapshot"
        " and its pod deleted; clients' messages are journaled and wait; back to Running, a"
        " new owner starts from the snapshot and the journal and answers them, in order.",
    )
    idle_suspend_after: str | None = Field(
        default=None,
        max_length=32,
        pattern=DURATION_PATTERN,
        description='Suspend the session when no client message came for this long ("15m",'
        ' "1h30m"); the next message wakes it. Unset: never suspended for being idle.',
    )
    fork_from: ForkFrom | None = Field(
        default=None,
        description="Start as a fork of another session: its state at that point (its"
        " journal up to it, shared with it, not copied), a journal of its own from there"
        " on; the parent is untouched. Tool calls done before the point are not redone.",
    )


class SessionPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    MIGRATING = "Migrating"
    # No owner runs: its epoch is fenced, messages wait in the journal.
    SUSPENDED = "Suspended"
    # The next owner starts; the messages that waited are released once it is ready.
    RESUMING = "Resuming"


class SuspendReason(StrEnum):
    REQUESTED = "Requested"  # spec.operatingMode: Suspended
    IDLE = "Idle"  # spec.idleSuspendAfter passed with no client message


class Suspension(KubeModel):
    """Why and since when the session is suspended."""

    reason: SuspendReason
    since: Time | None = None
    epoch: Int64 | None = Field(default=None, description="The epoch its old owner was fenced at.")


class JournalStatus(KubeModel):
    """Where the session's journal stands, as the gateway last reported it."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            Rule(
                "self.ackedSeq <= self.headSeq",
                "journal.ackedSeq cannot be past journal.headSeq: report both from one"
                " gateway answer",
            )
        )
    )

    head_seq: Int64 = Field(default=0, description="The last entry's seq.")
    acked_seq: Int64 = Field(default=0, description="The last inbound seq the owner processed.")


class MigrationSummary(KubeModel):
    """The session's latest AgentMigration, in short."""

    name: ObjectName = Field(description="The AgentMigration.")
    reason: str | None = Field(default=None, max_length=64)
    result: MigrationResult | None = Field(
        default=None, description="Succeeded, RolledBack or Failed; unset while it runs."
    )
    source_image: str | None = Field(default=None, max_length=512)
    target_image: str | None = Field(default=None, max_length=512)
    start_time: Time | None = None
    completion_time: Time | None = None
    duration_milliseconds: Int64 | None = None
    fence_pause_milliseconds: Int64 | None = Field(
        default=None, description="How long the first held-back message waited."
    )


class SessionCondition(Condition):
    """Ready (an owner serves), Migrating (an AgentMigration runs), Degraded
    (something needs attention: the message says what)."""

    type: Literal["Ready", "Migrating", "Degraded"]


class AgentSessionStatus(KubeModel):
    """The session as last observed."""

    observed_generation: Int64 | None = Field(
        default=None, description="The metadata.generation this status was written for."
    )
    phase: SessionPhase = Field(
        default=SessionPhase.PENDING,
        description="Pending, Running, Migrating, Suspended or Resuming.",
    )
    epoch: Int64 | None = Field(
        default=None, description="The owner generation: it grows by one with every new owner."
    )
    owner_pod: str | None = Field(default=None, max_length=253, description="The owner pod.")
    node_name: str | None = Field(default=None, max_length=253, description="The owner's node.")
    image: str | None = Field(default=None, max_length=512, description="The owner's image.")
    journal: JournalStatus | None = None
    active_migration: str | None = Field(
        default=None, max_length=253, description="The AgentMigration in progress, if any."
    )
    last_migration: MigrationSummary | None = None
    suspension: Suspension | None = Field(
        default=None, description="Set while the session is suspended or resuming."
    )
    conditions: list[SessionCondition] = Field(
        default_factory=list, max_length=3, json_schema_extra=list_map("type")
    )

    _one_per_type = field_validator("conditions")(one_per_type)


class AgentSession(CustomResource):
    """A long-running agent session. Shadowpod runs it in one owner pod at a time and
    moves it live — to a new image when spec.image changes, or to another node —
    with no message lost or processed twice."""

    definition: ClassVar[ResourceDefinition] = ResourceDefinition(
        group=GROUP,
        version=VERSION,
        kind="AgentSession",
        plural="agentsessions",
        short_names=("ags",),
        categories=CATEGORIES,
        columns=(
            PrinterColumn("Phase", "string", ".status.phase", "Where the session stands."),
            PrinterColumn("Image", "string", ".status.image", "The image the owner runs."),
            PrinterColumn("Epoch", "integer", ".status.epoch", "The owner generation."),
            PrinterColumn("Owner", "string", ".status.ownerPod", "The pod that owns the session."),
            PrinterColumn(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "Whether an owner serves the session.",
            ),
            AGE,
            PrinterColumn("Node", "string", ".status.nodeName", "The owner's node.", priority=1),
            PrinterColumn("Desired", "string", ".spec.image", "The image asked for.", priority=1),
            PrinterColumn(
                "Message",
                "string",
                '.status.conditions[?(@.type=="Ready")].message',
                "Why the session is or is not ready.",
                priority=1,
            ),
        ),
        rules=(
            Rule(
                "size(self.metadata.name) <= 63",
                "an AgentSession's name is at most 63 characters: it labels the session's pods"
                " and a label value is at most 63; choose a shorter name",
            ),
        ),
    )

    api_version: Literal["shadowpod.dev/v1alpha1"] = API_VERSION
    kind: Literal["AgentSession"] = "AgentSession"
    spec: AgentSessionSpec
    status: AgentSessionStatus | None = None
