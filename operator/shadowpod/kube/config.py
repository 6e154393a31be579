"""The operator's settings: flags, environment, files (``shadowpod operator --help``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


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
    criu: bool = False
