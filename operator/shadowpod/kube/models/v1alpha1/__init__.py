"""``shadowpod.dev/v1alpha1``: AgentSession and AgentMigration."""

from __future__ import annotations

from shadowpod.kube.models.v1alpha1.migration import (
    AgentMigration,
    AgentMigrationSpec,
    AgentMigrationStatus,
    FenceStatus,
    InstanceStatus,
    MigrationCondition,
    MigrationResult,
    MigrationTarget,
    PhaseTiming,
    SessionReference,
    SnapshotStatus,
)
from shadowpod.kube.models.v1alpha1.policy import (
    EvictionStrategy,
    MigrationPolicy,
    MigrationStrategy,
)
from shadowpod.kube.models.v1alpha1.session import (
    AgentSession,
    AgentSessionSpec,
    AgentSessionStatus,
    CheckpointPolicy,
    ClaimMemory,
    Credential,
    EmptyDirMemory,
    Identity,
    JournalRetention,
    JournalRetentionPolicy,
    JournalStatus,
    MemoryVolume,
    MigrationSummary,
    Schedule,
    SecretReference,
    SessionCondition,
    SessionPhase,
)
from shadowpod.kube.models.v1alpha1.version import API_VERSION, GROUP, VERSION

# Every kind of this version, in the order ``shadowpod crds`` writes them.
RESOURCES = (AgentSession, AgentMigration)

__all__ = [
    "API_VERSION",
    "GROUP",
    "RESOURCES",
    "VERSION",
    "AgentMigration",
    "AgentMigrationSpec",
    "AgentMigrationStatus",
    "AgentSession",
    "AgentSessionSpec",
    "AgentSessionStatus",
    "CheckpointPolicy",
    "ClaimMemory",
    "Credential",
    "EmptyDirMemory",
    "EvictionStrategy",
    "FenceStatus",
    "Identity",
    "InstanceStatus",
    "JournalRetention",
    "JournalRetentionPolicy",
    "JournalStatus",
    "MemoryVolume",
    "MigrationCondition",
    "MigrationPolicy",
    "MigrationResult",
    "MigrationStrategy",
    "MigrationSummary",
    "MigrationTarget",
    "PhaseTiming",
    "Schedule",
    "SecretReference",
    "SessionCondition",
    "SessionPhase",
    "SessionReference",
    "SnapshotStatus",
]
