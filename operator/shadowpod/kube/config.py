"""The operator's settings: flags, environment, files (``shadowpod operator --help``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shadowpod.fleet.pacing import DEFAULT_MAX_CONCURRENT, DEFAULT_MAX_PER_NODE, Caps
from shadowpod.fleet.strategy import MAX_CONCURRENCY


class OperatorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gateway_url: str = Field(description="Where the operator reaches the gateway's control API.")
    agent_gateway_url: str = Field(
        description="Where agent pods reach the gateway (its Service, in a cluster)."
    )
    control_token: str = Field(min_length=1, repr=False)
    namespaces: tuple[str, ...] = ()
    kubeconfig: Path | None = Field(
        default=None, description="Unset: in-cluster credentials, else $KUBECONFIG."
    )
    reconcile_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="How often a session is checked in any case (an owner pod's change, a"
        " cordon and a finished migration trigger a check at once; a steady pass costs"
        " one gateway read and two API reads).",
    )
    deletion_attempts: int = Field(
        default=5,
        ge=1,
        description="Attempts to reach the gateway when a session is deleted, before the"
        " finalizer is released with an event saying what was left behind.",
    )
    criu: bool = Field(
        default=False,
        description="The CRIU path: checkpoints through KEP-5823's PodCheckpoint where it is"
        " served (podcheckpoints create, get, delete, restore), else the kubelet API"
        " (nodes/proxy create).",
    )
    checkpoint_registry: str | None = Field(
        default=None,
        description="Where the node agents push checkpoint images ([host[:port]/]path), and"
        " so where restored pods pull them from; without it there is no CRIU path.",
    )
    checkpoint_registry_insecure: bool = Field(
        default=False,
        description="Reach the checkpoint registry's API over plain HTTP (a registry on a"
        " private network), to delete checkpoint images.",
    )
    checkpoint_registry_authfile: Path | None = Field(
        default=None,
        description="The registry's credentials (a dockerconfigjson file), to delete"
        " checkpoint images once their migration has ended.",
    )
    checkpoint_timeout_s: int = Field(
        default=60,
        ge=1,
        le=3600,
        description="The kubelet checkpoint API's timeout (its dump time grows with the"
        " agent's memory).",
    )
    max_concurrent_migrations: int = Field(
        default=DEFAULT_MAX_CONCURRENT,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Migrations running at once in everything the operator serves; the"
        " rest wait in the Queued phase (KubeVirt's parallelMigrationsPerCluster).",
    )
    max_concurrent_migrations_per_node: int = Field(
        default=DEFAULT_MAX_PER_NODE,
        ge=1,
        le=MAX_CONCURRENCY,
        description="Of those, running out of one source node"
        " (KubeVirt's parallelOutboundMigrationsPerNode).",
    )

    @model_validator(mode="after")
    def _caps_fit(self) -> OperatorConfig:
        self.caps()  # raises StrategyError (a ValueError) saying what to give
        return self

    def caps(self) -> Caps:
        return Caps(self.max_concurrent_migrations, self.max_concurrent_migrations_per_node)
