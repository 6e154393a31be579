"""The ownership record of a session: who may write, and whether it receives work.

``epoch`` is the owner generation. Every owner write carries the epoch it was given;
the store refuses a write whose epoch is not the current one (``Fenced``), in the same
transaction as the write. ``fence`` is the ExchangeFence's first half: while it is
``fenced`` the gateway stops delivering inbound entries to the owner (they keep being
journaled), and the owner may still finish and journal the turn it is in.

A suspended session (``suspended``) was fenced to an epoch whose owner is not running:
nothing is delivered, inbound keeps being journaled, and the record names the instance
that will own the session when it resumes. ``waking``: suspended, and a client's
message asked for an owner (the operator resumes the session when its spec allows).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from shadowpod.domain.bounds import Epoch, Seq


class FenceState(StrEnum):
    OPEN = "open"
    FENCED = "fenced"
    SUSPENDED = "suspended"
    WAKING = "waking"


class Ownership(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: Epoch = 0
    owner: str | None = Field(default=None, min_length=1, max_length=253)
    fence: FenceState = FenceState.OPEN
    fence_seq: Seq | None = Field(
        default=None, description="Seq of the control entry that recorded the latest epoch."
    )
    updated: datetime | None = None
